"""The CLI answers without the numeric stack: no torch/numba at parse time, --version, a closed pipe, one
--workers default, help on every option, and build/ as the default destination of regenerations."""

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TIMBENCH = [sys.executable, "-m", "timbench.cli"]


def _subparsers(parser):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            yield from action.choices.items()


def _all_parsers(parser, prefix="timbench"):
    yield prefix, parser
    for name, sub in _subparsers(parser):
        yield from _all_parsers(sub, f"{prefix} {name}")


def test_parser_and_arg_errors_import_no_torch_or_numba():
    code = (
        "import sys\nfrom timbench.cli import main\n"
        "for argv in (['grid', 'run'], ['submit'], ['paper'], ['train'], ['warmstart'], ['align', '--seed', 'x']):\n"
        "    try:\n        main(argv)\n    except SystemExit as e:\n        assert e.code == 2, (argv, e.code)\n"
        "heavy = sorted(m for m in ('torch', 'numba', 'matplotlib', 'numpy') if m in sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stderr[-2000:]


def test_version_names_timbench_git_and_the_stack():
    r = subprocess.run(TIMBENCH + ["--version"], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stderr
    line = r.stdout.strip()
    assert line.startswith("timbench ") and "torch " in line and "numba " in line and "vllm " in line
    assert "(git " in line  # the tests run in a checkout


def test_closed_pipe_is_not_a_traceback():
    # A reader that takes one line and goes away, as `timbench remedies list | head -1` does.
    p = subprocess.Popen(TIMBENCH + ["remedies", "list"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO)
    p.stdout.readline()
    p.stdout.close()
    err = p.stderr.read().decode()
    p.wait(timeout=120)
    assert "Traceback" not in err and "BrokenPipeError" not in err, err
    assert p.returncode in (0, 141)


def test_every_option_has_help_and_workers_has_one_default():
    from timbench.cli import build_parser

    missing, workers = [], {}
    for name, parser in _all_parsers(build_parser()):
        for a in parser._actions:
            if isinstance(a, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            if not a.help:
                missing.append(f"{name} {'/'.join(a.option_strings) or a.dest}")
            if "--workers" in a.option_strings:
                workers[name] = (a.default, a.help)
    assert not missing, missing
    assert set(workers) >= {"timbench grid run", "timbench grid plan", "timbench submit", "timbench track run"}
    assert len(set(workers.values())) == 1, workers


def test_default_workers_rule():
    from timbench.grid.cli import default_workers

    assert default_workers(3, 2) == 3
    assert default_workers(None, 2) == 2
    assert default_workers(None) >= 1


@pytest.mark.parametrize(
    "source,out",
    [
        ("results/paper", "build/paper"),
        ("results/paper_vllm/", "build/paper_vllm"),
        ("build/paper", "build/paper"),
        ("/tmp/x/results/quick", "build/quick"),
    ],
)
def test_regenerations_default_under_build(source, out):
    from timbench.report.cli import default_out

    assert default_out(source, "build/paper") == out


def test_paper_on_a_narrower_grid_writes_only_where_told(tmp_path):
    """results/rise_collapse (recompute only, 160 steps) is a narrower paper grid: `timbench paper` answers what
    its cells can; results/quick (24 steps) is none and is refused, writing nothing (tests/test_paper.py)."""
    before = sorted(p.name for p in (REPO / "results/rise_collapse").iterdir())
    r = subprocess.run(
        TIMBENCH + ["paper", "results/rise_collapse", "--out", str(tmp_path / "p")],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert r.returncode == 0, r.stderr
    text = (tmp_path / "p" / "paper.md").read_text()
    assert "## F1:" in text and "## F2: not tested" in text  # recompute only: F2 compares the two modes
    assert sorted(p.name for p in (REPO / "results/rise_collapse").iterdir()) == before
    r = subprocess.run(
        TIMBENCH + ["paper", "results/quick", "--out", str(tmp_path / "q")], capture_output=True, text=True, cwd=REPO
    )
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "runs are 24 steps" in r.stderr, r.stderr
    assert not (tmp_path / "q").exists()


def test_grid_progress_counts_running_cells_steps(tmp_path):
    from timbench.runners.progress import Progress, steps_of

    cells = [{"id": "a", "config": {"steps": 10}}, {"id": "b", "config": {"steps": 6}}]
    (tmp_path / "runs" / "a").mkdir(parents=True)
    (tmp_path / "runs" / "a" / "metrics.jsonl").write_text('{"step": 0}\n{"step": 1}\n{"step": 2}\n')
    assert steps_of(str(tmp_path), cells) == (3, 16)  # b has not started: 0 of its 6
    p = Progress("g", 4, 1, 0, 2)
    p.running = 2
    p.running_steps = lambda: steps_of(str(tmp_path), cells)
    assert "2 running (steps 3/16)" in p.line()


def test_eta_counts_and_estimates():
    from timbench.eta import Eta

    t = [0.0]
    eta = Eta(3, clock=lambda: t[0])
    t[0] = 10.0
    assert eta.tick() == "1/3, ETA 20s"
    t[0] = 30.0
    assert eta.tick() == "2/3, ETA 15s"
    assert eta.tick() == "3/3, took 30s"
