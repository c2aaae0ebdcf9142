"""Summarise pytest-benchmark JSON files into results/bench/summary.md.

    python bench/summarize.py [FILES...] [--out results/bench/summary.md]

Default input: every results/bench/*.json. Runs of the same configuration in
several files (repeats: engine.json, engine.2.json, ...) are pooled: a
configuration's time is the median over runs of each run's median round, and
the ratio column is exact_time / torch_time from those pooled medians; the
spread column gives the lowest and highest per-run ratio (both kernel sets from
the same file), which shows how much machine load moved the numbers. Engine
rows measured with vLLM as well (`kernels` = vllm) add a vLLM tok/s column and
exact_time / vllm_time, the median over files holding both (same machine load).
Every row has a target (exact kernels no slower than PyTorch: exact/torch <= 1.0 for the trainer and the RL
step, <= 0.9 for the engine); the ratios are also printed one per line, marked met
or missed.
"""

from __future__ import annotations

import argparse
import glob
import json
import statistics
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DIR = ROOT / "results" / "bench"
# exact time / torch time each bench should stay under: exact and no slower than plain PyTorch.
TARGETS = {"trainer": 1.0, "rl_step": 1.0, "engine": 0.9}


def load(paths):
    """-> {config key: {kernels: [(file, median_s, tokens)]}}, plus run metadata per file."""
    runs, meta = defaultdict(lambda: defaultdict(list)), {}
    for p in paths:
        data = json.loads(Path(p).read_text())
        for b in data.get("benchmarks", []):
            info = b.get("extra_info", {})
            if "bench" not in info or "kernels" not in info or "tokens" not in info:  # others: not ours
                continue
            key = (info["bench"], info.get("model", "?"), info.get("batch", "-"), info.get("dtype", "-"))
            runs[key][info["kernels"]].append((str(p), b["stats"]["median"], int(info["tokens"])))
            meta[str(p)] = {
                k: info.get(k)
                for k in ("torch_threads", "numba_threads", "numba_threading_layer", "torch_version", "numba_version")
            }
            meta[str(p)]["datetime"] = data.get("datetime", "?")
            meta[str(p)]["cpu"] = cpu_kind(data.get("machine_info", {}).get("cpu", {}))
    return runs, meta


KINDS_ASKED = ("Intel with AVX-512", "AMD")
"""The CPU kinds the targets are asked on (a result on one kind is not a result on another)."""


def cpu_kind(cpu: dict) -> str:
    """'BRAND (vendor family F model M), ISA' from py-cpuinfo's dict: the ISA the native tiles pick (AVX-512 when
    avx512f, +AMX when amx_tile; else AVX2 or SSE2), which decides the speed ratios more than the brand string."""
    flags = set(cpu.get("flags", []))
    isa = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "SSE2" if flags else "?"
    if "amx_tile" in flags:
        isa += "+AMX"
    vendor = {"AuthenticAMD": "AMD", "GenuineIntel": "Intel"}.get(cpu.get("vendor_id_raw", ""), "?")
    fam = f" ({vendor} family {cpu['family']} model {cpu['model']})" if "family" in cpu and "model" in cpu else ""
    return f"{cpu.get('brand_raw', '?')}{fam}, {isa}"


def kinds_line(meta) -> str:
    """Which of the asked CPU kinds these runs cover, and which are missing."""
    seen = sorted({m["cpu"] for m in meta.values()})
    have = {
        k
        for k in KINDS_ASKED
        for c in seen
        if (k == "AMD" and "(AMD " in c) or (k == "Intel with AVX-512" and "(Intel " in c and "AVX-512" in c)
    }
    missing = [k for k in KINDS_ASKED if k not in have]
    return (
        f"CPU kinds in these runs: {'; '.join(seen) or 'none'}. Asked: {'; '.join(KINDS_ASKED)}; "
        + (
            f"missing: {', '.join(missing)} (no such machine was available; the ratios here say nothing about it)."
            if missing
            else "none missing."
        )  # fmt: skip
    )


def summarize(runs) -> list[dict]:
    rows = []
    for key in sorted(runs, key=lambda k: (k[0], k[1], str(k[3]), str(k[2]).zfill(8))):
        by_k = runs[key]
        row = {"bench": key[0], "model": key[1], "batch": key[2], "dtype": key[3]}
        for k, rs in by_k.items():
            t = statistics.median(r[1] for r in rs)
            row[k] = {"time_s": t, "tokens": rs[0][2], "tokens_per_s": rs[0][2] / t, "runs": len(rs)}
        if "exact" in by_k and "torch" in by_k:
            row["ratio"] = row["exact"]["time_s"] / row["torch"]["time_s"]
            torch_by_file = {f: t for f, t, _ in by_k["torch"]}
            per_run = [t / torch_by_file[f] for f, t, _ in by_k["exact"] if f in torch_by_file]
            row["ratio_range"] = (min(per_run), max(per_run)) if per_run else None
        if "exact" in by_k and "vllm" in by_k:
            # Only exact runs measured next to vLLM (same file): pooling them with quiet-machine
            # exact runs would compare different loads.
            vllm_by_file = {f: t for f, t, _ in by_k["vllm"]}
            paired = [t / vllm_by_file[f] for f, t, _ in by_k["exact"] if f in vllm_by_file]
            if paired:
                row["ratio_vllm"] = statistics.median(paired)
        rows.append(row)
    return rows


def _fmt_tps(cell):
    return f"{cell['tokens_per_s']:,.0f}" if cell else "n/a"


def markdown(rows, meta) -> str:
    out = [
        "# timbench throughput benchmarks",
        "",
        "Generated by `bench/summarize.py` from pytest-benchmark JSON (see `bench/README.md`).",
        "Ratio = exact time / torch time for the same work (lower is better for exact; "
        f"target <= {TARGETS['trainer']} for trainer fwd+bwd and the RL step, <= {TARGETS['engine']} for the engine). "
        "Times are medians of rounds, pooled over runs by median.",
        "",
    ]
    vllm = any("vllm" in r for r in rows)
    extra_head, extra_rule = (" vllm tok/s | exact/vllm time |", "---:|---:|") if vllm else ("", "")
    out += [
        "| bench | model | batch | dtype | exact tok/s | torch tok/s | exact/torch time | per-run ratio range |"
        + extra_head
        + " runs |",
        "|---|---|---:|---|---:|---:|---:|---|" + extra_rule + "---:|",
    ]
    for r in rows:
        e, t, v = r.get("exact"), r.get("torch"), r.get("vllm")
        ratio = f"{r['ratio']:.2f}" if "ratio" in r else "n/a"
        rng = r.get("ratio_range")
        rng = f"{rng[0]:.2f}-{rng[1]:.2f}" if rng else "n/a"
        n = max((c["runs"] for c in (e, t, v) if c), default=0)
        extra = (
            (f" {_fmt_tps(v)} | {r['ratio_vllm']:.2f} |" if "ratio_vllm" in r else f" {_fmt_tps(v)} | n/a |")
            if vllm
            else ""
        )
        out.append(
            f"| {r['bench']} | {r['model']} | {r['batch']} | {r['dtype']} | {_fmt_tps(e)} | {_fmt_tps(t)} "
            f"| {ratio} | {rng} |{extra} {n} |"
        )
    out += [
        "",
        "Engine: tokens = generated tokens (batch x 64, prompt 10, one prefill + 63 decode steps per round). "
        "Trainer: tokens = 256 sequences x (10 prompt + 18 response), forward + backward. "
        "RL step: one step of bench/runs/baseline.yaml (rollout, recompute, updates, sync); "
        "tokens = sampled response tokens per step.",
        "",
        "## Targets",
        "",
        kinds_line(meta),
        "",
        *target_lines(rows),
        "",
        "## Runs",
        "",
        "| file | datetime | cpu | torch threads | numba threads | numba layer | torch | numba |",
        "|---|---|---|---:|---:|---|---|---|",
    ]
    for f, m in sorted(meta.items()):
        out.append(
            f"| {Path(f).name} | {m['datetime']} | {m['cpu']} | {m['torch_threads']} | {m['numba_threads']} "
            f"| {m['numba_threading_layer']} | {m['torch_version']} | {m['numba_version']} |"
        )
    return "\n".join(out) + "\n"


def target_lines(rows) -> list[str]:
    """One line per bench row with a target: its exact/torch ratio against the target."""
    out = []
    for r in rows:
        goal = TARGETS.get(r["bench"])
        if goal is None:
            continue
        where = f"{r['bench']} {r['model']} {r['batch']} {r['dtype']}"
        if "ratio" not in r:
            out.append(f"- {where}: exact/torch n/a (needs both kernel sets in one run), target <= {goal}")
        else:
            verdict = "met" if r["ratio"] <= goal else "MISSED"
            out.append(
                f"- {where}: exact/torch {r['ratio']:.2f} "
                f"({r['exact']['time_s']:.3f} s vs {r['torch']['time_s']:.3f} s), "
                f"target <= {goal}: {verdict}"
            )
    return out or ["- no rows with a target"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="*", help="pytest-benchmark JSON files (default: results/bench/*.json)")
    ap.add_argument("--out", default=str(DEFAULT_DIR / "summary.md"))
    args = ap.parse_args(argv)
    files = args.files or sorted(glob.glob(str(DEFAULT_DIR / "*.json")))
    if not files:
        raise SystemExit(f"no benchmark JSON files given or found in {DEFAULT_DIR}")
    runs, meta = load(files)
    text = markdown(summarize(runs), meta)
    Path(args.out).write_text(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
