"""Grids: spec validation, expansion, references, cost model, layout, local/Ray runners, failure, kill and resume.

Runs use a random-init tiny checkpoint (base.model) and 2 steps of 4x4. Cells
run in fresh processes where a monkeypatched reward does not reach, so those
runs see zero rewards; the runner must (and does) work either way.
"""

import io
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from timbench.cli import main
from timbench.grid.conditions import KINDS, load_conditions
from timbench.grid.cost import cell_seconds, wall_seconds
from timbench.grid.layout import prepare, read_status, run_dir, write_status
from timbench.grid.spec import SHIPPED_CONDITIONS, expand, load_grid, parse_grid
from timbench.model import PRESETS, Qwen3ForCausalLM, save_checkpoint
from timbench.runners.cell import run_cell
from timbench.runners.driver import run_grid, select
from timbench.runners.order import order_cells
from timbench.tasks.base import Task
from timbench.util.manifest import stamp_run

ROOT = Path(__file__).resolve().parents[1]
TINY = {"steps": 2, "prompts_per_step": 4, "group_size": 4, "mini_batches": 2, "eval_n": 16, "checkpoint_every": 1}


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    d = tmp_path_factory.mktemp("ckpt")
    save_checkpoint(Qwen3ForCausalLM(PRESETS["tiny-dense"], seed=2), d)
    return str(d)


def _grid_file(tmp_path, doc, name="g.yaml") -> Path:
    p = tmp_path / name
    p.write_text(yaml.safe_dump(doc))
    return p


def _tiny(ckpt, name, conditions, **extra):
    return {
        "name": name,
        "base": {"model": ckpt, **TINY, **extra.pop("base", {})},
        "axes": {"condition": conditions, **extra.pop("axes", {})},
        **extra,
    }


def _lines(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


# ---- spec, expansion, references ----------------------------------------------------------------


def test_shipped_condition_table():
    table = load_conditions(SHIPPED_CONDITIONS)
    kinds = {n: c.kind for n, c in table.items()}
    assert {
        k: kinds[k]
        for k in (
            "baseline",
            "bf16-engine",
            "torch-kernels",
            "production",
            "tp4",
            "splitkv4",
            "moe-router-bf16",
            "noise-g2",
            "vllm-bf16",
            "nvfp4-rollout",
        )
    } == {
        "baseline": "reference",
        "bf16-engine": "precision",
        "torch-kernels": "kernels",
        "production": "precision",
        "tp4": "tp",
        "splitkv4": "kernels",
        "moe-router-bf16": "moe",
        "noise-g2": "noise",
        "vllm-bf16": "vllm",
        "nvfp4-rollout": "quant",
    }
    assert set(kinds.values()) == set(KINDS)  # every family has a shipped condition
    assert table["mma-k16-vs-k8"].trainer_spec.mma_accum.block == 8
    assert table["production"].engine == "kernels=torch,dtype=bf16"
    assert all(len(c.doc) > 100 and "\n" not in c.doc for c in table.values())


def test_shipped_condition_table_is_package_data_and_the_default(tmp_path, monkeypatch):
    import fnmatch
    import tomllib

    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["timbench"]
    rel = SHIPPED_CONDITIONS.relative_to(ROOT / "timbench").as_posix()
    assert any(fnmatch.fnmatch(rel, pattern) for pattern in data), (rel, data)
    monkeypatch.chdir(tmp_path)  # library code must not read tables relative to the repo root
    grid = parse_grid({"name": "d", "axes": {"condition": ["baseline", "noise-g2"]}})
    assert grid.conditions["noise-g2"].engine == "noise=gaussian:2"
    (tmp_path / "mine.yaml").write_text(
        "conditions:\n  base2: {kind: reference, engine: kernels=exact, trainer: kernels=exact}\n"
    )
    own = parse_grid(
        {"name": "o", "conditions_file": "mine.yaml", "reference": "base2", "axes": {"condition": ["base2"]}}
    )  # relative to the working directory
    assert list(own.conditions) == ["base2"]


def test_expansion_order_ids_exclusion_and_references(ckpt):
    grid = parse_grid(
        {
            "name": "x",
            "base": {"model": ckpt, "steps": 3},
            "axes": {
                "condition": ["baseline", "bf16-engine"],
                "remedy": ["none", "tis_token+seq_rs"],
                "mode": ["recompute", "bypass"],
                "seed": [0, 1],
            },
            "exclude": [
                {"condition": "baseline", "remedy": "tis_token+seq_rs"},
                {"condition": "bf16-engine", "mode": "bypass", "remedy": ["none"]},
            ],
        }
    )
    cells = expand(grid)
    assert len(cells) == 16 - 4 - 2
    assert [c.id for c in cells] == [c.id for c in expand(grid)]  # deterministic
    ids = {c.id: c for c in cells}
    assert len(ids) == len(cells)
    c = ids["add-4d-v1.tiny-dense.bf16-engine.tis_token-seq_rs.bypass.grpo.s1"]
    assert c.axes == {
        "task": "add-4d-v1",
        "model": "tiny-dense",
        "condition": "bf16-engine",
        "remedy": "tis_token+seq_rs",
        "mode": "bypass",
        "algorithm": "grpo",
        "seed": 1,
    }
    assert c.config["remedy"] == "tis_token+seq_rs" and c.config["mode"] == "bypass"
    assert c.config["engine"] == {"kernels": "exact", "dtype": "bf16"} and c.config["preset"] == "tiny-dense"
    assert c.config["steps"] == 3 and c.config["threads"] == 1 and c.config["model"] == ckpt
    # every mismatched cell points at the baseline of its seed with remedy none and mode recompute
    assert c.reference == "add-4d-v1.tiny-dense.baseline.none.recompute.grpo.s1"
    for cell in cells:
        if cell.axes["condition"] == "baseline":
            assert cell.reference is None
        else:
            assert cell.reference == f"add-4d-v1.tiny-dense.baseline.none.recompute.grpo.s{cell.axes['seed']}"
    assert not any(k.startswith("add-4d-v1.tiny-dense.baseline.tis") for k in ids)


def test_reference_falls_back_to_another_mode_and_is_null_without_one(ckpt):
    grid = parse_grid(
        {
            "name": "x",
            "base": {"model": ckpt},
            "axes": {"condition": ["baseline", "torch-kernels"], "mode": ["recompute", "bypass"], "seed": [0, 1]},
            "exclude": [{"condition": "baseline", "mode": "recompute"}, {"condition": "baseline", "seed": 1}],
        }
    )
    refs = {c.id: c.reference for c in expand(grid)}
    assert (
        refs["add-4d-v1.tiny-dense.torch-kernels.none.recompute.grpo.s0"]
        == "add-4d-v1.tiny-dense.baseline.none.bypass.grpo.s0"
    )
    assert refs["add-4d-v1.tiny-dense.torch-kernels.none.bypass.grpo.s1"] is None


def test_inline_conditions_override_and_defaults(ckpt, tmp_path):
    p = _grid_file(
        tmp_path,
        {
            "name": "y",
            "base": {"model": ckpt},
            "conditions": {
                "fp16-both": {"kind": "reference", "engine": "dtype=fp16", "trainer": "kernels=exact,dtype=fp16"}
            },
            "axes": {"condition": ["fp16-both", "torch-kernels"]},
            "reference": "fp16-both",
        },
    )
    grid = load_grid(p)
    cells = expand(grid)
    assert [c.id for c in cells] == [
        "add-4d-v1.tiny-dense.fp16-both.none.recompute.grpo.s0",
        "add-4d-v1.tiny-dense.torch-kernels.none.recompute.grpo.s0",
    ]
    assert cells[1].reference == cells[0].id and cells[0].config["trainer"]["dtype"] == "fp16"


@pytest.mark.parametrize(
    "doc, message",
    [
        ({"axes": {"colour": ["red"]}}, "unknown axis 'colour'; valid axes: task, model"),
        ({"axes": {"condition": ["baseline", "warp-drive"]}}, "unknown condition 'warp-drive'; valid: baseline"),
        ({"conditions": {"bad": {"kind": "kernels", "engine": "kernels=cuda", "trainer": ""}}}, "missing trainer"),
        (
            {"conditions": {"bad": {"kind": "kernels", "engine": "kernels=cuda", "trainer": "dtype=fp32"}}},
            "invalid value 'cuda' for kernels; valid: exact|torch",
        ),
        (
            {"conditions": {"bad": {"kind": "gpu", "engine": "dtype=fp32", "trainer": "dtype=fp32"}}},
            "unknown kind 'gpu'; valid: reference, precision",
        ),
        ({"conditions": {"bad": {"kind": "noise", "engine": "", "trainer": "", "sigma": 2}}}, "unknown key"),
        (
            {"conditions": {"r2": {"kind": "reference", "engine": "dtype=bf16", "trainer": "dtype=fp32"}}},
            "identical engine and trainer",
        ),
        ({"conditions_file": "nowhere/conditions.yaml"}, "conditions_file 'nowhere/conditions.yaml' not found"),
        ({"conditions_file": 5}, "'conditions_file' must be a path string or null"),
        ({"reference": "bf16-engine"}, "not a condition of kind reference"),
        ({"base": {"seed": 3}}, "base sets 'seed', which axis 'seed' owns"),
        ({"base": {"engine": "kernels=torch"}}, "axis 'condition' owns"),
        ({"base": {"learning_rate": 1}}, "unknown config key 'learning_rate'"),
        ({"exclude": [{"condition": "torch-kernel"}]}, "condition='torch-kernel' is not a value of axes.condition"),
        ({"exclude": [{"flavour": "x"}]}, "exclude[0]: unknown axis 'flavour'"),
        ({"axes": {"seed": [0, 0]}}, "axes.seed lists ['0'] more than once"),
        ({"axes": {"seed": ["zero"]}}, "axes.seed values are integers"),
        ({"workers": 0}, "'workers' must be an integer >= 1"),
        ({"name": "a/b"}, "'name' must be a filesystem-safe string"),
        ({"colour": 1}, "unknown key(s) ['colour']"),
    ],
)
def test_bad_grid_specs_are_one_line_errors(doc, message, tmp_path):
    p = _grid_file(tmp_path, {"name": "bad", **doc})
    with pytest.raises((ValueError, FileNotFoundError)) as e:
        load_grid(p)
    assert message in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    "doc, message",
    [
        ({"base": {"eval_n": 0}}, "cell add-4d-v1.tiny-dense.baseline.none.recompute.grpo.s0: eval_n must be >= 1"),
        ({"axes": {"task": ["add-9d-v9"]}}, "cell add-9d-v9.tiny-dense.baseline.none.recompute.grpo.s0: unknown task"),
        ({"axes": {"mode": ["sideways"]}}, "cell add-4d-v1.tiny-dense.baseline.none.sideways.grpo.s0: mode"),
        ({"axes": {"task": ["mul-v1"]}}, "no shipped warm-start checkpoint for task 'mul-v1'"),
        ({"axes": {"model": ["huge"]}}, "unknown model preset 'huge'"),
        (
            {
                "conditions": {
                    n: {"kind": "kernels", "engine": "kernels=torch", "trainer": "kernels=exact"}
                    for n in ("t+k", "t:k")
                },
                "axes": {"condition": ["t+k", "t:k"]},
            },
            "both get id",
        ),
    ],
)
def test_invalid_cells_fail_at_plan_time_naming_the_cell(doc, message):
    with pytest.raises(ValueError) as e:
        expand(parse_grid({"name": "bad", **doc}))
    assert message in str(e.value) and "\n" not in str(e.value)


def test_cli_errors_are_one_line_exit_2(tmp_path, capsys):
    assert main(["grid", "plan", str(tmp_path / "none.yaml")]) == 2
    assert capsys.readouterr().err.strip() == f"timbench grid: error: grid file {tmp_path / 'none.yaml'} does not exist"
    p = _grid_file(tmp_path, {"name": "b", "axes": {"algo": ["grpo"]}})
    assert main(["grid", "run", str(p), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("timbench grid: error:") and "unknown axis 'algo'" in err and "\n" not in err
    assert main(["grid", "run", "bench/grids/example.yaml", "--out", str(tmp_path / "o"), "--address", "auto"]) == 2
    assert "--address is only for --backend ray" in capsys.readouterr().err


# ---- cost model and plan ------------------------------------------------------------------------


def test_cost_model_matches_the_measured_baseline_and_orders_conditions(capsys):
    base = expand(
        parse_grid(
            {
                "name": "c",
                "base": {"steps": 200},
                "axes": {"condition": ["baseline", "torch-kernels", "production"], "model": ["tiny-dense", "tiny-moe"]},
            }
        )
    )
    cost = {(c.axes["model"], c.axes["condition"]): cell_seconds(c.config) for c in base}
    no_eval = {**base[0].config, "eval_every": 1000}  # evals at the start and the end only
    per_step = [cell_seconds({**no_eval, "steps": n}) for n in (100, 200, 300)]
    assert per_step[2] - per_step[1] == pytest.approx(per_step[1] - per_step[0])  # linear in steps
    assert cost[("tiny-dense", "production")] < cost[("tiny-dense", "torch-kernels")] < cost[("tiny-dense", "baseline")]
    assert cost[("tiny-moe", "baseline")] > 1.4 * cost[("tiny-dense", "baseline")]
    longer = dict(base[0].config, task="addchain-v1")  # ~63 response tokens vs ~18.6
    assert cell_seconds(longer) > 2.5 * cost[("tiny-dense", "baseline")]
    assert wall_seconds([10, 10, 10, 10], 2) == 20 and wall_seconds([30, 10, 10, 10], 2) == 30
    assert main(["grid", "plan", "bench/grids/example.yaml", "--json", "--workers", "4"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert len(plan["cells"]) == 8 and plan["workers"] == 4
    assert sum(c["est_s"] for c in plan["cells"]) == pytest.approx(plan["total_s"], abs=0.5)
    assert plan["total_s"] / 4 <= plan["wall_s"] < plan["total_s"]
    assert main(["grid", "plan", "bench/grids/example.yaml"]) == 0
    text = capsys.readouterr().out
    assert "add-4d-v1.tiny-dense.production.none.recompute.grpo.s1" in text and "8 cells" in text


def test_cost_model_predicts_the_committed_quick_grid_measurement():
    """The model against a measurement: results/quick's cells recorded their wall times in cell.json."""
    out = ROOT / "results" / "quick"
    cells = expand(load_grid(out / "grid.yaml"))  # the resolved spec the committed run was made from
    measured = [read_status(out, c.id)["wall_s"] for c in cells]
    predicted = [cell_seconds(c.config) for c in cells]
    assert all(m > 0 for m in measured)
    # 2 workers on 2 cores, other jobs idle: the model (README constants, measured on the Intel Xeon, 1 thread)
    # within 0.8x-1.5x in total. Machines differ: the Xeon's committed run measured 1.06x; the regeneration on an
    # AMD EPYC with AVX2 only (2026-12-04, quiet, 24 cells) measured 1.40x, with the same code timed equal there.
    assert 0.8 <= sum(measured) / sum(predicted) <= 1.5, (sum(measured), sum(predicted))
    assert wall_seconds(measured, 2) > 0.75 * wall_seconds(predicted, 2)


QUICK_BUDGET_S = 20 * 60 - 90
"""`make quick` must finish in 20 min on 2 cores; ~60 s of setup and ~30 s of report come off the top."""
MODEL_ERROR = 1.15
"""Safety margin on the model: the committed quick grid measured 1.00x it per cell (32.7 s vs 32.8 s)."""


def test_quick_grid_has_three_seeds_a_512_eval_and_fits_make_quick():
    grid = load_grid(ROOT / "bench" / "grids" / "quick.yaml")
    cells = expand(grid)
    groups = {}
    for c in cells:
        groups.setdefault(tuple(v for k, v in c.axes.items() if k != "seed"), []).append(c.axes["seed"])
    assert min(len(seeds) for seeds in groups.values()) >= 3
    assert {c.config["eval_n"] for c in cells} == {512}
    settings = {(a[2], a[3], a[4]) for a in groups}  # condition, remedy, mode
    for sigma in ("noise-g1", "noise-g2"):
        assert {(sigma, "none", "recompute"), (sigma, "none", "bypass")} <= settings
    assert {("noise-g2", r, "bypass") for r in ("none", "tis_token", "tis_token+seq_rs")} <= settings
    assert ("baseline", "none", "recompute") in settings
    assert any(grid.conditions[a[2]].kind not in ("reference", "noise") for a in groups)  # a real condition
    wall = wall_seconds([cell_seconds(c.config) for c in cells], 2)
    assert wall * MODEL_ERROR <= QUICK_BUDGET_S, f"quick grid: {wall:.0f} s by the cost model"


# ---- layout and runner pieces (in process) ------------------------------------------------------


def test_layout_refuses_another_grid_and_resolved_spec_reloads(ckpt, tmp_path):
    grid = parse_grid(_tiny(ckpt, "one", ["baseline", "bf16-engine"]))
    prepare(tmp_path, grid, expand(grid))
    doc = json.loads((tmp_path / "cells.json").read_text())
    assert doc["grid"] == "one" and doc["reference_condition"] == "baseline" and doc["collapse"] == {}
    assert [c["id"] for c in doc["cells"]] == [c.id for c in expand(grid)]
    assert doc["cells"][1]["condition"]["kind"] == "precision" and doc["cells"][1]["reference"] == doc["cells"][0]["id"]
    again = load_grid(tmp_path / "grid.yaml")  # the resolved spec is self-contained
    before = (tmp_path / "cells.json").read_bytes()
    prepare(tmp_path, again, expand(again))
    assert (tmp_path / "cells.json").read_bytes() == before
    other = parse_grid(_tiny(ckpt, "one", ["baseline", "bf16-engine"], base={"lr": 1e-3}))
    with pytest.raises(ValueError, match=r"different grid \(cell .* differs in lr\); use another --out"):
        prepare(tmp_path, other, expand(other))
    # `grid merge` writes the union of its sources in their order: the same cells in another order resume
    doc["cells"].reverse()
    (tmp_path / "cells.json").write_text(json.dumps(doc))
    prepare(tmp_path, again, expand(again))
    assert (tmp_path / "cells.json").read_bytes() == before


def _sealed_done(out, cid, rows=3):
    """A done cell as the runner leaves it: the run's files, sealed by its manifest, then cell.json."""
    d = run_dir(out, cid)
    d.mkdir(parents=True, exist_ok=True)
    (d / "metrics.jsonl").write_text("".join(f'{{"step": {i}}}\n' for i in range(rows)))
    (d / "eval.jsonl").write_text('{"step": 0}\n')
    (d / "summary.json").write_text('{"status": "finished"}\n')
    stamp_run(d)
    write_status(out, cid, "done", None, 1.0, 1)
    return d


def test_select_skips_done_and_failed_unless_retrying(tmp_path):
    cells = [{"id": i} for i in ("a", "b", "c", "d")]
    _sealed_done(tmp_path, "a")
    write_status(tmp_path, "b", "failed", "boom", 1.0, 1)
    write_status(tmp_path, "c", "running", None, 0.0, 1)  # left by a kill: resumes
    assert [c["id"] for c in select(cells, tmp_path, retry_failed=False)] == ["c", "d"]
    assert [c["id"] for c in select(cells, tmp_path, retry_failed=True)] == ["b", "c", "d"]
    with pytest.raises(ValueError, match="valid: running, done, failed"):
        write_status(tmp_path, "a", "finished", None, 0.0, 1)


def test_seeds_order_runs_every_settings_seed_0_first_and_keeps_axis_order_within_a_seed(ckpt):
    grid = parse_grid(_tiny(ckpt, "o", ["baseline", "bf16-engine"], axes={"seed": [0, 1, 2]}))
    cells = [c.to_dict() for c in expand(grid)]
    axes = [(c["axes"]["condition"], c["axes"]["seed"]) for c in cells]
    assert [a[1] for a in axes] == [0, 1, 2] * (len(cells) // 3)  # the grid's own order: seed innermost
    seeds = [(c["axes"]["condition"], c["axes"]["seed"]) for c in order_cells(cells, "seeds")]
    assert [s for _, s in seeds] == sorted(s for _, s in axes)
    assert [c for c, s in seeds if s == 0] == [c for c, s in axes if s == 0]
    assert order_cells(cells, "axes") == cells
    with pytest.raises(ValueError, match="unknown order 'random'; valid: axes, seeds"):
        order_cells(cells, "random")


def test_select_redoes_a_damaged_done_cell_and_refuses_one_without_manifest(tmp_path):
    import io

    cells = [{"id": "a"}, {"id": "b"}]
    d = _sealed_done(tmp_path, "a")
    _sealed_done(tmp_path, "b")
    assert select(cells, tmp_path, retry_failed=False) == []
    (d / "metrics.jsonl").write_text('{"step": 0}\n{"step": 1}\n')  # the last row dropped after the run
    err = io.StringIO()
    assert [c["id"] for c in select(cells, tmp_path, retry_failed=False, stream=err)] == ["a"]
    assert "cell a:" in err.getvalue() and "metrics.jsonl: sha256 differs" in err.getvalue()
    assert not (d / "summary.json").exists() and not (d / "manifest.json").exists()  # reset: reruns from step 0
    (run_dir(tmp_path, "b") / "manifest.json").unlink()  # a result made before manifests
    with pytest.raises(ValueError, match=r"1 done cell\(s\) have no manifest.json .*grid verify .* --adopt"):
        select(cells, tmp_path, retry_failed=False)


def test_run_cell_records_non_finite_failure_and_skips_finished_runs(ckpt, tmp_path, monkeypatch):
    monkeypatch.setattr(Task, "reward", lambda self, response, problem, format_reward=0.0: float(len(response) % 2))
    grid = parse_grid(
        _tiny(ckpt, "nan", ["baseline"], base={"lr": 1e30, "grad_clip": 1e30, "steps": 3}, axes={"seed": [0]})
    )
    (bad,) = [c.to_dict() for c in expand(grid)]
    st = run_cell(bad, str(tmp_path))
    assert st["status"] == "failed" and st["attempts"] == 1
    assert st["error"].startswith("NonFiniteError: step ") and "non-finite" in st["error"]
    assert "\n" not in st["error"] and read_status(tmp_path, bad["id"]) == st
    assert "Traceback" in (tmp_path / "runs" / bad["id"] / "error.txt").read_text()
    assert run_cell(bad, str(tmp_path))["attempts"] == 2

    good = dict(bad, id="good", config=dict(bad["config"], lr=1e-3, grad_clip=1.0))
    st = run_cell(good, str(tmp_path))
    assert st["status"] == "done" and st["error"] is None and st["wall_s"] > 0
    metrics = tmp_path / "runs" / "good" / "metrics.jsonl"
    assert [r["step"] for r in _lines(metrics)] == [0, 1, 2]
    before = metrics.read_bytes(), metrics.stat().st_mtime_ns
    write_status(tmp_path, "good", "running", None, 0.0, 1)  # as if killed after summary.json, before cell.json
    st = run_cell(good, str(tmp_path))
    assert st["status"] == "done" and st["attempts"] == 1
    assert (metrics.read_bytes(), metrics.stat().st_mtime_ns) == before  # skipped, not rerun


def test_missing_ray_and_busy_directory_are_one_line_errors(ckpt, tmp_path, monkeypatch, capsys):
    from timbench.grid.layout import GridLock
    from timbench.runners import get_backend

    monkeypatch.setitem(sys.modules, "ray", None)  # as if the extra were not installed
    with pytest.raises(ValueError, match=r"needs the optional extra: pip install 'timbench\[ray\]'"):
        get_backend("ray")([], str(tmp_path))
    with pytest.raises(ValueError, match="unknown backend 'slurm'; valid: local, ray"):
        get_backend("slurm")
    p = _grid_file(tmp_path, _tiny(ckpt, "busy", ["baseline"]))
    with GridLock(tmp_path / "out"):  # another runner holds the directory
        assert main(["grid", "run", str(p), "--out", str(tmp_path / "out")]) == 2
    assert "is in use by another `timbench grid run`" in capsys.readouterr().err
    assert not (tmp_path / "out" / "runs").exists()


# ---- local runner end to end (cells in spawned processes) ---------------------------------------


def test_local_grid_two_workers_layout_and_failure_isolation(ckpt, tmp_path, capfd):
    p = _grid_file(
        tmp_path, _tiny(ckpt, "iso", ["baseline", "torch-kernels", "bf16-engine"], collapse={"min_drop": 0.2})
    )
    out = tmp_path / "out"
    bad = "add-4d-v1.tiny-dense.bf16-engine.none.recompute.grpo.s0"
    # A stale, foreign run directory: the run refuses it, so this one cell fails at run time.
    (out / "runs" / bad / "checkpoints").mkdir(parents=True)
    (out / "runs" / bad / "config.yaml").write_text("something: else\n")
    (out / "runs" / bad / "checkpoints" / "state.pt").write_bytes(b"not a checkpoint")

    assert main(["grid", "run", str(p), "--out", str(out), "--workers", "2"]) == 1
    io_ = capfd.readouterr()
    assert "[grid iso] 2/3 done, 0 running, 1 failed, 0 pending" in io_.err
    assert f"FAILED {bad}: ValueError:" in io_.err and "2/3 cells done, 1 failed" in io_.out

    doc = json.loads((out / "cells.json").read_text())
    assert doc["collapse"] == {"min_drop": 0.2} and len(doc["cells"]) == 3
    assert yaml.safe_load((out / "grid.yaml").read_text())["name"] == "iso"
    for cell in doc["cells"]:
        st = read_status(out, cell["id"])
        if cell["id"] == bad:
            assert st["status"] == "failed" and "different config.yaml" in st["error"] and "\n" not in st["error"]
            continue
        d = out / "runs" / cell["id"]
        assert st == {"status": "done", "error": None, "wall_s": st["wall_s"], "attempts": 1} and st["wall_s"] > 0
        assert [r["step"] for r in _lines(d / "metrics.jsonl")] == [0, 1]
        assert [r["step"] for r in _lines(d / "eval.jsonl")] == [0, 2]
        assert json.loads((d / "summary.json").read_text())["status"] == "finished"
        assert yaml.safe_load((d / "config.yaml").read_text()) == cell["config"]
        rows = _lines(d / "metrics.jsonl")
        zero = cell["axes"]["condition"] == "baseline"
        assert (rows[0]["training/rollout_probs_diff_max"] == 0.0) == zero

    # failed cells are not retried without --retry-failed; nothing else is rerun either
    stamps = {c["id"]: (out / "runs" / c["id"] / "cell.json").read_bytes() for c in doc["cells"]}
    assert main(["grid", "run", str(p), "--out", str(out), "--workers", "2"]) == 1
    assert {c["id"]: (out / "runs" / c["id"] / "cell.json").read_bytes() for c in doc["cells"]} == stamps
    assert "--retry-failed" in capfd.readouterr().out

    other = _grid_file(tmp_path, _tiny(ckpt, "iso", ["baseline"]), "other.yaml")
    assert main(["grid", "run", str(other), "--out", str(out)]) == 2
    assert "cells.json was written by a different grid" in capfd.readouterr().err


def _spawned_children(pid: int) -> list[int]:
    kids = []
    for d in Path("/proc").iterdir():
        try:
            status = (d / "status").read_text()
            cmd = (d / "cmdline").read_bytes()
        except OSError:
            continue
        if f"\nPPid:\t{pid}\n" in status and b"spawn_main" in cmd:
            kids.append(int(d.name))
    return kids


def _alive(pid: int) -> bool:
    try:
        return "\nState:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="uses /proc to find the worker processes")
def test_kill_9_then_rerun_finishes_without_losing_or_duplicating(ckpt, tmp_path):
    p = _grid_file(tmp_path, _tiny(ckpt, "kill", ["baseline", "torch-kernels"], base={"steps": 3}))
    out = tmp_path / "out"
    first, second = (c.id for c in expand(load_grid(p)))
    cmd = [sys.executable, "-m", "timbench.cli", "grid", "run", str(p), "--out", str(out), "--workers", "1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
    deadline = time.monotonic() + 300
    try:
        # Kill once the first cell is done and the second has a checkpoint (mid-run if we are quick enough).
        while time.monotonic() < deadline and proc.poll() is None:
            if (read_status(out, first) or {}).get("status") == "done" and (
                out / "runs" / second / "checkpoints" / "state.pt"
            ).is_file():
                break
            time.sleep(0.05)
        assert proc.poll() is None, "the grid finished before it could be killed"
        workers = _spawned_children(proc.pid)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
    for _ in range(100):  # the orphaned worker dies with its runner instead of writing on
        if not any(_alive(w) for w in workers):
            break
        time.sleep(0.05)
    assert not any(_alive(w) for w in workers)
    done_bytes = {n: (out / "runs" / first / f"{n}.jsonl").read_bytes() for n in ("metrics", "eval")}
    interrupted = read_status(out, second)["status"] == "running"
    import torch

    resume_at = torch.load(out / "runs" / second / "checkpoints" / "state.pt", weights_only=True)["step"]
    # Wall times differ between runs, so kept timing rows prove a resume from the checkpoint, not a restart.
    kept_timing = (out / "runs" / second / "timing.jsonl").read_text().splitlines(keepends=True)[:resume_at]

    assert main(["grid", "run", str(p), "--out", str(out), "--workers", "1"]) == 0
    assert {n: (out / "runs" / first / f"{n}.jsonl").read_bytes() for n in ("metrics", "eval")} == done_bytes
    assert read_status(out, first)["attempts"] == 1
    st = read_status(out, second)
    assert st["status"] == "done" and st["attempts"] == (2 if interrupted else 1)
    assert resume_at >= 1 and len(kept_timing) == resume_at
    assert (out / "runs" / second / "timing.jsonl").read_text().startswith("".join(kept_timing))
    for cid in (first, second):
        d = out / "runs" / cid
        assert [r["step"] for r in _lines(d / "metrics.jsonl")] == [0, 1, 2]
        assert [r["step"] for r in _lines(d / "timing.jsonl")] == [0, 1, 2]
        assert [r["step"] for r in _lines(d / "eval.jsonl")] == [0, 3]


# ---- Ray backend --------------------------------------------------------------------------------


def test_ray_backend_runs_a_two_cell_grid(ckpt, tmp_path):
    ray = pytest.importorskip("ray", reason="the Ray backend needs the optional extra timbench[ray]")
    grid = load_grid(_grid_file(tmp_path, _tiny(ckpt, "ray", ["baseline", "production"])))
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        stream = io.StringIO()
        final = run_grid(grid, tmp_path / "out", backend="ray", stream=stream)
    finally:
        ray.shutdown()
    assert [s["status"] for s in final.values()] == ["done", "done"]
    for cid in final:
        assert [r["step"] for r in _lines(tmp_path / "out" / "runs" / cid / "metrics.jsonl")] == [0, 1]
    assert "[grid ray] 2/2 done, 0 running, 0 failed, 0 pending" in stream.getvalue()


# ---- remedy variants ------------------------------------------------------------------------------


def test_remedy_variants_label_a_remedy_with_its_own_args_and_config(ckpt):
    doc = _tiny(
        ckpt,
        "v",
        ["baseline"],
        axes={"remedy": ["none", "rs_k1", "clip"]},
        remedy_variants={
            "rs_k1": {"remedy": "tis_token+seq_rs", "remedy_args": {"divergence": "k1"}},
            "clip": {"remedy": "none", "eps_low": 0.05, "eps_high": 0.05},
        },
    )
    grid = parse_grid(doc)
    cells = {c.axes["remedy"]: c for c in expand(grid)}
    assert cells["rs_k1"].id == "add-4d-v1.tiny-dense.baseline.rs_k1.recompute.grpo.s0"
    assert cells["rs_k1"].config["remedy"] == "tis_token+seq_rs"
    assert cells["rs_k1"].config["remedy_args"] == {"divergence": "k1"}
    assert (cells["clip"].config["remedy"], cells["clip"].config["eps_low"], cells["clip"].config["eps_high"]) == (
        "none",
        0.05,
        0.05,
    )
    assert cells["none"].config["eps_low"] is None and cells["none"].config["remedy_args"] == {}
    assert parse_grid(grid.to_dict()).remedy_variants == grid.remedy_variants  # the resolved spec reloads
    # A grid without variants keeps its resolved spec (and so its fingerprint) as before the key existed.
    assert "remedy_variants" not in parse_grid(_tiny(ckpt, "plain", ["baseline"])).to_dict()


@pytest.mark.parametrize(
    "variants, message",
    [
        ({"x": {"remedy_args": {}}}, "remedy_variants.x must be a mapping with a 'remedy' name"),
        ({"x": {"remedy": "none", "seed": 3}}, "unknown key(s) ['seed']; 'seed' is owned by axis 'seed'"),
        ({"x": {"remedy": "none", "colour": 1}}, "remedy_variants.x: unknown key(s) ['colour']"),
        ({"a/b": {"remedy": "none"}}, "remedy_variants label 'a/b' must be a string of [A-Za-z0-9_.+-]"),
        ([1], "'remedy_variants' must be a mapping"),
    ],
)
def test_bad_remedy_variants_are_one_line_errors(variants, message):
    with pytest.raises(ValueError) as e:
        parse_grid({"name": "bad", "remedy_variants": variants})
    assert message in str(e.value) and "\n" not in str(e.value)


def test_a_variant_with_a_bad_parameter_fails_at_plan_time_naming_the_cell():
    doc = {
        "name": "bad",
        "axes": {"remedy": ["v"]},
        "remedy_variants": {"v": {"remedy": "tis_token+seq_rs", "remedy_args": {"ratio": "pi"}}},
    }
    with pytest.raises(ValueError) as e:
        expand(parse_grid(doc))
    assert "cell add-4d-v1.tiny-dense.baseline.v.recompute.grpo.s0" in str(e.value) and "ratio 'pi'" in str(e.value)


def test_paper_grid_fits_three_hours_and_holds_every_figures_cells():
    grid = load_grid(ROOT / "bench/grids/paper.yaml")
    cells = expand(grid)
    assert wall_seconds([cell_seconds(c.config) for c in cells], 2) <= 3 * 3600
    settings = {}
    for c in cells:
        settings.setdefault((c.axes["condition"], c.axes["remedy"], c.axes["mode"]), []).append(c.axes["seed"])
    assert all(len(seeds) >= 3 for seeds in settings.values())  # >= 3 seeds per compared setting
    kinds = {c.axes["condition"]: c.condition.kind for c in cells}
    assert {"quant", "precision", "noise", "reference"} <= set(kinds.values())
    remedies = {c.axes["remedy"]: c.config for c in cells}
    assert remedies["tis+rs_k3_ppo"]["remedy_args"]["ratio"] == "ppo"
    assert remedies["ppo_clip_0.05"]["eps_low"] == 0.05
    assert {remedies[r]["remedy_args"].get("divergence") for r in ("tis+rs_k1", "tis+rs_k3")} == {"k1", "k3"}
    # every mismatched noise and real condition runs in both modes (F2 and the dose-response)
    for cond, kind in kinds.items():
        if kind != "reference":
            assert {m for (c, r, m) in settings if c == cond and r == "none"} == {"recompute", "bypass"}, cond


SLEEPER = """
import time
from timbench.remedies import Remedy

class Sleeper(Remedy):
    name = "sleeper"
    doc = "never returns (a hung plug-in)"
    def __call__(self, batch):
        time.sleep(3600)
"""


# waits out a 40 s cell timeout: CI's `slow` stage (make test-slow).
@pytest.mark.slow
def test_a_cell_past_its_timeout_is_killed_and_the_grid_goes_on(ckpt, tmp_path, capfd):
    (tmp_path / "sleeper.py").write_text(SLEEPER)
    p = _grid_file(
        tmp_path,
        _tiny(
            ckpt,
            "hang",
            ["baseline", "bf16-engine"],
            axes={"remedy": ["none", f"{tmp_path / 'sleeper.py'}:Sleeper"]},
            exclude=[{"condition": "baseline", "remedy": f"{tmp_path / 'sleeper.py'}:Sleeper"}],
        ),
    )
    out = tmp_path / "out"
    # 40 s: a cell's process start and imports count, and on a loaded 2-core machine 20 s was seen to be too few
    assert main(["grid", "run", str(p), "--out", str(out), "--workers", "2", "--cell-timeout", "40"]) == 1
    io_ = capfd.readouterr()
    assert "2/3 cells done, 1 failed" in io_.out
    (hung,) = [line for line in io_.err.splitlines() if line.startswith("FAILED ")]
    assert "sleeper" in hung and "timed out after 40 s" in hung and "--cell-timeout" in hung
    with pytest.raises(ValueError, match="--cell-timeout must be >= 0"):
        from timbench.runners.local import cell_timeouts

        cell_timeouts([{"id": "a", "config": {}}], -1.0)


HANG_WHILE = """
import os, time
from timbench.remedies.builtin import NoRemedy

class HangWhile(NoRemedy):
    name = "hang_while"
    doc = "no correction, but from step 1 on waits while the file HANG exists (a plug-in that hangs until fixed)"
    calls = 0
    def __call__(self, batch):
        with open(PIDS, "a") as f:
            f.write(f"{os.getpid()}\\n")
        HangWhile.calls += 1
        while HangWhile.calls > 1 and os.path.exists(HANG):
            time.sleep(0.2)
        return super().__call__(batch)
"""


@pytest.mark.slow  # 30-90 s: CI runs it in the `slow` stage (make test-slow)
def test_a_ray_cell_past_its_timeout_is_cancelled_recorded_and_resumed_by_a_rerun(ckpt, tmp_path, capfd):
    ray = pytest.importorskip("ray", reason="the Ray backend needs the optional extra timbench[ray]")
    from timbench.runners.ship import CKPT, checkpoint_step

    hang, pids = tmp_path / "hang", tmp_path / "pids"
    hang.touch()
    (tmp_path / "hang.py").write_text(f"HANG, PIDS = {str(hang)!r}, {str(pids)!r}\n{HANG_WHILE}")
    remedy = f"{tmp_path / 'hang.py'}:HangWhile"
    p = _grid_file(tmp_path, _tiny(ckpt, "rayhang", ["baseline"], axes={"remedy": ["none", remedy]}))
    out = tmp_path / "out"
    # 30 s: a cell here runs ~7 s once started on a worker
    run = ["grid", "run", str(p), "--out", str(out), "--backend", "ray", "--cell-timeout", "30"]
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        assert main(run) == 1  # fail closed
        io_ = capfd.readouterr()
        assert "1/2 cells done, 1 failed" in io_.out
        (hung,) = [line for line in io_.err.splitlines() if line.startswith("FAILED ")]
        assert ".hang_while-" in hung and "timed out after 30 s" in hung and "--cell-timeout" in hung
        cid = hung.split()[1].rstrip(":")
        st = read_status(out, cid)
        assert st["status"] == "failed" and st["attempts"] == 1 and st["wall_s"] >= 30 and "\n" not in st["error"]
        assert "lost on" not in io_.err  # cancelled, not taken for a lost worker and resubmitted
        ckpt = out / "runs" / cid / CKPT  # what the driver holds: step 0's checkpoint, which the rerun resumes from
        assert checkpoint_step(ckpt.read_bytes()) == 1 and len(_lines(out / "runs" / cid / "metrics.jsonl")) == 1
        (pid,) = {int(x) for x in pids.read_text().split()}  # the hung worker's process is gone, not just ignored
        for _ in range(50):
            if not Path(f"/proc/{pid}").exists():
                break
            time.sleep(0.2)
        assert not Path(f"/proc/{pid}").exists()
        hang.unlink()  # the plug-in fixed (its file unchanged, so the cell's identity is too)
        assert main([*run, "--retry-failed"]) == 0
        st = read_status(out, cid)
        assert st["status"] == "done" and st["attempts"] == 2
    finally:
        ray.shutdown()
    (other,) = [d for d in (out / "runs").iterdir() if d.name != cid]
    for name in ("metrics.jsonl", "eval.jsonl"):  # the redone cell trained as `none` (its twin) does, byte for byte
        assert (out / "runs" / cid / name).read_bytes() == (other / name).read_bytes(), name
    assert [r["step"] for r in _lines(out / "runs" / cid / "metrics.jsonl")] == [0, 1]


_RAY_AUTH = """
import os, subprocess, sys
from timbench.runners.ray_runner import _import_ray, _token_auth_for_a_local_cluster
ray = _import_ray()  # imported first, as run_ray does: the token mode must still reach Ray's cached config
_token_auth_for_a_local_cluster()
ctx = ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)
ok = ray.get(ray.remote(lambda: 42).remote())
env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
code = "import ray; ray.init(address=%r, log_to_driver=False); print('JOINED')" % ctx.address_info["gcs_address"]
p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
ray.shutdown()
print("RESULT", ok, p.returncode, "JOINED" in p.stdout)
"""


@pytest.mark.slow  # 30-90 s: CI runs it in the `slow` stage (make test-slow)
def test_the_local_ray_cluster_refuses_a_client_without_its_token(tmp_path):
    import subprocess
    import sys

    pytest.importorskip("ray", reason="the Ray backend needs the optional extra timbench[ray]")
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith(("RAY_AUTH", "RAY_ADDRESS"))}
    p = subprocess.run(
        [sys.executable, "-c", _RAY_AUTH], capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path
    )
    (line,) = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT")] or [p.stderr[-3000:]]
    ok, rc, joined = line.split()[1:]
    assert ok == "42" and rc != "0" and joined == "False", line  # our tasks run; a tokenless client is refused
