"""timbench.metrics.ratios: the one definition of each ratio quantity, checked against plain Python."""

import math
import os

import torch

from timbench.metrics.ratios import (
    LOG_RATIO_BOUND,
    k1,
    k2,
    k3,
    log_ratio,
    log_rho,
    masked_mean,
    select,
    seq_log_ratio,
    seq_max,
    seq_mean,
    seq_sum,
)

D = torch.float64


def test_log_ratio_clamps_at_20_both_ways():
    assert LOG_RATIO_BOUND == 20.0
    got = log_ratio(torch.tensor([30.0, -30.0, 0.5], dtype=D), torch.tensor([0.0, 0.0, 1.5], dtype=D))
    assert got.tolist() == [20.0, -20.0, -1.0]


def test_k_estimators_by_hand():
    lr = torch.tensor([math.log(2), 0.0, -math.log(4)], dtype=D)
    assert k1(lr).tolist() == [-math.log(2), -0.0, math.log(4)]
    assert k2(lr).tolist() == [0.5 * math.log(2) ** 2, 0.0, 0.5 * math.log(4) ** 2]
    want = [2 - 1 - math.log(2), 0.0, 0.25 - 1 + math.log(4)]
    assert all(math.isclose(a, b, rel_tol=1e-15) for a, b in zip(k3(lr).tolist(), want))
    assert float(k3(torch.linspace(-5, 5, 101, dtype=D)).min()) >= -1e-15  # >= 0 up to rounding near log r = 0


def test_log_rho_is_zero_outside_the_mask_even_for_nan():
    old = torch.tensor([[-1.0, math.nan, 50.0]], dtype=torch.float32)
    roll = torch.tensor([[-1.5, -2.0, 0.0]], dtype=torch.float32)
    lr = log_rho(old, roll, torch.tensor([[True, False, True]]))
    assert lr.dtype == D and lr.tolist() == [[0.5, 0.0, 20.0]]
    assert select(torch.tensor([math.nan, 1.0]), torch.tensor([False, True])).tolist() == [0.0, 1.0]


def test_sequence_forms_over_masked_in_tokens():
    x = torch.tensor([[1.0, 2.0, 100.0], [-3.0, math.nan, 4.0], [7.0, 7.0, 7.0]], dtype=D)
    mask = torch.tensor([[True, True, False], [True, False, True], [False, False, False]])
    assert seq_sum(x, mask).tolist() == [3.0, 1.0, 0.0]
    assert seq_mean(x, mask).tolist() == [1.5, 0.5, 0.0]  # an empty row gives 0, not NaN
    assert seq_max(x, mask).tolist() == [2.0, 4.0, -math.inf]
    assert float(masked_mean(x, mask)) == (1 + 2 - 3 + 4) / 4
    big = torch.full((1, 3), 9.0, dtype=D)  # sum 27 -> clamped to 20, as verl clamps the raw sum
    assert seq_log_ratio(big, torch.ones(1, 3, dtype=torch.bool)).tolist() == [20.0]


# Everything of the ratio maths that reaches training or a metric, hashed: mismatch metrics, remedy
# results, PPO/GSPO losses and gradients with a KL term, drift, GRPO advantages. Inputs come from
# numpy (scalar code), so only timbench's arithmetic can differ between the processes compared.
PROBE = """
import hashlib, json, numpy as np, torch
from timbench.metrics.mismatch import mismatch_metrics
from timbench.rl.algorithms import agg_loss, grpo_advantage, gspo_loss, kl_penalty, ppo_clip_loss
from timbench.rl.drift import objective_drift
from timbench.remedies import RemedyBatch, load_remedy
rng = np.random.default_rng(0)
U = lambda *s: torch.from_numpy(rng.random(s)).float()
G = lambda *s: torch.from_numpy(rng.standard_normal(s)).float()
N, T = 256, 301
old = -U(N, T) * 4
roll = old + 0.5 * G(N, T)
mask = U(N, T) > 0.2
adv = grpo_advantage((U(N) > 0.5).float(), 8)
h = hashlib.sha256(adv.numpy().tobytes())
put = lambda d: h.update(json.dumps(d, sort_keys=True).encode())
put(mismatch_metrics(old, roll, mask))
for name in ["tis_token", "tis_token+seq_rs", "mis_seq", "trm_max"]:
    r = load_remedy(name)(RemedyBatch(old, roll, adv, mask, 8))
    put(r.metrics)
    h.update(r.mask.numpy().tobytes() + (b"" if r.weights is None else r.weights.numpy().tobytes()))
for fn, agg in [(ppo_clip_loss, "token-mean"), (gspo_loss, "seq-mean-token-mean")]:
    lp = (old + 0.05 * G(N, T)).requires_grad_()
    loss, m = fn(lp, old, adv, mask, agg=agg, weights=U(N, T) + 0.5)
    (loss + 0.1 * agg_loss(kl_penalty(lp, roll), mask, agg)).backward()
    put(m)
    put(objective_drift(lp, old, roll, adv, mask))
    h.update(lp.grad.numpy().tobytes() + loss.detach().numpy().tobytes())
print(h.hexdigest())
"""


def _probe(capability: str, threads: int) -> str:
    import subprocess
    import sys

    env = dict(
        os.environ,
        ATEN_CPU_CAPABILITY=capability,
        OMP_NUM_THREADS=str(threads),
        NUMBA_NUM_THREADS=str(threads),
        MKL_NUM_THREADS=str(threads),
    )
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip()


def test_ratio_maths_is_bitwise_identical_across_cpu_dispatch_and_thread_counts():
    # Scalar ATen code on one thread vs the widest vector code this CPU has on two: torch.sum gave
    # different bits for 1 vs 2 threads here before the reductions became fixed-order.
    flags = open("/proc/cpuinfo").read() if os.path.exists("/proc/cpuinfo") else ""
    wide = "avx512" if "avx512f" in flags else "avx2"
    assert _probe("default", 1) == _probe(wide, 2)
