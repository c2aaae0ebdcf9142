"""Hostile inputs, integrity bound to content: a run bound to its cell, a summary its logs still give,
cells.json under the grid's manifest, a checkpoint that carries its own hash (docs/reliability.md)."""

import json
import shutil

import pytest
import torch

from timbench.cli import main
from timbench.grid import layout
from timbench.util.manifest import stamp_run

EVALS = [
    {"step": 0, "accuracy_t1": 0.25, "accuracy_greedy": 0.5},
    {"step": 2, "accuracy_t1": 0.5, "accuracy_greedy": 0.75},
]


def _row(step):
    from timbench.metrics.log_summary import MEAN_KEYS

    return {"step": step, **{k: 0.001 * (step + 1) for k in MEAN_KEYS}, "critic/rewards/mean": 0.5 + step / 10}


def _grid(out, seeds=(0, 1)):
    """A grid dir of one cell per seed, each a finished, sealed run as the grid runner leaves it (bound, done)."""
    from timbench.metrics.log_summary import from_logs

    cells = [
        {
            "id": f"c{s}",
            "axes": {"remedy": "none", "mode": "recompute", "condition": "baseline", "seed": s},
            "condition": {"name": "baseline", "kind": "reference"},
            "reference": None,
            "config": {"steps": 2, "seed": s},
        }
        for s in seeds
    ]
    out.mkdir(parents=True)
    (out / "cells.json").write_text(json.dumps({"grid": "g", "cells": cells}))
    for c in cells:
        d = out / "runs" / c["id"]
        d.mkdir(parents=True)
        rows = [_row(i) for i in range(2)]
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (d / "eval.jsonl").write_text("".join(json.dumps(e) + "\n" for e in EVALS))
        (d / "timing.jsonl").write_text("".join(f'{{"step": {i}}}\n' for i in range(2)))
        (d / "status.json").write_text(json.dumps({"status": "finished", "error": None}))
        (d / "summary.json").write_text(
            json.dumps({"status": "finished", "seed": c["config"]["seed"], **from_logs(rows, EVALS)})
        )
        stamp_run(d)
        layout.record_done(out, c, 1.0, 1)
    return out, cells


def _verify(out, capsys) -> tuple[int, str]:
    rc = main(["grid", "verify", str(out)])
    return rc, capsys.readouterr().out


# 1. A run's manifest binds its cell (id and config fingerprint).


def test_a_run_dir_copied_under_another_cells_id_fails_verify_and_is_not_done(tmp_path, capsys):
    out, cells = _grid(tmp_path / "g")
    assert _verify(out, capsys)[0] == 0
    shutil.rmtree(out / "runs" / "c1")
    shutil.copytree(out / "runs" / "c0", out / "runs" / "c1")  # c0's run (seed 0) passed off as c1 (seed 1)
    rc, text = _verify(out, capsys)
    assert rc == 1 and "cell c1: " in text and "bound to cell 'c0'" in text
    assert layout.integrity(out, cells[1])  # grid run resets and redoes it
    with pytest.raises(ValueError, match="bound to cell 'c0'"):
        from timbench.report.results import load_results

        load_results(out)
    (out / "runs" / "c1" / "cell.json").unlink()  # not recorded done: the next grid run must not record it either
    assert layout.record_if_finished(out, cells[1]) is None
    assert not (out / "runs" / "c1" / "summary.json").exists()


def test_a_run_with_the_same_id_and_config_in_another_grid_still_verifies(tmp_path, capsys):
    """What a powered grid that reuses an earlier grid's cells does: same cell id, same RunConfig."""
    src, _ = _grid(tmp_path / "a")
    dst = tmp_path / "b"
    shutil.copytree(src, dst)
    assert _verify(dst, capsys)[0] == 0


def test_a_run_bound_to_the_same_id_but_another_config_fails(tmp_path, capsys):
    out, cells = _grid(tmp_path / "g", seeds=(0,))
    doc = json.loads((out / "cells.json").read_text())
    doc["cells"][0]["config"]["lr"] = 1.0
    (out / "cells.json").write_text(json.dumps(doc))
    rc, text = _verify(out, capsys)
    assert rc == 1 and "with another config" in text


def test_an_unbound_manifest_made_before_bindings_still_verifies(tmp_path, capsys):
    out, _ = _grid(tmp_path / "g")
    for c in ("c0", "c1"):
        stamp_run(out / "runs" / c)  # a manifest as older runs wrote it: files only
        assert "cell" not in json.loads((out / "runs" / c / "manifest.json").read_text())
    assert _verify(out, capsys)[0] == 0


def test_a_finished_run_is_bound_when_recorded(tmp_path):
    out, cells = _grid(tmp_path / "g", seeds=(0,))
    d = out / "runs" / "c0"
    stamp_run(d)
    (d / "cell.json").unlink()  # killed between the run's seal and cell.json
    assert layout.record_if_finished(out, cells[0])["status"] == "done"
    assert json.loads((d / "manifest.json").read_text())["cell"] == layout.cell_binding(cells[0])


# 2. verify recomputes the summary's log aggregates.


@pytest.mark.parametrize("edit", ["eval", "metrics"])
def test_an_edited_log_rehashed_into_the_manifest_is_caught(tmp_path, capsys, edit):
    out, _ = _grid(tmp_path / "g", seeds=(0,))
    d = out / "runs" / "c0"
    if edit == "eval":
        text = (d / "eval.jsonl").read_text()
        (d / "eval.jsonl").write_text(text.replace('"accuracy_t1": 0.5', '"accuracy_t1": 0.9'))
    else:
        (d / "metrics.jsonl").write_text((d / "metrics.jsonl").read_text().replace("0.6", "0.1"))
    stamp_run(d)  # re-hashed: the manifest alone no longer tells
    rc, text = _verify(out, capsys)
    key = "final_accuracy_t1" if edit == "eval" else "final/critic/rewards/mean"
    assert rc == 1 and f"{key} is " in text and "but the logs give" in text


def test_adopt_refuses_a_summary_its_logs_do_not_give(tmp_path, capsys):
    out, _ = _grid(tmp_path / "g", seeds=(0,))
    d = out / "runs" / "c0"
    (d / "manifest.json").unlink()
    (d / "eval.jsonl").write_text((d / "eval.jsonl").read_text().replace('"accuracy_t1": 0.5', '"accuracy_t1": 0.9'))
    assert main(["grid", "verify", str(out), "--adopt"]) == 1
    assert "not adopted" in capsys.readouterr().out and not (d / "manifest.json").exists()


# 3. cells.json is covered by the grid's manifest.


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    from timbench.model import PRESETS, Qwen3ForCausalLM, save_checkpoint

    d = tmp_path_factory.mktemp("ckpt")
    save_checkpoint(Qwen3ForCausalLM(PRESETS["tiny-dense"], seed=2), d)
    return d


def _prepared(ckpt, out):
    from timbench.grid.spec import expand, parse_grid

    grid = parse_grid(
        {
            "name": "g",
            "base": {"model": str(ckpt), "steps": 2},
            "axes": {"condition": ["baseline", "bf16-engine"], "seed": [0, 1]},
        }
    )
    layout.prepare(out, grid, expand(grid))
    return out


def _swap_axes(doc):
    doc["cells"][0]["axes"], doc["cells"][1]["axes"] = doc["cells"][1]["axes"], doc["cells"][0]["axes"]


def _drop_cell(doc):
    doc["cells"].pop()


def _bogus(doc):
    doc["cells"] = [dict(doc["cells"][0], id="bogus")]


@pytest.mark.parametrize("damage", [_swap_axes, _drop_cell, _bogus])
def test_an_edited_cells_json_fails_verify(ckpt, tmp_path, capsys, damage):
    out = _prepared(ckpt, tmp_path / "g")
    assert _verify(out, capsys)[0] == 0
    doc = json.loads((out / "cells.json").read_text())
    damage(doc)
    (out / "cells.json").write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    rc, text = _verify(out, capsys)
    assert rc == 1 and "grid: " in text and "cells.json: sha256 differs" in text


def test_prepare_covers_cells_json_and_an_update_keeps_other_entries(ckpt, tmp_path):
    from timbench.util import manifest

    out = _prepared(ckpt, tmp_path / "g")
    assert list(manifest.read(out)) == ["cells.json"]
    manifest.update(out, ["grid.yaml"])
    assert sorted(manifest.read(out)) == ["cells.json", "grid.yaml"]


def test_a_report_beside_cells_json_keeps_it_covered(tmp_path, capsys):
    from gridfab import standard_grid

    from timbench.util import manifest

    out = standard_grid(tmp_path / "g")
    manifest.update(out, ["cells.json"])
    assert main(["grid", "report", str(out)]) == 0
    assert "cells.json" in manifest.read(out) and "leaderboard.md" in manifest.read(out)
    capsys.readouterr()
    assert _verify(out, capsys)[0] == 0


# 4. A checkpoint carries a hash of its content, checked before a resume.


def _train_args(ckpt, out, steps):
    return ["train", "--out", str(out), "--quiet"] + [
        a
        for o in (
            f"model={ckpt}",
            f"steps={steps}",
            "prompts_per_step=4",
            "group_size=4",
            "mini_batches=2",
            "eval_every=1",
            "eval_n=16",
            "checkpoint_every=1",
        )
        for a in ("--set", o)
    ]


def test_a_flipped_bit_in_an_interrupted_runs_checkpoint_is_refused(ckpt, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(_train_args(ckpt, out, 2)) == 0
    for name in ("manifest.json", "summary.json"):  # killed after its last checkpoint, before its end markers
        (out / name).unlink()
    path = out / "checkpoints" / "state.pt"
    state = torch.load(path, weights_only=True)
    assert isinstance(state.get("sha256"), str)
    w = next(iter(state["lanes"][0]["model"].values()))
    w.view(-1).view(torch.int32)[0] ^= 1  # one bit of one weight, saved with the old hash
    torch.save(state, path)
    capsys.readouterr()
    assert main(_train_args(ckpt, out, 2)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "state.pt: refused: its content no longer matches the sha256" in err[0]
    assert not (out / "summary.json").exists()
