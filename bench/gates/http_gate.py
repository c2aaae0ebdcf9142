"""The HTTP gate's wall time and its detection matrix on the HTTP path.

Gates an OpenAI-compatible server (by default the in-process fake server backed by timbench's exact engine, on
the shipped tiny dense checkpoint; or `--url URL --trainer DIR` for a running server, its key in OPENAI_API_KEY)
with the suite, timing the run; then with `--faults` once through the loopback fault proxy per fault
(`timbench.gate.fault_proxy`: each must fail the gate naming its probe), and `--clean-runs N` times through the
proxy without a fault, reseeded (suite seed + 1..N): a failure there is a false alarm. The stale-checkpoint fault
forwards completions to a server holding other weights: with the fake server, a second fake server on the shipped
small dense checkpoint (same tokenizer); with `--url`, the server `--stale-url` names (the fault is skipped
without it). With `--sync-dir DIR` (the server's own --model directory, a server started with
VLLM_SERVER_DEV_MODE=1) the weight-sync probe runs too: one direct run with `sync_dir=DIR` (its verdict is the
server's, reported beside the matrix, not a false alarm), and the `kept_prefix_cache` fault through the proxy
(every other run leaves weight sync not tested). Without it that fault is skipped, as with the fake server,
which keeps no prefix cache.

    python bench/gates/http_gate.py OUT_DIR [--suite smoke] [--faults] [--clean-runs N]
        [--url URL --trainer DIR [--stale-url URL] [--sync-dir DIR]]

OUT_DIR/<run>/gate.json and gate.md per run; OUT_DIR/detection.json and detection.md: per run its verdict, the
probes that failed, what the logprobs fit, and its wall time; the false-alarm count.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import time
from pathlib import Path

from timbench.gate.fake_server import FakeServer
from timbench.gate.fault_proxy import EXPECTED_PROBE, SYNC_FAULTS, FaultProxy
from timbench.gate.http_run import run_http_gate
from timbench.gate.suite import load_suite
from timbench.util.atomic import atomic_write
from timbench.util.shipped import default_checkpoint


def one(url: str, trainer: str, suite, out: Path, fault: str, stale: str | None = None, sync_dir=None) -> dict:
    t0 = time.perf_counter()
    where = out / (fault if fault != "none" else f"none-seed{suite.seed}")
    kw = {"stale": stale} if fault == "stale_checkpoint" else {}
    direct = fault in ("direct", "weight_sync")
    spec = ",sync_dir=" + str(sync_dir) if sync_dir else ""
    with FaultProxy(url, fault, **kw) if not direct else contextlib.nullcontext() as proxy:
        rep = run_http_gate(f"openai={proxy.url if proxy else url}{spec}", f"hf={trainer}", suite, where)
    failed = [r["probe"] for r in rep["probes"] if not r["passed"] and not r["not_tested"] and not r["error"]]
    erred = [f"{r['probe']}: {r['error']}" for r in rep["probes"] if r["error"]]
    sem = next((r for r in rep["probes"] if r["probe"] == "logprob_semantics"), {"numbers": {}})
    row = {
        "fault": fault,
        "seed": suite.seed,
        "gate_passed": not failed and not erred,
        "failed": failed,
        "erred": erred,
        "not_tested": [r["probe"] for r in rep["probes"] if r["not_tested"]],
        "fits": sem["numbers"].get("fits"),
        **sync_columns(rep),
        "wall_s": round(time.perf_counter() - t0, 1),
    }
    if fault in EXPECTED_PROBE:
        row["caught_by_expected"] = EXPECTED_PROBE[fault] in failed
    print(
        f"{fault} seed {suite.seed}: {'FAIL ' + ', '.join(failed) if failed else 'pass'}"
        f"{'; ERROR ' + '; '.join(erred) if erred else ''} ({row['wall_s']} s)"
    )
    return row


def sync_columns(rep: dict) -> dict:
    """The weight-sync row's verdict where it ran: what the logprobs fit after the sync, and the mismatch of the
    prompts prefilled before it against fresh ones (a prefix cache not flushed shows there)."""
    ws = next((r for r in rep["probes"] if r["probe"] == "weight_sync" and not r["not_tested"]), None)
    if ws is None or ws["error"]:
        return {}
    n = ws["numbers"]
    return {
        "weight_sync": {
            "passed": ws["passed"],
            "fits": n["fits"],
            "mean_abs_diff_prefilled": n["mean_abs_diff_prefilled"],
            "mean_abs_diff_fresh": n["mean_abs_diff_fresh"],
            "note": ws["note"],
        }
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--suite", default="smoke")
    ap.add_argument("--faults", action="store_true")
    ap.add_argument("--clean-runs", type=int, default=0)
    ap.add_argument("--url", help="a running server (default: start the fake server)")
    ap.add_argument("--trainer", help="its HF checkpoint directory (default: the shipped tiny dense one)")
    ap.add_argument("--stale-url", help="with --url: a server holding other weights (the stale_checkpoint fault)")
    ap.add_argument("--sync-dir", help="with --url: the server's --model directory (the weight-sync probe's opt-in)")
    a = ap.parse_args()
    out, suite = Path(a.out), load_suite(a.suite)
    trainer = a.trainer or str(default_checkpoint("add-4d-v1", "tiny-dense"))
    other = default_checkpoint("add-4d-v1", "small-dense")
    with (
        FakeServer(trainer) if not a.url else contextlib.nullcontext() as fake,
        FakeServer(other) if not a.url and a.faults else contextlib.nullcontext() as old,
    ):
        url, stale = a.url or fake.url, a.stale_url or (old.url if old else None)
        rows = [one(url, trainer, suite, out, "direct")]
        if a.sync_dir:
            rows.append(one(url, trainer, suite, out, "weight_sync", sync_dir=a.sync_dir))
        for fault in EXPECTED_PROBE if a.faults else ():
            if fault == "stale_checkpoint" and not stale:
                print("stale_checkpoint: skipped (no --stale-url)")
                continue
            if fault in SYNC_FAULTS and not a.sync_dir:
                print(f"{fault}: skipped (no --sync-dir: weight sync is not tested)")
                continue
            rows.append(one(url, trainer, suite, out, fault, stale, a.sync_dir if fault in SYNC_FAULTS else None))
        for k in range(1, a.clean_runs + 1):
            rows.append(one(url, trainer, dataclasses.replace(suite, seed=suite.seed + k), out, "none"))
    server = json.loads((out / "direct" / "gate.json").read_text())["identity"]
    clean = [r for r in rows if r["fault"] == "none"]
    sync = next((r for r in rows if r["fault"] == "weight_sync"), None)
    doc = {
        "server": f"{server['engine_package']} {server['engine_version']}",
        "suite": suite.name,
        "suite_version": suite.version,
        "runs": rows,
        "clean_reruns": len(clean),
        "false_alarms": sum(not r["gate_passed"] for r in clean),
        "missed": [r["fault"] for r in rows if r["fault"] in EXPECTED_PROBE and r["gate_passed"]],
        "missed_expected_probe": [r["fault"] for r in rows if r.get("caught_by_expected") is False],
        "weight_sync": sync and sync.get("weight_sync"),
    }
    lines = [
        f"HTTP gate on {doc['server']}, suite {suite.name} v{suite.version}: faults missed: "
        f"{', '.join(doc['missed']) or 'none'}; false alarms in {len(clean)} clean proxy reruns: "
        f"{doc['false_alarms']}. Wall times on a shared 2-core machine."
    ]
    if doc["weight_sync"]:
        ws = doc["weight_sync"]
        lines.append(
            f"Weight sync (run `weight_sync`, sync_dir given): {'pass' if ws['passed'] else 'FAIL'}: {ws['note']}."
        )
    lines += [
        "",
        "| run | seed | verdict | failed probes | logprobs fit | weight sync fit (prefilled / fresh mean \\|delta\\|) "
        "| wall s |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        word = "pass" if r["gate_passed"] else "FAIL" if r["failed"] else "ERROR"
        ws = r.get("weight_sync")
        sync_cell = (
            f"{ws['fits']} ({ws['mean_abs_diff_prefilled']:.3g} / {ws['mean_abs_diff_fresh']:.3g})" if ws else "-"
        )
        lines.append(
            f"| {r['fault']} | {r['seed']} | {word} | {', '.join(r['failed'] + r['erred']) or '-'} | "
            f"{r['fits']} | {sync_cell} | {r['wall_s']} |"
        )
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(out / "detection.json", json.dumps(doc, indent=1) + "\n")
    atomic_write(out / "detection.md", "\n".join(lines) + "\n")
    print(lines[0])
    return 1 if doc["missed"] or doc["false_alarms"] or not rows[0]["gate_passed"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
