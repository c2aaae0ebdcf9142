"""Engine and trainer specs: `key=value,key=value` strings parsed against one registry of keys.

A spec says how one side of the RL system computes: which engine, kernel set,
precision, tensor-parallel layout, MoE router arithmetic and synthetic noise.
Each key is data: a parser, its default, its valid values, the sides it makes
sense on and a one-line doc. A new mismatch condition adds an entry here (and
the arithmetic it selects in the model, kernels or sampler), nothing else;
every bad spec produces the same kind of one-line error naming the key and
what is valid. The defaults are the zero-mismatch reference: exact kernels,
fp32, no TP, no noise.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable

import torch

from .quant.schemes import ACT_QUANT, KV_ALIASES, KV_CACHE, WEIGHT_QUANT

# fp64: the float64 reference of `timbench diagnose` (trainer side; the engine's KV cache is fp32).
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "fp64": torch.float64}
SIDES = ("engine", "trainer")


class SpecError(ValueError):
    """A spec string that names an unknown key or an invalid value."""


@dataclass(frozen=True)
class SpecKey:
    parse: Callable[[str], Any]
    valid: str
    doc: str
    sides: tuple[str, ...] = SIDES


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


def _nonneg_float(v: str) -> float:
    x = float(v)
    if not x >= 0 or x == float("inf"):
        raise ValueError
    return x


# The quantization formats are data in timbench.quant (one registry per use); the spec only names them.
_WQ = ("none", *(k for k in WEIGHT_QUANT if k != "none"))
_AQ = ("none", *(k for k in ACT_QUANT if k != "none"))
_KV = ("auto", *(k for k in KV_CACHE if k != "auto"))


def _kv_cache_dtype(v: str) -> str:
    """vLLM's kv_cache_dtype values; its alias `fp8` is stored under the format it means (fp8_e4m3)."""
    return _choice(*_KV)(KV_ALIASES.get(v, v))


@dataclass(frozen=True)
class Noise:
    """Synthetic logit noise on the engine's sampler: `kind:sigma[:df]`."""

    kind: str = "none"
    sigma: float = 0.0
    df: int = 0

    def __str__(self) -> str:
        if self.kind == "none":
            return "none"
        return f"{self.kind}:{self.sigma:g}" + (f":{self.df}" if self.kind == "student_t" else "")


NOISE_KINDS = {"gaussian": 1, "lowprob": 1, "student_t": 2}  # kind -> number of parameters after it


def parse_noise(v: str) -> Noise:
    """`none`, `gaussian:SIGMA`, `lowprob:SIGMA` or `student_t:SIGMA:DF` (DF a positive integer)."""
    if v == "none":
        return Noise()
    kind, *args = v.split(":")
    if NOISE_KINDS.get(kind) != len(args):
        raise ValueError
    sigma = _nonneg_float(args[0])
    df = _positive_int(args[1]) if kind == "student_t" else 0
    return Noise(kind, sigma, df)


SPEC_KEYS: dict[str, SpecKey] = {
    "engine": SpecKey(_choice("timbench", "vllm"), "timbench|vllm",
                      "rollout engine: timbench's own, or a real vLLM (optional extra)", ("engine",)),
    "kernels": SpecKey(_choice("exact", "torch"), "exact|torch",
                       "exact: fixed-order batch-invariant kernels; torch: plain PyTorch (MKL, SDPA)"),
    "dtype": SpecKey(_choice(*DTYPES), "|".join(DTYPES), "dtype of weights and activations"),
    "logits_dtype": SpecKey(_choice("auto", *DTYPES), "auto|" + "|".join(DTYPES),
                            "dtype of the LM head matmul (auto = dtype); fp32 is the usual fp32 lm_head"),
    "attn_splits": SpecKey(_positive_int, "integer >= 1",
                           "decode attention splits the KV range into S chunks merged by log-sum-exp "
                           "(flash-decoding / split-KV)", ("engine",)),
    "tp": SpecKey(_int_in(1, 2, 4, 8), "1|2|4|8",
                  "simulated tensor parallelism: row-parallel o_proj/down_proj partial sums all-reduced"),
    "tp_reduce": SpecKey(_choice("ring", "tree"), "ring|tree", "all-reduce summation order for tp > 1"),
    "router_dtype": SpecKey(_choice("auto", *DTYPES), "auto|" + "|".join(DTYPES),
                            "MoE router (gate) matmul dtype (auto = dtype)"),
    "router_noise": SpecKey(_nonneg_float, "float >= 0",
                            "std of gaussian noise on MoE router logits, keyed by the token's activations"),
    "weight_quant": SpecKey(_choice(*_WQ), "|".join(_WQ),
                            "fake-quantize the weights of every decoder linear (q/k/v/o, MLP and experts) onto a "
                            "low-precision format (timbench.quant.schemes.WEIGHT_QUANT); embedding, norms, router "
                            "and LM head stay unquantized"),
    "act_quant": SpecKey(_choice(*_AQ), "|".join(_AQ),
                         "dynamic per-token quantization of the inputs of the quantized linears "
                         "(timbench.quant.schemes.ACT_QUANT); needs weight_quant"),
    "kv_cache_dtype": SpecKey(_kv_cache_dtype, "|".join((*_KV, *KV_ALIASES)),
                              "KV cache storage format (vLLM's kv_cache_dtype): keys and values are rounded to it "
                              "as they are written, and every attention read sees the stored values", ("engine",)),
    "noise": SpecKey(parse_noise, "none|gaussian:SIGMA|lowprob:SIGMA|student_t:SIGMA:DF",
                     "synthetic noise on the sampler's logits, keyed by (seed, request, position)", ("engine",)),
}


@dataclass(frozen=True)
class Spec:
    """How one side (engine or trainer) computes. Defaults are the zero-mismatch reference."""

    engine: str = "timbench"
    """Rollout engine backend (engine side only): timbench or vllm."""
    kernels: str = "exact"
    """Kernel set name (see `timbench.kernels`)."""
    dtype: str = "fp32"
    """Weights/activations dtype: fp32, bf16 or fp16."""
    logits_dtype: str = "auto"
    """LM-head dtype; auto follows dtype."""
    attn_splits: int = 1
    """Split-KV chunks in decode attention (1 = one pass over all keys)."""
    tp: int = 1
    """Simulated tensor-parallel degree."""
    tp_reduce: str = "ring"
    """All-reduce order of the row-parallel partial sums (ring or tree)."""
    router_dtype: str = "auto"
    """MoE router matmul dtype; auto follows dtype."""
    router_noise: float = 0.0
    """Gaussian noise std on MoE router logits."""
    weight_quant: str = "none"
    """Low-precision weight format of the decoder linears (none = the dtype's own weights)."""
    act_quant: str = "none"
    """Dynamic per-token quantization of the quantized linears' inputs (none = off)."""
    kv_cache_dtype: str = "auto"
    """KV cache storage format (engine only; auto = the activation dtype, exact)."""
    noise: Noise = Noise()
    """Synthetic sampler-logit noise (engine only)."""

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
                out[f.name] = str(v) if isinstance(v, Noise) else v
        return out

    def __str__(self) -> str:
        return ",".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in self.to_dict().items())

    def override(self, changes: dict | None, what: str = "spec", side: str | None = None) -> "Spec":
        """This spec with some keys replaced (raw `key: value` pairs, parsed like a spec string)."""
        if not changes:
            return self
        return parse_spec({**{k: str(v) for k, v in self.to_dict().items()}, **changes}, what, side)


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


def _check_side(spec: Spec, what: str, side: str | None) -> Spec:
    if side is not None:
        for f in dataclasses.fields(spec):
            sk = SPEC_KEYS[f.name]
            if side not in sk.sides and getattr(spec, f.name) != f.default:
                raise SpecError(f"{what}: {f.name} is an {'/'.join(sk.sides)}-only key ({sk.doc})")
    return spec


def parse_spec(text: str | dict | Spec | None, what: str = "spec", side: str | None = None) -> Spec:
    """Parse `kernels=torch,dtype=bf16` (or a dict of the same) into a Spec; raise SpecError on any bad part.

    `side` ("engine" or "trainer") rejects keys that make no sense there (noise on the trainer, say).
    A Spec is returned as it is (after the side check): specs are parsed once, at the edge
    (config file, CLI, condition table), and travel as Spec objects from there on.
    """
    if isinstance(text, Spec):  # already parsed (and valid): only the side can still be wrong
        return _check_side(text, what, side)
    if text is None:
        items = {}
    elif isinstance(text, dict):
        items = {str(k): str(v) for k, v in text.items()}
    else:
        items = {}
        for part in text.split(",") if text.strip() else []:
            key, sep, value = part.strip().partition("=")
            if not sep or not key:
                raise SpecError(f"{what}: {part.strip()!r} is not key=value; valid keys: {', '.join(SPEC_KEYS)}")
            items[key.strip()] = value.strip()
    values = {}
    for key, raw in items.items():
        if key not in SPEC_KEYS:
            raise SpecError(f"{what}: unknown key {key!r}; valid keys: "
                            + ", ".join(f"{k}={s.valid}" for k, s in SPEC_KEYS.items()))
        sk = SPEC_KEYS[key]
        if side is not None and side not in sk.sides:
            raise SpecError(f"{what}: {key} is an {'/'.join(sk.sides)}-only key ({sk.doc})")
        try:
            values[key] = sk.parse(raw)
        except (ValueError, TypeError):
            raise SpecError(f"{what}: invalid value {raw!r} for {key}; valid: {sk.valid}") from None
    spec = Spec(**values)
    if spec.tp_reduce != "ring" and spec.tp == 1:
        raise SpecError(f"{what}: tp_reduce={spec.tp_reduce} needs tp > 1")
    if spec.act_quant != "none" and spec.weight_quant == "none":
        raise SpecError(f"{what}: act_quant={spec.act_quant} needs weight_quant (activations are quantized at the "
                        f"inputs of quantized linears); valid weight_quant: {SPEC_KEYS['weight_quant'].valid}")
    return spec
