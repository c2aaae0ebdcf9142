"""Weight sync over HTTP: a server reloads perturbed weights, and its logprobs must then be the new weights'.

Opt-in only (`--engine openai=URL,sync_dir=DIR`): DIR is the checkpoint directory the server was started with
(`--model DIR`, checked against /v1/models' `root`), and the probe changes what the running server serves while
it lasts. It drives the routes vLLM's OpenAI server offers with `VLLM_SERVER_DEV_MODE=1`: `/collective_rpc` with
the worker method `reload_weights` (its `weights_path` argument points the in-place reload at another directory)
and `/reset_prefix_cache`. The user's files are never written: the perturbed checkpoint goes to a scratch
directory under DIR (`.timbench-weight-sync`: the server must be able to read it, so it lives where the server's
weights do), each file written atomically, and is deleted after the server has been reloaded from DIR again.

The perturbation is the in-process `weight_sync` probe's (timbench.gate.probes): `updates` times, every floating
tensor of the checkpoint + 1e-2 N(0, 1) from a generator seeded with the suite's seed (the tensors in file and
name order), and the server reloads after each update. The suite's prompts are generated once before the first
sync, as an RL loop meets a prompt again, with lengths spread up to the server's context so they fill whole
prefix-cache blocks (vLLM's CPU blocks are 128 tokens): a prefix cache the sync leaves stale serves them wrong
afterwards. After the last sync the same prompts, and as many fresh ones of the same lengths, are generated and
scored by the HF trainer loaded from the new weights (the user's dtype and attention). The statistics are
alignment's (mean / max |delta|, k3). They are held to the server's own mismatch with the old weights on the same
prompts before the sync: at most `max_growth` times it (exactly 0 when it was 0, zero mismatch being bitwise),
and within the alignment bound. The note names what the logprobs fit, of: the new weights, the old ones (the
sync did not reach the server), and, for a checkpoint with a tied LM head, the new weights with the old LM head
(a reload that re-materialised the embedding but left the tied head on the old tensor); and whether the prompts
prefilled before the sync are further than fresh ones from what the logprobs fit (a prefix cache not flushed).
Afterwards the server is reloaded from DIR and must again be within `max_growth` of its first mismatch. The
prefix cache is flushed before the first generation too, so both it and the restored one are computed afresh.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path

import torch

from ..engine import SamplingParams
from ..metrics.schema import K3_KL
from .hf_trainer import HfTrainer, log_softmax_at
from .http_client import ServerError
from .http_engine import NotTested, Offer, weight_sync_reason
from .probes import Probe, _requests

SYNC_ROUTES = ("/collective_rpc", "/reset_prefix_cache")
"""The routes the probe drives (vLLM's dev mode)."""
STAGE = ".timbench-weight-sync"
"""The scratch directory under sync_dir that holds the perturbed checkpoint while the probe runs."""
SCALE = 1e-2
"""Each update's noise, as the in-process weight_sync probe's."""
DEFAULTS = {"updates": 2, "requests": 6, "max_new_tokens": 8, "max_growth": 10.0, "max_mean_abs_diff": 0.1}
"""The probe's work and bounds where the suite does not name them; max_mean_abs_diff is alignment's bound."""
WEIGHT_FILES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
"""Files not copied into the scratch checkpoint (the safetensors are written perturbed; the others not read)."""
FITS = {
    "synced": "the new weights",
    "not_synced": "the old weights (the sync did not reach the server)",
    "stale_lm_head": "the new weights with the old LM head (the reload left the tied LM head on the old tensor)",
}


def check_sync_dir(spec, offer: Offer) -> None:
    """A one-line ValueError unless sync_dir is the directory the server reports serving (/v1/models `root`)."""
    if spec.sync_dir is None:
        return
    root = offer.root
    if root is None or not os.path.isabs(root):
        raise ValueError(
            f"engine spec: sync_dir={spec.sync_dir} cannot be checked: the server reports "
            f"{'no model path' if root is None else f'model path {root!r}, not an absolute directory'} "
            "(/v1/models root); start it with --model /absolute/dir"
        )
    if Path(root).resolve() != spec.sync_dir:
        raise ValueError(
            f"engine spec: sync_dir={spec.sync_dir} is not the directory the server serves ({root}, its "
            "/v1/models root); sync_dir is the server's own --model directory"
        )


def not_tested_reason(spec, offer: Offer) -> str | None:
    """Why the probe cannot run against this server (no opt-in, or the routes missing), or None."""
    if spec.sync_dir is None:
        return (
            f"{weight_sync_reason(offer)}; to drive it, give the engine spec sync_dir=DIR (the server's --model "
            "directory: the gate writes perturbed weights under it and has the server reload them)"
        )
    missing = [r for r in SYNC_ROUTES if r not in (offer.weight_routes or [])]
    if offer.weight_routes is None or missing:
        lists = "no routes (/openapi.json)" if offer.weight_routes is None else "no " + ", ".join(missing)
        return (
            f"sync_dir is given, but the server lists {lists}; the probe drives /collective_rpc reload_weights "
            "and /reset_prefix_cache (vLLM with VLLM_SERVER_DEV_MODE=1)"
        )
    return None


def perturbations(src: Path, seed: int, updates: int):
    """Yield, per update, {file name: {tensor name: tensor}}: src's safetensors with every floating tensor moved
    by SCALE N(0, 1) once more (a float32 master copy, written in each tensor's own dtype)."""
    from safetensors.torch import load_file

    files = {f.name: load_file(f) for f in sorted(src.glob("*.safetensors"))}
    master = {(f, k): t.float() for f, ts in files.items() for k, t in ts.items() if t.is_floating_point()}
    gen = torch.Generator().manual_seed(seed)
    for _ in range(updates):
        for key in sorted(master):
            master[key] = master[key] + SCALE * torch.randn(master[key].shape, generator=gen)
        yield {
            f: {k: master[(f, k)].to(t.dtype) if (f, k) in master else t for k, t in ts.items()}
            for f, ts in files.items()
        }


def write_checkpoint(src: Path, stage: Path, tensors: dict) -> None:
    """`stage` as a copy of the checkpoint `src` (config, tokenizer) with `tensors` as its weights; each file is
    written under a temporary name and renamed, so the server never reads half a file."""
    from safetensors.torch import save_file

    stage.mkdir(exist_ok=True)
    for f in src.iterdir():
        if f.is_file() and not f.name.endswith(WEIGHT_FILES) and not (stage / f.name).exists():
            shutil.copyfile(f, stage / f.name)
    for name, ts in tensors.items():
        tmp = stage / f".{name}.tmp"
        save_file({k: t.contiguous() for k, t in ts.items()}, str(tmp), metadata={"format": "pt"})
        os.replace(tmp, stage / name)


def sync(client, path: str) -> None:
    """The server reloads its weights in place from `path`, then drops its prefix cache."""
    client.post("/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": str(path)}})
    reset(client)


def reset(client) -> None:
    """The server drops its prefix cache."""
    done = client.post("/reset_prefix_cache", {})
    if done.get("success") is False:  # vLLM refuses while requests hold cache blocks
        raise ServerError(f"POST {client.spec.url}/reset_prefix_cache answered success false: the cache was kept")


def _deltas(comps, trainer: HfTrainer, t: float) -> torch.Tensor:
    rows = trainer.logits([(c.prompt_ids, c.token_ids) for c in comps])
    return torch.cat(
        [
            log_softmax_at(z, t).gather(-1, torch.tensor(c.token_ids, dtype=torch.long)[:, None])[:, 0]
            for z, c in zip(rows, comps)
        ]
    ) - torch.cat([c.logprobs.double() for c in comps])


def _old_head(trainer: HfTrainer, old: HfTrainer) -> HfTrainer:
    """`trainer` with its output embedding replaced by `old`'s (untied)."""
    head = trainer.model.get_output_embeddings()
    head.weight = torch.nn.Parameter(old.model.get_input_embeddings().weight.detach().clone())
    return trainer


def weight_sync(engine, trainer: HfTrainer, p: dict, params: SamplingParams) -> Probe:
    """The probe (module docstring); NotTested without the opt-in or the routes."""
    client, offer = engine.client, engine.offer
    why = not_tested_reason(client.spec, offer)
    if why:
        raise NotTested(why)
    p = {**DEFAULTS, **p}
    n, new, t = p["requests"], p["max_new_tokens"], params.temperature
    span = engine.max_len - new
    lengths = [max(1, round((i + 1) * span / n)) for i in range(n)]
    seen = _requests("gate:ws", trainer.vocab_size, n, new, lengths=lengths)
    fresh = _requests("gate:ws-fresh", trainer.vocab_size, n, new, first_id=n, lengths=lengths)
    src, stage = client.spec.sync_dir, client.spec.sync_dir / STAGE
    load = lambda d: HfTrainer(dataclasses.replace(trainer.spec, dir=d))  # noqa: E731
    old = load(src)
    reset(client)  # the baseline from a flushed cache, as the restored run's (a cache hit can move the last bits)
    pre = _deltas(engine.generate(seen, params), old, t).abs()
    shutil.rmtree(stage, ignore_errors=True)  # an interrupted earlier run's scratch
    try:
        for tensors in perturbations(src, params.seed, p["updates"]):
            write_checkpoint(src, stage, tensors)
            sync(client, str(stage))
        after = engine.generate(seen + fresh, params)
        hyp = {"synced": load(stage), "not_synced": old}
        if getattr(old.model.config, "tie_word_embeddings", False):
            hyp["stale_lm_head"] = _old_head(load(stage), old)
        d = {k: _deltas(after, m, t) for k, m in hyp.items()}
    finally:
        sync(client, offer.root)  # back to the server's own weights, whatever happened
        shutil.rmtree(stage, ignore_errors=True)
    back = _deltas(engine.generate(seen, params), old, t).abs()
    post = d["synced"].abs()
    k_seen = sum(len(c.token_ids) for c in after[:n])
    mad = {k: float(v.abs().mean()) for k, v in d.items()}
    fits = min(mad, key=lambda k: (mad[k], k != "synced"))
    near = d[fits].abs()  # prefilled vs fresh prompts against what the logprobs fit: a stale head aside
    from ..metrics.mismatch import mismatch_metrics

    lp_e = torch.cat([c.logprobs.double() for c in after])
    numbers = {
        "updates": p["updates"],
        "tokens": int(post.numel()),
        "mean_abs_diff_before": float(pre.mean()),
        "mean_abs_diff": mad["synced"],
        "max_abs_diff": float(post.max()),
        "k3_kl": mismatch_metrics(lp_e + d["synced"], lp_e)[K3_KL],
        "mean_abs_diff_prefilled": float(near[:k_seen].mean()),
        "mean_abs_diff_fresh": float(near[k_seen:].mean()),
        **{f"mean_abs_diff_{k}": v for k, v in mad.items() if k != "synced"},
        "mean_abs_diff_restored": float(back.mean()),
        "fits": fits,
    }
    growth, bound = p["max_growth"], p["max_mean_abs_diff"]
    limit = min(growth * numbers["mean_abs_diff_before"], bound)
    within = lambda x: x <= limit if limit > 0 else x == 0.0  # noqa: E731 - zero mismatch before: bitwise after
    passed = fits == "synced" and within(numbers["mean_abs_diff"]) and within(numbers["mean_abs_diff_restored"])
    note = f"after {p['updates']} sync(s) the logprobs fit {FITS[fits]}"
    if numbers["mean_abs_diff_before"] > bound:
        note += f"; before the sync they were {numbers['mean_abs_diff_before']:.3g} from sync_dir's weights already"
    fr, pf = numbers["mean_abs_diff_fresh"], numbers["mean_abs_diff_prefilled"]
    if pf > growth * fr if fr > 0 else pf > 0:
        note += (
            f"; prompts prefilled before the sync are {pf:.3g} from {FITS[fits].split(' (')[0]}, fresh ones "
            f"{fr:.3g}: served from a prefix cache the sync did not flush"
        )
    if not within(numbers["mean_abs_diff_restored"]):
        note += f"; reloaded from sync_dir, the server is {numbers['mean_abs_diff_restored']:.3g} from its weights"
    thresholds = {"mean_abs_diff": limit, "mean_abs_diff_restored": limit, "max_growth": growth}
    return Probe(passed, numbers, thresholds, note=note)
