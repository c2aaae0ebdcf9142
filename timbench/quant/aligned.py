"""Rounding-aligned weight quantization (TRACE, arXiv 2610.07767): round toward the rollout's codeword.

Every weight scheme dequantizes to c * f: a codeword c on its element grid (E4M3 / E2M1 values, or
integers) times a factor f from the block's scale; round-to-nearest takes c = nearest(y) of the
pre-rounding value y = w / f. TRACE's rollout records its codewords and the training side's
quantization picks, of the two grid neighbours lo <= y <= hi of its own y, the one the rollout used.
A codeword that is not a neighbour any more (the weight moved past a grid point since the rollout)
is a case the description leaves open; here the neighbour nearest to it is taken. Both cases are one
formula:

    c_aligned = clamp(c_rollout, lo(y), hi(y))        (lo, hi: y rounded down / up on the grid)

With the rollout's own weights c_rollout = nearest(y) is lo or hi, so the result is the scheme's own
value bit for bit (tested): aligned rounding differs from straight-through re-quantization only
where the trainer's weights differ from the ones that sampled (the later mini-batches and epochs of
an update, or a stale engine). The gradient is the straight-through one (`fake_quant`): the codeword
is a fixed choice, the upstream gradient reaches the master weight unchanged.

Floor and ceil on a float grid use round_unchecked's quantum (a power of two from y's exponent), so
they are exact and the same bits on every CPU. `int4_awq` (a zero point per group) is not split.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from timbench.quant import rules as R
from timbench.quant.formats import FloatFormat, QuantError, check_finite, quantum, round_unchecked

Tensor = torch.Tensor


@dataclass(frozen=True)
class Split:
    """A scheme's quantization of one weight, stopped before the rounding: value = restore(grid(y) * factor)."""

    y: Tensor
    """Pre-rounding values, in the scheme's blocked layout."""
    factor: Tensor
    """The dequantization factor (block scale), broadcastable against y."""
    grid: FloatFormat | tuple[int, int]
    """The element grid: a float format, or an integer range (qmin, qmax)."""
    restore: Callable[[Tensor], Tensor]
    """Blocked layout -> the weight's [N, K]."""


def _groups(x2: Tensor, block: int, split, grid) -> Split:
    x3, k = R.blocks_along_k(x2, block)
    y, factor = split(x3)
    return Split(y, factor, grid, lambda y3: R.unblock(y3, k))


def _rows(x2: Tensor, scale: Tensor, grid) -> Split:
    return Split(x2 / scale, scale, grid, lambda y: y)


def _int_groups(block: int, div: float, qmin: int, qmax: int):
    def split(x2: Tensor) -> Split:
        x3, k = R.blocks_along_k(x2, block)
        scale = R.int_scale(R.amax(x3, -1), div)
        return Split(x3 / scale, scale, (qmin, qmax), lambda y3: R.unblock(y3, k))

    return split


def _nvfp4(w: Tensor) -> Split:
    gs = R.nvfp4_global_scale(R.amax(w, (0, 1)))[None]
    return _groups(w, 16, lambda x3: R.nvfp4_split(x3, gs), R.E2M1)


def _fp8_block(w: Tensor) -> Split:
    y, factor = R.fp8_block2d_split(w, 128, 128)
    return Split(y, factor, R.E4M3, lambda y4: R.unblock2d(y4, w.shape))


SPLITS: dict[str, Callable[[Tensor], Split]] = {
    # Each mirrors the scheme of the same name in timbench.quant.schemes.WEIGHT_QUANT (tested bitwise).
    "fp8": lambda w: _rows(w, torch.clamp(R.amax(w, -1) / R.E4M3.max, min=R.FP32_EPS), R.E4M3),
    "fp8_block": _fp8_block,
    "mxfp8": lambda w: _groups(w, 32, lambda x3: R.mx_split(x3, R.E4M3), R.E4M3),
    "mxfp4": lambda w: _groups(w, 32, lambda x3: R.mx_split(x3, R.E2M1), R.E2M1),
    "nvfp4": _nvfp4,
    "int8": lambda w: _rows(w, R.int_scale(R.amax(w, -1), 127.0), (-127, 127)),
    "int4": _int_groups(128, 7.0, -7, 7),
    "int4_gptq": _int_groups(128, 7.5, -8, 7),
}
"""Weight schemes that rounding-aligned quantization supports."""


def check_scheme(name: str) -> None:
    """QuantError unless `name` is a weight scheme with a split (one line naming the supported ones)."""
    if name not in SPLITS:
        raise QuantError(
            f"rounding-aligned quantization does not support weight_quant={name}; supported: {', '.join(SPLITS)}"
        )


def _split(w: Tensor, name: str) -> Split:
    check_scheme(name)
    if w.dim() != 2:
        raise QuantError(f"quantize {name}: weight must be 2-D [N, K], got shape {tuple(w.shape)}")
    w = w.detach().float()
    check_finite(w, name)
    return SPLITS[name](w)


def _nearest(y: Tensor, grid) -> Tensor:
    if isinstance(grid, FloatFormat):
        return round_unchecked(y, grid)
    return torch.clamp(torch.round(y), *grid)


def _down_up(y: Tensor, grid) -> tuple[Tensor, Tensor]:
    """y rounded down and up onto the grid (saturating at its ends)."""
    if not isinstance(grid, FloatFormat):
        return torch.clamp(torch.floor(y), *grid), torch.clamp(torch.ceil(y), *grid)
    y = y.float().contiguous()
    q = quantum(y, grid)  # a power of two: y / q is exact, so floor and ceil are too
    yq = y / q
    return (torch.floor(yq) * q).clamp_(-grid.max, grid.max), (torch.ceil(yq) * q).clamp_(-grid.max, grid.max)


def codewords(w: Tensor, name: str) -> Tensor:
    """The codewords quantize_weight(w, name) uses (round to nearest), float32 in the scheme's blocked layout."""
    s = _split(w, name)
    return _nearest(s.y, s.grid)


OUTSIDE = ("clamp", "nearest")
"""What a codeword that is no longer a grid neighbour of y becomes: the neighbour nearest to it, or nearest(y)."""


def quantize_aligned(w: Tensor, name: str, rollout: Tensor, outside: str = "clamp") -> Tensor:
    """w fake-quantized with each codeword rounded toward `rollout`'s (TRACE); float32 [N, K].

    `rollout` is `codewords(w_rollout, name)` of the weights that sampled, in the same blocked layout.
    `outside` (OUTSIDE) settles the codewords that are not a neighbour of w's own y any more.
    """
    if outside not in OUTSIDE:
        raise QuantError(f"rounding-aligned: outside={outside!r} is invalid; valid: {', '.join(OUTSIDE)}")
    s = _split(w, name)
    if tuple(rollout.shape) != tuple(s.y.shape):
        raise QuantError(
            f"rounding-aligned {name}: rollout codewords have shape {tuple(rollout.shape)}, "
            f"the weight's blocked layout is {tuple(s.y.shape)}"
        )
    lo, hi = _down_up(s.y, s.grid)
    c = torch.minimum(torch.maximum(rollout, lo), hi)
    if outside == "nearest":
        c = torch.where(c == rollout, c, _nearest(s.y, s.grid))
    return s.restore(c * s.factor)


class RolloutCodes:
    """The codewords of the weights a rollout sampled with, per trainer parameter (looked up by identity).

    Built from the trainer's model and the rollout's weights by name (its own state at the last sync, or a
    stale engine's behavior weights); a parameter's codewords are computed on first use, from the rollout
    weight cast to the compute dtype as the engine stores it, and kept for the step.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        rollout_weights: Mapping[str, Tensor],
        scheme: str,
        dtype: torch.dtype,
        outside: str = "clamp",
    ):
        check_scheme(scheme)
        self.scheme, self.dtype, self.outside = scheme, dtype, outside
        # Copies: the trainer's own weights (the rollout's, synchronous) change in the update passes.
        self._source = {
            id(p): (p, rollout_weights[n].detach().clone())
            for n, p in model.named_parameters()
            if p.dim() == 2 and n in rollout_weights
        }
        self._codes: dict[int, Tensor] = {}

    def get(self, param: Tensor) -> Tensor | None:
        """The rollout's codewords for `param`, or None when it is not one of the model's parameters."""
        entry = self._source.get(id(param))
        if entry is None or entry[0] is not param:
            return None
        if id(param) not in self._codes:
            self._codes[id(param)] = codewords(entry[1].to(self.dtype).float(), self.scheme)
        return self._codes[id(param)]
