"""`timbench paper`: the claim verdicts on hand-built results whose outcome is pinned, the figures and files.

The grid below is fabricated in the runner's layout (tests/gridfab.py explains why that is legitimate):
every curve is chosen so each claim's rule has a known answer, and one variant flips a rule's answer
to show the rule can fail.
"""

from __future__ import annotations

import json
import math

import pytest
from gridfab import write_cells_json

from timbench.cli import main
from timbench.report.results import CellRun
from timbench.report.verdict_rules import CHECK_PASS, EQUIVALENT
from timbench.studies.paper import paper_data, verdicts, write_paper
from timbench.studies.paper_claims import (
    CONSISTENT,
    NOT,
    REPRODUCED,
    REVERSED,
    UNTESTED,
    Sub,
    Verdict,
    kl_alarm_step,
    rose_before_collapse,
    spearman,
)
from timbench.util.manifest import stamp_run

STEPS = 80
"""The paper grid's step budget (timbench.studies.paper.PAPER_STEPS): a shorter grid is refused."""
SEEDS = 8
"""Enough seeds for the verdict rules to detect the fabricated effects after Holm (Fisher's 8/8 vs 0/8, say)."""
CONDS = {
    "baseline": {"kind": "reference", "engine": "kernels=exact", "trainer": "kernels=exact"},
    "q4": {"kind": "quant", "engine": "kernels=exact,weight_quant=nvfp4", "trainer": "kernels=exact"},
    "noise-g1": {"kind": "noise", "engine": "kernels=exact,noise=gaussian:1", "trainer": "kernels=exact"},
    "noise-g2": {"kind": "noise", "engine": "kernels=exact,noise=gaussian:2", "trainer": "kernels=exact"},
    "noise-g3": {"kind": "noise", "engine": "kernels=exact,noise=gaussian:3", "trainer": "kernels=exact"},
}
VARIANTS = {
    "none": {"remedy": "none"},
    "tis_token": {"remedy": "tis_token"},
    "tis+rs_k3": {"remedy": "tis_token+seq_rs", "remedy_args": {"divergence": "k3", "threshold": 0.01}},
    "tis+rs_k1": {"remedy": "tis_token+seq_rs", "remedy_args": {"divergence": "k1", "threshold": 0.03}},
    "tis+rs_k3_ppo": {
        "remedy": "tis_token+seq_rs",
        "remedy_args": {"divergence": "k3", "threshold": 0.01, "ratio": "ppo"},
    },
    "clip": {"remedy": "none", "eps_low": 0.05, "eps_high": 0.05},
}


def curve(
    seed,
    *,
    collapse_at=None,
    spike_at=None,
    silent=False,
    k3=0.0,
    k3_rise_at=None,
    delta=0.0,
    pos=0.0,
    neg=0.0,
    rej=0.0,
):
    rows = []
    for i in range(STEPS):
        reward = 0.40 + 0.006 * i + 0.01 * seed
        grad = 1.0 + 0.05 * ((i + seed) % 3)
        if collapse_at is not None and i >= collapse_at:
            reward, grad = 0.01, (0.0 if silent else grad)
        if spike_at is not None and i == spike_at:
            grad = 8.0
        kl = k3 * (5.0 if k3_rise_at is not None and i >= k3_rise_at else 1.0)
        rows.append(
            {
                "step": i,
                "critic/rewards/mean": reward,
                "actor/grad_norm": grad,
                "actor/loss": 0.01,
                "actor/pg_loss": 0.01,
                "rollout_corr/k3_kl": kl,
                "rollout_corr/kl": kl / 2,
                "mismatch/mean_abs_delta": delta,
                "drift/diff_abs_mean": abs(pos) + abs(neg),
                "drift/diff_mean": pos + neg,
                "drift/diff_pos_adv_mean": pos * (1 + 0.1 * seed),
                "drift/diff_neg_adv_mean": neg * (1 + 0.1 * seed),
                "rollout_corr/rollout_rs_seq_masked_fraction": rej,
            }
        )
    return rows


def write(root, cond, remedy, mode, seed, rows, final_acc, decls):
    cid = f"add-4d-v1.tiny-dense.{cond}.{remedy}.{mode}.grpo.s{seed}"
    d = root / "runs" / cid
    d.mkdir(parents=True)
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    evals = [
        {"step": 0, "accuracy_t1": 0.37, "accuracy_greedy": 0.6},
        {"step": STEPS, "accuracy_t1": final_acc, "accuracy_greedy": 0.6},
    ]
    (d / "eval.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evals))
    (d / "summary.json").write_text(json.dumps({"status": "finished", "error": None, "steps_done": STEPS}))
    stamp_run(d)  # sealed, as a finished run is
    (d / "cell.json").write_text(json.dumps({"status": "done", "error": None, "wall_s": 1.0, "attempts": 1}))
    v = VARIANTS[remedy]
    config = {
        "task": "add-4d-v1",
        "remedy": v["remedy"],
        "remedy_args": v.get("remedy_args", {}),
        "mode": mode,
        "steps": STEPS,
        "seed": seed,
        "eval_n": 256,
        "eps_low": v.get("eps_low"),
        "eps_high": v.get("eps_high"),
    }
    ref = None if cond == "baseline" else f"add-4d-v1.tiny-dense.baseline.none.recompute.grpo.s{seed}"
    decls.append(
        {
            "id": cid,
            "axes": {
                "task": "add-4d-v1",
                "model": "tiny-dense",
                "condition": cond,
                "remedy": remedy,
                "mode": mode,
                "algorithm": "grpo",
                "seed": seed,
            },
            "condition": {"name": cond, "doc": cond, **CONDS[cond]},
            "reference": ref,
            "config": config,
        }
    )


def paper_grid(root, k3_rise_at=None, clip_fixes=False):
    decls = []
    for s in range(SEEDS):
        write(root, "baseline", "none", "recompute", s, curve(s), 0.60 + 0.01 * s, decls)
        # q4: recompute rises, spikes and collapses at 26; bypass rises briefly and collapses silently at 12
        q4 = dict(k3=0.02, k3_rise_at=k3_rise_at, delta=0.11, pos=0.01, neg=-0.004)
        write(root, "q4", "none", "recompute", s, curve(s, collapse_at=26, spike_at=25, **q4), 0.30 + 0.01 * s, decls)
        write(root, "q4", "none", "bypass", s, curve(s, collapse_at=12, silent=True, **q4), 0.05 + 0.01 * s, decls)
        for mode, acc in (("recompute", 0.55), ("bypass", 0.45)):
            write(
                root,
                "noise-g1",
                "none",
                mode,
                s,
                curve(s, delta=0.1, k3=0.01, pos=0.02, neg=-0.01),
                acc + 0.01 * s,
                decls,
            )
        for mode, acc in (("recompute", 0.45), ("bypass", 0.30)):
            write(
                root,
                "noise-g2",
                "none",
                mode,
                s,
                curve(s, delta=0.5, k3=0.1, pos=0.1, neg=-0.05),
                acc + 0.01 * s,
                decls,
            )
        write(
            root,
            "noise-g3",
            "none",
            "recompute",
            s,
            curve(s, delta=0.9, k3=0.3, pos=0.2, neg=-0.1),
            0.35 + 0.01 * s,
            decls,
        )
        write(
            root, "noise-g3", "none", "bypass", s, curve(s, delta=0.9, k3=0.3, collapse_at=14, silent=True), 0.02, decls
        )
        for remedy, acc, rej in (
            ("tis_token", 0.50, 0.0),
            ("tis+rs_k3", 0.58, 0.3),
            ("tis+rs_k1", 0.57, 0.32),
            ("tis+rs_k3_ppo", 0.45, 0.0),
            ("clip", 0.31, 0.0),
        ):
            write(
                root,
                "q4",
                remedy,
                "recompute",
                s,
                curve(s, delta=0.11, k3=0.02, rej=rej),
                acc
                + 0.012 * s
                + 0.003 * (s == 1)
                + (0.02, -0.015, 0.0, 0.01, -0.01, 0.005, -0.005, 0.0)[s] * (remedy == "tis+rs_k1"),
                decls,
            )
        write(
            root,
            "q4",
            "clip",
            "bypass",
            s,
            curve(s, delta=0.11, k3=0.02) if clip_fixes else curve(s, collapse_at=12, silent=True, delta=0.11),
            0.61 + 0.01 * s if clip_fixes else 0.10,
            decls,
        )
    write_cells_json(root, decls, name="paper")
    return root


@pytest.fixture(scope="module")
def grid(tmp_path_factory):
    return paper_grid(tmp_path_factory.mktemp("paper"))


def by_claim(vs):
    return {v.claim: v for v in vs}


def test_every_claim_gets_the_verdict_its_curves_imply(grid):
    d, _ = paper_data(grid)
    v = by_claim(verdicts(d))
    assert [s.verdict for s in v["F1"].subs] == [REPRODUCED] * 3
    assert v["F2"].verdict == REPRODUCED, v["F2"].subs
    assert v["F3"].verdict == REPRODUCED and "0/" not in v["F3"].subs[0].numbers.split(" collapsed")[0]
    assert v["F4"].verdict == REPRODUCED and "max |diff| = 0.0" in v["F4"].subs[0].numbers
    # the two sub-claims true by construction are implementation checks, outside the claim counts
    assert [(s.check, s.verdict) for s in v["F4"].subs[:2]] == [(True, CHECK_PASS)] * 2
    f5 = {s.text.split(" (")[0]: s.verdict for s in v["F5"].subs}
    assert f5["token TIS + sequence rejection is closest to the zero-mismatch run"] == REPRODUCED
    assert f5["rejection on rho beats rejection on the PPO ratio"] == REPRODUCED
    # a claim of no difference is decided by equivalence (TOST) within half the learning range
    assert f5["K1 and K3 work about equally as the sequence criterion"] == EQUIVALENT
    k1 = next(s for s in v["F5"].subs if s.text.startswith("K1"))
    assert "TOST margin +-0.208" in k1.numbers and "80% power, n 8" in k1.numbers
    assert v["F5"].verdict == REPRODUCED  # an equivalence is how a no-difference claim is reproduced
    assert f5["tightening the PPO clip is not a fix"] == REPRODUCED
    dose = {s.text.split(":")[0]: s.verdict for s in v["dose-response"].subs}
    assert dose["recompute"] == dose["bypass"] == REPRODUCED, v["dose-response"].subs
    # q4 loses half its accuracy at |delta| 0.11, where the noise sweep loses ~8%: |delta| alone does not predict it
    curve_sub = v["dose-response"].subs[2]
    assert dose["mean |delta| alone predicts the damage"] == NOT and [t.word() for t in curve_sub.tests] == [NOT] * 2
    assert dose["bypass collapses at a lower dose than recompute (literature's CPU-scale try"] == REPRODUCED


def test_rules_can_fail(tmp_path):
    # The KL rises 10 steps before each collapse: an early warning, so F3 is reversed.
    d, _ = paper_data(paper_grid(tmp_path / "kl", k3_rise_at=5))
    v = by_claim(verdicts(d))
    assert v["F3"].subs[0].verdict == REVERSED and v["F3"].verdict.startswith(REVERSED)
    # A tightened clip that rescues bypass reverses that sub-claim; the claim's headline is then its weakest.
    d, _ = paper_data(paper_grid(tmp_path / "clip", clip_fixes=True))
    f5 = by_claim(verdicts(d))["F5"]
    clip = [s for s in f5.subs if s.text.startswith("tightening") and "bypass" in s.text]
    assert [s.verdict for s in clip] == [REVERSED] and f5.verdict.startswith(REVERSED + " (")


def test_noise_curve_interpolates_in_log_delta_and_clamps():
    from timbench.report.stats import Interval
    from timbench.studies.paper_claims import noise_curve

    pts = [{"x": Interval(0.01), "y": Interval(1.0)}, {"x": Interval(1.0), "y": Interval(0.0)}]
    assert (
        noise_curve(pts, 0.1) == pytest.approx(0.5) and noise_curve(pts, 1e-4) == 1.0 and noise_curve(pts, 5.0) == 0.0
    )


def test_verdict_aggregation():
    sub = lambda v, central=True: Sub("x", v, "", central)  # noqa: E731
    assert Verdict("F", [sub(REPRODUCED), sub(REPRODUCED)]).verdict == REPRODUCED
    # the headline is the weakest central sub-claim, with the count reproduced beside it
    assert Verdict("F", [sub(REPRODUCED), sub(NOT)]).verdict == NOT + " (1 of 2 sub-claims reproduced)"
    assert Verdict("F", [sub(NOT), sub(REVERSED)]).verdict == REVERSED
    assert Verdict("F", [sub(NOT)]).verdict == NOT and Verdict("F", []).verdict == UNTESTED
    assert Verdict("F", [sub(UNTESTED), sub(REPRODUCED)]).verdict == UNTESTED + " (1 of 2 sub-claims reproduced)"
    assert Verdict("F", [sub(CONSISTENT), sub(REPRODUCED)]).verdict.startswith(CONSISTENT)
    assert Verdict("F", [sub(REPRODUCED), sub(NOT, central=False)]).verdict.startswith(REPRODUCED)


def test_smallest_detectable_difference():
    from timbench.report.stats import Interval, t_quantile
    from timbench.studies.paper_claims import detectable

    iv = Interval(0.0, -1.0, 1.0, 3)  # half-width 1 = t_0.975,2 x sd / sqrt(3)
    assert detectable(iv) == pytest.approx(1.0 + t_quantile(0.8, 2) / t_quantile(0.975, 2))
    assert detectable(Interval(0.5, n=1)) is None


def test_seeds_used_lists_settings_with_fewer_seeds(grid, tmp_path):
    from timbench.studies.paper_claims import seed_ranges, seeds_used

    assert seed_ranges([5, 0, 1, 2, 3]) == "0-3, 5" and seed_ranges([4]) == "4"
    d, _ = paper_data(grid)
    assert seeds_used(d) == "every setting: seeds 0-7 (8)"
    d.rows[("q4", "clip", "bypass")] = [r for r in d.rows[("q4", "clip", "bypass")] if r["seed"] != 1]
    assert (
        seeds_used(d)
        == "seeds 0-7 (8): "
        + ", ".join("/".join(k) for k in sorted(d.rows) if k[1:] != ("clip", "bypass"))
        + "; seeds 0, 2-7 (7): q4/clip/bypass"
    )


def test_a_difference_with_zero_inside_states_what_the_design_could_detect(grid):
    d, _ = paper_data(grid)
    f2 = by_claim(verdicts(d))["F2"].subs[2]
    # every test states its smallest detectable difference beside the learning range
    from timbench.report.stats import Interval
    from timbench.studies.paper_claims import _diff, detectable

    assert "smallest detectable" in f2.numbers and "vs learning range 0.417" in f2.numbers
    # an interval holding 0 ("no difference detected") says what the design could have detected
    wide = Interval(0.1, lo=-0.5, hi=0.7, n=6)
    assert _diff(wide).endswith(f"(smallest detectable difference {detectable(wide):.3g} at 80% power, 6 seeds)")
    assert "smallest" not in _diff(Interval(0.4, lo=0.3, hi=0.5, n=6))


def test_helpers():
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == -1.0 and spearman([1, 2, 3], [1, 2, 3]) == 1.0
    assert spearman([1, 2], [2, 1]) is None
    cell = CellRun("c", {}, {}, None, {}, metrics=curve(0, k3=0.01, k3_rise_at=20))
    assert kl_alarm_step(cell, 5) == 21  # smoothed 5 steps: 2x is passed on the second step at 5x
    flat = CellRun("c", {}, {}, None, {}, metrics=curve(0, k3=0.01))
    assert kl_alarm_step(flat, 5) is None
    rising = CellRun("c", {}, {}, None, {}, metrics=curve(0, collapse_at=30))
    assert rose_before_collapse(rising, {"collapse/step": 30}, 5)
    early = CellRun("c", {}, {}, None, {}, metrics=curve(0, collapse_at=5))
    assert not rose_before_collapse(early, {"collapse/step": 5}, 5)


def test_cli_writes_every_figure_and_the_same_bytes_twice(grid, tmp_path):
    assert main(["paper", str(grid)]) == 0
    doc = json.loads((grid / "paper.json").read_text())
    assert [c["claim"] for c in doc["claims"]] == ["F1", "F2", "F3", "F4", "F5", "dose-response"]
    pngs = {c["figure"]: (grid / "figures" / c["figure"]).read_bytes() for c in doc["claims"]}
    assert all(p[:8] == b"\x89PNG\r\n\x1a\n" and len(p) > 5000 for p in pngs.values())
    md = (grid / "paper.md").read_text()
    assert "## F1: reproduced (last-half, 8 seeds)" in md and "figures/paper_f5_remedies.png" in md
    assert "cells: 120 done of 120" in md and "Holm" in md and "docs/verdicts.md" in md
    assert "every setting: seeds 0-7 (8)" in md and doc["seeds"] == "every setting: seeds 0-7 (8)"
    assert "Primary endpoint last-half" in md and "declares none" in md and doc["exploratory"] is False
    assert "## Sensitivity to the endpoint" in md and doc["sensitivity"][0]["claim"] == "F1"
    write_paper(grid)
    assert all((grid / "figures" / f).read_bytes() == b for f, b in pngs.items())
    # the two pages of a paper grid link each other
    assert main(["grid", "report", str(grid)]) == 0
    assert '<a href="paper.html">' in (grid / "leaderboard.html").read_text()
    assert '<a href="leaderboard.html">' in (grid / "paper.html").read_text()


def test_paper_html_links_a_leaderboard_that_exists(grid, tmp_path):
    """`timbench paper results/paper` writes build/paper/paper.html, which linked a leaderboard.html not beside it."""
    import re

    fresh = paper_grid(tmp_path / "fresh")  # no leaderboard anywhere: no link
    write_paper(fresh, out=tmp_path / "out1")
    assert "leaderboard.html" not in (tmp_path / "out1" / "paper.html").read_text()
    if not (grid / "leaderboard.html").is_file():
        assert main(["grid", "report", str(grid)]) == 0
    out = tmp_path / "build" / "paper"
    write_paper(grid, out=out)
    hrefs = re.findall(r'href="([^"]*leaderboard\.html)"', (out / "paper.html").read_text())
    assert hrefs and all((out / h).resolve() == (grid / "leaderboard.html").resolve() for h in hrefs), hrefs


def test_half_run_grid_and_bad_input(tmp_path, capsys):
    root = paper_grid(tmp_path / "half")
    for cid in [p.name for p in (root / "runs").iterdir() if ".q4." in p.name and ".s2" in p.name]:
        (root / "runs" / cid / "cell.json").unlink()  # these cells are now pending
    written = write_paper(root)
    assert math.isfinite(len(written)) and "pending" in (root / "paper.md").read_text()
    assert main(["paper", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "missing" in err[0] and "not a directory" in err[0]


def test_a_recompute_only_grid_answers_f1_and_leaves_the_mode_comparison_untested(tmp_path):
    """bench/grids/rise_collapse.yaml's shape: the reference and a real condition, recompute only."""
    decls = []
    for s in range(SEEDS):
        write(tmp_path, "baseline", "none", "recompute", s, curve(s), 0.60 + 0.01 * s, decls)
        write(
            tmp_path,
            "q4",
            "none",
            "recompute",
            s,
            curve(s, collapse_at=26, spike_at=25, k3=0.02, delta=0.11),
            0.10 + 0.01 * s,
            decls,
        )
    write_cells_json(tmp_path, decls, name="rise_collapse")
    d = paper_data(tmp_path)[0]
    vs = by_claim(verdicts(d))
    assert [s.verdict for s in vs["F1"].subs] == [REPRODUCED, REPRODUCED, REPRODUCED]
    assert "8/8 collapsed 1 [0.676, 1] (8 after a rise)" in vs["F1"].subs[1].numbers  # a Wilson interval on the rate
    # on 3 seeds, 3/3 collapsed vs 0/3 is not a detection (Fisher's exact p = 0.1)
    for k in d.rows:
        d.rows[k] = [r for r in d.rows[k] if r["seed"] < 3]
    f1 = by_claim(verdicts(d))["F1"].subs[1]
    assert f1.verdict == NOT and "p 0.1 (Holm" in f1.numbers
    assert [s.verdict for s in vs["F2"].subs] == [UNTESTED] * 3
    assert "both recompute and bypass" in vs["F2"].subs[0].numbers


def test_a_grid_without_a_real_condition_is_refused_in_one_line(tmp_path, capsys):
    decls = []
    for s in range(2):
        write(tmp_path, "baseline", "none", "recompute", s, curve(s), 0.60, decls)
        for mode in ("recompute", "bypass"):
            write(tmp_path, "noise-g1", "none", mode, s, curve(s, delta=0.1), 0.5, decls)
    write_cells_json(tmp_path, decls, name="noise_only")
    assert main(["paper", str(tmp_path), "--out", str(tmp_path / "p")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not a paper grid" in err[0] and "real (not noise)" in err[0], err
    assert "noise-g1/bypass" in err[0] and not (tmp_path / "p").exists()


def test_a_grid_shorter_than_the_paper_budget_is_refused_in_one_line(tmp_path, capsys):
    """results/quick (24 steps, the reference and bf16-engine with remedy none) used to get verdicts and exit 0."""
    import yaml

    from timbench.studies.paper import PAPER_STEPS

    spec = yaml.safe_load((COMMITTED.parents[1] / "bench" / "grids" / "paper.yaml").read_text())
    assert PAPER_STEPS == spec["base"]["steps"]
    quick = COMMITTED.parent / "quick"
    assert main(["paper", str(quick), "--out", str(tmp_path / "q")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not a paper grid" in err[0] and "runs are 24 steps" in err[0], err
    assert f">= {PAPER_STEPS} steps" in err[0] and "bench/grids/paper.yaml" in err[0]
    assert not (tmp_path / "q").exists()


COMMITTED = __import__("pathlib").Path(__file__).resolve().parents[1] / "results" / "paper"
REPLAYED = (
    "nvfp4-rollout.none.bypass.grpo.s1",
    "noise-g2.none.recompute.grpo.s0",
    "nvfp4-rollout.tis-rs_k3_ppo.recompute.grpo.s2",
    "nvfp4-rollout.ppo_clip_0-05.bypass.grpo.s0",
)


@pytest.mark.parametrize("tail", REPLAYED)
def test_committed_paper_cells_replay_byte_for_byte(tail, tmp_path):
    """The first 3 steps of committed paper cells, rerun now, give the committed metrics.jsonl lines exactly
    (training is bitwise deterministic on any x86-64 CPU; the cross-CPU emulation is tests/test_determinism.py).
    Keys logged since the cells were committed (the `tim/` distribution metrics) are set aside: every committed
    key's value must come back in the same bytes, and nothing else may be new."""
    from timbench.rl.config import from_dict
    from timbench.rl.loop import run
    from timbench.rl.rundir import dumps

    d = COMMITTED / "runs" / f"add-4d-v1.tiny-dense.{tail}"
    if not (d / "metrics.jsonl").is_file():
        pytest.fail(f"{d} is not committed (README 'Paper figures' lists the pending cells)")
    cell = json.loads((COMMITTED / "cells.json").read_text())
    cfg = next(c["config"] for c in cell["cells"] if c["id"] == d.name)
    run(from_dict(dict(cfg, steps=3), "replay"), tmp_path / "r", progress=False)
    now = [json.loads(line) for line in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    now = [dumps({k: v for k, v in r.items() if not k.startswith("tim/")}).encode() for r in now]
    assert now == (d / "metrics.jsonl").read_bytes().splitlines()[:3]


def test_another_endpoint_is_exploratory_and_a_bad_one_is_one_line(grid, tmp_path, capsys):
    assert main(["paper", str(grid), "--out", str(tmp_path / "x"), "--endpoint", "final"]) == 0
    md = (tmp_path / "x" / "paper.md").read_text()
    assert "EXPLORATORY: the grid's endpoint is last-half" in md and "--endpoint final" in md
    assert json.loads((tmp_path / "x" / "paper.json").read_text())["exploratory"] is True
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main(["paper", str(grid), "--endpoint", "best"])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and "unknown endpoint 'best'; valid: final, last3, last-half, auc" in err[-1]
