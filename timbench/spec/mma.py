"""Accumulation order inside matrix instructions: the `mma_accum=` condition key of the exact linear.

A GPU matmul does not sum K in one chain. Tensor-core / matrix-core
instructions consume K in fixed-width chunks (bf16 `mma.sync.m16n8k16` and
AMD `v_mfma_f32_32x32x8bf16` take K = 16 and 8 per instruction; Hopper FP8
`wgmma` K = 32) and add each chunk's partial into an accumulator whose
precision and order the vendor chooses. Cross-vendor mismatch traces to this
order (arXiv 2610.05458), and Hopper's FP8 tensor cores keep only about 14
bits of the accumulator's mantissa, which DeepSeek-V3 works around by
promoting partial sums to FP32 every 128 elements (arXiv 2412.19437, §3.3.2).

`mma_accum=B` makes the exact linear sum K in blocks of width B: each block's
partial is the exact kernel's own fixed-order fp32 chain over its B products,
and the partials are added into an fp32 accumulator in ascending block order.
`mma_accum=B:eM` keeps only M mantissa bits of that accumulator (the low 23-M
bits chopped, i.e. rounded toward zero, after each block), a truncated
accumulator. `none` (the default) is one chain over all of K, which is what
B = 1 and B = K also give, bit for bit. Two "vendors" are two values of this
key; the same value on both sides is still zero mismatch, exactly. Forward
only: the backward stays the exact kernel's (the gradient of the same linear
map), so a trainer with this key trains with straight-through accumulation.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MmaAccum:
    """A K-block width (None: one chain) and the accumulator's mantissa bits (None: all 23 of fp32)."""

    block: int | None = None
    mantissa: int | None = None

    def __str__(self) -> str:
        if self.block is None:
            return "none"
        return f"{self.block}" + (f":e{self.mantissa}" if self.mantissa is not None else "")


def parse_mma_accum(v: str) -> MmaAccum:
    """'none' | 'B' | 'B:eM' (B >= 1, 1 <= M <= 22); raises ValueError otherwise."""
    v = str(v).strip()
    if v == "none":
        return MmaAccum()
    block, _, mant = v.partition(":")
    b = int(block)
    if b < 1:
        raise ValueError
    if not mant:
        return MmaAccum(b)
    if not mant.startswith("e"):
        raise ValueError
    m = int(mant[1:])
    if not 1 <= m <= 22:
        raise ValueError
    return MmaAccum(b, m)


VALID = "none|B|B:eM (B >= 1: K-block width dividing every matmul's K; M in 1..22: accumulator mantissa bits)"


__all__ = ["MmaAccum", "VALID", "parse_mma_accum"]
