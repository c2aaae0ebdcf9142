"""The size ladder's dose measurement (bench/size_ladder_dose.py) rebuilds a grid cell's first RL batch: its mean
|delta| and the share of sequences K3 rejection keeps are the RL loop's own step-0 metrics."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from timbench.grid.spec import expand, load_grid
from timbench.rl.config import from_dict
from timbench.rl.loop import run

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("size_ladder_dose", ROOT / "bench" / "size_ladder_dose.py")
dose = importlib.util.module_from_spec(spec)
spec.loader.exec_module(dose)


def test_dose_is_the_rl_loops_step_zero_mismatch(tmp_path):
    engine = "noise=gaussian:0.55"
    got = dose.measure("tiny-dense", engine, seed=1)
    cfg = {
        "preset": "tiny-dense",
        "engine": engine,
        "trainer": "kernels=exact",
        "remedy": "tis_token+seq_rs",
        "remedy_args": {"divergence": "k3", "threshold": 0.01},
        "seed": 1,
        "steps": 1,
        "prompts_per_step": dose.PROMPTS,
        "group_size": dose.GROUP,
        "eval_every": 100,
        "eval_n": 8,
        "checkpoint_every": 100,
    }
    run(from_dict(cfg, "test"), tmp_path / "run", progress=False)
    step0 = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert got["mean_abs_delta"] > 0.01  # the noise bites
    assert got["mean_abs_delta"] == pytest.approx(step0["mismatch/mean_abs_delta"], rel=1e-9)
    assert got["k3_mean"] == pytest.approx(step0["rollout_corr/k3_kl"], rel=1e-6)
    assert got["kept"]["0.01"] == pytest.approx(1 - step0["rollout_corr/rollout_rs_seq_masked_fraction"], abs=1e-12)


def test_unknown_condition_is_a_one_line_error(capsys):
    assert dose.main(["--out", "unused", "--conditions", "nvfp5"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "nvfp5" in err and "noise-g0.55" in err
    assert not Path("unused").exists()


def test_grid_gives_each_size_one_dose_one_threshold_and_its_own_baseline():
    cells = expand(load_grid(ROOT / "bench" / "grids" / "size_ladder.yaml"))
    assert len(cells) == 3 * 6 * 6
    by_model: dict[str, set] = {}
    ids = {c.id: c for c in cells}
    for c in cells:
        by_model.setdefault(c.axes["model"], set()).add((c.axes["condition"], c.axes["remedy"], c.axes["mode"]))
        if c.axes["condition"] != "baseline":  # compared with the zero-mismatch run of its own size and seed
            ref = ids[c.reference].axes
            assert (ref["model"], ref["seed"], ref["condition"]) == (c.axes["model"], c.axes["seed"], "baseline")
    for model, settings in by_model.items():
        doses = {cond for cond, _, _ in settings} - {"baseline"}
        rejections = {r for _, r, _ in settings if r.startswith("tis+rs")}
        assert len(settings) == 6 and len(doses) == 1 and len(rejections) == 1, (model, settings)
