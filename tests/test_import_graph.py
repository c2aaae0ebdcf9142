"""The import graph inside tasks/ has no circle: Problem lives in tasks/problem.py, so
tasks/base.py and tasks/io.py no longer import each other."""

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit  # builds no model (make test-unit)

TASKS = Path(__file__).resolve().parents[1] / "tasks"


def _local_imports(path: Path) -> set[str]:
    """Sibling modules of tasks/ that `path` imports (relative imports, at any depth in the file)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            out.add(node.module.split(".")[0] if node.module else "__init__")
    return out


def test_tasks_has_no_import_cycle():
    graph = {p.stem: _local_imports(p) - {"__init__"} for p in TASKS.glob("*.py") if p.stem != "__init__"}
    assert "problem" in graph and not graph["problem"], "tasks/problem.py imports no sibling"

    def reach(start, node, seen):
        for nxt in graph.get(node, ()):
            if nxt == start:
                return True
            if nxt not in seen:
                seen.add(nxt)
                if reach(start, nxt, seen):
                    return True
        return False

    cycles = [m for m in graph if reach(m, m, set())]
    assert not cycles, f"tasks/ modules on an import circle: {cycles}"


ROOT = Path(__file__).resolve().parents[1]
LIBRARY = ROOT / "timbench"


def _imported_modules(path: Path, package: list[str]) -> set[str]:
    """Absolute names of every module `path` (in `package`) imports, at any depth (function-local ones too)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            mod = ".".join(base + ([node.module] if node.module else []))
            out.add(mod)
            out.update(f"{mod}.{a.name}" for a in node.names)  # `from .. import runners`
    return out


def test_the_library_never_imports_the_runners_or_the_command_layer():
    """Runners sit above the library and the command layer (timbench/cli/) above both: only timbench/cli/ imports
    the runners (it hands `grid run`, `submit` and `track run` a backend), and nothing below imports timbench.cli;
    everything else gets what it runs passed in."""
    offenders = sorted(
        f"{p.relative_to(ROOT)} imports {m}"
        for p in LIBRARY.rglob("*.py")
        if p.relative_to(LIBRARY).parts[0] != "cli"
        for m in _imported_modules(p, ["timbench", *p.relative_to(LIBRARY).parent.parts])
        if m.startswith(("timbench.runners", "timbench.cli")) and m.split(".")[1] in ("runners", "cli")
    )
    assert not offenders, offenders
    runner_side = sorted(
        f"{p.relative_to(ROOT)} imports {m}"
        for p in (ROOT / "runners").rglob("*.py")
        for m in _imported_modules(p, ["timbench", "runners", *p.relative_to(ROOT / "runners").parent.parts])
        if m == "timbench.cli" or m.startswith("timbench.cli.")
    )
    assert not runner_side, runner_side


def test_the_import_scan_sees_relative_and_function_local_imports(tmp_path):
    # The check above must be able to fail: a function-local relative import of the runners is seen.
    f = tmp_path / "probe.py"
    f.write_text("def f():\n    from ..runners.driver import run_cells\n    from .. import runners\n")
    found = _imported_modules(f, ["timbench", "submit"])
    assert {"timbench.runners.driver", "timbench.runners"} <= found
