"""Problems <-> `datasets.Dataset`, and split files on disk (.parquet, .jsonl).

The dataset schema is fixed: string columns `prompt`, `answer`, `task`, `meta`,
`solution`, with `meta` as a JSON string so the schema does not depend on what
each task keeps in its meta dict. Files are read into memory (pyarrow / json)
rather than through `load_dataset`, so loading never writes a cache directory.
Writes are atomic: a temporary file in the target directory, then `os.replace`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from timbench.util.atomic import atomic_path

from .problem import Problem

COLUMNS = ("prompt", "answer", "task", "meta", "solution")
SPLIT_EXTENSIONS = (".parquet", ".jsonl")
READ_EXTENSIONS = (".parquet", ".jsonl", ".json")


def _meta_json(meta: dict) -> str:
    # default=str keeps odd values (dates, numpy scalars from real files) writable.
    return json.dumps(meta, sort_keys=True, ensure_ascii=False, default=str)


def problem_row(p: Problem) -> dict[str, str]:
    return {"prompt": p.prompt, "answer": p.answer, "task": p.task, "meta": _meta_json(p.meta), "solution": p.solution}


def to_dataset(problems: Iterable[Problem]):
    """A `datasets.Dataset` with the fixed string schema."""
    import datasets

    rows = [problem_row(p) for p in problems]
    features = datasets.Features({c: datasets.Value("string") for c in COLUMNS})
    return datasets.Dataset.from_dict({c: [r[c] for r in rows] for c in COLUMNS}, features=features)


def problems_from_dataset(ds) -> list[Problem]:
    """Inverse of `to_dataset` (accepts a Dataset or a list of row dicts)."""
    out = []
    for row in ds:
        meta = row.get("meta") or "{}"
        out.append(
            Problem(
                prompt=row["prompt"],
                answer=row["answer"],
                task=row["task"],
                meta=json.loads(meta) if isinstance(meta, str) else dict(meta),
                solution=row.get("solution") or "",
            )
        )
    return out


def _check_ext(path: Path, allowed: tuple[str, ...]) -> str:
    ext = path.suffix.lower()
    if ext not in allowed:
        raise ValueError(f"{path}: unsupported file extension {ext or '(none)'!r}; use one of {', '.join(allowed)}")
    return ext


def save_split(data, path: str | os.PathLike) -> Path:
    """Write a Dataset or a list of Problems to `path` (.parquet or .jsonl), atomically."""
    path = Path(path)
    ext = _check_ext(path, SPLIT_EXTENSIONS)
    ds = data if hasattr(data, "column_names") else to_dataset(data)
    missing = [c for c in COLUMNS if c not in ds.column_names]
    if missing:
        raise ValueError(f"dataset lacks columns {missing}; expected {list(COLUMNS)}")
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        if ext == ".parquet":
            ds.to_parquet(tmp)
        else:
            with open(tmp, "w", encoding="utf-8") as f:
                for row in ds:
                    f.write(json.dumps({c: row[c] for c in ds.column_names}, ensure_ascii=False) + "\n")
    return path


def read_records(path: str | os.PathLike) -> tuple[list[str], list[dict[str, Any]]]:
    """(column names, rows) of a .parquet, .jsonl or .json (array or JSON lines) file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    ext = _check_ext(path, READ_EXTENSIONS)
    if ext == ".parquet":
        import pyarrow.parquet as pq

        table = pq.read_table(path)
        return list(table.column_names), table.to_pylist()
    text = path.read_text(encoding="utf-8")
    try:
        if ext == ".json" and text.lstrip().startswith("["):
            rows = json.loads(text)
        else:
            rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None
    if not all(isinstance(r, dict) for r in rows):
        raise ValueError(f"{path}: every record must be a JSON object")
    columns: list[str] = []
    for r in rows:
        columns.extend(k for k in r if k not in columns)
    return columns, rows


def load_split(path: str | os.PathLike):
    """Read a split written by `save_split` back into a `datasets.Dataset`."""
    import datasets

    path = Path(path)
    _check_ext(path, SPLIT_EXTENSIONS)
    columns, rows = read_records(path)
    missing = [c for c in COLUMNS if c not in columns]
    if missing:
        raise ValueError(f"{path}: missing columns {missing}; found {columns}, expected {list(COLUMNS)}")
    features = datasets.Features({c: datasets.Value("string") for c in COLUMNS})
    return datasets.Dataset.from_dict({c: [r.get(c) for r in rows] for c in COLUMNS}, features=features)
