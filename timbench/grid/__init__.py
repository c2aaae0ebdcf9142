"""Planning grids of RL runs: the spec (axes x conditions), its expansion into cells, the cost model and
the result layout (the single owner of cells.json and cell.json). Reports live in `timbench.report`,
runners in `timbench.runners`."""

from .conditions import KINDS, Condition, load_conditions
from .spec import AXES, Axes, Cell, GridSpec, expand, load_grid

__all__ = ["KINDS", "Condition", "load_conditions", "AXES", "Axes", "Cell", "GridSpec", "expand", "load_grid"]
