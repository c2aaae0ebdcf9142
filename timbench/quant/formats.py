"""Element grids of the low-precision formats: FP8 E4M3/E5M2, FP4 E2M1, E8M0 scales, integers.

`round_to_format(x, fmt)` rounds every element of a float tensor to the nearest value the format
can represent, ties to even (the even mantissa LSB), and returns it as float32 ("fake quant": the
exact fp32 kernels then run on the quantized values).

How, and why it is the same on every CPU: for a float format with `mbits` mantissa bits the
representable values near |x| are the multiples of the quantum q = 2^(E - mbits), where E is x's
unbiased exponent clamped to [emin, emax] (the clamp at emin gives the subnormals, the one at emax
the top binade). q is built from x's fp32 exponent bits, x / q is exact (q is a power of two),
torch.round is IEEE round-half-to-even on an integer-valued significand (so "even integer" is
"even mantissa LSB"), and round(x / q) * q is exact. No exp/log/pow anywhere (those run
per-CPU SIMD code in torch); only bit ops, * /, round, clamp, comparisons and frexp.

Rules (documented choices):
- Saturation: results are clamped to +-max, as vLLM does before every FP8 cast (its quant kernels
  clamp to +-448 and convert with `__NV_SATFINITE`; its KV-cache writes convert with
  `__NV_SATFINITE`). torch's casts differ above the top midpoint (464 for E4M3, 61440 for E5M2):
  `float8_e5m2` gives +-inf there; `float8_e4m3fn` gives NaN in c10's scalar conversion (older torch; not
  measured here) but saturates to +-448
  in the installed torch 2.13 CPU build (measured; it even maps inf to 448). Below those points
  the casts and this function agree bit for bit (tested).
- NaN/inf input: `QuantError` (a ValueError), one line naming the format and the count.
- Signed zero: kept (-0.0 and negatives that round to zero come back as -0.0, like torch's casts).
- E8M0 (the MX shared scale, 2^-127..2^127, unsigned, no zero) has no mantissa: `round_to_format`
  rounds a positive value to the nearest power of two (ties to the even biased exponent), and
  `e8m0_floor` gives 2^floor(log2 x), the rule the OCP MX v1.0 spec uses for scales.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..util.registry import Registry

Tensor = torch.Tensor


class QuantError(ValueError):
    """Bad input to a quantizer (non-finite values, unknown format or scheme)."""


@dataclass(frozen=True)
class FloatFormat:
    name: str
    ebits: int
    mbits: int
    bias: int
    max: float  # largest finite magnitude (saturation point)
    min_normal: float
    min_subnormal: float  # 0.0 when the format has no subnormals (E8M0)
    emin: int  # unbiased exponent of the smallest normal
    emax: int  # unbiased exponent of the largest finite value
    doc: str


FORMATS: Registry[FloatFormat] = Registry(
    "format",
    {
        "e4m3": FloatFormat(
            "e4m3",
            4,
            3,
            7,
            448.0,
            2.0**-6,
            2.0**-9,
            -6,
            8,
            "OCP FP8 E4M3FN (torch.float8_e4m3fn): no inf, one NaN code (S.1111.111), so the top "
            "binade reaches 1.75*2^8 = 448; subnormals down to 2^-9.",
        ),
        "e5m2": FloatFormat(
            "e5m2",
            5,
            2,
            15,
            57344.0,
            2.0**-14,
            2.0**-16,
            -14,
            15,
            "OCP FP8 E5M2 (torch.float8_e5m2): IEEE-like with inf/NaN, max 1.75*2^15 = 57344; "
            "subnormals down to 2^-16.",
        ),
        "e2m1": FloatFormat(
            "e2m1",
            2,
            1,
            1,
            6.0,
            1.0,
            0.5,
            0,
            2,
            "OCP FP4 E2M1 (the MXFP4/NVFP4 element): values 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives; "
            "no inf/NaN.",
        ),
        "e8m0": FloatFormat(
            "e8m0",
            8,
            0,
            127,
            2.0**127,
            2.0**-127,
            0.0,
            -127,
            127,
            "OCP E8M0 (the MX shared scale): unsigned powers of two 2^-127..2^127, code 0xFF is NaN, no zero, no sign.",
        ),
    },
    error=QuantError,
)


def check_finite(x: Tensor, what: str) -> None:
    """Raise QuantError naming `what` and the count of NaN/inf elements, if there are any."""
    # amax propagates NaN and inf, and costs a tenth of isfinite(x).all() (measured)
    if x.numel() and not bool(torch.isfinite(x.abs().amax())):
        n = int((~torch.isfinite(x)).sum())
        raise QuantError(f"quantize {what}: {n} non-finite values in input; weights/activations must be finite")


def get_format(fmt: str) -> FloatFormat:
    return FORMATS.lookup(fmt)


def pow2(e: Tensor) -> Tensor:
    """2.0**e as float32 for an integer tensor e in [-149, 127], built from bits (exact)."""
    e = e.to(torch.int32)
    normal = torch.bitwise_left_shift(torch.clamp(e + 127, min=0), 23)
    sub = torch.bitwise_left_shift(torch.ones_like(e), torch.clamp(e + 149, 0, 22))
    return torch.where(e >= -126, normal, sub).view(torch.float32)


def quantum(x: Tensor, f: FloatFormat) -> Tensor:
    """The grid spacing of `f` at each element of a contiguous fp32 x: 2^(clamp(E, emin, emax) - mbits)."""
    # Made in the bit domain: keep x's exponent field, clamp it, lower it by mbits. Every format here
    # has emin - mbits >= -126, so q is a normal fp32 and its bits are just the biased exponent << 23.
    q = torch.bitwise_and(x.view(torch.int32), 0x7F800000)
    q.clamp_((f.emin + 127) << 23, (f.emax + 127) << 23).sub_(f.mbits << 23)
    return q.view(torch.float32)


def round_unchecked(x: Tensor, f: FloatFormat) -> Tensor:
    """round_to_format without the finiteness check (callers that checked already)."""
    x = x.float().contiguous()
    q = quantum(x, f)
    # x / q and round(.) * q are exact: q is a power of two and the quotient stays a normal fp32.
    # (In-place after the first op: fewer fresh buffers, which cost more than the arithmetic.)
    return torch.div(x, q).round_().mul_(q).clamp_(-f.max, f.max)


def round_to_format(x: Tensor, fmt: str) -> Tensor:
    """Round each element to the nearest `fmt` value, ties to even, saturating at +-max; fp32 out."""
    f = get_format(fmt)
    check_finite(x, fmt)
    if f.name == "e8m0":
        return _round_e8m0(x.float())
    return round_unchecked(x, f)


def _positive(x: Tensor, what: str) -> None:
    n = int((x <= 0).sum())
    if n:
        raise QuantError(f"quantize {what}: {n} values <= 0 in input; E8M0 encodes positive powers of two only")


def _round_e8m0(x: Tensor) -> Tensor:
    _positive(x, "e8m0")
    m, e = torch.frexp(x)  # x = m * 2^e, m in [0.5, 1): exact, subnormals included
    e = e - 1  # x = (2m) * 2^e with 2m in [1, 2)
    two_m = m * 2
    odd = torch.remainder(e + 127, 2) == 1
    up = (two_m > 1.5) | ((two_m == 1.5) & odd)  # 1.5*2^e is the midpoint; tie -> even code
    return pow2(torch.clamp(e + up.to(e.dtype), -127, 127))


def e8m0_floor(x: Tensor) -> Tensor:
    """2^floor(log2 x) clamped to the E8M0 range, for positive finite x (OCP MX scale rule)."""
    check_finite(x, "e8m0")
    _positive(x, "e8m0")
    return pow2(torch.clamp(floor_log2(x), -127, 127))


def floor_log2(x: Tensor) -> Tensor:
    """floor(log2 x) as int32 for positive finite x, exactly (frexp, no log)."""
    _, e = torch.frexp(x.float())
    return (e - 1).to(torch.int32)


def round_to_int(x: Tensor, qmax: int, qmin: int | None = None) -> Tensor:
    """Round half to even onto the integers, clamped to [qmin, qmax] (qmin defaults to -qmax)."""
    check_finite(x, f"int (qmax {qmax})")
    lo = -qmax if qmin is None else qmin
    return torch.clamp(torch.round(x.float()), lo, qmax)
