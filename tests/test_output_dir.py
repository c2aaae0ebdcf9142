"""A bad `--out` (an existing file, a path under a file, a place nobody can write) is one error line.

`train`, `grid run`, `align --table`, `warmstart` and `claims` share `timbench.util.atomic.check_output_dir`; each
command is driven through `timbench.cli.main` as a user would, and must exit 2 with one stderr line naming the
path, write nothing, and leave the file that was in the way untouched.

"Not writable" without permission bits: the tests may run as root, which ignores them. Linux's
procfs refuses new entries even to root (mkdir/creat give ENOENT in /proc), so `/proc` (an existing
directory nobody can write) and `/proc/<new>` (a directory nobody can create) are real cases
everywhere. A mode-0555 directory is checked too when not running as root.
"""

from __future__ import annotations

import os
import sys

import pytest

from timbench.cli import main
from timbench.util.atomic import check_output_dir

COMMANDS = {
    "train": lambda out: ["train", "--out", out, "--set", "steps=1"],
    "grid run": lambda out: ["grid", "run", "bench/grids/quick.yaml", "--out", out],
    "align --table": lambda out: ["align", "--table", "bench/align_quick.yaml", "--out", out],
    "warmstart": lambda out: ["warmstart", "--task", "add-3d-v1", "--model", "tiny-dense", "--out", out],
    "claims": lambda out: ["claims", "results/align", "--out", out],
}
on_linux_proc = pytest.mark.skipif(
    not sys.platform.startswith("linux") or not os.path.isdir("/proc/self"), reason="needs Linux procfs"
)


def _one_line_error(capsys, argv, *needles):
    assert main(argv) == 2
    cap = capsys.readouterr()
    assert cap.err.count("\n") == 1, cap.err
    assert "Traceback" not in cap.err
    for n in needles:
        assert n in cap.err, (n, cap.err)
    return cap.err


@pytest.mark.parametrize("command", list(COMMANDS))
def test_out_that_is_a_file_or_under_a_file_is_one_line(command, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # repo root: bench/ paths
    blocker = tmp_path / "notes.txt"
    blocker.write_text("keep me\n")
    _one_line_error(capsys, COMMANDS[command](str(blocker)), str(blocker), "not a directory")
    _one_line_error(capsys, COMMANDS[command](str(blocker / "run" / "deeper")), str(blocker), "not a directory")
    assert blocker.read_text() == "keep me\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]  # no probe or partial output left


@on_linux_proc
@pytest.mark.parametrize("command", list(COMMANDS))
def test_out_nobody_can_write_is_one_line(command, capsys, monkeypatch):
    monkeypatch.chdir(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    _one_line_error(capsys, COMMANDS[command]("/proc"), "/proc", "not writable")
    _one_line_error(capsys, COMMANDS[command]("/proc/timbench-run/x"), "/proc/timbench-run/x", "not writable")


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root ignores permission bits")
def test_read_only_directory_is_rejected_for_other_users(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        with pytest.raises(ValueError, match="not writable"):
            check_output_dir(ro / "run")
    finally:
        ro.chmod(0o755)


def test_writable_outputs_pass_and_nothing_is_created(tmp_path):
    existing = tmp_path / "old-run"
    existing.mkdir()
    (existing / "metrics.jsonl").write_text("{}\n")
    assert check_output_dir(existing) == existing  # an existing run directory is resumed, not refused
    assert check_output_dir(tmp_path / "new" / "run") == tmp_path / "new" / "run"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old-run"]
    assert [p.name for p in existing.iterdir()] == ["metrics.jsonl"]


def test_dangling_symlink_is_not_a_directory(tmp_path):
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "gone")
    with pytest.raises(ValueError, match="exists and is not a directory"):
        check_output_dir(link, flag="--out")


def test_a_disk_that_takes_no_data_fails_the_probe(tmp_path):
    # RLIMIT_FSIZE 0 stands in for a 100%-full disk: an empty file can still be created, one byte cannot.
    import subprocess

    code = (
        "import resource, signal, sys; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
        "resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0)); from timbench.util.atomic import check_output_dir\n"
        "try:\n    check_output_dir(sys.argv[1])\nexcept ValueError as e:\n    print('REFUSED', e)"
    )
    p = subprocess.run([sys.executable, "-c", code, str(tmp_path / "out")], capture_output=True, text=True)
    assert "REFUSED --out" in p.stdout and "not writable (writing in" in p.stdout, p.stdout + p.stderr
    assert not [f for f in os.listdir(tmp_path) if f.startswith(".timbench-probe")]


def test_grid_report_takes_the_directory_lock(tmp_path, capsys):
    from gridfab import standard_grid

    from timbench.util.dirlock import DirLock

    root = standard_grid(tmp_path / "g")
    with DirLock(root, "timbench grid run"):  # a grid run (or another report) is writing there
        assert main(["grid", "report", str(root)]) == 2
    assert "is in use" in capsys.readouterr().err
    assert main(["grid", "report", str(root)]) == 0
