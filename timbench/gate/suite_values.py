"""The values a gate suite may hold: each probe parameter and top-level key with its valid range.

A suite's numbers are its test: `requests: -5` or `samples: 0` made a probe do nothing and pass, so every known
key is checked when the suite loads and a bad one is a one-line ValueError naming the key, its value and what
is valid. Keys not listed here are left to the probe that reads them.
"""

from __future__ import annotations

import math

COUNTS = (
    "requests",
    "max_new_tokens",
    "updates",
    "prompts",
    "samples",
    "seeds",
    "steps",
    "window",
    "prompts_per_step",
    "group_size",
    "eval_n",
)
"""Probe parameters that count work: an integer >= 1."""
COUNT_LISTS = ("prompt_lengths", "batch_sizes", "batches")
"""Non-empty lists of integers >= 1."""
FRACTIONS = {"alpha": "a number in (0, 1)", "max_frac_bf16_exact": "a number in [0, 1]"}
POSITIVE = ("lr", "temperature")
NON_NEGATIVE = ("max_mean_abs_diff",)
SEED_MAX = 2**32 - 1


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v) -> bool:
    return (isinstance(v, (int, float)) and not isinstance(v, bool)) and math.isfinite(v)


def value_problem(key: str, v) -> str | None:
    """What is wrong with `v` as the value of suite key `key` (None: valid, or a key not checked here)."""
    if key in COUNTS and not (_is_int(v) and v >= 1):
        return "an integer >= 1"
    if key in COUNT_LISTS and not (isinstance(v, list) and v and all(_is_int(x) and x >= 1 for x in v)):
        return "a non-empty list of integers >= 1"
    if key == "alpha" and not (_is_num(v) and 0 < v < 1):
        return FRACTIONS[key]
    if key == "max_frac_bf16_exact" and not (_is_num(v) and 0 <= v <= 1):
        return FRACTIONS[key]
    if key in POSITIVE and not (_is_num(v) and v > 0):
        return "a finite number > 0"
    if key in NON_NEGATIVE and not (_is_num(v) and v >= 0):
        return "a finite number >= 0"
    if key == "seed" and not (_is_int(v) and 0 <= v <= SEED_MAX):
        return f"an integer 0..{SEED_MAX}"
    if key == "version" and not (_is_int(v) and v >= 1):
        return "an integer >= 1"
    return None


def check_values(doc: dict, where: str) -> None:
    """Refuse (one-line ValueError) the first invalid value of suite `doc`: its top-level seed, temperature and
    version, then each probe's parameters (a probe's entry must be a mapping)."""
    for key in ("version", "seed", "temperature"):
        if key in doc:
            _check(key, doc[key], where)
    for probe, params in (doc.get("probes") or {}).items():
        if params is None:
            continue
        if not isinstance(params, dict):
            raise ValueError(f"{where}: probes.{probe} is {params!r}; valid: a mapping of the probe's parameters")
        for key, v in params.items():
            _check(f"probes.{probe}.{key}", v, where, key)


def _check(name: str, v, where: str, key: str | None = None) -> None:
    valid = value_problem(key or name, v)
    if valid:
        raise ValueError(f"{where}: {name} is {v!r}; valid: {valid}")
