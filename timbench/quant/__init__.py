"""Low-precision formats for rollout/trainer conditions: exact, CPU-independent fake quantization.

formats: element grids (E4M3, E5M2, E2M1, E8M0, integers) with round-half-to-even and saturation.
rules:   scale rules (per channel/token, 128x128 blocks, OCP MX, NVFP4, symmetric/asymmetric int).
schemes: the registries WEIGHT_QUANT, ACT_QUANT, KV_CACHE and quantize_weight/act/kv.
ste:     fake_quant (straight-through gradient) and QuantCache.
"""

from timbench.quant.formats import FORMATS, FloatFormat, QuantError, e8m0_floor, round_to_format, round_to_int
from timbench.quant.schemes import (
    ACT_QUANT,
    KV_ALIASES,
    KV_CACHE,
    WEIGHT_QUANT,
    Scheme,
    format_table,
    quantize_act,
    quantize_kv,
    quantize_weight,
)
from timbench.quant.ste import QuantCache, fake_quant

__all__ = [
    "FORMATS",
    "FloatFormat",
    "QuantError",
    "e8m0_floor",
    "round_to_format",
    "round_to_int",
    "ACT_QUANT",
    "KV_ALIASES",
    "KV_CACHE",
    "WEIGHT_QUANT",
    "Scheme",
    "format_table",
    "quantize_act",
    "quantize_kv",
    "quantize_weight",
    "QuantCache",
    "fake_quant",
]
