"""One writer per output directory: an exclusive, kill-safe lock taken before anything is written."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path


class DirLock:
    """An exclusive flock on <out>/.lock: one writer (grid run, train, submit) per output directory at a time.

    The kernel drops the lock when its holder dies (even by kill -9), so a stale
    lock never blocks the rerun that resumes a killed grid.
    """

    def __init__(self, out: str | Path, holder: str = "timbench grid run"):
        self.path = Path(out) / ".lock"
        self.holder = holder
        self.fd = None

    def __enter__(self):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:  # the holder wrote its own command there: name it, not the caller's
                other, _, pid = os.pread(self.fd, 200, 0).decode(errors="replace").partition("\n")
            except OSError:
                other, pid = "", ""
            os.close(self.fd)
            who = f"`{other.strip() or 'timbench command'}`" + (f" (pid {pid.strip()})" if pid.strip() else "")
            raise ValueError(f"{self.path.parent} is in use by another {who} (a lock held on "
                             f"{self.path}); wait for it or stop it first") from None
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, f"{self.holder}\n{os.getpid()}\n".encode(), 0)
        return self

    def __exit__(self, *exc):
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)
