"""Engine and trainer specs: `key=value,key=value` strings parsed against one registry of keys.

A spec says how one side of the RL system computes: which engine, kernel set,
precision, tensor-parallel layout, MoE router arithmetic and synthetic noise.
Each key is data: a parser, its default, its valid values, the sides it makes
sense on, a one-line doc and (optionally) a check against the other keys. The
`Spec` dataclass is generated from that registry, and the model's `Compute`
carries the parsed Spec itself, so a new mismatch condition adds an entry here
(and the arithmetic it selects in the model, kernels or sampler, and its test),
nothing else: tests/test_spec_registry.py adds a throwaway key to a copy of the
registry and follows it from a spec string to `Compute`. Every bad spec produces
the same kind of one-line error naming the key and what is valid. The defaults
are the zero-mismatch reference: exact kernels, fp32, no TP, no noise.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ..quant.schemes import ACT_QUANT, KV_ALIASES, KV_CACHE, WEIGHT_QUANT
from .faults import FAULTS
from .faults import VALID as FAULT_VALID
from .mma import VALID as MMA_VALID
from .mma import MmaAccum, parse_mma_accum
from .noise import NOISE_KINDS, Noise, parse_noise  # noqa: F401  (re-exported: the noise= key)

# fp64: the float64 reference of `timbench diagnose` (trainer side; the engine's KV cache is fp32).
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "fp64": torch.float64}
SIDES = ("engine", "trainer")


class SpecError(ValueError):
    """A spec string that names an unknown key or an invalid value."""


@dataclass(frozen=True)
class SpecKey:
    """One condition key: how its value is parsed and checked, and what it means."""

    parse: Callable[[str], Any]
    """Raw string -> value; raises ValueError/TypeError on an invalid value."""
    valid: str
    """The valid values, as printed in errors and help."""
    doc: str
    """One line: what the key selects."""
    sides: tuple[str, ...] = SIDES
    """The sides (engine, trainer) on which a non-default value makes sense."""
    default: Any = None
    """The zero-mismatch value (the Spec field's default)."""
    check: Callable[[Any], str | None] | None = None
    """Optional cross-key check on the whole Spec: a message (without the `what:` prefix) when it is invalid."""


def _choice(*options: str) -> Callable[[str], str]:
    def parse(v: str) -> str:
        if v not in options:
            raise ValueError
        return v

    return parse


def _int_in(*options: int) -> Callable[[str], int]:
    def parse(v: str) -> int:
        n = int(v)
        if n not in options:
            raise ValueError
        return n

    return parse


def _positive_int(v: str) -> int:
    n = int(v)
    if n < 1:
        raise ValueError
    return n


def _nonneg_int(v: str) -> int:
    n = int(v)
    if n < 0:
        raise ValueError
    return n


def _nonneg_float(v: str) -> float:
    x = float(v)
    if not x >= 0 or x == float("inf"):
        raise ValueError
    return x


# The quantization formats are data in timbench.quant (one registry per use); the spec only names them.
_WQ = ("none", *(k for k in WEIGHT_QUANT if k != "none"))
_AQ = ("none", *(k for k in ACT_QUANT if k != "none"))
_KV = ("auto", *(k for k in KV_CACHE if k != "auto"))


def _unit_mass(v: str) -> float:
    x = float(v)
    if not 0 < x <= 1:
        raise ValueError
    return x


def _kv_cache_dtype(v: str) -> str:
    """vLLM's kv_cache_dtype values; its alias `fp8` is stored under the format it means (fp8_e4m3)."""
    return _choice(*_KV)(KV_ALIASES.get(v, v))


def _needs_tp(spec) -> str | None:
    return f"tp_reduce={spec.tp_reduce} needs tp > 1" if spec.tp_reduce != "ring" and spec.tp == 1 else None


def _needs_weight_quant(spec) -> str | None:
    if spec.act_quant != "none" and spec.weight_quant == "none":
        return (
            f"act_quant={spec.act_quant} needs weight_quant (activations are quantized at the inputs of "
            f"quantized linears); valid weight_quant: {SPEC_KEYS['weight_quant'].valid}"
        )
    return None


def _needs_exact_engine(spec) -> str | None:
    if spec.mma_accum.block is not None and (spec.kernels != "exact" or spec.engine != "timbench"):
        return (
            f"mma_accum={spec.mma_accum} needs kernels=exact on timbench's engine or trainer (the accumulation "
            f"order is a property of the exact linear); got kernels={spec.kernels}, engine={spec.engine}"
        )
    return None


def _device(v: str) -> str:
    """cpu, cuda or cuda:N (torch's device names for the devices an engine can run on)."""
    kind, _, index = v.partition(":")
    if kind not in ("cpu", "cuda") or (index and (kind == "cpu" or not index.isdigit())):
        raise ValueError
    return v


DEVICE_KEYS = (
    "engine",
    "kernels",
    "dtype",
    "logits_dtype",
    "attn_splits",
    "tp",
    "tp_reduce",
    "router_dtype",
    "fault",
    "top_k",
    "top_p",
    "device",
)
"""The keys whose arithmetic runs on any torch device; the others (exact kernels, quantization, keyed noise,
mma_accum, staleness) are numba / NumPy code on host memory. (top_k / top_p: the sampler is on the host anyway.)"""


def _device_capable(spec) -> str | None:
    if spec.device == "cpu":
        return None
    if spec.engine == "timbench" and spec.kernels != "torch":
        return (
            f"device={spec.device} needs kernels=torch on timbench's engine (the exact kernels are CPU "
            f"code; the zero-mismatch reference stays on the CPU)"
        )
    off = spec.changed(keep=DEVICE_KEYS)
    if off:
        return f"device={spec.device} runs only the keys {', '.join(DEVICE_KEYS)}; {', '.join(off)} is host-only"
    return None


# The one definition of every condition key; `Spec` (below) is generated from it, in this order.
SPEC_KEYS: dict[str, SpecKey] = {
    "engine": SpecKey(
        _choice("timbench", "vllm"),
        "timbench|vllm",
        "rollout engine: timbench's own, or a real vLLM (optional extra)",
        ("engine",),
        "timbench",
    ),
    "kernels": SpecKey(
        _choice("exact", "torch"),
        "exact|torch",
        "exact: fixed-order batch-invariant kernels; torch: plain PyTorch (MKL, SDPA)",
        default="exact",
    ),
    "dtype": SpecKey(_choice(*DTYPES), "|".join(DTYPES), "dtype of weights and activations", default="fp32"),
    "logits_dtype": SpecKey(
        _choice("auto", *DTYPES),
        "auto|" + "|".join(DTYPES),
        "dtype of the LM head matmul (auto = dtype); fp32 is the usual fp32 lm_head",
        default="auto",
    ),
    "attn_splits": SpecKey(
        _positive_int,
        "integer >= 1",
        "decode attention splits the KV range into S chunks merged by log-sum-exp (flash-decoding / split-KV)",
        ("engine",),
        1,
    ),
    "tp": SpecKey(
        _int_in(1, 2, 4, 8),
        "1|2|4|8",
        "simulated tensor parallelism: row-parallel o_proj/down_proj partial sums all-reduced",
        default=1,
    ),
    "tp_reduce": SpecKey(
        _choice("ring", "tree"), "ring|tree", "all-reduce summation order for tp > 1", default="ring", check=_needs_tp
    ),
    "router_dtype": SpecKey(
        _choice("auto", *DTYPES),
        "auto|" + "|".join(DTYPES),
        "MoE router (gate) matmul dtype (auto = dtype)",
        default="auto",
    ),
    "router_noise": SpecKey(
        _nonneg_float,
        "float >= 0",
        "std of gaussian noise on MoE router logits, keyed by the token's activations",
        default=0.0,
    ),
    "weight_quant": SpecKey(
        _choice(*_WQ),
        "|".join(_WQ),
        "fake-quantize the weights of every decoder linear (q/k/v/o, MLP and experts) onto a "
        "low-precision format (timbench.quant.schemes.WEIGHT_QUANT); embedding, norms, router "
        "and LM head stay unquantized",
        default="none",
    ),
    "act_quant": SpecKey(
        _choice(*_AQ),
        "|".join(_AQ),
        "dynamic per-token quantization of the inputs of the quantized linears "
        "(timbench.quant.schemes.ACT_QUANT); needs weight_quant",
        default="none",
        check=_needs_weight_quant,
    ),
    "kv_cache_dtype": SpecKey(
        _kv_cache_dtype,
        "|".join((*_KV, *KV_ALIASES)),
        "KV cache storage format (vLLM's kv_cache_dtype): keys and values are rounded to it "
        "as they are written, and every attention read sees the stored values",
        ("engine",),
        "auto",
    ),
    "staleness": SpecKey(
        _nonneg_int,
        "integer >= 0",
        "asynchronous RL: the engine samples with the policy of K updates ago (0 = synchronous; timbench.rl.staleness)",
        ("engine",),
        0,
    ),
    "stale_old": SpecKey(
        _choice("current", "behavior"),
        "current|behavior",
        "with a stale engine, the weights the trainer recomputes pi_old with: its current ones "
        "(AReaL decoupled PPO, verl one-step-off) or those that sampled",
        ("trainer",),
        "current",
    ),
    "mma_accum": SpecKey(
        parse_mma_accum,
        MMA_VALID,
        "the exact linear's K reduction in blocks of width B, partials added in ascending order "
        "into an fp32 (or M-bit-mantissa) accumulator: a matrix instruction's accumulation order "
        "(timbench.spec.mma; arXiv 2610.05458, 2412.19437)",
        default=MmaAccum(),
        check=_needs_exact_engine,
    ),
    "fault": SpecKey(
        _choice("none", *FAULTS),
        FAULT_VALID,
        "inject one real engine bug class (timbench.spec.faults: stale weights, zeroed or bf16 logprobs, "
        "batch-size leak, rotary base), for proving the release gate catches it",
        ("engine",),
        "none",
    ),
    "noise": SpecKey(
        parse_noise,
        "none|" + "|".join(f"{k}:SIGMA" + ":DF" * (n.n_params - 1) for k, n in NOISE_KINDS.items()),
        "synthetic noise on the sampler's logits, keyed by (seed, request, position)",
        ("engine",),
        Noise(),
    ),
    "top_k": SpecKey(
        _nonneg_int,
        "integer >= 0",
        "rollout sampling keeps only the k most likely tokens (vLLM's top_k; 0 = off): the engine's "
        "logprobs are renormalised over that support, the trainer's are not (timbench.engine.sampler)",
        ("engine",),
        0,
    ),
    "top_p": SpecKey(
        _unit_mass,
        "float in (0, 1]",
        "rollout sampling keeps the smallest most-likely set of mass >= p (vLLM's top_p, applied after "
        "top_k; 1 = off), renormalised like top_k",
        ("engine",),
        1.0,
    ),
    "device": SpecKey(
        _device,
        "cpu|cuda|cuda:N",
        "the torch device the engine runs on (kernels=torch or engine=vllm); the trainer and the "
        "zero-mismatch reference stay on the CPU",
        ("engine",),
        "cpu",
        check=_device_capable,
    ),
}


class _SpecMethods:
    """What every generated Spec can do besides holding its keys."""

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def torch_logits_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype if self.logits_dtype == "auto" else self.logits_dtype]

    @property
    def torch_router_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype if self.router_dtype == "auto" else self.router_dtype]

    def to_dict(self) -> dict[str, Any]:
        """kernels and dtype always, every other key only where it differs from its default.

        Keeping the short form stable means a spec string, a run's config.yaml and an
        align report read the same as before a key existed. A vLLM engine has its own
        kernels, so `kernels` is left out there rather than printed as a misleading default.
        """
        always = ("dtype",) if self.engine != "timbench" else ("kernels", "dtype")
        out = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.name in always or v != f.default:
                out[f.name] = str(v) if isinstance(v, (Noise, MmaAccum)) else v
        return out

    def changed(self, keep: tuple[str, ...] = ()) -> list[str]:
        """`key=value` for every key off its default, except those in `keep` (what a backend must refuse)."""
        return [
            f"{f.name}={getattr(self, f.name)}"
            for f in dataclasses.fields(self)
            if f.name not in keep and getattr(self, f.name) != f.default
        ]

    def __str__(self) -> str:
        return ",".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in self.to_dict().items())

    def override(self, changes: dict | None, what: str = "spec", side: str | None = None) -> Spec:
        """This spec with some keys replaced (raw `key: value` pairs, parsed like a spec string)."""
        if not changes:
            return self
        return parse_spec({**{k: str(v) for k, v in self.to_dict().items()}, **changes}, what, side)


def make_spec_class(keys: dict[str, SpecKey], name: str = "Spec") -> type:
    """A frozen dataclass with one field per registry key (its default from the registry), in registry order."""
    cls = dataclasses.make_dataclass(
        name,
        [(k, Any, dataclasses.field(default=sk.default)) for k, sk in keys.items()],
        bases=(_SpecMethods,),
        frozen=True,
    )
    cls.__module__ = __name__  # pickled by reference (Ray workers, multiprocessing)
    cls.__doc__ = (
        "How one side (engine or trainer) computes; generated from SPEC_KEYS (one field per key, "
        "documented there). Defaults are the zero-mismatch reference."
    )
    return cls


Spec = make_spec_class(SPEC_KEYS)


ZERO_MISMATCH = Spec()
"""The reference both sides of a zero-mismatch run use: exact kernels, fp32, no TP, no noise."""

QUANT_KEYS = ("weight_quant", "act_quant", "kv_cache_dtype")
"""The keys that change the policy itself (its weights, activations or cache are rounded), not only its logprobs."""


def quantized_reference(spec: Spec) -> Spec | None:
    """The zero-mismatch reference with `spec`'s quantization keys, or None when it has none.

    Generating with it measures the quantized policy on its own (no other mismatch): what quantization
    costs the policy, as opposed to what the engine-trainer mismatch costs training.
    """
    keys = {k: getattr(spec, k) for k in QUANT_KEYS if getattr(spec, k) != getattr(ZERO_MISMATCH, k)}
    return dataclasses.replace(ZERO_MISMATCH, **keys) if keys else None


def _check_side(spec: Spec, what: str, side: str | None, keys: dict[str, SpecKey]) -> Spec:
    if side is not None:
        for f in dataclasses.fields(spec):
            sk = keys[f.name]
            if side not in sk.sides and getattr(spec, f.name) != f.default:
                raise SpecError(f"{what}: {f.name} is an {'/'.join(sk.sides)}-only key ({sk.doc})")
    return spec


def parse_spec(
    text: str | dict | Spec | None,
    what: str = "spec",
    side: str | None = None,
    keys: dict[str, SpecKey] | None = None,
    spec_cls: type | None = None,
) -> Spec:
    """Parse `kernels=torch,dtype=bf16` (or a dict of the same) into a Spec; raise SpecError on any bad part.

    `side` ("engine" or "trainer") rejects keys that make no sense there (noise on the trainer, say).
    A Spec is returned as it is (after the side check): specs are parsed once, at the edge
    (config file, CLI, condition table), and travel as Spec objects from there on.
    `keys` / `spec_cls` replace the registry and its class (tests of the registry itself).
    """
    keys, spec_cls = keys or SPEC_KEYS, spec_cls or Spec
    if isinstance(text, spec_cls):  # already parsed (and valid): only the side can still be wrong
        return _check_side(text, what, side, keys)
    if text is None:
        items = {}
    elif isinstance(text, dict):
        items = {str(k): str(v) for k, v in text.items()}
    else:
        items = {}
        for part in text.split(",") if text.strip() else []:
            key, sep, value = part.strip().partition("=")
            if not sep or not key:
                raise SpecError(f"{what}: {part.strip()!r} is not key=value; valid keys: {', '.join(keys)}")
            items[key.strip()] = value.strip()
    values = {}
    for key, raw in items.items():
        if key not in keys:
            raise SpecError(
                f"{what}: unknown key {key!r}; valid keys: " + ", ".join(f"{k}={s.valid}" for k, s in keys.items())
            )
        sk = keys[key]
        if side is not None and side not in sk.sides:
            raise SpecError(f"{what}: {key} is an {'/'.join(sk.sides)}-only key ({sk.doc})")
        try:
            values[key] = sk.parse(raw)
        except (ValueError, TypeError):
            raise SpecError(f"{what}: invalid value {raw!r} for {key}; valid: {sk.valid}") from None
    spec = spec_cls(**values)
    for sk in keys.values():
        problem = sk.check(spec) if sk.check else None
        if problem:
            raise SpecError(f"{what}: {problem}")
    return spec
