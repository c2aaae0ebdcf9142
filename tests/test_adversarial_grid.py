"""Hostile inputs for the grid runner: one cell whose run directory refuses writes fails alone, in one line, while
its sibling finishes; a driver of the Ray backend killed by SIGKILL leaves no Ray process behind, and a local Ray
instance listens on the loopback address only (docs/reliability.md)."""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest
import yaml

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


def _listening(pids: list[int]) -> list[str]:
    """The local addresses (hex, as /proc/net/tcp writes them) on which processes `pids` listen for TCP."""
    inodes = set()
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:["):
                    inodes.add(link[8:-1])
        except OSError:
            continue
    addrs = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in open(table).read().splitlines()[1:]:
            f = line.split()
            if f[3] == "0A" and f[9] in inodes:  # 0A: LISTEN
                addrs.append(f[1].split(":")[0])
    return addrs


LOOPBACK_HEX = {"0100007F", "0000000000000000FFFF00000100007F", "00000000000000000000000001000000"}
"""127.0.0.1, ::ffff:127.0.0.1 and ::1 as /proc/net/tcp{,6} write them."""


@pytest.mark.ray_cluster  # starts a real local Ray instance: the Ray stage (make test-ray)
def test_a_killed_ray_driver_leaves_no_ray_process_and_ray_listens_on_loopback_only(ckpt, tmp_path):
    pytest.importorskip("ray", reason="the Ray backend needs the optional extra timbench[ray]")
    from timbench.runners.reaper import session_pids

    grid = {
        "name": "g",
        "base": {"model": ckpt, "steps": 200, "prompts_per_step": 4, "group_size": 4, "mini_batches": 2},
        "axes": {"seed": [0]},
    }
    (tmp_path / "g.yaml").write_text(yaml.safe_dump(grid))
    root = tempfile.mkdtemp(prefix="tbr-", dir="/tmp")  # short: Ray's socket paths live under it
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_ADDRESS")} | {"TMPDIR": root}
    args = ["grid", "run", str(tmp_path / "g.yaml"), "--out", str(tmp_path / "out"), "--backend", "ray"]
    p = subprocess.Popen([sys.executable, "-m", "timbench.cli", *args, "--workers", "1"], env=env)
    try:
        temp, t0 = None, time.monotonic()
        while time.monotonic() - t0 < 240:  # until the cell's worker runs: every part of Ray is up
            assert p.poll() is None, f"the driver exited ({p.returncode}) before Ray was up"
            temp = next((os.path.join(root, d) for d in os.listdir(root) if d.startswith("timbench-ray-")), None)
            st = next((tmp_path / "out" / "runs").glob("*/cell.json"), None) if (tmp_path / "out").is_dir() else None
            if temp and st is not None and json.loads(st.read_text())["status"] == "running":
                break
            time.sleep(0.2)
        else:
            pytest.fail("the Ray backend did not start the cell within 240 s")
        pids = session_pids(temp)
        assert len(pids) >= 4, pids  # GCS, raylet, agents, the worker (and the reaper)
        addrs = _listening(pids)
        assert addrs and set(addrs) <= LOOPBACK_HEX, addrs  # nothing listens on the host's address
        p.send_signal(signal.SIGKILL)
        p.wait(30)
        t0 = time.monotonic()
        while session_pids(temp) and time.monotonic() - t0 < 60:
            time.sleep(0.5)
        left = session_pids(temp)
        assert not left, [open(f"/proc/{q}/cmdline", "rb").read()[:80] for q in left]
        assert not os.path.exists(temp)  # its files went with it
    finally:
        if p.poll() is None:
            p.kill()
        shutil.rmtree(root, ignore_errors=True)
