"""Thread pools of the two arithmetic back ends (torch intra-op and numba), set up in one place.

numba's OpenMP threading layer turns on nested OpenMP parallelism process-wide when it launches
(`omp_set_nested(1)`, i.e. max-active-levels = INT_MAX). torch's CPU kernels that open a parallel
region inside another one (scaled_dot_product_attention's flash kernel) then spawn a fresh thread team
per inner region: on a 2-core AMD EPYC (Zen3) one SDPA call over 256 x 28 tokens went from 0.008 s to
2.3 s, which made every `kernels=torch` cell and benchmark ~100x slower. `start_numba_pool` launches
numba's pool and puts the nesting limit back to one level. Neither numba nor torch needs nesting here
(no exact kernel calls another parallel kernel), and the limit changes scheduling only, never a value.
"""

from __future__ import annotations

import ctypes
import re

import torch

_OPENMP_RUNTIME = re.compile(r"/lib(gomp|iomp5|omp)[^/]*\.so[^/]*$")
_started = False


def _loaded_openmp_runtimes() -> list[str]:
    """Paths of the OpenMP runtimes mapped into this process (torch bundles its own libgomp)."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if _OPENMP_RUNTIME.search(line.strip())}
    except OSError:  # not Linux: nothing to undo that this code knows how to find
        return []
    return sorted(paths)


def single_level_openmp() -> int:
    """Set max-active-levels = 1 in every loaded OpenMP runtime; returns how many runtimes were set."""
    n = 0
    for path in _loaded_openmp_runtimes():
        try:
            ctypes.CDLL(path).omp_set_max_active_levels(1)
            n += 1
        except (OSError, AttributeError):  # a runtime without the OpenMP 3 API cannot have nesting on
            pass
    return n


def start_numba_pool() -> None:
    """Launch numba's thread pool now (idempotent), then undo its nested-OpenMP side effect."""
    global _started
    if _started:
        return
    from numba.np.ufunc import parallel  # deferred: numba is heavy

    parallel._launch_threads()
    single_level_openmp()
    _started = True


def set_threads(n: int) -> None:
    """Pin torch intra-op and numba (exact kernels) threads to `n` (numba: at most its pool size)."""
    if n < 1:
        raise ValueError(f"threads must be >= 1, got {n}")
    start_numba_pool()
    torch.set_num_threads(n)
    import numba  # deferred: numba is heavy

    numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))
