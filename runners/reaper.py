"""The reaper of a local Ray instance: when its driver ends, however it ends, no process of that instance is left.

A local instance (`--backend ray`, address `local`) runs its GCS, raylet, agents and workers as processes of
their own, which outlive a driver killed by SIGKILL (its `ray.shutdown()` never runs): they kept running, one
listening on the network, and kept the private temp dir. So the driver starts this small process before
`ray.init`, with a pipe whose write end only the driver holds; when that pipe reaches end of file (the driver
closed it after `ray.shutdown()`, or died), the reaper kills every process of this user that names the
instance's private temp dir in its command line or by a file it holds open there (every Ray process of the
instance keeps its logs there, and no other process does: the dir is a fresh `mkdtemp`), until none is left,
and removes the dir. Another user's Ray, or another instance of this user, names another dir and is never
touched.

Run as a script (`python -I reaper.py TEMP_DIR`, stdlib only), so it starts fast and imports neither Ray nor
torch.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

SWEEP_S = 30.0
"""How long the reaper keeps killing (a raylet dying may still be starting a worker)."""


def start(temp_dir: str) -> subprocess.Popen:
    """Start the reaper of the instance whose private temp dir is `temp_dir`; closing the returned process's stdin
    (or this process's death) sets it off."""
    return subprocess.Popen(
        [sys.executable, "-I", os.path.abspath(__file__), temp_dir],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        close_fds=True,
        start_new_session=True,  # a Ctrl-C to the driver's terminal group does not end it before its sweep
    )


def _names(pid: str, temp_dir: str) -> bool:
    """Whether process `pid` names `temp_dir`: in its command line (the GCS, raylet, monitors) or by a file it
    holds open there (its log files: the agents and workers, whose command lines Ray rewrites to `ray::IDLE`)."""
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        if temp_dir.encode() in f.read():
            return True
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith(temp_dir + os.sep):
                return True
        except OSError:
            pass
    return False


def session_pids(temp_dir: str) -> list[int]:
    """This user's processes (not this one) that name `temp_dir` (`_names`)."""
    me, uid, found = os.getpid(), os.getuid(), []
    temp_dir = os.path.realpath(temp_dir)
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            if os.stat(f"/proc/{name}").st_uid == uid and _names(name, temp_dir):
                found.append(int(name))
        except OSError:  # ended meanwhile, or not ours to read
            continue
    return found


def reap(temp_dir: str, sweep_s: float = SWEEP_S) -> int:
    """Kill the instance's processes until none is left (or `sweep_s` passed); remove its dir. Returns how many
    processes it killed."""
    killed, t0 = set(), time.monotonic()
    while time.monotonic() - t0 < sweep_s:
        pids = session_pids(temp_dir)
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
            except OSError:
                pass
        time.sleep(0.2)
    shutil.rmtree(temp_dir, ignore_errors=True)
    return len(killed)


def _main(temp_dir: str) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while os.read(sys.stdin.fileno(), 1 << 12):  # nothing is ever sent: only the end of file matters
        pass
    reap(temp_dir)


if __name__ == "__main__":
    _main(sys.argv[1])
