"""Planning grids of RL runs: the spec (axes x conditions), its expansion into cells, the cost model and
the result layout (the single owner of cells.json and cell.json). Reports live in `timbench.report`,
runners in `timbench.runners`."""

from ..util.lazy import lazy_exports

_EXPORTS = {
    ".conditions": ["KINDS", "Condition", "load_conditions"],
    ".spec": ["AXES", "Axes", "Cell", "GridSpec", "expand", "load_grid"],
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = [n for names in _EXPORTS.values() for n in names]
