"""`timbench gate`: a versioned suite of engine probes for regression-testing a framework release.

`suite` loads bench/gates/<name>.yaml, `probes` holds the probes, `run` runs a suite on one engine spec and
records what was tested, `check` compares a candidate with a baseline, `matrix` tables several releases'
runs, `cli` is the command. The fault
library the gate is proven on is `timbench.spec.faults` (engine spec key `fault=`).
"""

from ..util.lazy import lazy_exports

_EXPORTS = {".run": ["run_gate"], ".check": ["check", "load_report"], ".suite": ["load_suite"]}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = [n for names in _EXPORTS.values() for n in names]
