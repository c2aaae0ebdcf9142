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
        self.created = not self.path.parent.exists()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        while True:
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
                raise ValueError(
                    f"{self.path.parent} is in use by another {who} (a lock held on "
                    f"{self.path}); wait for it or stop it first"
                ) from None
            # The holder before us unlinks .lock on exit: a lock on the unlinked inode guards nothing, so take it
            # again on the file now at the path (the usual flock-and-unlink protocol).
            try:
                same = os.path.samestat(os.fstat(self.fd), os.stat(self.path))
            except FileNotFoundError:
                same = False
            if same:
                os.ftruncate(self.fd, 0)
                os.pwrite(self.fd, f"{self.holder}\n{os.getpid()}\n".encode(), 0)
                return self
            os.close(self.fd)

    def __exit__(self, *exc):
        # Unlinked while still held, so no one locks the old inode after us; a run that was refused before it
        # wrote anything leaves no trace: not the .lock, not the directory it made.
        try:
            self.path.unlink()
            if self.created:
                self.path.parent.rmdir()  # only when empty: OSError otherwise, and the results stay
        except OSError:
            pass
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)
