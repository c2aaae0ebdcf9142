"""A wall-clock limit on each call into third-party remedy code, so a plug-in that never returns fails its run.

The grid's per-cell timeout (runners.local.cell_timeouts) bounds a whole cell; this bounds one call of a
plug-in's hooks (`__call__`, `update_keep`) inside a step, which is what a bare `timbench train` has. Built-in
remedies (classes defined under `timbench.`) are called directly: their cost is known and tested.

The limit is a SIGALRM timer, so it applies in a process's main thread (the CLI, a local-backend worker);
elsewhere the call runs unbounded and the cell timeout is the bound. The handler raises between Python
bytecodes, so a plug-in stuck inside one native call (a torch op that never returns) is stopped by the cell
timeout instead. The error is a RuntimeError, not a TimeoutError (an OSError), because the CLI reads OSError
as a refused write: a hung plug-in is a failed run (exit 1, traceback in OUT/error.txt), not bad input.
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager

PLUGIN_CALL_TIMEOUT_S = 300.0
"""Default limit of one plug-in hook call in seconds. A step's batch holds a few thousand tokens at most and
every built-in takes well under 0.1 s on it, so 300 s only ever ends a call that hangs."""


class PluginTimeout(RuntimeError):
    """A plug-in remedy's hook ran past its limit."""


def is_third_party(remedy) -> bool:
    """Whether `remedy`'s class is defined outside timbench (a file, module or entry-point plug-in)."""
    return not type(remedy).__module__.startswith("timbench.")


@contextmanager
def deadline(seconds: float, what: str):
    """Raise PluginTimeout in the body after `seconds` of wall clock (0: no limit; no-op off the main thread or
    when another interval timer is already running, which this must not replace)."""
    if not seconds or threading.current_thread() is not threading.main_thread() \
            or signal.getitimer(signal.ITIMER_REAL)[0] > 0:
        yield
        return

    def expire(signum, frame):
        raise PluginTimeout(f"{what} did not return within {seconds:g} s (the plug-in call limit: "
                            f"timbench train --plugin-timeout SECONDS sets it, 0 = none)")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def call_hook(remedy, hook: str, *args, limit_s: float = PLUGIN_CALL_TIMEOUT_S):
    """`remedy(*args)` (hook "__call__") or `remedy.<hook>(*args)`; a third-party remedy's within `limit_s`."""
    fn = remedy if hook == "__call__" else getattr(remedy, hook)
    if not is_third_party(remedy):
        return fn(*args)
    with deadline(limit_s, f"remedy {remedy.name}: {hook}"):
        return fn(*args)
