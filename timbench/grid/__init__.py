"""Grids of RL runs: the spec (axes x conditions), its expansion into cells, the cost model and the layout."""

from .conditions import KINDS, Condition, load_conditions
from .spec import AXES, Axes, Cell, GridSpec, expand, load_grid

__all__ = ["KINDS", "Condition", "load_conditions", "AXES", "Axes", "Cell", "GridSpec", "expand", "load_grid"]
