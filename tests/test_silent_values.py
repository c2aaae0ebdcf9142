"""Values that used to train silently wrong are refused in one line, or mean what the messages say."""

from __future__ import annotations

import pytest
import torch

from timbench.grid.spec import load_grid
from timbench.remedies import RemedyBatch, RemedyResult
from timbench.remedies.base import check_result
from timbench.rl.config import load_config
from timbench.rl.loop import run

QUICK = ["steps=1", "prompts_per_step=2", "group_size=4", "eval_every=1", "eval_n=8"]


def test_negative_remedy_weights_are_refused():
    mask = torch.ones(2, 3, dtype=torch.bool)
    batch = RemedyBatch(torch.zeros(2, 3), torch.zeros(2, 3), torch.tensor([1.0, -1.0]), mask, 2)
    w = torch.ones(2, 3)
    w[1, 2] = -0.5
    with pytest.raises(ValueError, match="remedy flip: weights must be >= 0 on kept tokens .* got min -0.5"):
        check_result(RemedyResult(w, mask, {}), batch, "flip")
    keep = mask.clone()
    keep[1, 2] = False  # a negative weight on a masked-out token never reaches the loss
    assert check_result(RemedyResult(w, keep, {}), batch, "flip").mask is keep


def test_temperature_zero_is_refused():
    with pytest.raises(ValueError, match="'temperature': 0.0 is out of range; valid: a finite number > 0"):
        load_config(None, QUICK + ["temperature=0"])


def test_a_yaml_key_given_twice_is_an_error_naming_it_and_both_lines(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("task: add-4d-v1\nsteps: 2\nlr: 1e-3\nsteps: 5\n")
    with pytest.raises(ValueError, match=r"c.yaml: key 'steps' is given twice \(lines 2 and 4\)"):
        load_config(str(cfg), [])
    grid = tmp_path / "g.yaml"
    grid.write_text("name: g\naxes:\n  seed: [0]\n  condition: [baseline]\n  seed: [1, 2]\n")
    with pytest.raises(ValueError, match=r"key 'seed' is given twice \(lines 3 and 5\)"):
        load_grid(grid)


def test_grad_clip_inf_means_no_clipping(tmp_path):
    run(load_config(None, QUICK + ["grad_clip=inf"]), tmp_path / "inf", progress=False)
    run(load_config(None, QUICK + ["grad_clip=1e30"]), tmp_path / "huge", progress=False)  # never reached
    assert (tmp_path / "inf/metrics.jsonl").read_bytes() == (tmp_path / "huge/metrics.jsonl").read_bytes()
    with pytest.raises(ValueError, match="grad_clip"):
        load_config(None, QUICK + ["grad_clip=0"])


def test_a_second_train_on_the_same_directory_is_refused_before_writing(tmp_path):
    from timbench.util.dirlock import DirLock

    out = tmp_path / "run"
    with DirLock(out, "timbench train"):  # another process's run, as far as the flock can tell
        with pytest.raises(ValueError, match=r"run is in use by another `timbench train`"):
            run(load_config(None, QUICK), out, progress=False)
        assert sorted(p.name for p in out.iterdir()) == [".lock"]  # nothing written, nothing truncated
    run(load_config(None, QUICK), out, progress=False)  # the lock is gone with its holder
    assert (out / "summary.json").is_file()
