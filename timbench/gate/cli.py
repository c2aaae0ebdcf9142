"""`timbench gate run|check`: the release gate's command line."""

from __future__ import annotations

import json
import sys


def add_parser(sub) -> None:
    g = sub.add_parser("gate", help="regression-test an engine release: run a versioned probe suite, compare "
                                    "with a baseline")
    gs = g.add_subparsers(dest="gate_cmd", required=True)
    r = gs.add_parser("run", help="run a gate suite on one engine spec; exit 1 when a probe fails")
    r.add_argument("--engine", default="kernels=exact,dtype=fp32",
                   help="engine spec (timbench.spec), e.g. engine=vllm,dtype=bf16 or fault=batch_leak")
    r.add_argument("--suite", default="default", help="suite name (bench/gates/NAME.yaml) or path to a suite .yaml")
    r.add_argument("--out", default="build/gate", help="output directory for gate.json and gate.md")
    r.set_defaults(func=_run)
    f = gs.add_parser("faults", help="run the suite on the clean engine and under every fault of timbench.faults; "
                                     "write the detection matrix")
    f.add_argument("--suite", default="smoke", help="suite name or path")
    f.add_argument("--out", default="build/gates", help="output directory (results/gates updates the committed one)")
    f.add_argument("--clean-runs", type=int, default=0, metavar="N",
                   help="also rerun the clean engine with N other seeds and count false alarms (default 0)")
    f.set_defaults(func=_faults)
    m = gs.add_parser("matrix", help="one table of several releases' gate runs (or their install errors) and "
                                     "what changed between consecutive ones (make gate-matrix)")
    m.add_argument("dirs", nargs="+", metavar="DIR",
                   help="release dirs in order: each a `gate run --out DIR` (gate.json) or an error.txt")
    m.add_argument("--out", required=True, help="where matrix.json and matrix.md go")
    m.set_defaults(func=_matrix)
    c = gs.add_parser("check", help="compare a candidate gate.json with a baseline: exit 0 pass, 1 regression, "
                                    "2 incomparable")
    c.add_argument("baseline", help="baseline gate.json or its directory")
    c.add_argument("candidate", help="candidate gate.json or its directory")
    c.add_argument("--json", action="store_true", help="print the verdict as one JSON object")
    c.set_defaults(func=_check)


def _run(args) -> int:
    from .run import run_gate
    from .suite import load_suite

    suite = load_suite(args.suite)
    report = run_gate(args.engine, suite, args.out, progress=lambda m: print(m, file=sys.stderr, flush=True))
    failed = [f"{r['model']} {r['probe']}" for r in report["probes"] if not r["passed"]]
    print(f"gate {suite.name} v{suite.version}: {'PASS' if not failed else 'FAIL: ' + ', '.join(failed)} "
          f"({report['seconds']:.0f}s; {args.out}/gate.md)")
    return 0 if not failed else 1


def _check(args) -> int:
    from .check import check, load_checkable

    code, lines = check(load_checkable(args.baseline), load_checkable(args.candidate))
    if args.json:
        print(json.dumps({"exit": code, "findings": lines}))
    else:
        print("\n".join(lines) if lines else "gate check: no regression")
    return code


def _faults(args) -> int:
    from .run import detection_matrix
    from .suite import load_suite

    if args.clean_runs < 0:
        raise ValueError(f"--clean-runs must be >= 0, got {args.clean_runs}")
    doc = detection_matrix(load_suite(args.suite), args.out, clean_runs=args.clean_runs,
                           progress=lambda m: print(m, file=sys.stderr, flush=True))
    missed = [f for f, row in doc["faults"].items() if f != "none" and row["gate_passed"]]
    clean_failed = not doc["faults"]["none"]["gate_passed"]
    print(f"detection matrix: {len(doc['faults']) - 1} faults, missed: {', '.join(missed) or 'none'}; clean engine "
          f"{'FAILED' if clean_failed else 'passed'}; false alarms in {len(doc['clean_reruns'])} clean reruns: "
          f"{sum(bool(r['failed']) for r in doc['clean_reruns'])} ({args.out}/detection.md)")
    return 1 if missed or clean_failed else 0


def _matrix(args) -> int:
    from .matrix import write

    doc = write(args.dirs, args.out)
    rows = ", ".join(f"{r['name']} " + ("ERROR" if r["error"] else "pass" if r["passed"] else "FAIL")
                     for r in doc["releases"])
    print(f"gate matrix: {rows} ({args.out}/matrix.md)")
    return 0
