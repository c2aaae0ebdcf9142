"""Tear down a server a test started in its own process group (start_new_session=True), whatever it left."""

from __future__ import annotations

import os
import signal
import subprocess


def stop_group(proc: subprocess.Popen, grace: float = 30.0) -> None:
    """SIGTERM the whole group (an OpenAI server's API process alone leaves its workers), SIGKILL after `grace` s."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
