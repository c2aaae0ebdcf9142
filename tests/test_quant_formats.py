"""Element grids: round_to_format against torch's float8 casts and an independent brute-force grid."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch

from timbench.quant import FORMATS, QuantError, e8m0_floor, round_to_format, round_to_int

pytestmark = pytest.mark.unit  # builds no model (make test-unit)

TORCH_DTYPE = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


def grid_from_bits(ebits: int, mbits: int, bias: int, fmt: str):
    """All non-negative finite values of a format from its bit layout, with their mantissa LSB."""
    vals, lsb = [], []
    for e in range(2**ebits):
        for m in range(2**mbits):
            if fmt == "e4m3" and e == 15 and m == 7:  # E4M3FN: S.1111.111 is NaN
                continue
            if fmt == "e5m2" and e == 31:  # IEEE-style inf/NaN
                continue
            frac = m / 2**mbits
            v = frac * 2.0 ** (1 - bias) if e == 0 else (1 + frac) * 2.0 ** (e - bias)
            vals.append(v)
            lsb.append(m & 1)
    order = np.argsort(vals)
    return np.array(vals)[order], np.array(lsb)[order]


def brute_force(x: np.ndarray, fmt: str) -> np.ndarray:
    """Nearest grid value by exhaustive search in float64, ties to the even mantissa, sign kept."""
    f = FORMATS[fmt]
    vals, lsb = grid_from_bits(f.ebits, f.mbits, f.bias, fmt)
    a = np.abs(x.astype(np.float64))[:, None]
    d = np.abs(a - vals[None, :])
    dmin = d.min(axis=1, keepdims=True)
    cand = d == dmin
    # among tied candidates prefer the even-mantissa one (there are at most two)
    pick = np.where(cand & (lsb[None, :] == 0), 1, 0) + cand
    idx = pick.argmax(axis=1)
    return np.copysign(vals[idx], x).astype(np.float32)


def points(fmt: str) -> torch.Tensor:
    f = FORMATS[fmt]
    vals, _ = grid_from_bits(f.ebits, f.mbits, f.bias, fmt)
    mids = (vals[1:] + vals[:-1]) / 2
    g = torch.Generator().manual_seed(7)
    mid32 = torch.tensor(mids, dtype=torch.float32)
    inf = torch.tensor(float("inf"))
    near = torch.cat([torch.nextafter(mid32, inf), torch.nextafter(mid32, -inf)])
    # random fp32 over many binades: random mantissa bits, exponent spanning the format and beyond
    n = 20000
    mant = torch.randint(0, 2**23, (n,), generator=g, dtype=torch.int32)
    lo, hi = f.emin - f.mbits - 4, f.emax + 3
    exp = torch.randint(lo + 127, hi + 127, (n,), generator=g, dtype=torch.int32)
    rand = torch.bitwise_or(torch.bitwise_left_shift(exp, 23), mant).view(torch.float32)
    tiny = torch.tensor(
        [
            0.0,
            1e-40,
            1e-30,
            f.min_subnormal / 2,
            f.min_subnormal / 4,
            f.min_subnormal * 0.75,
            f.min_subnormal,
            f.min_normal,
        ],
        dtype=torch.float32,
    )
    pos = torch.cat([torch.tensor(vals, dtype=torch.float32), mid32, near, rand, tiny])
    return torch.cat([pos, -pos])


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2", "e2m1"])
def test_matches_brute_force_grid(fmt):
    x = points(fmt)
    ours = round_to_format(x, fmt)
    ref = torch.from_numpy(brute_force(x.numpy(), fmt))
    assert torch.equal(ours.view(torch.int32), ref.view(torch.int32))  # bitwise, signs of zero too


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_matches_torch_cast(fmt):
    x = points(fmt)
    ours = round_to_format(x, fmt)
    theirs = x.to(TORCH_DTYPE[fmt]).float()
    f = FORMATS[fmt]
    # below the midpoint above max both round the same way (ties to even), bit for bit
    top_mid = f.max + 2.0 ** (f.emax - f.mbits - 1)
    inside = x.abs() < top_mid
    assert torch.equal(ours[inside].view(torch.int32), theirs[inside].view(torch.int32))
    # above it we saturate; torch gives NaN (older e4m3fn), +-448 (torch 2.13 e4m3fn) or +-inf (e5m2)
    assert torch.equal(ours[~inside], torch.sign(x[~inside]) * f.max)
    assert bool((theirs[~inside].abs() >= f.max).all() | theirs[~inside].isnan().all())


def test_e2m1_values_and_ties():
    x = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 0.26, 5.01, 7.0, 1e9, -0.2, -0.0])
    want = torch.tensor([0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 0.5, 6.0, 6.0, 6.0, -0.0, -0.0])
    got = round_to_format(x, "e2m1")
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))


def test_signed_zero_kept():
    x = torch.tensor([-0.0, 0.0, -1e-20, 1e-20])
    for fmt in ("e4m3", "e5m2", "e2m1"):
        assert round_to_format(x, fmt).signbit().tolist() == [True, False, True, False]


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2", "e2m1", "e8m0"])
def test_non_finite_raises_one_line(fmt):
    x = torch.tensor([1.0, float("nan"), float("inf"), -float("inf"), 2.0])
    with pytest.raises(QuantError, match=rf"^quantize {fmt}: 3 non-finite values in input; "):
        round_to_format(x, fmt)
    try:
        round_to_format(x, fmt)
    except QuantError as err:
        assert "\n" not in str(err) and isinstance(err, ValueError)


def test_unknown_format():
    with pytest.raises(QuantError, match="unknown format 'e3m4'; valid: e4m3, e5m2, e2m1, e8m0"):
        round_to_format(torch.ones(2), "e3m4")


def test_e8m0_nearest_and_floor():
    # brute force over all 255 finite codes: nearest power of two, ties to the even biased exponent
    g = torch.Generator().manual_seed(3)
    e = torch.randint(-140, 128, (5000,), generator=g).double()
    m = 1 + torch.rand(5000, generator=g, dtype=torch.float64)
    x = (m * 2.0**e).float()
    x = x[(x > 0) & torch.isfinite(x)]
    ties = torch.tensor([1.5 * 2.0**k for k in range(-127, 127)], dtype=torch.float32)
    x = torch.cat([x, ties, torch.tensor([2.0**-127, 2.0**127, 3e38, 1e-45])])
    codes = np.arange(-127, 128)
    vals = 2.0 ** codes.astype(np.float64)
    xd = x.double().numpy()[:, None]
    d = np.abs(xd - vals[None, :])
    cand = d == d.min(axis=1, keepdims=True)
    pick = cand.astype(int) + (cand & ((codes + 127) % 2 == 0)[None, :])
    want = torch.from_numpy(vals[pick.argmax(axis=1)]).float()
    assert torch.equal(round_to_format(x, "e8m0"), want)
    flo = torch.from_numpy(vals[np.clip(np.floor(np.log2(x.double().numpy())), -127, 127).astype(int) + 127]).float()
    assert torch.equal(e8m0_floor(x), flo)
    with pytest.raises(QuantError, match="1 values <= 0"):
        round_to_format(torch.tensor([1.0, 0.0]), "e8m0")


def test_round_to_int():
    x = torch.tensor([0.5, 1.5, 2.5, -0.5, -1.5, 126.6, 200.0, -200.0, 7.5, -8.4])
    assert round_to_int(x, 127).tolist() == [0, 2, 2, -0, -2, 127, 127, -127, 8, -8]
    assert round_to_int(x, 7, -8).tolist() == [0, 2, 2, -0, -2, 7, 7, -8, 7, -8]
    with pytest.raises(QuantError, match="1 non-finite"):
        round_to_int(torch.tensor([float("nan")]), 7)


def test_formats_registry_consistent():
    for name, f in FORMATS.items():
        vals, _ = grid_from_bits(f.ebits, f.mbits, f.bias, name)
        if name != "e8m0":
            assert vals.max() == f.max and vals[vals > 0].min() == f.min_subnormal
            assert f.min_normal == 2.0**f.emin


def test_no_cpu_dependent_transcendentals():
    """The quantizers use only IEEE-exact ops; exp/log/pow run per-CPU SIMD code in torch."""
    src = Path(__file__).resolve().parents[1] / "timbench" / "quant"
    banned = re.compile(
        r"\b(exp|exp2|expm1|log|log2|log10|log1p|pow|float_power|sigmoid|softmax)\s*\(|\*\*\s*[a-zA-Z(]"
    )
    for path in sorted(src.glob("*.py")):
        code = "\n".join(line.split("#")[0] for line in path.read_text().splitlines())
        code = re.sub(r'"""[\s\S]*?"""', "", code)  # docstrings may name the rules
        assert not banned.search(code), f"{path.name}: {banned.search(code).group(0)}"


def test_single_nan_anywhere_is_caught():
    """The finiteness check reduces with amax; a lone NaN or inf must be found at any position."""
    g = torch.Generator().manual_seed(5)
    for n in (1, 7, 8, 15, 16, 17, 33, 1000):
        for pos in {0, n // 2, n - 1}:
            for bad in (float("nan"), float("inf"), -float("inf")):
                x = torch.randn(n, generator=g)
                x[pos] = bad
                with pytest.raises(QuantError, match="1 non-finite"):
                    round_to_format(x, "e4m3")
