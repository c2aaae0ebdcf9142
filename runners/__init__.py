"""Grid runners (installed as `timbench.runners`): run the cells of a grid locally or on Ray.

`BACKENDS` maps a backend name to the function that runs a list of cells; each
has the signature `fn(cells, out, workers, address, progress) -> list[status]`
and is imported only when chosen (Ray is an optional extra).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from timbench.util.registry import Registry

BACKENDS: Registry[str] = Registry(
    "backend", {"local": "timbench.runners.local:run_local", "ray": "timbench.runners.ray_runner:run_ray"}
)


def get_backend(name: str) -> Callable:
    module, _, fn = BACKENDS.lookup(name).partition(":")
    return getattr(importlib.import_module(module), fn)
