"""Scale rules: how a block of values gets its scale before rounding onto an element grid.

Every rule takes a float32 tensor already cut into blocks, x3 [rows, nblocks, block] (the block
runs along K, the reduction dim; `blocks_along_k` pads a partial last block by repeating its last
element, which leaves the block's statistics unchanged), and returns the dequantized values in the
same shape. A rule touches only its own block (and, for NVFP4, a global scale the caller passes), so a per-row or
per-block rule is row-local by construction. All arithmetic is elementwise IEEE fp32 plus amax
(order-independent), so the bits are the same on every CPU and thread count.

Each rule follows a named recipe, cited where it is defined; where the real recipes differ in a
detail (x / scale vs x * (1/scale), the floor put under a zero block's scale) the citation says
which one this copies.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from timbench.quant.formats import FORMATS, floor_log2, pow2, round_unchecked

Tensor = torch.Tensor

E4M3, E5M2, E2M1 = FORMATS["e4m3"], FORMATS["e5m2"], FORMATS["e2m1"]
FP32_EPS = float(torch.finfo(torch.float32).eps)
# vLLM's dynamic FP8 activation kernels (dynamic_per_token_scaled_fp8_quant, the CUDA
# per_token_group_quant_fp8): scale = max(amax / 448, 1 / (448 * 512)).
VLLM_MIN_FP8_SCALE = 1.0 / (448.0 * 512.0)


def blocks_along_k(x2: Tensor, block: int) -> tuple[Tensor, int]:
    """[R, K] -> ([R, ceil(K/block), block], K). A partial last block is padded by repeating
    its last element, which leaves its amax, min and max (every rule's statistic) unchanged;
    the padding is cut off again by `unblock`."""
    k = x2.shape[-1]
    nb = -(-k // block)
    if nb * block != k:
        x2 = F.pad(x2, (0, nb * block - k), mode="replicate")
    return x2.reshape(x2.shape[0], nb, block), k


def unblock(y3: Tensor, k: int) -> Tensor:
    return y3.reshape(y3.shape[0], -1)[:, :k]


def amax(x: Tensor, dim) -> Tensor:
    return x.abs().amax(dim=dim, keepdim=True)


def divide_scaled(x: Tensor, scale: Tensor, fmt=E4M3) -> Tensor:
    """fmt(x / scale) * scale: the per-channel / per-token / group recipe (compressed-tensors,
    vLLM's dynamic quant kernels and its Triton per_token_group_quant_fp8 all divide by scale)."""
    return round_unchecked(x / scale, fmt) * scale


def fp8_rowwise(x2: Tensor, min_scale: float) -> Tensor:
    """E4M3 with one scale per row: scale = max(row amax / 448, min_scale)."""
    return divide_scaled(x2, torch.clamp(amax(x2, -1) / E4M3.max, min=min_scale))


def fp8_groups(x2: Tensor, group: int) -> Tensor:
    """E4M3, 1 x group blocks along K, as vLLM's per_token_group_quant_fp8 (the DeepSeek-V3
    activation recipe FP8-RL uses): scale = max(amax, 1e-10) / 448, q = e4m3(x / scale)."""
    x3, k = blocks_along_k(x2, group)
    scale = torch.clamp(amax(x3, -1), min=1e-10) / E4M3.max
    return unblock(divide_scaled(x3, scale), k)


def fp8_block2d(w: Tensor, bn: int, bk: int) -> Tensor:
    """E4M3 with one scale per bn x bk weight block, as DeepGEMM's / vLLM's test reference
    per_block_cast_to_fp8 (DeepSeek-V3 checkpoints, FP8-RL's 128x128 weight blocks):
    amax = max(block amax, 1e-4); q = e4m3(x * (448 / amax)); dequant q * (amax / 448).
    Partial edge blocks are padded by replication (their amax is that of the real elements)."""
    y, factor = fp8_block2d_split(w, bn, bk)
    return unblock2d(round_unchecked(y, E4M3) * factor, w.shape)


def fp8_block2d_split(w: Tensor, bn: int, bk: int) -> tuple[Tensor, Tensor]:
    """fp8_block2d before its rounding: (y = w4 * (448 / amax) [N/bn, bn, K/bk, bk], factor amax / 448)."""
    n, k = w.shape
    pn, pk = -(-n // bn) * bn, -(-k // bk) * bk
    wp = F.pad(w[None], (0, pk - k, 0, pn - n), mode="replicate")[0] if (pn, pk) != (n, k) else w
    w4 = wp.reshape(pn // bn, bn, pk // bk, bk)
    a = torch.clamp(amax(w4, (1, 3)), min=1e-4)
    return w4 * (E4M3.max / a), a / E4M3.max


def unblock2d(y4: Tensor, shape) -> Tensor:
    """[N/bn, bn, K/bk, bk] blocks (padded) -> [N, K]."""
    n, k = shape
    return y4.reshape(y4.shape[0] * y4.shape[1], -1)[:n, :k]


def mx(x3: Tensor, elem=E4M3) -> Tensor:
    """OCP Microscaling Formats (MX) v1.0 spec: shared_exp = floor(log2(block amax)) - emax_elem
    (2 for E2M1, 8 for E4M3), clamped to E8M0's [-127, 127]; scale X = 2^shared_exp; elements
    = elem(x / X), saturating (amax / X lies in [2^emax, 2^(emax+1)), so the top of the block can
    clip: 7.9 * X in E2M1 becomes 6 * X; that is the spec's rule, kept). floor(log2) comes from
    frexp and X from bits, so x / X and q * X are exact. An all-zero block stays zeros (its
    scale code is irrelevant; a real encoder writes 2^-127 there)."""
    y, scale = mx_split(x3, elem)
    return round_unchecked(y, elem) * scale


def mx_split(x3: Tensor, elem=E4M3) -> tuple[Tensor, Tensor]:
    """mx before its rounding: (y = x3 / X, the E8M0 scale X)."""
    scale = pow2(torch.clamp(floor_log2(amax(x3, -1)) - elem.emax, -127, 127))
    return x3 / scale, scale


_RECIP6 = torch.tensor(1.0 / 6.0, dtype=torch.float32)  # get_reciprocal(FLOAT4_E2M1_MAX) in fp32


def nvfp4_global_scale(a: Tensor) -> Tensor:
    """vLLM's get_nvfp4_global_scale: (448 * 6) / amax (encode direction; dequant divides by it).
    amax == 0 gives 1 (the values are all zero anyway); a tiny amax is capped at fp32 max."""
    gs = (E4M3.max * E2M1.max) / torch.where(a > 0, a, torch.ones_like(a))
    return torch.clamp(gs, max=float(torch.finfo(torch.float32).max))


def nvfp4(x3: Tensor, gs: Tensor) -> Tensor:
    """NVFP4 as vLLM's reference (tests/kernels/quantization/test_nvfp4_quant.py, ref_nvfp4_quant,
    checked bitwise against ops.scaled_fp4_quant; the ModelOpt/`modelopt_fp4` recipe):
      block_scale = e4m3(gs * (block_amax * fp32(1/6)))
      out_scale   = 1 / (block_scale * (1 / gs))   (0 where block_scale is 0)
      q           = e2m1(clamp(x * out_scale, -6, 6))
      dequant     = q * (block_scale / gs)          (dequantize_nvfp4_to_dtype)
    gs broadcasts against x3 ([1,1,1] per tensor, [R,1,1] per row)."""
    y, factor = nvfp4_split(x3, gs)
    return round_unchecked(y, E2M1) * factor


def nvfp4_split(x3: Tensor, gs: Tensor) -> tuple[Tensor, Tensor]:
    """nvfp4 before its element rounding: (y = clamp(x * out_scale, -6, 6), factor block_scale / gs)."""
    s = round_unchecked(gs * (amax(x3, -1) * _RECIP6), E4M3)
    inv = torch.where(s == 0, torch.zeros_like(s), 1.0 / torch.where(s == 0, torch.ones_like(s), s * (1.0 / gs)))
    return (x3 * inv).clamp_(-E2M1.max, E2M1.max), s / gs


def int_symmetric(x: Tensor, a: Tensor, div: float, qmin: int, qmax: int) -> Tensor:
    """scale = max(amax / div, fp32 eps); q = clamp(round_half_even(x / scale), qmin, qmax);
    dequant q * scale. div = qmax (narrow range: ModelOpt / TensorRT-LLM, vLLM's dynamic int8
    activations) or (qmax - qmin) / 2 (full range: compressed-tensors calculate_qparams, GPTQ)."""
    scale = int_scale(a, div)
    return torch.clamp(torch.round(x / scale), qmin, qmax) * scale


def int_scale(a: Tensor, div: float) -> Tensor:
    """int_symmetric's scale max(amax / div, fp32 eps)."""
    return torch.clamp(a / div, min=FP32_EPS)


def int_asymmetric(x: Tensor, lo: Tensor, hi: Tensor, qmax: int) -> Tensor:
    """AWQ's pseudo_quantize_tensor (zero_point=True, the AutoAWQ checkpoints vLLM serves):
    scale = max(hi - lo, 1e-5) / qmax, zero = clamp(-round(lo / scale), 0, qmax),
    q = clamp(round(x / scale) + zero, 0, qmax), dequant (q - zero) * scale; lo/hi are the
    group's min and max."""
    scale = torch.clamp(hi - lo, min=1e-5) / qmax
    zero = torch.clamp(-torch.round(lo / scale), 0, qmax)
    q = torch.clamp(torch.round(x / scale) + zero, 0, qmax)
    return (q - zero) * scale
