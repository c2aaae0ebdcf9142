"""Run `diagnose` over named conditions of the condition table on several models; write JSON, Markdown, figures.

A table (`bench/diagnose.yaml`) names models (a preset, a checkpoint directory or
a shipped warm start such as `add-4d-v1-tiny-dense`) and conditions of
`timbench/grid/conditions.yaml`. MoE-kind conditions run on MoE models only;
vLLM conditions are skipped (and listed) where vLLM is not installed. Results
are written atomically after every condition and a rerun skips what is done.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from ..grid.conditions import load_conditions
from ..grid.spec import SHIPPED_CONDITIONS
from ..model import load_model
from ..util.atomic import atomic_write
from ..util.readfile import read_yaml
from ..util.shipped import available_checkpoints, default_checkpoint
from .figures import draw_all
from .run import diagnose

_KEYS = {"models", "seed", "conditions", "batches"}


def resolve_model(name: str) -> str:
    """A path as is; a shipped warm-start name (`add-4d-v1-tiny-dense`) to its directory; else a preset."""
    if Path(name).exists() or name not in available_checkpoints():
        return name
    task, _, preset = name.rpartition("-tiny-")
    return str(default_checkpoint(task, "tiny-" + preset))


def read_table(path) -> dict:
    p = Path(path)
    t = read_yaml(p, "diagnose table") or {}
    if not isinstance(t, dict) or set(t) - _KEYS:
        raise ValueError(f"{p}: a diagnose table is a mapping with keys {sorted(_KEYS)}")
    known = load_conditions(SHIPPED_CONDITIONS)
    names = list(t.get("conditions") or [])
    bad = [n for n in names if n not in known]
    if bad:
        raise ValueError(f"{p}: unknown condition(s) {bad}; valid: {', '.join(known)}")
    from ..grid.same_run import refuse_repeats

    refuse_repeats(names, "condition", str(p))
    refuse_repeats(t.get("models") or [], "model", str(p))
    return {**t, "conditions": [known[n] for n in names]}


def run_table(path, out, progress=print) -> list[dict]:
    t = read_table(path)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    res = out / f"{Path(path).stem}.json"
    rows = json.loads(res.read_text()) if res.is_file() else []
    done = {(r["model_name"], r["condition"]) for r in rows}
    seed = int(t.get("seed", 0))
    kw = {"batches": tuple(t["batches"])} if "batches" in t else {}
    skipped = []
    has_vllm = importlib.util.find_spec("vllm") is not None
    for model_name in t.get("models", ["tiny-dense"]):
        model = load_model(resolve_model(model_name), seed=seed)
        for c in t["conditions"]:
            if (c.kind == "moe" and not model.config.is_moe) or (c.kind == "vllm" and not has_vllm):
                skipped.append(f"{model_name}: {c.name} ({'needs MoE' if c.kind == 'moe' else 'vLLM not installed'})")
                continue
            if (model_name, c.name) in done:
                continue
            r = diagnose(model, c.engine_spec, c.trainer_spec, seed=seed, **kw)
            rows.append({"model_name": model_name, "condition": c.name, **r})
            atomic_write(res, json.dumps(rows, indent=1, sort_keys=True) + "\n")
            a = r["attribution"]
            progress(
                f"{model_name:22s} {c.name:18s} gap_rms={a['gap']['rms']:.3g} "
                f"e_eng={a['e_engine']['rms']:.3g} e_tr={a['e_trainer']['rms']:.3g} best={a['best_model']}"
            )
    for model_name in t.get("models", ["tiny-dense"]):
        mine = [(r["condition"], r) for r in rows if r["model_name"] == model_name]
        if mine:
            draw_all(mine, out / model_name)
    atomic_write(out / f"{Path(path).stem}.md", to_markdown(rows, path, skipped))
    return rows


def _g(x, fmt=".3g"):
    return "-" if x is None else format(x, fmt)


def to_markdown(rows, source, skipped=()) -> str:
    lines = [
        f"Diagnosis table from `{source}` (regenerate: `timbench diagnose --table {source} --out DIR`). "
        "Errors are logprob differences against the float64 exact-kernel reference; rms over all sampled tokens.",
        "",
        "| model | condition | tokens | rms e_engine | rms e_trainer | rms gap | corr | gap^2/(e^2+t^2) | "
        "best model | gap^2 share p<0.1 | flip rate | first differing level | top one-side key (gap share) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---|---|",
    ]
    for r in rows:
        a, v = r["attribution"], r["views"]
        low = sum(b["gap_sq_share"] or 0.0 for b in v["probability"][:4])  # buckets below p = 0.1
        keys = [k for k in r.get("keys", {}).get("keys", []) if k["gap_share"]]
        top = max(keys, key=lambda k: k["gap_share"]) if keys else None
        topk = f"{top['side']}:{top['key']} ({top['gap_share']:.2f})" if top else "-"
        first = r.get("layers", {}).get("most_common_first_level") or "none"
        lines.append(
            f"| {r['model_name']} | {r['condition']} | {r['tokens']} | {_g(a['e_engine']['rms'])} | "
            f"{_g(a['e_trainer']['rms'])} | {_g(a['gap']['rms'])} | {_g(a['correlation'], '.3f')} | "
            f"{_g(a['quadrature_ratio'], '.3f')} | {a['best_model'] or '-'} | "
            f"{low:.2f} | {_g(v['argmax_flip_rate'], '.4f')} | {first} | {topk} |"
        )
    if skipped:
        lines += ["", "Skipped: " + "; ".join(skipped) + "."]
    return "\n".join(lines) + "\n"
