"""`timbench compare`: exit codes and listed regressions for grid dirs and align tables, tolerance files."""

import copy
import json
import shutil

import pytest
from gridfab import cell_id, group_id, seeded_grid, standard_grid, write_cell

from timbench.cli import main
from timbench.report.compare import Tolerances, compare, load_tolerances
from timbench.util.manifest import stamp_run

ALIGN = [
    {
        "model_name": "tiny-dense",
        "condition": "zero-mismatch (exact/exact fp32)",
        "max_abs_diff": 0.0,
        "mean_abs_diff": 0.0,
        "k3_kl": 0.0,
        "frac_tokens_differ": 0.0,
    },
    {
        "model_name": "tiny-dense",
        "condition": "precision mismatch",
        "max_abs_diff": 0.0071,
        "mean_abs_diff": 0.00149,
        "k3_kl": 1.77e-06,
        "frac_tokens_differ": 1.0,
    },
    {
        "model_name": "tiny-moe",
        "condition": "precision mismatch",
        "max_abs_diff": 0.0525,
        "mean_abs_diff": 0.00216,
        "k3_kl": 7.72e-06,
        "frac_tokens_differ": 1.0,
        "routing_agreement": 0.9887,
    },
]


@pytest.fixture(scope="module")
def base_grid(tmp_path_factory):
    return standard_grid(tmp_path_factory.mktemp("cmp") / "base")


def _copy(base_grid, tmp_path):
    return shutil.copytree(base_grid, tmp_path / "cand")


def _run(capsys, *argv):
    rc = main(["compare", *map(str, argv), "--json"])
    out = capsys.readouterr().out
    return rc, json.loads(out) if out.strip() else None


def _write(path, rows):
    path.write_text(json.dumps(rows))
    return path


def test_equal_grids_pass(base_grid, tmp_path, capsys):
    rc, v = _run(capsys, base_grid, _copy(base_grid, tmp_path))
    assert rc == 0 and v["verdict"] == "pass" and v["regressions"] == [] and v["compared"] == 10


def test_collapse_appeared_and_accuracy_fell(base_grid, tmp_path, capsys):
    cand = _copy(base_grid, tmp_path)
    write_cell(cand, "noise-3", "tis_token", final_acc=0.64, delta=0.9, collapse=True)
    write_cell(cand, "noise-1", "tis_token", final_acc=0.60, delta=0.11)  # 0.74 -> 0.60: beyond 0.05
    rc, v = _run(capsys, base_grid, cand)
    got = {(r["id"], r["check"]) for r in v["regressions"]}
    assert rc == 1 and v["verdict"] == "fail"
    # one seed per group: the explicit tolerances decide, per seed group (the cell id without its seed)
    assert got == {
        (group_id("noise-3", "tis_token"), "collapse_appeared"),
        (group_id("noise-1", "tis_token"), "accuracy_fell"),
    }
    # the same drop passes with a looser tolerance file
    tol = tmp_path / "tol.yaml"
    tol.write_text("accuracy_abs: 0.2\n")
    rc, v = _run(capsys, base_grid, cand, "--tolerances", tol)
    assert rc == 1 and {r["check"] for r in v["regressions"]} == {"collapse_appeared"}


def test_exactness_lost_and_mismatch_grew_in_a_grid(base_grid, tmp_path, capsys):
    cand = _copy(base_grid, tmp_path)
    write_cell(cand, "baseline", "none", final_acc=0.80, delta=1e-9)  # no longer bitwise exact
    write_cell(cand, "bf16-engine", "none", final_acc=0.76, delta=4e-3)  # 2x the mean |delta|
    rc, v = _run(capsys, base_grid, cand)
    got = {(r["id"].split(".")[2], r["check"], r["metric"]) for r in v["regressions"]}
    assert rc == 1
    assert ("baseline", "exact_lost", "max/training/rollout_probs_diff_max") in got
    assert ("bf16-engine", "mismatch_grew", "mean/mismatch/mean_abs_delta") in got
    assert ("bf16-engine", "mismatch_grew", "mean/rollout_corr/k3_kl") in got
    tol = tmp_path / "tol.yaml"
    tol.write_text("mismatch_rel: 4.0\n")  # 2x |delta| (4x k3) is allowed now; exactness never is
    rc, v = _run(capsys, base_grid, cand, "--tolerances", tol)
    # only the baseline cell regresses now: exactness lost, and 0 -> 1e-9 is growth no ratio allows
    assert rc == 1 and {r["id"] for r in v["regressions"]} == {cell_id("baseline", "none")}
    assert "exact_lost" in {r["check"] for r in v["regressions"]}


def test_unfinished_cells(base_grid, tmp_path, capsys):
    cand = _copy(base_grid, tmp_path)
    (cand / "runs" / cell_id("bf16-engine", "tis_token") / "cell.json").write_text(
        json.dumps({"status": "running", "error": None, "wall_s": 1.0, "attempts": 1})
    )
    rc, v = _run(capsys, base_grid, cand)
    got = {(r["id"], r["check"]) for r in v["regressions"]}
    assert rc == 1 and got == {(cell_id("bf16-engine", "tis_token"), "not_finished")}


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda m: m["cells"].pop(), "cell sets differ (10 vs 9 cells; add-4d-v1.tiny-dense.noise-3.mis_seq"),
        (lambda m: m.update(grid="other"), "grid name 'fab' vs 'other'"),
        (lambda m: m["cells"][1]["config"].update(steps=1), "config differs in steps (30 vs 1)"),
        (lambda m: m.update(collapse={"alpha": 0.9}), "collapse {} vs {'alpha': 0.9}"),
    ],
)
def test_different_experiments_are_refused_with_one_line_exit_2(base_grid, tmp_path, capsys, edit, message):
    cand = _copy(base_grid, tmp_path)
    meta = json.loads((cand / "cells.json").read_text())
    edit(meta)
    (cand / "cells.json").write_text(json.dumps(meta))
    assert main(["compare", str(base_grid), str(cand)]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert captured.out == "" and len(err.splitlines()) == 1 and err.startswith("timbench compare: error:")
    assert "are different experiments" in err and message in err


# three seeds: (final acc, mean |delta|, collapse) for seeds 0, 1, 2
BASE3 = {
    ("baseline", "none"): [(0.80, 0.0, False), (0.74, 0.0, False), (0.77, 0.0, False)],
    ("noise-1", "none"): [(0.72, 0.11, False), (0.66, 0.11, False), (0.70, 0.11, False)],
    ("noise-3", "tis_token"): [(0.64, 0.9, False), (0.60, 0.9, False), (0.66, 0.9, False)],
}


def test_seed_intervals_that_overlap_pass(tmp_path, capsys):
    base = seeded_grid(tmp_path / "base", BASE3)
    # another machine: every seed lands elsewhere (a 0.06 drop on noise-1 seed 0, more than the
    # single-run tolerance of 0.05), but the means stay inside the seeds' spread
    other = {
        ("baseline", "none"): [(0.76, 0.0, False), (0.79, 0.0, False), (0.75, 0.0, False)],
        ("noise-1", "none"): [(0.66, 0.11, False), (0.71, 0.11, False), (0.68, 0.11, False)],
        ("noise-3", "tis_token"): [(0.62, 0.9, False), (0.66, 0.9, False), (0.61, 0.9, False)],
    }
    cand = seeded_grid(tmp_path / "cand", other)
    rc, v = _run(capsys, base, cand)
    assert rc == 0 and v["verdict"] == "pass" and v["compared"] == 3


def test_seed_interval_regressions_fail_with_both_intervals(tmp_path, capsys):
    base = seeded_grid(tmp_path / "base", BASE3)
    worse = dict(BASE3)
    worse[("noise-1", "none")] = [(0.45, 0.30, True), (0.40, 0.31, True), (0.42, 0.32, True)]  # made noisy
    cand = seeded_grid(tmp_path / "cand", worse)
    rc, v = _run(capsys, base, cand)
    got = {(r["id"], r["check"], r["metric"]) for r in v["regressions"]}
    g = group_id("noise-1", "none")
    assert rc == 1 and got == {
        (g, "accuracy_fell", "final_accuracy_t1"),
        (g, "collapse_appeared", "collapse_rate"),
        (g, "mismatch_grew", "mean/mismatch/mean_abs_delta"),
        (g, "mismatch_grew", "mean/rollout_corr/k3_kl"),
    }
    acc = next(r for r in v["regressions"] if r["check"] == "accuracy_fell")
    assert acc["baseline_interval"][0] == pytest.approx(2.08 / 3) and acc["candidate_interval"][0] == pytest.approx(
        1.27 / 3
    )
    assert acc["difference_interval"][2] < 0 and acc["baseline_interval"][3] == 3
    assert main(["compare", str(base), str(cand)]) == 1
    out = capsys.readouterr().out
    assert f"REGRESSION accuracy_fell: {g} final_accuracy_t1: 0.6933 [" in out and "(n=3) -> 0.4233 [" in out
    assert "difference -0.27 [" in out


def test_align_tables(tmp_path, capsys):
    base = _write(tmp_path / "base.json", ALIGN)
    rc, v = _run(capsys, base, _write(tmp_path / "same.json", ALIGN))
    assert rc == 0 and v["kind"] == "align" and v["compared"] == 3
    worse = copy.deepcopy(ALIGN)
    worse[0]["max_abs_diff"] = 9.5e-7  # the zero-mismatch row is no longer exact
    worse[1]["mean_abs_diff"] = 0.004  # > 1.5 x 0.00149
    worse[2]["routing_agreement"] = 0.95
    del worse[2]["k3_kl"]
    rc, v = _run(capsys, base, _write(tmp_path / "worse.json", worse))
    got = {(r["id"], r["check"], r["metric"]) for r in v["regressions"]}
    assert rc == 1 and got == {
        ("tiny-dense / zero-mismatch (exact/exact fp32)", "exact_lost", "max_abs_diff"),
        ("tiny-dense / precision mismatch", "mismatch_grew", "mean_abs_diff"),
        ("tiny-moe / precision mismatch", "routing_dropped", "routing_agreement"),
    }
    # small growth inside the tolerance passes; a dropped row is a regression
    slight = copy.deepcopy(ALIGN)
    slight[1]["mean_abs_diff"] = 0.0016
    rc, _ = _run(capsys, base, _write(tmp_path / "slight.json", slight))
    assert rc == 0
    rc, v = _run(capsys, base, _write(tmp_path / "fewer.json", ALIGN[:2]))
    assert rc == 1 and [r["check"] for r in v["regressions"]] == ["missing"]


def test_human_readable_output_lists_each_regression(tmp_path, capsys):
    worse = copy.deepcopy(ALIGN)
    worse[0]["max_abs_diff"] = 1e-6
    assert main(["compare", str(_write(tmp_path / "a.json", ALIGN)), str(_write(tmp_path / "b.json", worse))]) == 1
    out = capsys.readouterr().out
    assert "REGRESSION exact_lost: tiny-dense / zero-mismatch (exact/exact fp32) max_abs_diff: 0.0 -> 1e-06" in out
    assert out.strip().endswith("1 regressions: FAIL")


def test_bad_inputs_are_one_line_errors(base_grid, tmp_path, capsys):
    a = _write(tmp_path / "a.json", ALIGN)
    cases = [
        ([a, tmp_path / "nope.json"], "no such grid directory or alignment JSON file"),
        ([a, base_grid], "cannot compare align table JSON file"),
        ([a, _write(tmp_path / "obj.json", {"x": 1})], "expected a JSON list of alignment rows"),
        ([a, a, "--tolerances", tmp_path / "none.yaml"], "does not exist"),
    ]
    for argv, msg in cases:
        assert main(["compare", *map(str, argv)]) == 2
        err = capsys.readouterr().err.strip()
        assert msg in err and err.startswith("timbench compare: error:") and len(err.splitlines()) == 1
    tol = tmp_path / "t.yaml"
    for text, msg in [
        ("mismatch_rell: 1\n", "unknown key 'mismatch_rell'; valid: mismatch_rel, mismatch_abs"),
        ("accuracy_abs: -1\n", "finite number >= 0"),
        ("accuracy_abs: .nan\n", "finite number"),
        ("- 1\n", "expected a mapping"),
        ("a: [\n", "malformed YAML"),
    ]:
        tol.write_text(text)
        with pytest.raises(ValueError, match=msg):
            load_tolerances(tol)
    tol.write_text("routing_abs: 0.5\n")
    assert load_tolerances(tol) == Tolerances(routing_abs=0.5)


def test_compare_function_matches_cli(base_grid):
    v = compare(base_grid, base_grid)
    assert v["verdict"] == "pass" and v["tolerances"]["accuracy_abs"] == 0.05


# ---- real tiny runs -----------------------------------------------------------------------------

TINY = {"steps": 2, "prompts_per_step": 4, "group_size": 4, "mini_batches": 2, "eval_n": 16, "checkpoint_every": 1}


@pytest.fixture(scope="module")
def real_grid(tmp_path_factory):
    """baseline + bf16-engine, 2 steps of 4x4 from a random-init tiny checkpoint, run in process."""
    from timbench.grid.layout import prepare
    from timbench.grid.spec import expand, parse_grid
    from timbench.model import PRESETS, Qwen3ForCausalLM, save_checkpoint
    from timbench.runners.cell import run_cell

    ckpt = tmp_path_factory.mktemp("ckpt")
    save_checkpoint(Qwen3ForCausalLM(PRESETS["tiny-dense"], seed=2), ckpt)
    spec = {"name": "real", "base": {"model": str(ckpt), **TINY}, "axes": {"condition": ["baseline", "bf16-engine"]}}
    grid = parse_grid(spec)
    out = tmp_path_factory.mktemp("real") / "base"
    cells = expand(grid)
    prepare(out, grid, cells)
    for c in cells:
        assert run_cell(c.to_dict(), str(out))["status"] == "done"
    return out, spec


def test_real_runs_same_grid_passes_and_a_silently_bf16_engine_fails(real_grid, tmp_path, capsys):
    out, _ = real_grid
    rc, v = _run(capsys, out, shutil.copytree(out, tmp_path / "same"))
    assert rc == 0 and v["compared"] == 2
    # the reference cell's engine silently computes in bf16: its config still says fp32
    cand = shutil.copytree(out, tmp_path / "bf16")
    ref, bf16 = (f"add-4d-v1.tiny-dense.{c}.none.recompute.grpo.s0" for c in ("baseline", "bf16-engine"))
    for name in ("metrics.jsonl", "eval.jsonl", "summary.json"):
        shutil.copy(out / "runs" / bf16 / name, cand / "runs" / ref / name)
    stamp_run(cand / "runs" / ref)  # as that run would have sealed it
    rc, v = _run(capsys, out, cand)
    got = {(r["id"], r["check"], r["metric"]) for r in v["regressions"]}
    assert rc == 1 and (ref, "exact_lost", "max/training/rollout_probs_diff_max") in got
    assert (ref, "exact_lost", "mean/mismatch/mean_abs_delta") in got
    assert all(r["id"] == ref for r in v["regressions"])


def test_real_grids_of_different_step_budgets_are_refused(real_grid, tmp_path, capsys):
    from timbench.grid.layout import prepare
    from timbench.grid.spec import expand, parse_grid

    out, spec = real_grid
    one_step = parse_grid({**spec, "base": {**spec["base"], "steps": 1}})
    prepare(tmp_path / "one", one_step, expand(one_step))
    assert main(["compare", str(out), str(tmp_path / "one")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "config differs in steps (2 vs 1)" in err


def test_bytes_are_reported_and_with_bytes_a_changed_deterministic_cell_fails(base_grid, tmp_path, capsys):
    cand = _copy(base_grid, tmp_path)
    rc, v = _run(capsys, base_grid, cand, "--bytes")
    assert rc == 0 and v["bytes"]["changed"] == [] and v["bytes"]["identical"] > 0
    cid = cell_id("baseline", "none")
    ev = cand / "runs" / cid / "eval.jsonl"
    ev.write_text(ev.read_text().replace("}", ', "note": 1}', 1))  # same numbers, other bytes
    stamp_run(ev.parent)  # a run that wrote these bytes itself (an edit after sealing is refused, not compared)
    rc, v = _run(capsys, base_grid, cand)
    assert rc == 0 and v["bytes"]["changed"] == [cid]  # reported, not judged, without --bytes
    rc, v = _run(capsys, base_grid, cand, "--bytes")
    assert rc == 1 and [(r["id"], r["check"]) for r in v["regressions"]] == [(cid, "bytes_changed")]
    assert main(["compare", str(base_grid), str(cand), "--bytes"]) == 1
    assert "bytes: " in capsys.readouterr().out


def test_cells_with_cpu_dependent_kernels_are_not_byte_checked(base_grid, tmp_path, capsys):
    base = shutil.copytree(base_grid, tmp_path / "base")
    cells = json.loads((base / "cells.json").read_text())
    cid = cell_id("baseline", "none")
    for c in cells["cells"]:
        if c["id"] == cid:
            c["config"]["engine"] = {"kernels": "torch"}
    (base / "cells.json").write_text(json.dumps(cells))
    cand = shutil.copytree(base, tmp_path / "cand")
    ev = cand / "runs" / cid / "eval.jsonl"
    ev.write_text(ev.read_text().replace("}", ', "note": 1}', 1))
    stamp_run(ev.parent)
    rc, v = _run(capsys, base, cand, "--bytes")
    assert rc == 0 and v["bytes"]["changed"] == [] and v["bytes"]["skipped"] >= 1
