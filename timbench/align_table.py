"""Run `align` over a table of (model, engine spec, trainer spec) conditions; write JSON and Markdown.

Results are written atomically, and a rerun skips conditions already in the
JSON file (so an interrupted table resumes instead of starting over).
"""

from __future__ import annotations

import json
from pathlib import Path


from .align import ENGINE_BATCHES, align
from .atomic import atomic_write
from .eta import Eta
from .model import load_model
from .readfile import read_yaml
from .spec import parse_spec

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
            raise ValueError(f"{p}: condition {c!r} needs name, engine, trainer, optional models and kind "
                             f"(unknown: {sorted(bad)})")
        # Parsed once here; the probe gets Spec objects.
        conditions.append({**c, "engine": parse_spec(c.get("engine"), f"{p}: {c['name']}: engine", side="engine"),
                           "trainer": parse_spec(c.get("trainer"), f"{p}: {c['name']}: trainer", side="trainer")})
    return {**t, "conditions": conditions}


def run_table(path: str | Path, out: str | Path, progress=print) -> list[dict]:
    t = read_table(path)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    res_path = out / f"{Path(path).stem}.json"
    rows = json.loads(res_path.read_text()) if res_path.is_file() else []
    done = {(r["model_name"], r["condition"]) for r in rows}
    seed = int(t.get("seed", 0))
    batches = tuple(t.get("batches", ENGINE_BATCHES))
    models = t.get("models", ["tiny-dense"])
    todo = [(m, c) for m in models for c in t["conditions"]
            if (m, c["name"]) not in done and m in c.get("models", [m])]
    eta = Eta(len(todo))
    if todo:
        progress(f"align table {path}: {len(todo)} rows to run ({len(rows)} already in {res_path})")
    for model_name in models:
        mine = [c for m, c in todo if m == model_name]
        if not mine:
            continue
        model = load_model(model_name, seed=seed)
        for c in mine:
            r = align(model, c["engine"], c["trainer"], seed=seed, batches=batches)
            rows.append({"model_name": model_name, "condition": c["name"], **r,
                         **({"kind": c["kind"]} if "kind" in c else {})})
            atomic_write(res_path, json.dumps(rows, indent=1, sort_keys=True) + "\n")
            progress(f"[row {eta.tick()}] {model_name:11s} {c['name']:55s} max|d|={r['max_abs_diff']:.3g} "
                     f"k3={r['k3_kl']:.3g}")
    atomic_write(out / f"{Path(path).stem}.md", to_markdown(rows, path))
    if any("kind" in r for r in rows):  # a table that names kinds gets its |delta| axis figure
        from .report.plots_align import save_delta_axis
        save_delta_axis(rows, out / f"{Path(path).stem}.png", f"timbench align --table {path}")
    return rows


def to_markdown(rows: list[dict], source) -> str:
    lines = [f"Alignment table from `{source}` (regenerate: `timbench align --table {source} --out DIR`).", "",
             "| model | condition | tokens | max abs diff | mean abs diff | frac differ | k3_kl | routing agree |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        ra = f"{r['routing_agreement']:.4f}" if "routing_agreement" in r else "-"
        lines.append(f"| {r['model_name']} | {r['condition']} | {r['tokens']} | {r['max_abs_diff']:.3g} | "
                     f"{r['mean_abs_diff']:.3g} | {r['frac_tokens_differ']:.3f} | {r['k3_kl']:.3g} | {ra} |")
    return "\n".join(lines) + "\n"
