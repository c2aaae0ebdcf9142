"""`timbench claims`: every rule on synthetic evidence where it must say reproduced and where it must not, the
headline, and bad input (a missing dir, a dir without cells) as one-line errors with exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from timbench.cli import main
from timbench.report.results import CellRun
from timbench.report.verdict_rules import EQUIVALENT, NOT_TESTED
from timbench.studies.claims_data import Evidence
from timbench.studies.claims_registry import CLAIMS, DEMO, NOT_TESTABLE, headline
from timbench.studies.claims_rules import fp8_rl, fp16, gpu_study, icepop, routing_replay, threshold, tis_mis, triage
from timbench.studies.paper_claims import CONSISTENT, NOT, REPRODUCED, REVERSED, PaperData, Sub, family

pytestmark = pytest.mark.unit  # builds no model (make test-unit)

KINDS = {
    "baseline": "reference",
    "production": "precision",
    "bf16-engine": "precision",
    "fp16-engine": "precision",
    "fp8-rollout": "quant",
    "nvfp4-rollout": "quant",
    "vllm-bf16": "vllm",
    "noise-a": "noise",
    "noise-b": "noise",
    "noise-c": "noise",
}


def setting(
    cond, remedy="none", mode="recompute", rel=(1.0, 1.0, 1.0), collapse=None, delta=0.01, steps=20, k3=None, **metrics
):
    """Three seeds of one setting: (summary rows, cells). `metrics` are constant per-step metric values (a list
    gives one per step); `collapse` is the collapse step of every seed."""
    rows, cells = [], []
    for seed, r in enumerate(rel):
        step_rows = [
            {
                "step": t,
                "mismatch/mean_abs_delta": delta + 0.001 * seed,
                **{
                    k.replace("__", "/"): (v[t] if isinstance(v, list) else v + 1e-4 * seed) for k, v in metrics.items()
                },
            }
            for t in range(steps)
        ]
        rows.append(
            {
                "seed": seed,
                "condition": cond,
                "remedy": remedy,
                "mode": mode,
                "relative_accuracy_t1": r,
                "collapse/collapsed": collapse is not None,
                "collapse/step": collapse,
                "mean/mismatch/mean_abs_delta": delta + 0.001 * seed,
                "mean/rollout_corr/k3_kl": None if k3 is None else k3 * (1 + 0.1 * seed),
            }
        )
        cells.append(
            CellRun(
                f"{cond}.{remedy}.{mode}.s{seed}",
                {"seed": seed},
                {},
                None,
                {"steps": steps, "seed": seed},
                metrics=step_rows,
            )
        )
    return (cond, remedy, mode), rows, cells


def evidence(*settings, align=(), name="g", steps=20, learns=True) -> Evidence:
    """The grid's zero-mismatch seeds gain 0.15 [0.10, 0.20] over a 0.5 endpoint (a learning range of 0.3) unless
    `learns` is False (then they gain nothing, and every accuracy comparison is not tested)."""
    rows, cells = {}, {}
    ref = ("baseline", "none", "recompute")
    rows[ref] = [
        {
            "seed": s,
            "condition": "baseline",
            "remedy": "none",
            "mode": "recompute",
            "relative_accuracy_t1": 1.0,
            "collapse/collapsed": False,
            "collapse/step": None,
            "endpoint_t1": 0.5,
            "gain_t1": (0.13, 0.15, 0.17)[s] if learns else (-0.02, 0.0, 0.02)[s],
        }
        for s in range(3)
    ]
    cells[ref] = []
    for key, r, c in settings:
        rows[key], cells[key] = r, c
    kinds = {c: KINDS[c] for c, _, _ in rows}
    d = PaperData(cells, rows, kinds, ("baseline", "none", "recompute"), 5)
    return Evidence({name: d}, {name: steps}, [{"table": "align_t.json", **a} for a in align])


def verdicts(subs):
    """The words after the claim's family step (Holm over its tests), as `timbench claims` prints them."""
    return [s.verdict for s in family("x", subs).subs]


def align_row(model, engine, trainer, mean, k3=None, mx=1.0):
    return {
        "model_name": model,
        "engine": engine,
        "trainer": trainer,
        "mean_abs_diff": mean,
        "k3_kl": mean**2 if k3 is None else k3,
        "max_abs_diff": mx,
    }


def fp16_align(ratio):
    out = []
    for m in ("tiny-dense", "tiny-moe"):
        out += [
            align_row(m, "kernels=exact,dtype=bf16", "kernels=exact,dtype=fp32", 1e-3, k3=1e-6),
            align_row(m, "kernels=exact,dtype=fp16", "kernels=exact,dtype=fp32", 1e-4, k3=1e-6 / ratio),
        ]
    return out


def test_fp16():
    assert verdicts(fp16(evidence(align=fp16_align(64))))[0] == DEMO
    assert verdicts(fp16(evidence(align=fp16_align(3))))[0] == NOT
    assert verdicts(fp16(evidence(align=fp16_align(0.5))))[0] == REVERSED
    assert verdicts(fp16(evidence()))[0] == NOT_TESTABLE
    better = evidence(setting("fp16-engine", rel=(1.0, 1.1, 1.2)), setting("bf16-engine", rel=(0.5, 0.62, 0.68)))
    worse = evidence(setting("fp16-engine", rel=(0.5, 0.62, 0.68)), setting("bf16-engine", rel=(1.0, 1.1, 1.2)))
    assert verdicts(fp16(better))[2] == REPRODUCED and verdicts(fp16(worse))[2] == REVERSED
    assert verdicts(fp16(evidence()))[1:] == [NOT_TESTABLE] * 2
    # the fp16 remedy on a bf16 engine: its k3_kl far below (reproduced), only 2x below (not), above (reversed)
    for k3_fp16, want in ((1e-6, REPRODUCED), (1.5e-4, NOT), (1e-3, REVERSED)):
        ev = evidence(
            setting("production", "fp16", k3=k3_fp16, rel=(1.0, 0.97, 1.02)),
            setting("production", k3=3e-4, rel=(1.0, 1.0, 1.0)),
        )
        # "trains at least as well": equivalent within half the learning range (0.15 here), so reproduced
        assert verdicts(fp16(ev))[1:] == [want, REPRODUCED], k3_fp16
    # on a grid whose baseline does not learn, an accuracy comparison is not tested, however clear it looks
    flat = evidence(
        setting("fp16-engine", rel=(1.0, 1.1, 1.2)), setting("bf16-engine", rel=(0.5, 0.62, 0.68)), learns=False
    )
    sub = family("x", fp16(flat)).subs[2]
    assert sub.verdict == NOT_TESTED and "does not learn" in sub.numbers


def moe(r3_delta, none_rel=(1.0, 1.0, 1.0), r3_rel=(1.0, 1.0, 1.0)):
    return evidence(
        setting("vllm-bf16", delta=0.01, rel=none_rel, mismatch__routing_agreement=0.98),
        setting("vllm-bf16", "routing_replay_r2", delta=0.01, mismatch__routing_agreement=0.98),
        setting("vllm-bf16", "routing_replay_r3", delta=r3_delta, rel=r3_rel, mismatch__routing_agreement=1.0),
    )


def test_routing_replay():
    good = verdicts(routing_replay(moe(0.005)))
    assert good[0] == good[1] == good[3] == REPRODUCED
    assert good[2] == NOT_TESTABLE  # none does not lose accuracy: nothing to stabilise
    bad = verdicts(routing_replay(moe(0.02)))
    assert bad[0] == bad[3] == REVERSED
    saved = verdicts(routing_replay(moe(0.005, none_rel=(0.3, 0.4, 0.35), r3_rel=(0.95, 1.0, 1.02))))
    assert saved[2] == REPRODUCED
    assert verdicts(routing_replay(evidence()))[0] == NOT_TESTABLE


def test_tis_rescues_or_not():
    none = setting("nvfp4-rollout", rel=(0.4, 0.5, 0.45))
    helped = tis_mis(evidence(none, setting("nvfp4-rollout", "tis_token", rel=(0.95, 1.02, 1.0))))
    hurt = tis_mis(evidence(none, setting("nvfp4-rollout", "tis_token", rel=(0.1, 0.15, 0.12))))
    assert verdicts(helped)[0] == REPRODUCED and verdicts(hurt)[0] == REVERSED
    # none that loses nothing is no test of a rescue
    assert (
        verdicts(tis_mis(evidence(setting("nvfp4-rollout"), setting("nvfp4-rollout", "tis_token"))))[0] == NOT_TESTABLE
    )
    tok = setting("nvfp4-rollout", "tis_token", rel=(0.1, 0.15, 0.12), collapse=12)
    stable = tis_mis(evidence(none, tok, setting("nvfp4-rollout", "mis_seq", rel=(0.98, 1.0, 1.03))))
    fails = tis_mis(evidence(none, tok, setting("nvfp4-rollout", "mis_seq", rel=(0.1, 0.2, 0.1), collapse=9)))
    assert verdicts(stable)[1] == REPRODUCED and verdicts(fails)[1] == NOT


def test_the_same_runs_in_two_grids_count_once():
    """results/paper and results/claims_grid hold byte-identical nvfp4 none / tis_token runs (same RunConfig, same
    seed): a rescue counted there twice would turn 1 detection of 3 settings into 2 of 4 ("reproduced")."""

    def grid(steps, tis_rel):
        return evidence(
            setting("nvfp4-rollout", rel=(0.4, 0.5, 0.45), steps=steps),
            setting("nvfp4-rollout", "tis_token", rel=tis_rel, steps=steps),
            steps=steps,
        )

    grids = {
        "a": grid(20, (0.95, 1.02, 1.0)),
        "a_copy": grid(20, (0.95, 1.02, 1.0)),
        "b": grid(30, (0.42, 0.49, 0.46)),
        "c": grid(40, (0.41, 0.52, 0.45)),
    }  # b, c: no gain, with power
    ev = Evidence({n: next(iter(e.grids.values())) for n, e in grids.items()}, {n: 20 for n in grids}, [])
    sub = family("x", tis_mis(ev)).subs[0]
    assert sub.verdict == NOT and [t.word() for t in sub.tests] == [REPRODUCED, NOT, NOT], sub.numbers
    assert "(these runs, or a subset of them, also in: a_copy)" in sub.numbers
    del ev.grids["a_copy"], ev.grids["c"]
    assert family("x", tis_mis(ev)).subs[0].verdict == REPRODUCED  # 1 of 2: the same rule still detects a rescue


def test_a_grid_whose_runs_are_a_subset_of_another_counts_once_with_the_most_seeds():
    """results/paper at six seeds holds claims_grid's three-seed nvfp4 runs: one piece of evidence, read at 6 seeds."""

    def grid(none_rel, tis_rel, steps=20):
        return evidence(
            setting("nvfp4-rollout", rel=none_rel, steps=steps),
            setting("nvfp4-rollout", "tis_token", rel=tis_rel, steps=steps),
            steps=steps,
        )

    six = grid((0.4, 0.5, 0.45, 0.42, 0.48, 0.44), (0.95, 1.02, 1.0, 0.97, 0.99, 1.01))
    three = grid((0.4, 0.5, 0.45), (0.95, 1.02, 1.0))
    other = grid((0.4, 0.5, 0.45), (0.95, 1.02, 1.0), steps=30)  # other runs (30 steps): evidence of its own
    ev = Evidence(
        {"claims_grid": next(iter(three.grids.values())), "paper": next(iter(six.grids.values()))},
        {"claims_grid": 20, "paper": 20},
        [],
    )
    sub = family("x", tis_mis(ev)).subs[0]
    assert [t.word() for t in sub.tests] == [REPRODUCED] and sub.tests[0].interval.n == 6
    assert "paper nvfp4-rollout/recompute" in sub.numbers and "also in: claims_grid" in sub.numbers
    ev.grids["other"], ev.steps["other"] = next(iter(other.grids.values())), 30
    assert [t.word() for t in family("x", tis_mis(ev)).subs[0].tests] == [REPRODUCED] * 2


def test_icepop_mask_share():
    inside = icepop(evidence(setting("bf16-engine", mismatch__extreme_frac_5=1e-3, mismatch__extreme_frac_2=3e-3)))
    tiny = icepop(evidence(setting("bf16-engine", mismatch__extreme_frac_5=1e-6, mismatch__extreme_frac_2=1e-5)))
    assert verdicts(inside) == [NOT_TESTABLE, REPRODUCED] and verdicts(tiny)[1] == NOT
    none = setting("nvfp4-rollout", rel=(0.4, 0.5, 0.45))
    assert verdicts(icepop(evidence(none, setting("nvfp4-rollout", "icepop", rel=(1.0, 0.98, 1.01)))))[0] == REPRODUCED


def test_fp8_rl():
    fp8 = "weight_quant=fp8_block,act_quant=fp8_block"
    e2e = [
        align_row("tiny-dense", f"kernels=exact,dtype=bf16,{fp8}", f"kernels=exact,dtype=bf16,{fp8}", 0.0),
        align_row("tiny-dense", f"kernels=exact,dtype=fp32,{fp8}", "kernels=exact,dtype=fp32", 0.05),
    ]
    worse = [dict(e2e[0], mean_abs_diff=0.1), e2e[1]]
    same = evidence(
        setting("fp8-rollout", "tis_token", rel=(1.0, 0.97, 1.04)),
        setting("bf16-engine", rel=(1.01, 1.0, 1.0)),
        align=e2e,
    )
    apart = evidence(
        setting("fp8-rollout", "tis_token", rel=(0.5, 0.52, 0.49)),
        setting("bf16-engine", rel=(1.01, 1.0, 1.0)),
        align=worse,
    )
    v_same, v_apart = verdicts(fp8_rl(same)), verdicts(fp8_rl(apart))
    assert v_same[0] == EQUIVALENT and v_same[-1] == DEMO
    assert v_apart[0] == NOT and v_apart[-1] == NOT


def test_triage_needs_quadrant_metrics():
    subs = triage(evidence(setting("nvfp4-rollout")))
    assert verdicts(subs) == [NOT_TESTABLE, NOT_TESTABLE] and "tim/neg_adv_imbalance" in subs[0].numbers


def test_triage_reads_the_imbalance():
    """A collapse at step 15 whose (A < 0, delta < 0) imbalance doubles from step 10: it rose (1.0 -> 2.5) and
    led by 5 steps; the healthy settings stay flat (no false alarm); the A > 0 control stays flat."""
    flat, up = [1.0] * 20, [1.0] * 10 + [2.5] * 10
    ev = evidence(
        setting("baseline", tim__neg_adv_imbalance=flat, tim__pos_adv_imbalance=flat),
        setting("nvfp4-rollout", "tis_token", tim__neg_adv_imbalance=[1.1] * 20, tim__pos_adv_imbalance=flat),
        setting("nvfp4-rollout", collapse=15, tim__neg_adv_imbalance=up, tim__pos_adv_imbalance=flat),
    )
    subs = triage(ev)
    assert verdicts(subs) == [REPRODUCED, REPRODUCED, REPRODUCED]
    assert "3/3 rose" in subs[0].numbers and "1.00 -> 2.50" in subs[0].numbers
    assert (
        "early 3/3" in subs[1].numbers and "median lead 5" in subs[1].numbers and "false alarms 0/6" in subs[1].numbers
    )
    assert not subs[2].central
    late = evidence(
        *[
            s
            for s in (
                setting("baseline", tim__neg_adv_imbalance=flat, tim__pos_adv_imbalance=flat),
                setting("nvfp4-rollout", collapse=15, tim__neg_adv_imbalance=flat, tim__pos_adv_imbalance=flat),
            )
        ]
    )
    subs = triage(late)  # 3 collapsed and 3 surviving runs: even 3/3 early vs 0/3 would not be detected (p 0.1)
    assert verdicts(subs)[:2] == [NOT, NOT_TESTED] and "too few runs" in subs[1].numbers


def test_gpu_study():
    k3_rising = [1e-3] * 8 + [1e-2] * 12  # warns at step ~8, collapse at 16: 8 steps ahead
    same = gpu_study(
        evidence(
            setting("bf16-engine", rel=(1.0, 1.1, 0.9)),
            setting("bf16-engine", "tis_token", rel=(1.02, 1.05, 0.93)),
            setting("bf16-engine", mode="bypass", rel=(1.0, 0.1, 1.0), collapse=16, rollout_corr__k3_kl=k3_rising),
        )
    )
    v = verdicts(same)
    assert v[0] == EQUIVALENT and v[1:4] == [NOT_TESTABLE] * 3 and v[4] == REPRODUCED and v[5] == REPRODUCED
    apart = gpu_study(
        evidence(
            setting("bf16-engine", rel=(1.0, 1.1, 0.9)),
            setting("bf16-engine", "tis_token", rel=(0.5, 0.55, 0.4)),
            setting("bf16-engine", mode="bypass", rel=(1.0, 0.1, 1.0), collapse=16, rollout_corr__k3_kl=1e-3),
        )
    )
    v = verdicts(apart)
    assert v[0] == NOT and v[5] == NOT  # a flat KL never warns
    calm = gpu_study(evidence(setting("bf16-engine", mode="bypass")))
    assert verdicts(calm)[4] == NOT and verdicts(calm)[5] == NOT_TESTABLE


def dose(fail_from: float):
    xs = {"noise-a": 0.02, "noise-b": 0.07, "noise-c": 0.9}
    return evidence(*[setting(c, delta=x, collapse=10 if x >= fail_from else None) for c, x in xs.items()])


def test_threshold():
    assert verdicts(threshold(dose(0.05)))[0] == REPRODUCED
    assert verdicts(threshold(dose(0.5)))[0] == NOT
    assert verdicts(threshold(evidence(setting("bf16-engine"))))[0] == NOT_TESTABLE


def test_headline_is_the_weakest_central_subclaim():
    assert headline([Sub("a", REPRODUCED, ""), Sub("b", DEMO, "")]) == DEMO
    assert headline([Sub("a", REPRODUCED, ""), Sub("b", REPRODUCED, "")]) == REPRODUCED
    assert (
        headline([Sub("a", REPRODUCED, ""), Sub("b", NOT_TESTABLE, "")])
        == f"{NOT_TESTABLE} (1 of 2 sub-claims reproduced)"
    )
    assert headline([Sub("a", CONSISTENT, ""), Sub("b", REVERSED, "", central=False)]) == CONSISTENT
    assert headline([]) == NOT_TESTABLE


def test_every_claim_cites_its_source():
    assert len({c.id for c in CLAIMS}) == len(CLAIMS) >= 8
    for c in CLAIMS:
        doc = c.rule.__doc__ or ""
        assert c.source and any(s in doc for s in ("arXiv", "Yao", "study", "IcePop")), c.id


ROOT = Path(__file__).resolve().parents[1]


def test_cli_writes_claims_and_refuses_bad_input(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)  # the committed results/ paths
    out = tmp_path / "claims"
    assert main(["claims", "results/vllm_moe", "results/align", "--out", str(out)]) == 0
    md, doc = (out / "claims.md").read_text(), json.loads((out / "claims.json").read_text())
    assert doc["command"] == f"timbench claims results/vllm_moe results/align --out {out}" and doc["command"] in md
    rr = next(c for c in doc["claims"] if c["id"] == "Routing replay")
    assert rr["subclaims"][0]["verdict"] == REPRODUCED  # committed vllm_moe: R3 lowers |delta|
    capsys.readouterr()
    assert main(["claims", str(tmp_path / "nope"), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "not a directory" in err
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["claims", str(empty), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "neither cells.json" in err
    (empty / "cells.json").write_text('{"cells": []}')
    assert main(["claims", str(empty), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "no finished cells" in err
    assert (out / "claims.json").read_text() == json.dumps(doc, indent=1, sort_keys=True) + "\n"  # not clobbered


@pytest.mark.parametrize("bad", ["[1, 2]", "{}"])
def test_malformed_align_table(tmp_path, capsys, bad):
    (tmp_path / "align_x.json").write_text(bad)
    assert main(["claims", str(tmp_path), "--out", str(tmp_path / "o")]) == 2
    assert "align_x.json" in capsys.readouterr().err
