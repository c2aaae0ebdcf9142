"""`timbench grid report` on hand-built grid result dirs: files, figures, HTML, summary.csv values, ranking."""

import json
import shutil

import matplotlib.pyplot as plt
import pytest
from gridfab import (
    CONDITIONS,
    STEPS,
    cell_decl,
    cell_id,
    isclose,
    read_csv,
    seeded_grid,
    standard_grid,
    write_cell,
    write_cells_json,
)

from timbench.cli import main
from timbench.metrics.mismatch import ABS_DELTA_BINS
from timbench.report.cli import add_report_parser
from timbench.report.leaderboard import remedy_ranking, tim_tolerance, write_report
from timbench.report.summary import noise_sigma, summarize_grid
from timbench.util.manifest import stamp_run

FIGURES = [
    "remedy_scores.png",
    "reward_accuracy.png",
    "kl_grad_norm.png",
    "relative_accuracy_heatmap.png",
    "drift_by_adv_sign.png",
    "abs_delta_distribution.png",
    "dose_response.png",
    "time_to_collapse.png",
]


@pytest.fixture(scope="module")
def reported(tmp_path_factory):
    root = standard_grid(tmp_path_factory.mktemp("grid") / "fab", hist=True)
    assert main(["grid", "report", str(root)]) == 0
    return root


def test_every_file_is_written_and_every_png_reads_back(reported):
    for name in ["leaderboard.md", "leaderboard.html", "summary.csv", "seeds.csv"]:
        assert (reported / name).is_file()
    for name in FIGURES + ["abs_delta_histogram.png"]:
        img = plt.imread(reported / "figures" / name)
        assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100
        assert img[..., :3].std() > 0.01  # something is drawn, not a blank canvas


def test_html_is_self_contained(reported):
    html = (reported / "leaderboard.html").read_text()
    assert html.count('src="data:image/png;base64,') == len(FIGURES) + 1
    assert "http://" not in html and "https://" not in html and "<link" not in html and "<script" not in html
    assert "<style>" in html and "add-4d-v1 (version 1)" in html
    assert f"timbench grid report {reported}" in html


def test_html_puts_the_figures_before_the_long_tables_and_links_every_section(reported):
    """results/paper's figures started ~9,000 px down, after a 144-row per-cell table."""
    import re

    html = (reported / "leaderboard.html").read_text()
    first_figure = html.index("<figure")
    assert html.index(">Remedies ranked by score</h2>") < first_figure < html.index(">Every cell</h2>")
    assert first_figure < html.index(">Conditions over seeds (mean [95% CI])</h2>")
    targets = re.findall(r'<a href="#([^"]+)">', html)
    assert len(targets) == 4 and all(f'id="{t}"' in html for t in targets), targets
    assert html.index('href="#figures"') < html.index(">Remedies ranked by score</h2>")


def test_summary_csv_matches_the_written_cells(reported):
    rows = {r["id"]: r for r in read_csv(reported / "summary.csv")}
    assert len(rows) == 10
    collapsed = rows[cell_id("noise-3", "none")]
    # reward drops to 0 at step 16; the width-5 moving average crosses half its peak at step 18
    assert collapsed["collapse/collapsed"] == "true" and collapsed["collapse/step"] == "18"
    assert collapsed["collapse/reason"] == "reward_drop"
    assert isclose(collapsed["relative_accuracy_t1"], 0.60 / 0.80)
    assert isclose(collapsed["mean/mismatch/mean_abs_delta"], 0.9)
    assert isclose(collapsed["cum/drift/diff_mean"], STEPS * 0.09)
    assert isclose(collapsed["final/drift/diff_neg_adv_mean"], -0.09)
    assert collapsed["noise_sigma"] == "3.0" and collapsed["eval_n"] == ""  # the fabricated config has none
    # the remedy metrics real runs log (verl's names) are averaged over steps
    assert isclose(collapsed["mean/rollout_corr/rollout_is_mean"], 1.0 - 0.9)
    assert isclose(collapsed["mean/rollout_corr/rollout_rs_masked_fraction"], 0.45)
    failed = rows[cell_id("bf16-engine", "none", "bypass")]
    assert (failed["status"], failed["collapse/step"], failed["collapse/reason"]) == ("failed", "12", "non_finite")
    assert failed["steps_done"] == "12"
    base = rows[cell_id("baseline", "none")]
    assert base["collapse/collapsed"] == "false" and base["max/training/rollout_probs_diff_max"] == "0.0"
    assert isclose(base["relative_accuracy_t1"], 1.0)
    pending = rows[cell_id("noise-3", "mis_seq")]
    assert pending["status"] == "pending" and pending["final_accuracy_t1"] == "" and pending["collapse/step"] == ""


def test_ranking_follows_the_documented_score(reported):
    rank = remedy_ranking(summarize_grid(reported))
    assert [e["remedy"] for e in rank] == ["tis_token", "none", "mis_seq"]
    tis, none, mis = rank
    # one seed: the interval is the eval noise, and these cells' configs do not say eval_n
    assert tis["seeds"] == 1 and tis["interval"].lo is None and tis["tied_with"] == [2]
    assert tis["score"] == pytest.approx((0.78 + 0.74 + 0.64) / 3 / 0.80)
    # none is scored on the settings tis_token also ran (recompute bf16, noise-1, noise-3), not on its
    # failed bypass bf16 cell: 0.95, 0.90, and the noise-3 collapse capped at 0.5 (0.75 before the cap)
    assert none["score"] == pytest.approx((0.95 + 0.90 + 0.5) / 3)
    assert (none["collapses"], none["cells"]) == (1, 3) and mis["score"] is None and mis["cells"] == 0
    assert (tis["tolerance"], none["tolerance"], mis["tolerance"]) == (">= 3", "1", "-")
    md = (reported / "leaderboard.md").read_text()
    assert tis["rank"] == none["rank"] == "1-2 (tied)" and mis["rank"] == "3"  # no interval: a tie
    lines = [l for l in md.splitlines() if l.startswith("| 1-2 (tied) | 2 |") or l.startswith("| 1-2 (tied) | 1 |")]
    assert "tis_token" in lines[0] and "none" in lines[1] and "1/3" in lines[1]
    assert (
        "scored on the 3 settings all of them ran (bf16-engine/recompute, noise-1/recompute, noise-3/recompute)" in md
    )
    assert md.count("add-4d-v1 (version 1)") >= 3  # preamble and every table
    assert md.count(f"timbench grid report {reported}") >= 3
    assert "collapsed@18 (reward_drop)" in md and "collapsed@12 (non_finite)" in md


def test_a_remedy_with_failed_cells_ranks_after_every_complete_one():
    """The committed quick track ranked trm_avg first: its 3 nothing-trained noise cells kept the warm start
    (capped at 0.5) and its other cells scored high, above every remedy whose cells all trained."""
    from timbench.report.seeds import NOTHING_TRAINED

    def row(remedy, cond, seed, rel, status="done", error=None):
        return {
            "id": f"{cond}.{remedy}.s{seed}",
            "remedy": remedy,
            "condition": cond,
            "seed": seed,
            "kind": "reference" if cond == "baseline" else "noise",
            "status": status,
            "error": error,
            "task": "add-4d-v1",
            "model": "tiny-dense",
            "algorithm": "grpo",
            "mode": "recompute",
            "reference": f"baseline.none.s{seed}",
            "relative_accuracy_t1": rel,
            "final_accuracy_t1": rel,
            "collapse/collapsed": False,
            "mean/mismatch/mean_abs_delta": 0.4,
            "mean/rollout_corr/k3_kl": 0.3,
            "noise_sigma": None if cond == "baseline" else 2.0,
            "eval_n": 256,
        }

    rows = [row("none", "baseline", s, 1.0) for s in range(3)]
    for s in range(3):
        rows += [row("none", "noise-g2", s, 0.70 + 0.01 * s), row("none", "production", s, 0.70)]
        rows += [row("trm_avg", "noise-g2", s, 0.9, "failed", NOTHING_TRAINED), row("trm_avg", "production", s, 1.1)]
        rows += [
            row("slow", "noise-g2", s, 0.95),
            row("slow", "production", s, 0.95 if s else None, "done" if s else "running"),
        ]
    rank = remedy_ranking(rows)
    assert rank[0]["score"] < rank[1]["score"]  # trm_avg: (0.5 + 1.1) / 2 = 0.8 beats none's 0.71
    assert [(e["remedy"], e["failed"], e["unfinished"]) for e in rank] == [
        ("none", 0, 0),
        ("slow", 0, 1),  # its running cell is not run yet, not failed
        ("trm_avg", 3, 0),
    ]
    assert rank[0]["rank"] == "1" and rank[1]["rank"][0] == "2"  # failed remedies rank apart, after every complete one


def test_collapse_override_from_cells_json_changes_the_rule(reported, tmp_path):
    root = tmp_path / "g"
    shutil.copytree(reported, root)
    meta = json.loads((root / "cells.json").read_text())
    meta["collapse"] = {"alpha": 0.99}  # the reward drops to exactly 0: still below 1% of the peak
    (root / "cells.json").write_text(json.dumps(meta))
    rows = {r["id"]: r for r in summarize_grid(root)}
    assert rows[cell_id("noise-3", "none")]["collapse/step"] == 20  # all five smoothed values at 0
    meta["collapse"] = {"alpah": 0.9}
    (root / "cells.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="unknown key 'alpah'"):
        summarize_grid(root)


def test_same_input_gives_byte_identical_report(reported, tmp_path):
    root = tmp_path / "fab"
    shutil.copytree(reported, root, ignore=shutil.ignore_patterns("figures", "leaderboard.*", "summary.csv"))
    write_report(
        root, command=f"timbench grid run {reported}/grid.yaml --out {reported} && timbench grid report {reported}"
    )
    for name in ["leaderboard.md", "summary.csv", "figures/dose_response.png"]:
        assert (root / name).read_bytes() == (reported / name).read_bytes(), name


def test_one_condition_and_unfinished_cells_do_not_crash(tmp_path):
    root = tmp_path / "tiny"
    write_cell(root, "baseline", "none", final_acc=0.8, delta=0.0, status="running", steps_written=7)
    with open(root / "runs" / cell_id("baseline", "none") / "metrics.jsonl", "a") as f:
        f.write('{"step": 7, "critic/rew')  # a torn last line of a run still writing
    write_cells_json(root, [cell_decl("baseline", "none"), cell_decl("baseline", "tis_token")])
    written = write_report(root)
    assert all(p.is_file() for p in written.values())
    assert 'href="paper.html"' not in (root / "leaderboard.html").read_text()  # not a paper grid: no link to one
    rows = {r["id"]: r for r in read_csv(root / "summary.csv")}
    assert rows[cell_id("baseline", "none")]["status"] == "running"
    assert rows[cell_id("baseline", "none")]["steps_done"] == "7"
    assert rows[cell_id("baseline", "tis_token")]["status"] == "pending"
    for name in FIGURES:
        plt.imread(root / "figures" / name)


def test_bad_input_is_a_one_line_error(tmp_path, capsys):
    assert main(["grid", "report", str(tmp_path / "missing")]) == 2
    assert "not a directory" in capsys.readouterr().err
    root = standard_grid(tmp_path / "bad")
    run = root / "runs" / cell_id("noise-1", "none")
    metrics = (run / "metrics.jsonl").read_text()
    (run / "metrics.jsonl").write_text(metrics.rsplit("\n", 2)[0] + "\n")  # last row dropped after the run ended
    assert main(["grid", "report", str(root)]) == 2
    err = capsys.readouterr().err.strip()
    assert "metrics.jsonl: sha256 differs from manifest.json" in err and len(err.splitlines()) == 1
    assert main(["grid", "verify", str(root)]) == 1
    assert "cell " + cell_id("noise-1", "none") + ":" in capsys.readouterr().out
    (run / "metrics.jsonl").write_text('{"step": 0}\nnot json\n')
    stamp_run(run)  # as if the run itself had written the malformed line and sealed it
    assert main(["grid", "report", str(root)]) == 2
    err = capsys.readouterr().err.strip()
    assert "malformed JSON line" in err and "metrics.jsonl:2" in err and len(err.splitlines()) == 1
    (run / "manifest.json").unlink()  # made before manifests: refused with the adopt command
    assert main(["grid", "report", str(root)]) == 2
    err = capsys.readouterr().err
    assert "no manifest.json" in err and "grid verify" in err and "--adopt" in err
    (root / "cells.json").write_text(json.dumps({"grid": "x", "cells": [{"id": "a"}]}))
    with pytest.raises(ValueError, match="each cell needs keys id, axes, condition, reference, config"):
        summarize_grid(root)


def test_noise_sigma_parsing():
    assert noise_sigma(CONDITIONS["noise-3"]) == 3.0
    assert noise_sigma({"engine": "noise=student_t:0.5:3"}) == 0.5
    assert noise_sigma({"engine": {"kernels": "exact", "noise": "lowprob:2"}}) == 2.0
    assert noise_sigma(CONDITIONS["bf16-engine"]) is None
    with pytest.raises(ValueError, match="invalid value .gaussian. for noise"):
        noise_sigma({"name": "n", "engine": "noise=gaussian"})


def test_tim_tolerance_edges():
    def row(sigma, collapsed, status="done"):
        return {"kind": "noise", "noise_sigma": sigma, "status": status, "collapse/collapsed": collapsed}

    assert tim_tolerance([row(1.0, True), row(2.0, True)]) == "< 1"
    assert tim_tolerance([row(1.0, False), row(2.0, False), row(3.0, True)]) == "2"
    # a non-monotone collapse still caps the tolerance below the first collapsing sigma
    assert tim_tolerance([row(1.0, False), row(2.0, True), row(3.0, False)]) == "1"
    # unfinished cells are not evidence either way
    assert tim_tolerance([row(1.0, False), row(2.0, None, "pending")]) == ">= 1"


def test_histogram_bin_count_is_checked(tmp_path):
    root = standard_grid(tmp_path / "h")
    p = root / "runs" / cell_id("noise-1", "none") / "metrics.jsonl"
    rows = [json.loads(l) | {"mismatch/abs_delta_hist": [1, 2]} for l in p.read_text().splitlines()]
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    stamp_run(p.parent)  # as a run that logged the wrong bin count itself would have sealed it
    with pytest.raises(ValueError, match=f"expected {len(ABS_DELTA_BINS)}"):
        write_report(root)


def test_report_parser_registers_under_any_name():
    import argparse

    sub = argparse.ArgumentParser().add_subparsers(dest="command")
    add_report_parser(sub)
    assert sub.choices["report"].parse_args(["results/x"]).dir == "results/x"


# ---- seeds: aggregation, intervals, ties, survival -------------------------------------------------

THREE_SEEDS = {  # (cond, remedy): [(final acc, mean |delta|, collapse) for seeds 0, 1, 2]
    ("baseline", "none"): [(0.80, 0.0, False), (0.70, 0.0, False), (0.75, 0.0, False)],
    ("noise-3", "none"): [(0.40, 0.9, True), (0.35, 0.9, True), (0.40, 0.9, False)],
    ("noise-3", "tis_token"): [(0.72, 0.9, False), (0.68, 0.9, False), (0.74, 0.9, False)],
    ("noise-3", "tis_token+seq_rs"): [(0.70, 0.9, False), (0.63, 0.9, False), (0.71, 0.9, False)],
}


@pytest.fixture(scope="module")
def seeded(tmp_path_factory):
    root = seeded_grid(tmp_path_factory.mktemp("seeds") / "s3", THREE_SEEDS)
    write_report(root)
    return root


def test_seed_groups_aggregate_with_t_intervals_paired_by_seed(seeded):
    groups = {r["condition"] + "/" + r["remedy"]: r for r in read_csv(seeded / "seeds.csv")}
    tis = groups["noise-3/tis_token"]
    assert (tis["seeds"], tis["eval_n"], tis["collapses"]) == ("3", "512", "0")
    # by hand: mean 2.14 / 3 = 0.71333, sd = sqrt(0.00186667 / 2) = 0.0305505, t(0.975, 2) = 4.30265:
    # half width 4.30265 * 0.0305505 / sqrt(3) = 0.075893
    assert float(tis["final_accuracy_t1"]) == pytest.approx(0.713333, abs=1e-6)
    assert float(tis["final_accuracy_t1_hi"]) == pytest.approx(0.713333 + 0.075893, abs=1e-5)
    assert float(tis["final_accuracy_t1_lo"]) == pytest.approx(0.713333 - 0.075893, abs=1e-5)
    # relative accuracy pairs each seed with its own reference: 0.72/0.80, 0.68/0.70, 0.74/0.75
    assert isclose(tis["relative_accuracy_t1"], (0.72 / 0.80 + 0.68 / 0.70 + 0.74 / 0.75) / 3)
    none = groups["noise-3/none"]
    assert none["collapses"] == "2" and isclose(none["collapse_rate"], 2 / 3)
    assert float(none["collapse_rate_lo"]) == pytest.approx(0.2077, abs=1e-4)  # Wilson 2/3, z = 1.96
    assert float(none["collapse_rate_hi"]) == pytest.approx(0.9385, abs=1e-4)
    # both collapsing seeds collapse at step 18: survival 1 -> 1/3, so the median is step 18
    assert none["median_collapse_step"] == "18" and groups["noise-3/tis_token"]["median_collapse_step"] == ""
    md = (seeded / "leaderboard.md").read_text()
    assert "seeds: 0, 1, 2 (3 per condition x remedy x mode)" in md
    assert "512 problems: binomial SE sqrt(p(1-p)/512) <= 0.022 (p = 0.5)" in md
    assert "| noise-3 | noise | none | recompute | 3/3 |" in md and "2/3 [0.21, 0.94]" in md


def test_ranking_marks_overlapping_intervals_as_tied(seeded):
    from timbench.report.summary import summarize_grid

    rank = remedy_ranking(summarize_grid(seeded))
    assert [e["remedy"] for e in rank] == ["tis_token", "tis_token+seq_rs", "none"]
    tis, rs, none = rank
    assert tis["seeds"] == rs["seeds"] == 3 and all(e["interval"].lo is not None for e in rank)
    # the two TIS variants differ by less than their seed spread: tied; none (two collapses) is not
    assert tis["tied_with"] == [2] and rs["tied_with"] == [1]
    assert 3 not in tis["tied_with"] and none["tied_with"] == []
    assert none["score"] == pytest.approx((0.5 + 0.5 + 0.40 / 0.75) / 3)
    md = (seeded / "leaderboard.md").read_text()
    assert (tis["rank"], rs["rank"], none["rank"]) == ("1-2 (tied)", "1-2 (tied)", "3")
    assert "| 1-2 (tied) | 2 | tis_token |" in md and "| 3 | - | none |" in md


def test_survival_curve_is_kaplan_meier_over_seeds(seeded):
    from timbench.report.seeds import seed_groups
    from timbench.report.summary import summarize_grid

    g = next(
        g for g in seed_groups(summarize_grid(seeded)) if g.key["condition"] == "noise-3" and g.key["remedy"] == "none"
    )
    assert g.survival == [(0, 1.0), (18, pytest.approx(1 / 3))] and g.censor_steps == [STEPS]
    img = plt.imread(seeded / "figures" / "time_to_collapse.png")
    assert img[..., :3].std() > 0.01


def test_report_out_leaves_the_grid_dir_alone_and_results_default_to_build(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    src = standard_grid(tmp_path / "results" / "fab")
    before = sorted(p.relative_to(src) for p in src.rglob("*"))
    assert main(["grid", "report", "results/fab"]) == 0  # a committed-looking dir: the report goes to build/fab
    assert sorted(p.relative_to(src) for p in src.rglob("*")) == before
    assert (tmp_path / "build" / "fab" / "leaderboard.html").is_file()
    md = (tmp_path / "build" / "fab" / "leaderboard.md").read_text()
    assert "timbench grid report results/fab`" in md  # the default needs no --out to regenerate
    assert main(["grid", "report", "results/fab", "--out", "elsewhere"]) == 0
    assert (tmp_path / "elsewhere" / "figures" / "dose_response.png").is_file()
    assert sorted(p.relative_to(src) for p in src.rglob("*")) == before
    assert main(["grid", "report", "results/fab", "--out", "results/fab"]) == 0  # told so: into the committed dir
    assert "timbench grid report results/fab --out results/fab`" in (src / "leaderboard.md").read_text()


def test_a_report_is_one_generation_sealed_by_its_manifest(tmp_path, capsys):
    root = standard_grid(tmp_path / "g")
    assert main(["grid", "report", str(root)]) == 0
    assert main(["grid", "verify", str(root)]) == 0
    doc = json.loads((root / "manifest.json").read_text())
    assert {"leaderboard.md", "leaderboard.html", "summary.csv", "figures/dose_response.png"} <= set(doc["files"])
    md = root / "leaderboard.md"
    md.write_text(md.read_text() + "edited\n")  # a file of another generation (or a hand edit)
    capsys.readouterr()
    assert main(["grid", "verify", str(root)]) == 1
    assert "report: " in capsys.readouterr().out
    (root / "manifest.json").unlink()  # a report killed half-way has none: it was removed before writing
    assert main(["grid", "verify", str(root)]) == 1
    assert "no manifest.json" in capsys.readouterr().out
    assert main(["grid", "verify", str(root), "--adopt"]) == 0  # a pre-manifest report, stamped once
