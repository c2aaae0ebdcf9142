"""The import graph inside tasks/ has no circle (issue 24 item 5): Problem lives in tasks/problem.py, so
tasks/base.py and tasks/io.py no longer import each other."""

import ast
from pathlib import Path

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
