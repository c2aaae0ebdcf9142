"""A user's whole command sequences, as the README runs them, on committed data (CI's own stage,
`make test-journeys`): submit a built-in and a masking plug-in on the mini track until they are ranked, remake
the paper page of results/paper byte for byte, gate the exact engine and check it against the stored baseline,
and every README block marked `<!-- journey -->`. Each step is the `timbench` command in a subprocess from the
repository root, writing only under a temporary directory. A few minutes on 2 cores (most of it the gate).
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from plugin_text import readme_plugin

pytestmark = pytest.mark.journey

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
# The console script a user types, where this Python has one; else the same entry point through -m.
TIMBENCH = [str(BIN / "timbench")] if (BIN / "timbench").is_file() else [sys.executable, "-m", "timbench.cli"]


def timbench(*args, timeout: float = 600) -> subprocess.CompletedProcess:
    r = subprocess.run(TIMBENCH + [str(a) for a in args], cwd=REPO, capture_output=True, text=True, timeout=timeout)
    assert "Traceback" not in r.stderr, r.stderr
    return r


def _ranked(out: Path, remedy_prefix: str) -> dict:
    """The submission's record, checked to rank the remedy among the committed ones on its leaderboard."""
    sub = json.loads((out / "submission.json").read_text())
    assert sub["remedy"].startswith(remedy_prefix) and sub["track"] == "mini"
    assert sub["of"] == 3 and 1 <= sub["rank"] <= 3 and not sub["failed"], sub  # none, tis_token and this one
    board = (out / "leaderboard.md").read_text()
    assert f"| {sub['remedy']} |" in board, board
    return sub


def test_submit_a_builtin_on_the_mini_track(tmp_path):
    out = tmp_path / "trl-sequence_mask"
    r = timbench("submit", "trl:sequence_mask", "--track", "mini", "--out", out)
    assert r.returncode == 0, r.stderr[-2000:]
    sub = _ranked(out, "trl:sequence_mask")
    assert f"rank {sub['rank_label']} of 3" in r.stdout  # the printed rank is the tie-aware label
    assert (
        f"regenerate: `timbench submit trl:sequence_mask --track mini --out {out}`"
        in (out / "leaderboard.md").read_text()
    )


def test_submit_the_readme_masking_plugin_on_the_mini_track(tmp_path):
    plug = tmp_path / "mask_remedy.py"
    plug.write_text(readme_plugin("mask_remedy.py"))  # the README's example, as a user would save it
    out = tmp_path / "mask"
    r = timbench("submit", f"{plug}:MaskRemedy", "--track", "mini", "--out", out, "--set", "remedy_args.bound=0.5")
    assert r.returncode == 0, r.stderr[-2000:]
    sub = _ranked(out, "mask_log_rho@")
    # it masked some tokens and trained on the rest (keep= reached the loss)
    cells = [c for c in json.loads((out / "cells.json").read_text())["cells"] if c["axes"]["remedy"] == sub["remedy"]]
    assert len(cells) == 3
    masked = [
        json.loads(ln)["rollout_corr/rollout_rs_masked_fraction"]
        for c in cells
        for ln in (out / "runs" / c["id"] / "metrics.jsonl").read_text().splitlines()
    ]
    assert 0 < max(masked) < 1, masked
    # the regenerate line is a command that names the file and the parameter, as run
    assert (
        f"timbench submit {plug}:MaskRemedy --track mini --out {out} --set remedy_args.bound=0.5"
        in (out / "leaderboard.md").read_text()
    )


def test_the_paper_page_of_results_paper_is_remade_byte_for_byte(tmp_path):
    out = tmp_path / "paper"
    committed = REPO / "results/paper"
    r = timbench("paper", "results/paper", "--out", out)
    assert r.returncode == 0, r.stderr[-2000:]
    for name in ("paper.md", "paper.json", *(f"figures/{p.name}" for p in (committed / "figures").glob("paper_*.png"))):
        assert (out / name).read_bytes() == (committed / name).read_bytes(), name
    # paper.html links the grid's leaderboard relative to where the page is written: that one href, no more
    link = os.path.relpath(committed / "leaderboard.html", out)
    html = (committed / "paper.html").read_text()
    assert html.count('href="leaderboard.html"') == 1
    assert (out / "paper.html").read_text() == html.replace('href="leaderboard.html"', f'href="{link}"')


def test_gate_run_then_check_against_the_stored_baseline(tmp_path):
    suite = (REPO / "bench/gates/smoke.yaml").read_text()
    assert re.search(r"^baseline: results/gates/none$", suite, re.M)  # the baseline the README points to
    out = tmp_path / "gate"
    r = timbench("gate", "run", "--suite", "smoke", "--out", out)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "PASS; no regression(s) against" in r.stdout + r.stderr
    r = timbench("gate", "check", "results/gates/none", out)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "no regression" in r.stdout


def _journey_blocks() -> list[str]:
    text = (REPO / "README.md").read_text()
    return re.findall(r"^<!-- journey -->\n```(?:bash|sh)\n(.*?)^```", text, re.S | re.M)


def test_the_readme_marks_journey_blocks():
    assert _journey_blocks(), "README.md has no block marked <!-- journey --> before a ```bash fence"


@pytest.mark.parametrize("block", _journey_blocks(), ids=lambda b: b.split()[0] + "..." + b.splitlines()[-1][:30])
def test_a_readme_journey_block_runs_as_written(block, tmp_path):
    # As a user pastes it after `make setup`: the venv's bin first on PATH, from the repository root, any
    # failing line fails the block.
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", TMPDIR=str(tmp_path))
    r = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, f"README block failed (exit {r.returncode}):\n{block}\n{r.stderr[-2000:]}"
    assert r.stdout.strip()
