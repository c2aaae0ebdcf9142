"""A wall-clock limit on each call into third-party remedy code, so a plug-in that never returns fails its run.

The grid's per-cell timeout (runners.local.cell_timeouts) bounds a whole cell; this bounds one call of a
plug-in's hooks (`__call__`, `update_keep`) inside a step, which is what a bare `timbench train` has. Built-in
remedies (classes defined under `timbench.`) are called directly: their cost is known and tested.

The limit is a SIGALRM timer, so it applies in a process's main thread (the CLI, a local-backend worker);
elsewhere the call runs unbounded and the cell timeout is the bound. The handler raises between Python
bytecodes. A plug-in can catch that (or ignore the signal), so the limit escalates: a call that returns after
its limit fails all the same, and a watchdog thread ends the whole process (`os._exit`, after writing the
files the run's `last_words` name: status failed, error.txt) when the call is still running GRACE_S later;
that also ends a plug-in stuck in a native call that releases the GIL. A native call that keeps the GIL stops
that thread too, so a watchdog process (remedies.watchdog) writes the same files and SIGKILLs the process
KILL_AFTER_S later (the process then ends by the signal, not with exit status 1).

The error is a RuntimeError, not a TimeoutError (an OSError), because the CLI reads OSError as a refused
write: a hung plug-in is a failed run (exit 1, traceback in OUT/error.txt), not bad input. Any other exception
out of a plug-in's hook (SystemExit, an OSError, a KeyError) becomes a PluginError for the same reason: the
plug-in's bug, not the command's input.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from contextlib import contextmanager

from ..util.atomic import atomic_write
from .watchdog import Watchdog

PLUGIN_CALL_TIMEOUT_S = 300.0
"""Default limit of one plug-in hook call in seconds. A step's batch holds a few thousand tokens at most and
every built-in takes well under 0.1 s on it, so 300 s only ever ends a call that hangs."""
GRACE_S = 5.0
"""How long a plug-in call may outlive its limit (having caught the timeout) before its process is ended."""
KILL_AFTER_S = 5.0
"""How long after the watchdog thread's turn the watchdog process kills a process whose plug-in holds the GIL
(the thread's turn first, so a plug-in that lets Python run ends as before, with exit status 1)."""
EXIT_KILLED = 1
"""The exit status of a process the watchdog ends: a failed run, as `timbench train` reports one."""


class PluginTimeout(RuntimeError):
    """A plug-in remedy's hook ran past its limit."""


class PluginError(RuntimeError):
    """A plug-in remedy's hook raised (anything but KeyboardInterrupt): the plug-in's error, not bad input."""


_LAST_WORDS: list = []
"""Callables mapping the watchdog's one-line reason to the files to leave ({path: text}) when it ends the process
(a run's status := failed)."""
_WATCHDOG = Watchdog()


@contextmanager
def last_words(fn):
    """While the body runs, a watchdog that ends the process first writes the files `fn(reason)` names ({path:
    text}, e.g. status.json). `fn` only computes them: the watchdog process writes them from another process."""
    _LAST_WORDS.append(fn)
    try:
        yield
    finally:
        _LAST_WORDS.remove(fn)


def _will(reason: str) -> dict[str, str]:
    files: dict[str, str] = {}
    for fn in list(_LAST_WORDS):
        try:
            files.update({str(p): t for p, t in fn(reason).items()})
        except BaseException:  # noqa: BLE001 - the process ends regardless; what could be recorded is
            pass
    return files


def _end_process(reason: str) -> None:
    for path, text in _will(reason).items():
        try:
            atomic_write(path, text)
        except BaseException:  # noqa: BLE001 - the process ends regardless; what could be recorded was
            pass
    print(f"timbench: run failed: PluginTimeout: {reason}", file=sys.stderr, flush=True)
    os._exit(EXIT_KILLED)


def is_third_party(remedy) -> bool:
    """Whether `remedy`'s class is defined outside timbench (a file, module or entry-point plug-in)."""
    return not type(remedy).__module__.startswith("timbench.")


@contextmanager
def deadline(seconds: float, what: str):
    """Raise PluginTimeout in the body after `seconds` of wall clock (0: no limit; no-op off the main thread or
    when another interval timer is already running, which this must not replace); end the process GRACE_S
    later if the body still runs, and raise PluginTimeout after a body that returned past its limit."""
    if (
        not seconds
        or threading.current_thread() is not threading.main_thread()
        or signal.getitimer(signal.ITIMER_REAL)[0] > 0
    ):
        yield
        return
    message = (
        f"{what} did not return within {seconds:g} s (the plug-in call limit: "
        f"timbench train --plugin-timeout SECONDS sets it, 0 = none)"
    )
    expired, returned = threading.Event(), threading.Event()

    def expire(signum, frame):
        expired.set()
        raise PluginTimeout(message)

    def watchdog():  # the plug-in caught the timeout or blocked the signal: end the process
        if not returned.wait(seconds + GRACE_S):
            _end_process(f"{message}; it ignored the stop for {GRACE_S:g} s more, so the process was ended")

    held = (
        f"{message}; it held the interpreter (a native call keeping the GIL) for "
        f"{GRACE_S + KILL_AFTER_S:g} s more, so the process was killed"
    )
    _WATCHDOG.arm(seconds + GRACE_S + KILL_AFTER_S, held, _will(held))
    previous = signal.signal(signal.SIGALRM, expire)
    threading.Thread(target=watchdog, daemon=True, name="plugin-deadline").start()
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        returned.set()
        _WATCHDOG.disarm()
    if expired.is_set():  # the plug-in caught the timeout and returned anyway: the call still failed
        raise PluginTimeout(message)


def call_hook(remedy, hook: str, *args, limit_s: float = PLUGIN_CALL_TIMEOUT_S):
    """`remedy(*args)` (hook "__call__") or `remedy.<hook>(*args)`; a third-party remedy's within `limit_s`, its
    exceptions (but a Ctrl-C) as PluginError naming the remedy and hook."""
    fn = remedy if hook == "__call__" else getattr(remedy, hook)
    if not is_third_party(remedy):
        return fn(*args)
    what = f"remedy {remedy.name}: {hook}"
    try:
        with deadline(limit_s, what):
            return fn(*args)
    except (PluginTimeout, KeyboardInterrupt):
        raise
    except BaseException as e:  # SystemExit(0) too: a plug-in cannot end a run as a success
        msg = " ".join(str(e).split())
        raise PluginError(
            f"{what} raised {type(e).__name__}"
            + (f": {msg}" if msg else "")
            + " (the plug-in's error, not the command's)"
        ) from e
