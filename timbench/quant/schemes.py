"""Quantization schemes, one registry per use: WEIGHT_QUANT, ACT_QUANT, KV_CACHE.

A Scheme is data (element format, bits, block, scale type, the real system it stands for) plus the
function that fake-quantizes a [rows, K] float32 tensor (blocks run along K, the reduction dim).
The entry points `quantize_weight`, `quantize_act`, `quantize_kv` check the name and the input
(finite, shape) and return float32 values on the format's grid times their scales.

Weights use HF layout [N outputs, K inputs]. `nvfp4` is the one weight scheme with a per-tensor
statistic (its global scale, as in ModelOpt checkpoints).

Activation schemes are row-local: a row's result depends on that row alone, so a token's quantized
activations (and logprob) do not depend on which other sequences share its batch. That is why
act `nvfp4` uses a per-token global scale (448 * 6 / row amax): served NVFP4 (vLLM
`modelopt_fp4`) uses a static per-tensor input scale calibrated offline; a dynamic per-tensor amax
over the batch would couple tokens, and a static one needs a calibration set this benchmark does not
have. The per-token scale is the batch-invariant stand-in.

KV cache: vLLM's `kv_cache_dtype` names; the scale is per tensor, 1.0 by default, which is what vLLM
uses when the checkpoint carries no calibrated k_scale/v_scale (docs "FP8 E4M3 KV Cache": "If this
JSON is not specified, scaling factors default to 1.0"; `calculate_kv_scales` would instead take
amax / 200 of the first batch, which is batch-dependent and not modelled). `auto` = unquantized.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from timbench.quant import rules as R
from timbench.quant.formats import QuantError, check_finite, round_unchecked
from timbench.util.registry import Registry

Tensor = torch.Tensor


@dataclass(frozen=True)
class Scheme:
    name: str
    use: str  # "weight" | "act" | "kv"
    elem: str  # element format: e4m3, e5m2, e2m1, int8, int4, or "none"
    bits: int  # element bits (0: unquantized)
    block: tuple[int, int]  # (rows, cols) sharing one scale; -1 = the whole dim
    scale_type: str
    real_system: str
    doc: str
    fn: Callable[[Tensor], Tensor] = field(repr=False, compare=False)

    @property
    def block_text(self) -> str:
        r, c = self.block
        if (r, c) == (-1, -1):
            return "per tensor"
        if (r, c) == (1, -1):
            return "per row (1 x K)"
        return f"{r} x {c}"


def _grouped(rule, block: int):
    def fn(x2: Tensor) -> Tensor:
        x3, k = R.blocks_along_k(x2, block)
        return R.unblock(rule(x3), k)

    return fn


def _int_groups(block: int, div: float, qmin: int, qmax: int):
    return _grouped(lambda x3: R.int_symmetric(x3, R.amax(x3, -1), div, qmin, qmax), block)


def _awq_groups(block: int):
    return _grouped(lambda x3: R.int_asymmetric(x3, x3.amin(-1, keepdim=True), x3.amax(-1, keepdim=True), 15), block)


def _nvfp4_tensor(w: Tensor) -> Tensor:
    return _grouped(lambda x3: R.nvfp4(x3, R.nvfp4_global_scale(R.amax(w, (0, 1)))[None]), 16)(w)


def _nvfp4_rows(x2: Tensor) -> Tensor:
    return _grouped(lambda x3: R.nvfp4(x3, R.nvfp4_global_scale(R.amax(x3, (1, 2)))), 16)(x2)


_MXFP8 = _grouped(lambda x3: R.mx(x3, R.E4M3), 32)
_MXFP4 = _grouped(lambda x3: R.mx(x3, R.E2M1), 32)
_NV = "e4m3 per 16 x fp32 global"

WEIGHT_QUANT: Registry[Scheme] = Registry(
    "weight_quant",
    {
        s.name: s
        for s in [
            Scheme(
                "fp8",
                "weight",
                "e4m3",
                8,
                (1, -1),
                "fp32 per channel",
                "compressed-tensors FP8 W8A8 channel-wise (llm-compressor FP8_DYNAMIC) in vLLM",
                "scale = max(row amax / 448, fp32 eps) (compressed-tensors calculate_qparams); "
                "q = e4m3(w / scale). vLLM's online `--quantization fp8` uses one per-tensor scale.",
                lambda w: R.fp8_rowwise(w, R.FP32_EPS),
            ),
            Scheme(
                "fp8_block",
                "weight",
                "e4m3",
                8,
                (128, 128),
                "fp32 per block",
                "vLLM `fp8` with weight_block_size [128, 128] (DeepSeek-V3 / Qwen3-FP8 checkpoints; FP8-RL)",
                "DeepGEMM per_block_cast_to_fp8: a = max(block amax, 1e-4), q = e4m3(w * 448 / a), "
                "dequant q * a / 448; partial edge blocks allowed.",
                lambda w: R.fp8_block2d(w, 128, 128),
            ),
            Scheme(
                "mxfp8",
                "weight",
                "e4m3",
                8,
                (1, 32),
                "e8m0 per 32",
                "vLLM `mxfp8`; compressed-tensors W8A8-MXFP8 (OCP MXFP8)",
                "OCP MX v1.0: X = 2^(floor(log2 amax) - 8), q = e4m3(w / X) saturating.",
                _MXFP8,
            ),
            Scheme(
                "mxfp4",
                "weight",
                "e2m1",
                4,
                (1, 32),
                "e8m0 per 32",
                "vLLM `mxfp4` (gpt-oss checkpoints; OCP MXFP4)",
                "OCP MX v1.0: X = 2^(floor(log2 amax) - 2), q = e2m1(w / X) saturating.",
                _MXFP4,
            ),
            Scheme(
                "nvfp4",
                "weight",
                "e2m1",
                4,
                (1, 16),
                _NV,
                "vLLM `modelopt_fp4` (NVIDIA ModelOpt NVFP4 checkpoints; compressed-tensors NVFP4)",
                "gs = 448*6 / tensor amax; s = e4m3(gs * block amax / 6); q = e2m1(w / (s / gs)); "
                "dequant q * s / gs (vLLM ref_nvfp4_quant).",
                _nvfp4_tensor,
            ),
            Scheme(
                "int8",
                "weight",
                "int8",
                8,
                (1, -1),
                "fp32 per channel",
                "W8A8-INT8 (SmoothQuant; ModelOpt/TensorRT-LLM narrow range; compressed-tensors uses "
                "amax/127.5 on [-128, 127])",
                "scale = row amax / 127, q = clamp(round(w / scale), -127, 127).",
                lambda w: R.int_symmetric(w, R.amax(w, -1), 127.0, -127, 127),
            ),
            Scheme(
                "int4",
                "weight",
                "int4",
                4,
                (1, 128),
                "fp32 per group of 128",
                "symmetric W4A16, group 128, narrow range (ModelOpt/TensorRT-LLM int4 convention)",
                "scale = group amax / 7, q = clamp(round(w / scale), -7, 7). GPTQ and "
                "compressed-tensors W4A16 instead use amax / 7.5 on [-8, 7] (`int4_gptq`); AutoAWQ is "
                "asymmetric with a zero point (`int4_awq`).",
                _int_groups(128, 7.0, -7, 7),
            ),
            Scheme(
                "int4_gptq",
                "weight",
                "int4",
                4,
                (1, 128),
                "fp32 per group of 128",
                "vLLM `gptq`/`gptq_marlin` sym=True, compressed-tensors W4A16 (zero point 8)",
                "scale = group amax / 7.5, q = clamp(round(w / scale), -8, 7) (GPTQ Quantizer sym; "
                "compressed-tensors calculate_qparams).",
                _int_groups(128, 7.5, -8, 7),
            ),
            Scheme(
                "int4_awq",
                "weight",
                "int4",
                4,
                (1, 128),
                "fp32 + zero point per group of 128",
                "vLLM `awq`/`awq_marlin` (AutoAWQ GEMM checkpoints, zero_point=True)",
                "scale = max(max - min, 1e-5) / 15, zero = clamp(-round(min / scale), 0, 15), "
                "q = clamp(round(w / scale) + zero, 0, 15) (AWQ pseudo_quantize_tensor; no activation-"
                "aware search, only the grid).",
                _awq_groups(128),
            ),
        ]
    },
    error=QuantError,
)

ACT_QUANT: Registry[Scheme] = Registry(
    "act_quant",
    {
        s.name: s
        for s in [
            Scheme(
                "fp8",
                "act",
                "e4m3",
                8,
                (1, -1),
                "fp32 per token, dynamic",
                "vLLM dynamic per-token FP8 (compressed-tensors FP8_DYNAMIC input)",
                "scale = max(row amax / 448, 1/(448*512)) (dynamic_per_token_scaled_fp8_quant); q = e4m3(x / scale).",
                lambda x: R.fp8_rowwise(x, R.VLLM_MIN_FP8_SCALE),
            ),
            Scheme(
                "fp8_block",
                "act",
                "e4m3",
                8,
                (1, 128),
                "fp32 per 1 x 128 group, dynamic",
                "vLLM per_token_group_quant_fp8 (DeepSeek-V3 block FP8; FP8-RL)",
                "scale = max(group amax, 1e-10) / 448, q = e4m3(x / scale); a partial last group "
                "is allowed (vLLM requires K % 128 == 0).",
                lambda x: R.fp8_groups(x, 128),
            ),
            Scheme(
                "mxfp8",
                "act",
                "e4m3",
                8,
                (1, 32),
                "e8m0 per 32, dynamic",
                "vLLM `mxfp8` / compressed-tensors W8A8-MXFP8 activations",
                "as weight mxfp8, per row.",
                _MXFP8,
            ),
            Scheme(
                "mxfp4",
                "act",
                "e2m1",
                4,
                (1, 32),
                "e8m0 per 32, dynamic",
                "vLLM compressed-tensors W4A4-MXFP4; AMD Quark w4a4_mxfp4",
                "as weight mxfp4, per row.",
                _MXFP4,
            ),
            Scheme(
                "nvfp4",
                "act",
                "e2m1",
                4,
                (1, 16),
                "e4m3 per 16 x fp32 per-token global",
                "vLLM `modelopt_fp4` W4A4 (served with a static calibrated per-tensor input scale)",
                "as weight nvfp4 but gs = 448*6 / row amax, so rows stay batch-invariant.",
                _nvfp4_rows,
            ),
            Scheme(
                "int8",
                "act",
                "int8",
                8,
                (1, -1),
                "fp32 per token, dynamic",
                "vLLM dynamic per-token INT8 (dynamic_scaled_int8_quant; W8A8-INT8)",
                "scale = row amax / 127, q = clamp(round(x / scale), -127, 127).",
                lambda x: R.int_symmetric(x, R.amax(x, -1), 127.0, -127, 127),
            ),
        ]
    },
    error=QuantError,
)


def _kv(fmt):
    return lambda x, scale=1.0: round_unchecked(x / scale, fmt) * scale


KV_ALIASES = {"fp8": "fp8_e4m3"}  # vLLM: "fp8" means e4m3 on CUDA
KV_CACHE: Registry[Scheme] = Registry(
    "kv_cache_dtype",
    {
        s.name: s
        for s in [
            Scheme(
                "auto",
                "kv",
                "none",
                0,
                (-1, -1),
                "none",
                "vLLM kv_cache_dtype=auto (model dtype)",
                "no quantization.",
                lambda x, scale=1.0: x,
            ),
            Scheme(
                "fp8_e4m3",
                "kv",
                "e4m3",
                8,
                (-1, -1),
                "fp32 per tensor (k_scale = v_scale = 1.0)",
                "vLLM kv_cache_dtype=fp8_e4m3 (alias `fp8`), no calibrated scales",
                "q = e4m3(x / scale) * scale, saturating (vLLM's cache write uses a saturating cast).",
                _kv(R.E4M3),
            ),
            Scheme(
                "fp8_e5m2",
                "kv",
                "e5m2",
                8,
                (-1, -1),
                "fp32 per tensor (scale 1.0)",
                "vLLM kv_cache_dtype=fp8_e5m2",
                "q = e5m2(x / scale) * scale, saturating.",
                _kv(R.E5M2),
            ),
        ]
    },
    error=QuantError,
    aliases=KV_ALIASES,
)


def _prepare(x: Tensor, name: str) -> Tensor:
    x = x.detach().float()
    check_finite(x, name)
    return x


def quantize_weight(w: Tensor, name: str) -> Tensor:
    """Fake-quantize a weight [N, K] (HF layout) with WEIGHT_QUANT[name]; float32 [N, K]."""
    scheme = WEIGHT_QUANT.lookup(name)
    if w.dim() != 2:
        raise QuantError(f"quantize {name}: weight must be 2-D [N, K], got shape {tuple(w.shape)}")
    w = _prepare(w, name)
    return scheme.fn(w) if w.numel() else w.clone()


def quantize_act(x: Tensor, name: str) -> Tensor:
    """Fake-quantize activations [..., K] row by row with ACT_QUANT[name]; float32, same shape."""
    scheme = ACT_QUANT.lookup(name)
    if x.dim() < 1:
        raise QuantError(f"quantize {name}: activations need a last (K) dim, got a scalar")
    x = _prepare(x, name)
    if not x.numel():
        return x.clone()
    return scheme.fn(x.reshape(-1, x.shape[-1])).reshape(x.shape)


def quantize_kv(x: Tensor, name: str, scale: float = 1.0) -> Tensor:
    """Fake-quantize K or V [..., Hkv, D] with KV_CACHE[name] and a per-tensor scale (vLLM's
    k_scale / v_scale; 1.0 = vLLM's default without calibrated scales); float32. "auto" returns
    x itself."""
    scheme = KV_CACHE.lookup(name)
    if scheme.name == "auto":
        return x  # unquantized: the same tensor, no checks, no copy
    if not (scale > 0 and scale < float("inf")):
        raise QuantError(f"quantize {name}: kv scale must be a positive finite number, got {scale}")
    x = _prepare(x, scheme.name)
    return scheme.fn(x, scale)


def format_table() -> list[dict]:
    """One row per scheme for the README table: name, use, bits, block, scale type, real system."""
    return [
        dict(
            name=s.name,
            use=s.use,
            elem=s.elem,
            bits=s.bits,
            block=s.block_text,
            scale_type=s.scale_type,
            real_system=s.real_system,
        )
        for reg in (WEIGHT_QUANT, ACT_QUANT, KV_CACHE)
        for s in reg.values()
    ]
