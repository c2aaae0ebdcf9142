"""Atomic file writes: a temp file in the target directory, then `os.replace`.

A reader (or a resumed run) sees the old file or the new one, never half of
one. Files get mode 0644 (mkstemp's 0600 would make shipped assets unreadable
to other users). `check_output_dir` is the matching check at the edge: a
command that writes a results directory (`train`, `grid run`) calls it before
any work, so a bad `--out` is one line instead of a traceback hours later.
"""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from pathlib import Path


class WriteError(OSError):
    """A write that the OS refused (disk full, read-only, no permission, file too large), as one line naming the
    operation, the path and the errno: what a user needs to fix it, instead of `[Errno 28]` with no path."""

    def __str__(self) -> str:
        return self.strerror or super().__str__()


def write_error(e: OSError, op: str, path: str | os.PathLike) -> WriteError:
    if isinstance(e, WriteError):
        return e
    name = errno.errorcode.get(e.errno, "") if e.errno is not None else ""
    err = WriteError(e.errno, f"{op} {path}: {e.strerror or e}" + (f" ({name})" if name else ""))
    err.filename = str(path)
    return err


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike):
    """Yield a temp path beside `path`; on success it replaces `path`, on error it is removed.

    An OSError on the way (creating the directory or temp file, writing, replacing) is re-raised as one
    `WriteError` line naming `path`; the previous version of `path`, if any, is untouched."""
    path = Path(path)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        os.close(fd)
        yield tmp
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except OSError as e:
        raise write_error(e, "writing", path) from e
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.remove(tmp)


def atomic_write(path: str | os.PathLike, data: bytes | str) -> None:
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)


def check_output_dir(path: str | os.PathLike, flag: str = "--out") -> Path:
    """`path` if a writer can create it (or write into it), else a one-line ValueError naming why.

    Nothing is created: the check walks up to the nearest existing ancestor (where the writer's
    `mkdir(parents=True)` would start) and creates and removes one probe file there. A probe rather
    than `os.access`, because root passes every permission-bit check yet still cannot write to a
    read-only mount or a pseudo-filesystem such as /proc or /sys.
    """
    p = Path(path)
    try:
        if os.path.lexists(p) and not p.is_dir():
            raise ValueError(f"{flag} {p} exists and is not a directory; give a new or existing directory")
        nearest = p
        while not os.path.lexists(nearest):
            nearest = nearest.parent
    except PermissionError as e:
        raise ValueError(f"{flag} {p} cannot be checked ({e.strerror}); give a directory you can write to") from None
    if not nearest.is_dir():
        raise ValueError(f"{flag} {p} is under {nearest}, which is not a directory; give a directory path")
    try:
        fd, probe = tempfile.mkstemp(dir=nearest, prefix=".timbench-probe.")
    except OSError as e:
        raise ValueError(
            f"{flag} {p} is not writable (creating a file in {nearest}: {e.strerror}); "
            "give a directory you can write to"
        ) from None
    try:  # one byte too: a 100%-full disk still creates an empty file (a free inode) but refuses any data
        os.write(fd, b"\0")
        os.fsync(fd)
    except OSError as e:
        raise ValueError(
            f"{flag} {p} is not writable (writing in {nearest}: {e.strerror}); free space or give another directory"
        ) from None
    finally:
        os.close(fd)
        os.remove(probe)
    return p
