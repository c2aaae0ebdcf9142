"""Lazy package exports: a package's public names imported on first use, not at `import package`.

The CLI registers every subcommand's parser by importing `timbench.<pkg>.cli`, which imports the package
first; packages whose public names need torch/numba export them through `lazy_exports` so that
`timbench --help` and argument errors answer without loading either (about 4 s of imports).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable


def lazy_exports(package: str, exports: dict[str, list[str]]) -> tuple[Callable, Callable]:
    """Return (`__getattr__`, `__dir__`) for `package` that import `exports[submodule]` names on first access.

    `exports` maps a relative submodule (".run") to the names it provides; the package sets `__all__` to
    every name, so `from package import name` and `dir(package)` behave as with eager imports.
    """
    where = {name: sub for sub, names in exports.items() for name in names}

    def __getattr__(name: str):
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(where[name], package), name)

    def __dir__() -> list[str]:
        return sorted(where)

    return __getattr__, __dir__
