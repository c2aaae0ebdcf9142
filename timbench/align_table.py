"""Run `align` over a table of (model, engine spec, trainer spec) conditions; write JSON and Markdown.

Results are written atomically after every row, in table order, and a rerun skips conditions already
in the JSON file (so an interrupted table resumes instead of starting over). `workers` > 1 runs rows in
that many spawned processes, each with cores // workers threads: a row's numbers do not depend on which
process ran it (exact rows are bitwise thread-invariant; torch rows are measured at that thread count).
"""

from __future__ import annotations

import json
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

from .align import ENGINE_BATCHES, align
from .eta import Eta
from .model import load_model
from .spec.keys import parse_spec
from .util import manifest
from .util.atomic import atomic_write
from .util.readfile import read_yaml
from .util.threads import set_threads

_KEYS = {"models", "seed", "conditions", "batches"}
_COND_KEYS = {"name", "engine", "trainer", "models", "kind"}


def read_table(path: str | Path) -> dict:
    p = Path(path)
    t = read_yaml(p, "align table") or {}
    if not isinstance(t, dict):
        raise ValueError(f"{p}: an align table is a mapping with keys {sorted(_KEYS)}")
    unknown = set(t) - _KEYS
    if unknown:
        raise ValueError(f"{p}: unknown key(s) {sorted(unknown)}; valid: {sorted(_KEYS)}")
    conditions = []
    for c in t.get("conditions", []):
        bad = set(c) - _COND_KEYS
        if bad or "name" not in c:
            raise ValueError(
                f"{p}: condition {c!r} needs name, engine, trainer, optional models and kind (unknown: {sorted(bad)})"
            )
        # Parsed once here; the probe gets Spec objects.
        conditions.append(
            {
                **c,
                "engine": parse_spec(c.get("engine"), f"{p}: {c['name']}: engine", side="engine"),
                "trainer": parse_spec(c.get("trainer"), f"{p}: {c['name']}: trainer", side="trainer"),
            }
        )
    from .grid.same_run import refuse_repeats

    refuse_repeats([c["name"] for c in conditions], "condition", str(p))
    refuse_repeats(t.get("models") or [], "model", str(p))
    return {**t, "conditions": conditions}


def _worker_init(threads: int) -> None:
    set_threads(threads)


_MODELS: dict = {}  # per process: a model is loaded once for all the rows it serves


def _row(model_name: str, seed: int, c: dict, batches: tuple) -> dict:
    """One table row: `align` of condition `c` on `model_name` (a worker process's task, or inline)."""
    if (model_name, seed) not in _MODELS:
        _MODELS.clear()  # one model at a time is enough: rows come model by model
        _MODELS[(model_name, seed)] = load_model(model_name, seed=seed)
    r = align(_MODELS[(model_name, seed)], c["engine"], c["trainer"], seed=seed, batches=batches)
    return {"model_name": model_name, "condition": c["name"], **r, **({"kind": c["kind"]} if "kind" in c else {})}


def run_table(path: str | Path, out: str | Path, progress=print, workers: int = 1) -> list[dict]:
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    t = read_table(path)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    res_path = out / f"{Path(path).stem}.json"
    rows = json.loads(res_path.read_text()) if res_path.is_file() else []
    done = {(r["model_name"], r["condition"]) for r in rows}
    seed = int(t.get("seed", 0))
    batches = tuple(t.get("batches", ENGINE_BATCHES))
    models = t.get("models", ["tiny-dense"])
    table = [(m, c) for m in models for c in t["conditions"] if m in c.get("models", [m])]
    place = {(m, c["name"]): i for i, (m, c) in enumerate(table)}
    todo = [(m, c) for m, c in table if (m, c["name"]) not in done]
    eta = Eta(len(todo))
    workers = min(workers, max(1, len(todo)))
    if todo:
        progress(
            f"align table {path}: {len(todo)} rows to run ({len(rows)} already in {res_path})"
            + (f", {workers} workers" if workers > 1 else "")
        )

    def finish(row: dict) -> None:
        rows.append(row)
        rows.sort(key=lambda r: place.get((r["model_name"], r["condition"]), len(place)))
        atomic_write(res_path, json.dumps(rows, indent=1, sort_keys=True) + "\n")
        progress(
            f"[row {eta.tick()}] {row['model_name']:11s} {row['condition']:55s} "
            f"max|d|={row['max_abs_diff']:.3g} k3={row['k3_kl']:.3g}"
        )

    if workers == 1:
        for m, c in todo:
            finish(_row(m, seed, c, batches))
    else:
        threads = max(1, (os.cpu_count() or 1) // workers)
        with ProcessPoolExecutor(
            workers, mp_context=multiprocessing.get_context("spawn"), initializer=_worker_init, initargs=(threads,)
        ) as pool:
            futures = [pool.submit(_row, m, seed, c, batches) for m, c in todo]
            for f in as_completed(futures):
                finish(f.result())
    _MODELS.clear()
    atomic_write(out / f"{Path(path).stem}.md", to_markdown(rows, path))
    if any("kind" in r for r in rows):  # a table that names kinds gets its |delta| axis figure
        from .report.figures.align import save_delta_axis  # deferred: matplotlib is heavy

        save_delta_axis(rows, out / f"{Path(path).stem}.png", f"timbench align --table {path}")
    # last: the table's files in the dir's manifest (a reader refuses an edited one; a table killed half-way fails)
    manifest.update(out, [f"{Path(path).stem}{ext}" for ext in (".json", ".md", ".png")])
    return rows


def to_markdown(rows: list[dict], source) -> str:
    lines = [
        f"Alignment table from `{source}` (regenerate: `timbench align --table {source} --out DIR`).",
        "",
        "| model | condition | tokens | max abs diff | mean abs diff | frac differ | k3_kl | routing agree |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        ra = f"{r['routing_agreement']:.4f}" if "routing_agreement" in r else "-"
        lines.append(
            f"| {r['model_name']} | {r['condition']} | {r['tokens']} | {r['max_abs_diff']:.3g} | "
            f"{r['mean_abs_diff']:.3g} | {r['frac_tokens_differ']:.3f} | {r['k3_kl']:.3g} | {ra} |"
        )
    return "\n".join(lines) + "\n"
