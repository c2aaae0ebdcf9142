"""Is a plug-in remedy's step the same bytes under another thread count or CPU kernel set?

`submit` runs the remedy once on a seeded synthetic batch (large enough that torch splits its work across
threads) in three fresh processes: 1 thread, 2 threads, and 2 threads with torch's vector kernels forced to
the portable `default` set (ATEN_CPU_CAPABILITY, the closest this machine gets to another CPU). Differing
digests of weights, keep-mask and metrics mean the plug-in uses CPU-dependent maths (torch.exp, torch.sum,
...), so its committed results would not reproduce elsewhere: a warning names the fix (fexp, fsum from
timbench.remedies). Built-ins are covered by tests/test_determinism.py and are not checked here.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

from ..eta import Eta

SETTINGS = (
    ("1 thread", {"TIMBENCH_REPRO_THREADS": "1"}),
    ("2 threads", {"TIMBENCH_REPRO_THREADS": "2"}),
    ("2 threads, portable CPU kernels", {"TIMBENCH_REPRO_THREADS": "2", "ATEN_CPU_CAPABILITY": "default"}),
)


def step_digest(spec: str, args: dict, n: int = 64, t: int = 1024, group: int = 8) -> str:
    """sha256 of one remedy step on a seeded synthetic batch (the function each probe process runs)."""
    import numpy as np  # deferred: numpy is heavy
    import torch  # deferred: torch is heavy

    from ..remedies import RemedyBatch, load_remedy  # deferred: torch is heavy

    rng = np.random.default_rng(0)  # numpy's generator: torch.randn's bits depend on the CPU kernel set
    old = torch.from_numpy(-rng.random((n, t), dtype=np.float32) * 4)
    roll = old + torch.from_numpy(rng.standard_normal((n, t), dtype=np.float32) * np.float32(0.3))
    adv = torch.from_numpy(rng.standard_normal(n, dtype=np.float32))
    mask = torch.from_numpy(rng.random((n, t)) < 0.9)
    res = load_remedy(spec, args)(RemedyBatch(old, roll, adv, mask, group))
    h = hashlib.sha256()
    for x in (res.weights, res.mask):
        if x is not None:
            h.update(x.detach().contiguous().numpy().tobytes())
    h.update(json.dumps(res.metrics, sort_keys=True).encode())
    return h.hexdigest()


def is_plugin(spec: str) -> bool:
    """A file or module plug-in (not a built-in name, verl:/trl: preset)."""
    return ":" in spec and not spec.startswith(("verl:", "trl:"))


def reproducibility_warning(spec: str, args: dict, timeout: float = 120.0, settings=SETTINGS, say=None) -> str | None:
    """None when the plug-in's step digest agrees under every setting, else a one-line warning; a step that
    raises is a one-line ValueError (its cells would all fail the same way).

    `say` (a callable taking one line) hears a progress line before the first probe and after each one
    ("preflight: probes 1/3, ETA 52s: 1 thread done"): each probe is a fresh process that imports torch."""
    code = (
        "import json, os, sys, torch; torch.set_num_threads(int(os.environ['TIMBENCH_REPRO_THREADS']));"
        "from timbench.submit.repro import step_digest; a = json.loads(sys.argv[2]);"
        "print(step_digest(sys.argv[1], a))"
    )
    say = say or (lambda line: None)
    eta = Eta(len(settings))
    say(f"preflight: probes {eta.status()}: one remedy step under " + "; ".join(label for label, _ in settings))
    digests = {}
    for label, env in settings:
        try:
            r = subprocess.run(
                [sys.executable, "-c", code, spec, json.dumps(args)],
                capture_output=True,
                text=True,
                timeout=timeout,
                env={**os.environ, **env},
            )
        except subprocess.TimeoutExpired:  # a warning check, not a gate: say so and let the cells run
            say(f"preflight: probes {eta.tick()}: {label}: no answer in {timeout:g} s; check skipped")
            return None
        if r.returncode != 0:  # every cell would fail the same way: say why now instead of running them all
            why = next((x for x in reversed(r.stderr.splitlines()) if x.strip()), f"exit {r.returncode}")
            say(f"preflight: probes {eta.tick()}: {label}: the step raised")
            raise ValueError(
                f"remedy {spec}: one step on the preflight's synthetic batch (N=64 rows of T=1024 "
                f"tokens, groups of 8) raised {why.strip()}; no cell was run"
            )
        digests[label] = r.stdout.strip()
        say(f"preflight: probes {eta.tick()}: {label} done")
    if len(set(digests.values())) == 1:
        return None
    first = next(iter(digests.values()))
    differ = ", ".join(k for k, v in digests.items() if v != first)
    return (
        f"warning: remedy {spec}: its step gives other bytes under {differ} than under 1 thread, so its "
        "results will not reproduce on another CPU or thread count; use fexp / fsum / fmean / masked_mean "
        "from timbench.remedies instead of torch.exp / sum / mean (docs/internals/determinism.md)"
    )
