"""Hostile inputs for the grid runner: one cell whose run directory refuses writes fails alone, in one
line, while its sibling finishes (docs/reliability.md)."""

import json

import pytest

from timbench.grid.layout import prepare, read_status
from timbench.grid.spec import expand, parse_grid
from timbench.model import PRESETS, Qwen3ForCausalLM, save_checkpoint


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    d = tmp_path_factory.mktemp("ckpt")
    save_checkpoint(Qwen3ForCausalLM(PRESETS["tiny-dense"], seed=2), d)
    return str(d)


def test_an_unwritable_run_dir_fails_its_cell_in_one_line_and_the_sibling_finishes(ckpt, tmp_path, capfd):
    from timbench.runners.local import run_local

    grid = parse_grid(
        {
            "name": "g",
            "base": {
                "model": ckpt,
                "steps": 1,
                "prompts_per_step": 4,
                "group_size": 4,
                "mini_batches": 2,
                "eval_n": 16,
            },
            "axes": {"seed": [0, 1]},
        }
    )
    cells = [c.to_dict() for c in expand(grid)]
    prepare(tmp_path, grid, expand(grid))
    bad, good = cells[0]["id"], cells[1]["id"]
    (tmp_path / "runs" / bad / "cell.json").mkdir(parents=True)  # cell.json cannot be written there
    capfd.readouterr()
    final = run_local(cells, str(tmp_path), workers=2)
    err = capfd.readouterr().err
    assert "Traceback" not in err
    assert [line for line in err.splitlines() if bad in line] and all(good not in line for line in err.splitlines())
    assert final[0]["status"] == "failed" and "cell.json not written" in final[0]["error"]
    assert final[1]["status"] == "done" and read_status(tmp_path, good)["status"] == "done"
    assert json.loads((tmp_path / "runs" / good / "summary.json").read_text())["status"] == "finished"
