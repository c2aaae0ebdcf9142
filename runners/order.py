"""The order in which `grid run` runs a grid's cells: scheduling only, never a cell's bytes.

Kept apart from the driver so that the command line can list the orders without importing the grid machinery
(`timbench --help` stays torch-free).
"""

from __future__ import annotations

ORDERS = {
    "axes": "the grid's axis order (task outermost, seed innermost): one setting's seeds finish together",
    "seeds": "seed-major: every setting's seed 0 before any seed 1, so a campaign stopped part-way holds every "
    "setting at equal seed counts",
}
"""The orders `grid run --order` runs the cells of a grid in; an order changes when a cell runs, never its bytes."""


def order_cells(todo: list[dict], order: str) -> list[dict]:
    """`todo` in `order` (a key of ORDERS); stable, so ties keep the grid's axis order."""
    if order not in ORDERS:
        raise ValueError(f"unknown order {order!r}; valid: {', '.join(ORDERS)}")
    if order == "seeds":
        return sorted(todo, key=lambda c: c["axes"]["seed"])
    return list(todo)
