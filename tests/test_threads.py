"""Thread pools: numba's OpenMP layer must not leave nested OpenMP on for torch (timbench.util.threads)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from timbench.util.threads import set_threads

# Starts torch's pool first (the order in which the slowdown was seen), then numba's, and reports the
# nesting limit of every loaded OpenMP runtime.
_PROBE = """
import ctypes, json, sys, torch
import torch.nn.functional as F
q = torch.randn(8, 4, 16, 32)
F.scaled_dot_product_attention(q, q, q, is_causal=True)
if sys.argv[1] == "timbench":
    import timbench.kernels  # noqa: F401  (starts numba's pool the way timbench does)
else:
    import numba; numba.set_num_threads(2)  # bare numba: its layer turns nesting on
from numba.np.ufunc import parallel
from timbench.util.threads import _loaded_openmp_runtimes
print(json.dumps({"launched": bool(parallel._is_initialized),
                  "levels": [ctypes.CDLL(p).omp_get_max_active_levels() for p in _loaded_openmp_runtimes()]}))
"""


def _levels(mode: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, mode],
        capture_output=True,
        text=True,
        check=True,
        env={"NUMBA_THREADING_LAYER": "omp", "PATH": "/usr/bin:/bin"},
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_numba_pool_leaves_openmp_single_level():
    got = _levels("timbench")
    assert got["launched"], "importing timbench.kernels did not start numba's pool"
    assert got["levels"] and all(lv == 1 for lv in got["levels"]), got


def test_bare_numba_turns_nesting_on():
    # The negative control: without timbench.util.threads, numba's omp layer leaves nesting on; if this ever
    # stops holding, the guard above is testing nothing and can go.
    got = _levels("bare")
    assert got["launched"] and any(lv > 1 for lv in got["levels"]), got


def test_set_threads_refuses_zero():
    with pytest.raises(ValueError, match="threads must be >= 1"):
        set_threads(0)
