"""The RL-outcome probe's own detection row and false-alarm rate (suite `default`'s `rl_outcome`).

`timbench gate faults` measures the false alarms of the smoke suite's probes; `rl_outcome` runs only in
`default` (minutes on 2 cores), so its numbers come from here: the probe on the clean exact engine at suite
seeds 0..N (each a window of 3 consecutive RL seeds, as `gate faults --clean-runs` reseeds a suite) and under
each fault named. Each (engine, RL seed) run happens once and is shared by the windows that contain it.

    python bench/gates/outcome_false_alarms.py OUT_DIR [--clean-runs 10] [--faults stale_weights,...]

OUT_DIR/outcome.json and outcome.md: per run its verdict and numbers; the false-alarm count of the clean runs.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from timbench.engine import SamplingParams
from timbench.gate.outcome import one_run, rl_outcome
from timbench.gate.run import format_numbers
from timbench.gate.suite import load_suite
from timbench.model import load_checkpoint
from timbench.spec.keys import parse_spec
from timbench.util.atomic import atomic_write
from timbench.util.shipped import default_checkpoint


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--clean-runs", type=int, default=10)
    ap.add_argument("--faults", default="stale_weights,stale_embedding,zero_logprobs")
    args = ap.parse_args()
    suite = load_suite("default")
    p = {**suite.probes["rl_outcome"], "model": "tiny-dense"}
    model = load_checkpoint(default_checkpoint("add-4d-v1", "tiny-dense"))
    cache: dict[tuple[str, int], dict] = {}

    def runner(preset, spec, seed, q):
        key = (str(spec), seed)
        if key not in cache:
            cache[key] = one_run(preset, spec, seed, q)
        return cache[key]

    rows = []
    cases = [("none", suite.seed + i) for i in range(args.clean_runs + 1)]
    cases += [(f, suite.seed) for f in args.faults.split(",") if f]
    for fault, seed in cases:
        spec = parse_spec(f"kernels=exact,dtype=fp32,fault={fault}", side="engine")
        r = rl_outcome(None, model, p, SamplingParams(temperature=suite.temperature, seed=seed), spec, runner=runner)
        rows.append({"fault": fault, "seed": seed, "passed": r.passed, "numbers": r.numbers})
        print(f"[rl_outcome] fault={fault} seed={seed}: {'pass' if r.passed else 'FAIL'} {r.numbers}", flush=True)
    clean = [r for r in rows if r["fault"] == "none"]
    doc = {
        "suite": suite.name,
        "suite_version": suite.version,
        "probe": p,
        "runs": rows,
        "clean_runs": len(clean),
        "false_alarms": sum(not r["passed"] for r in clean),
        "command": "python bench/gates/outcome_false_alarms.py "
        + " ".join([args.out, f"--clean-runs {args.clean_runs}", f"--faults {args.faults}"]),
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(out / "outcome.json", json.dumps(doc, indent=1) + "\n")
    lines = [
        f"# rl_outcome: false alarms and faults (suite {suite.name} v{suite.version})",
        "",
        f"regenerate: `{doc['command']}`",
        "",
        f"Clean exact engine at suite seeds {clean[0]['seed']}..{clean[-1]['seed']}: "
        f"{doc['false_alarms']} false alarms in {len(clean)} runs.",
        "",
        "| engine | suite seed | verdict | numbers |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| {'clean' if r['fault'] == 'none' else 'fault=' + r['fault']} | {r['seed']} | "
        f"{'pass' if r['passed'] else '**FAIL**'} | {format_numbers(r['numbers'])} |"
        for r in rows
    ]
    atomic_write(out / "outcome.md", "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
