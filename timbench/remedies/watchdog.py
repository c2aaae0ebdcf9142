"""A watchdog process that ends a run whose plug-in call outlived its limit while holding the GIL.

The in-process limit (remedies.deadline: a SIGALRM handler, then a watchdog thread) needs the interpreter: a
plug-in stuck in a native call that keeps the GIL (a C extension's loop, `ctypes.PyDLL`) runs neither. So each
process that runs plug-in calls under a limit also has one small helper process, started on the first such
call: before a call the run sends it the deadline and the files its end must leave (status failed, error.txt,
a grid cell's cell.json), after the call it disarms it. Past the deadline the helper writes those files,
prints the one-line reason and SIGKILLs the run; the run's own logs and checkpoints, written before the call,
stay as they are. The helper reads its orders on stdin, whose write end only the run holds, so it exits when
the run does, however that ends.

The helper is this file run as a script (`python -I watchdog.py`, stdlib only): it starts in a few tens of
milliseconds and imports nothing of the run's (torch, the plug-in).
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time


class Watchdog:
    """The run's side: one helper process per process, armed around each limited plug-in call."""

    def __init__(self):
        self._proc: subprocess.Popen | None = None
        self._owner = os.getpid()

    def _send(self, order: dict) -> None:
        if self._proc is not None and self._owner != os.getpid():
            # a forked child (a fork-context worker pool) inherited its parent's helper, which would kill the
            # parent: it drops its copy of the pipe and starts its own
            try:
                self._proc.stdin.close()
            except OSError:
                pass
            self._proc = None
        if self._proc is None or self._proc.poll() is not None:
            self._owner = os.getpid()
            self._proc = subprocess.Popen(
                [sys.executable, "-I", os.path.abspath(__file__), str(os.getpid())],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                close_fds=True,
            )
        try:
            self._proc.stdin.write((json.dumps(order) + "\n").encode())
            self._proc.stdin.flush()
        except OSError:  # the helper died (killed by hand): the in-process limit still holds for Python code
            self._proc = None

    def arm(self, seconds: float, reason: str, files: dict[str, str]) -> None:
        """Kill this process `seconds` from now, leaving `files` ({path: text}) and printing `reason`, unless
        `disarm` comes first."""
        self._send({"arm": seconds, "reason": reason, "files": files})

    def disarm(self) -> None:
        if self._proc is not None:
            self._send({"disarm": True})


def _write(path: str, text: str) -> None:
    """Atomically, as timbench.util.atomic does (a reader sees the old file or the new one)."""
    d = os.path.dirname(path) or "."
    os.makedirs(d, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=d, prefix="." + os.path.basename(path) + ".")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _serve(pid: int) -> None:
    """The helper's loop: orders on stdin until EOF (the run ended); kill `pid` at an armed deadline."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is the run's to handle; EOF ends this
    fd, buf, order, due = sys.stdin.fileno(), b"", None, None
    while True:
        wait = None if due is None else max(0.0, due - time.monotonic())
        ready, _, _ = select.select([fd], [], [], wait)
        if not ready:  # the deadline passed with the call still running: the run cannot act, so this does
            for path, text in order["files"].items():
                try:
                    _write(path, text)
                except OSError:
                    pass  # the kill matters more than a record that cannot be written
            print(f"timbench: run failed: PluginTimeout: {order['reason']}", file=sys.stderr, flush=True)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            return
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            msg = json.loads(line)
            if "arm" in msg:
                order, due = msg, time.monotonic() + float(msg["arm"])
            else:
                order, due = None, None


if __name__ == "__main__":
    _serve(int(sys.argv[1]))
