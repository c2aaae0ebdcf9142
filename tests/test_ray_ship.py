"""The Ray backend's pieces without a cluster: what is shipped, snapshots, write order, errors, bounded retries.

The bounded-retry test uses an in-process Ray (`ray.init(num_cpus=1)`) and a
plug-in remedy that kills its Ray worker process on import, so every submission
of the cell is a lost worker.
"""

import io
import json
from pathlib import Path

import pytest
import torch
import yaml

from timbench.grid.layout import read_status
from timbench.grid.spec import load_grid
from timbench.model import PRESETS, Qwen3ForCausalLM, save_checkpoint
from timbench.runners import ship
from timbench.runners.driver import run_grid
from timbench.runners.ray_runner import parse_resources
from timbench.util.atomic import atomic_write


def _state(step: int) -> bytes:
    buf = io.BytesIO()
    torch.save({"step": step, "extra": {}, "lanes": []}, buf)
    return buf.getvalue()


def test_remedy_file_specs_are_told_from_names_and_modules():
    assert ship.remedy_file("plug/scaled.py:Scaled") == ("plug/scaled.py", "Scaled")
    assert ship.remedy_file("scaled.py:Scaled") == ("scaled.py", "Scaled")
    assert ship.remedy_file("/abs/dir/x:Cls") == ("/abs/dir/x", "Cls")
    assert ship.remedy_file("pkg.module:Cls") is None
    assert ship.remedy_file("tis") is None


def test_bundle_reads_relative_paths_on_the_driver_and_materialize_points_the_config_at_copies(tmp_path, monkeypatch):
    drv = tmp_path / "drv"
    (drv / "plug").mkdir(parents=True)
    (drv / "plug" / "r.py").write_text("# plug-in\n")
    save_checkpoint(Qwen3ForCausalLM(PRESETS["tiny-dense"], seed=1), drv / "ck")
    monkeypatch.chdir(drv)
    cfg = {"model": "ck", "remedy": "plug/r.py:R", "steps": 2}
    b = ship.bundle(cfg)
    assert b["remedy"] == ("r.py", b"# plug-in\n", "R")
    assert set(b["model"]) == {p.name for p in (drv / "ck").iterdir()}
    scratch = tmp_path / "scratch"
    new = ship.materialize(cfg, b, scratch)
    assert new["remedy"] == f"{scratch / 'remedy' / 'r.py'}:R" and new["model"] == str(scratch / "model")
    assert new["steps"] == 2 and cfg["model"] == "ck"  # the caller's config is not changed
    for name, data in b["model"].items():
        assert (scratch / "model" / name).read_bytes() == data == (drv / "ck" / name).read_bytes()
    assert ship.bundle({"model": "default", "remedy": "tis"}) == {"model": None, "remedy": None}
    with pytest.raises(ValueError, match=r"remedy file plug/missing.py does not exist on the driver \(cwd "):
        ship.bundle({"remedy": "plug/missing.py:R"})
    with pytest.raises(ValueError, match="model 'nope': checkpoint directory not found on the driver"):
        ship.bundle({"model": "nope"})


def test_mid_run_snapshot_holds_the_checkpoint_and_exactly_the_rows_a_resume_keeps(tmp_path):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "state.pt").write_bytes(_state(2))
    rows = lambda steps: "".join(json.dumps({"step": s}) + "\n" for s in steps)
    (run / "metrics.jsonl").write_text(rows([0, 1, 2]) + '{"step": 3, "tor')  # step 2 ran past the checkpoint
    (run / "timing.jsonl").write_text(rows([0, 1, 2]))
    (run / "eval.jsonl").write_text(rows([0, 2]))
    (run / "status.json").write_text('{"error": null, "status": "running"}\n')
    snap = ship.snapshot(run, "cfg: 1\n", final=False)
    assert snap["metrics.jsonl"] == snap["timing.jsonl"] == rows([0, 1]).encode()
    assert snap["eval.jsonl"] == rows([0, 2]).encode()  # the eval at step 2 precedes checkpoint 2
    assert snap["config.yaml"] == b"cfg: 1\n" and ship.checkpoint_step(snap[ship.CKPT]) == 2
    (run / "summary.json").write_text("{}\n")
    final = ship.snapshot(run, "cfg: 1\n", final=True)
    assert set(final) == {
        "checkpoints/state.pt",
        "metrics.jsonl",
        "timing.jsonl",
        "eval.jsonl",
        "status.json",
        "summary.json",
        "config.yaml",
    }
    assert final["metrics.jsonl"] == (run / "metrics.jsonl").read_bytes()


def test_write_run_writes_logs_before_the_checkpoint_and_the_end_markers_last(tmp_path, monkeypatch):
    order = []
    monkeypatch.setattr(
        ship, "atomic_write", lambda path, data: order.append(Path(path).name) or atomic_write(path, data)
    )
    files = {
        "summary.json": b"{}",
        ship.CKPT: _state(1),
        "metrics.jsonl": b"",
        "status.json": b"{}",
        "config.yaml": b"",
        "eval.jsonl": b"",
        "timing.jsonl": b"",
    }
    ship.write_run(tmp_path / "r", files)
    assert order == [
        "config.yaml",
        "metrics.jsonl",
        "timing.jsonl",
        "eval.jsonl",
        "status.json",
        "state.pt",
        "summary.json",
    ]
    with pytest.raises(ValueError, match="leaves the run directory"):
        ship.write_run(tmp_path / "r", {"../x": b""})


def test_resources_flag_is_validated_in_one_line():
    assert parse_resources('{"extra": 1}') == {"extra": 1}
    assert parse_resources(None) == {}
    with pytest.raises(ValueError, match="must be a JSON object"):
        parse_resources("extra=1")
    with pytest.raises(ValueError, match="positive numbers"):
        parse_resources('{"extra": 0}')
    with pytest.raises(ValueError, match="custom resources only"):
        parse_resources('{"CPU": 2}')


KILLER = """
import os, sys
from timbench.remedies.builtin import NoRemedy as Nope  # noqa: F401 - a valid class, should the driver look
if os.path.basename(sys.argv[0]) == "default_worker.py":  # inside a Ray worker: die like a lost node
    os._exit(3)
"""


def test_a_cell_whose_worker_keeps_dying_fails_after_max_attempts_with_one_line(tmp_path, monkeypatch):
    ray = pytest.importorskip("ray", reason="the Ray backend needs the optional extra timbench[ray]")
    (tmp_path / "killer.py").write_text(KILLER)
    monkeypatch.chdir(tmp_path)
    doc = {
        "name": "k",
        "base": {"steps": 1, "prompts_per_step": 2, "group_size": 2, "eval_n": 4},
        "axes": {"condition": ["baseline"], "remedy": ["killer.py:Nope"]},
    }
    (tmp_path / "g.yaml").write_text(yaml.safe_dump(doc))
    grid = load_grid(tmp_path / "g.yaml")
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        stream = io.StringIO()
        final = run_grid(grid, tmp_path / "out", backend="ray", stream=stream, options={"max_attempts": 2})
    finally:
        ray.shutdown()
    ((cid, st),) = final.items()
    assert st["status"] == "failed" and "\n" not in st["error"]
    assert st["error"].startswith("ray: worker or node lost 2 times (last on "), st["error"]
    assert f"cell {cid}: lost on " in stream.getvalue() and "(submission 2 of 2)" in stream.getvalue()
    assert stream.getvalue().splitlines()[-1].startswith("[grid k] 0/1 done, 0 running, 1 failed, 0 pending")
    assert read_status(tmp_path / "out", cid)["status"] == "failed"


def test_ray_only_flags_are_refused_elsewhere_and_bad_ones_are_one_line(tmp_path, capsys):
    from timbench.cli import main

    grid = ["grid", "run", "bench/grids/example.yaml", "--out", str(tmp_path / "o")]
    assert main([*grid, "--resources", '{"extra": 1}']) == 2
    assert "--resources is only for --backend ray" in capsys.readouterr().err
    assert main([*grid, "--max-attempts", "2"]) == 2
    assert "--max-attempts is only for --backend ray" in capsys.readouterr().err
    assert main([*grid, "--backend", "ray", "--resources", "extra"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--resources must be a JSON object" in err and "\n" not in err
    assert main([*grid, "--backend", "ray", "--max-attempts", "0"]) == 2
    assert "--max-attempts must be >= 1, got 0" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()  # refused before anything was written
