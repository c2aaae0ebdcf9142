"""`timbench gate run --engine openai=URL --trainer hf=DIR`: a suite's probes on a user's own server and trainer.

Before any probe: the server is discovered (what it serves and offers, printed) and the trainer's tokenizer is
checked against the server's; a server that cannot be used (unreachable, no logprobs, another model) or a
tokenizer that disagrees is a one-line error. Then every probe of the suite that applies runs on the one served
model, labelled by the trainer checkpoint's directory name (so two runs of one checkpoint on two server releases
compare by `gate check`): determinism, batch invariance (each request alone, then among concurrent requests),
prefill vs decode (prompt logprobs), alignment against the HF trainer, the sampling probe, and always the
logprob-semantics probe, and weight sync where the engine spec asks for it (`sync_dir=`, http_weight_sync). A
probe the server cannot serve (no prompt logprobs, no weight-load routes or no opt-in, RL over HTTP)
is a `not_tested` row with the reason: never passed, never failed. gate.json's `placement` and gate.md's last
section place the alignment probe's mismatch among timbench's committed conditions (gate.placement).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

import torch

from .. import __version__
from ..engine import SamplingParams
from ..fingerprint import machine
from ..studies.risk_data import gather
from ..submit.track import code_hash
from ..util import manifest
from ..util.atomic import atomic_write
from ..util.provenance import git_revision
from . import http_probes, http_weight_sync
from .hf_trainer import HfTrainer, check_tokenizer, checkpoint_hash, load_tokenizer, parse_hf_spec
from .html import render_gate_html
from .http_client import Client, parse_openai_spec
from .http_engine import HttpEngine, NotTested, TextVocab, discover
from .http_weight_sync import check_sync_dir
from .placement import placement, render_placement
from .probes import PROBES, Probe
from .run import NUMERIC_ENV, one_line, render
from .suite import Suite

SERVER_PROBES = ("determinism", "batch_invariance", "prefill_vs_decode", "sampling_semantics")
"""Suite probes that run over HTTP as they are (the engine factory hands them the HTTP engine)."""
NOT_OVER_HTTP = {"rl_outcome": "RL runs over HTTP would need the server to load each step's weights (not implemented)"}


class _Stub:
    """The `model` the suite probes read: only `config.vocab_size` (random prompts) is used with an HTTP engine."""

    def __init__(self, config):
        self.config = config


def identity(spec, offer, trainer, suite: Suite) -> dict:
    import transformers  # deferred: transformers is heavy

    ident = {
        "engine_spec": str(spec),
        "engine_package": offer.server,
        "engine_version": offer.version,
        "served_model": offer.model,
        "max_model_len": offer.max_model_len,
        "offers": {
            "token_ids": offer.token_ids,
            "prompt_logprobs": offer.prompt_logprobs,
            "top_k": offer.top_k,
            "tokenize": offer.tokenize,
            "weight_routes": offer.weight_routes,
            **({"prompt_text": offer.prompt_text, "token_text": offer.token_text} if offer.vocab else {}),
        },
        "trainer_spec": str(trainer.spec),
        "checkpoint": trainer.spec.dir.name,
        "checkpoint_hash": checkpoint_hash(trainer.spec.dir),
        "trainer_dtype": trainer.spec.dtype,
        "trainer_attn": trainer.spec.attn,
        "trainer_device": trainer.spec.device,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "torch_git": torch.version.git_version,
        "machine": machine(),
        "env": {k: os.environ[k] for k in NUMERIC_ENV if k in os.environ},
        "suite": suite.name,
        "suite_version": suite.version,
        "suite_sha256": suite.content,
        "timbench": __version__,
        "timbench_git": git_revision(),
        "timbench_code": code_hash(),
    }
    if trainer.spec.device != "cpu":  # a GPU trainer's numerics depend on the card, CUDA and its math-mode flags
        from ..engine.device import describe

        ident["trainer_accelerator"] = describe(torch.device(trainer.spec.device))
    ident["fingerprint"] = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]
    return ident


def connect(engine_spec: str, trainer_spec: str, allow_remote: bool = False, progress=None):
    """(engine, trainer, spec): the server discovered and the trainer loaded and checked against it."""
    say = progress or (lambda m: None)
    spec = parse_openai_spec(engine_spec, allow_remote)
    hf = parse_hf_spec(trainer_spec)
    client = Client(spec)
    offer = discover(client, vocab=lambda: TextVocab.of(load_tokenizer(hf)))
    check_sync_dir(spec, offer)
    for line in offer.lines():
        say(f"[gate http] {line}")
    trainer = HfTrainer(hf)
    if offer.tokenize:
        for line in check_tokenizer(trainer, client, offer.model, id_prompts=not offer.prompt_text):
            say(f"[gate http] {line}")
    else:
        say("[gate http] tokenizer agreement: not tested (the server has no /tokenize, /detokenize)")
    max_len = min(trainer.max_len, offer.max_model_len or trainer.max_len)
    return HttpEngine(client, offer, trainer.vocab_size, max_len), trainer, spec


def run_http_gate(
    engine_spec: str, trainer_spec: str, suite: Suite, out, allow_remote: bool = False, progress=None
) -> dict:
    """Run the suite's probes that apply over HTTP; write gate.json, gate.md and gate.html to `out`; return the
    report."""
    t0 = time.perf_counter()
    engine, trainer, spec = connect(engine_spec, trainer_spec, allow_remote, progress)
    name = trainer.spec.dir.name
    params = SamplingParams(temperature=suite.temperature, seed=suite.seed)
    probes = {k: v for k, v in suite.probes.items()}
    probes.setdefault("logprob_semantics", {})
    rows = []
    for probe, p in probes.items():
        t, error, skipped, r = time.perf_counter(), None, None, Probe(False, {})
        try:
            if probe in NOT_OVER_HTTP:
                raise NotTested(NOT_OVER_HTTP[probe])
            if probe in SERVER_PROBES:
                r = PROBES[probe](lambda m: engine, _Stub(engine.config), {**p, "model": name}, params, spec)
            elif probe == "alignment":
                r = http_probes.alignment(engine, trainer, p, params)
            elif probe == "weight_sync":
                r = http_weight_sync.weight_sync(engine, trainer, p, params)
            elif probe == "logprob_semantics":
                r = http_probes.logprob_semantics(engine, trainer, p, params)
            else:
                raise NotTested(f"probe {probe} has no HTTP form")
        except NotTested as e:
            skipped = str(e)
        except Exception as e:  # noqa: BLE001 - the probe's error is its row; the other probes still run
            error = one_line(e)
        rows.append(
            {
                "model": name,
                "probe": probe,
                "passed": r.passed and error is None and skipped is None,
                "numbers": r.numbers,
                "thresholds": r.thresholds,
                "note": r.note,
                "error": error,
                "not_tested": skipped,
                "seconds": time.perf_counter() - t,
            }
        )
        if progress:
            verdict = (
                f"not tested: {skipped}"
                if skipped
                else f"ERROR {error}"
                if error
                else f"{'pass' if r.passed else 'FAIL'} {r.numbers}" + (f" ({r.note})" if r.note else "")
            )
            progress(f"[gate {suite.name} v{suite.version} http] {name} {probe}: {verdict}")
    judged = [r for r in rows if not r["not_tested"]]
    report = {
        "identity": identity(spec, engine.offer, trainer, suite),
        "passed": all(r["passed"] for r in judged),
        "probes": rows,
        "errors": sum(r["error"] is not None for r in rows),
        "not_tested": sum(bool(r["not_tested"]) for r in rows),
        "seconds": time.perf_counter() - t0,
    }
    report["placement"] = placement(report, committed_rows())
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(out / "gate.json", json.dumps(report, indent=1, sort_keys=True) + "\n")
    atomic_write(out / "gate.md", render(report) + render_placement(report["placement"]))
    atomic_write(out / "gate.html", render_gate_html(report))
    # last: `gate check` refuses a gate.json edited after the run
    manifest.update(out, ["gate.json", "gate.md", "gate.html"])
    return report


def committed_rows() -> list:
    """The committed grids' risk rows, or none where this install has no results/ (a wheel, not a checkout)."""
    try:
        return gather()
    except FileNotFoundError:
        return []
