"""`timbench gate run|check`: the release gate's command line."""

from __future__ import annotations

import json
import sys

from .check import check, load_report


def add_parser(sub) -> None:
    g = sub.add_parser(
        "gate", help="regression-test an engine release: run a versioned probe suite, compare with a baseline"
    )
    gs = g.add_subparsers(dest="gate_cmd", required=True)
    r = gs.add_parser(
        "run",
        help="run a gate suite on one engine spec and compare it with the suite's stored "
        "baseline; exit 1 when a probe fails or regresses, 2 when one erred",
    )
    r.add_argument(
        "--engine",
        default="kernels=exact,dtype=fp32",
        help="engine spec (timbench.spec.keys), e.g. engine=vllm,dtype=bf16 or fault=batch_leak; or an "
        "OpenAI-compatible server: openai=URL[,model=NAME][,api_key_env=VAR][,timeout=S][,retries=N]"
        "[,concurrency=N][,sync_dir=DIR] (with --trainer hf=DIR; sync_dir: the server's --model directory, the "
        "opt-in to the weight-sync probe, which has the server reload perturbed weights)",
    )
    r.add_argument(
        "--trainer",
        metavar="hf=DIR",
        help="with --engine openai=URL: the trainer that scores the server's tokens, a Hugging Face "
        "checkpoint directory (hf=DIR[,dtype=fp32|bf16][,attn=eager|sdpa][,device=cpu|cuda|cuda:N])",
    )
    r.add_argument(
        "--allow-remote",
        action="store_true",
        help="with --engine openai=URL: allow a server that is not on a loopback address",
    )
    r.add_argument("--suite", default="default", help="suite name (bench/gates/NAME.yaml) or path to a suite .yaml")
    r.add_argument(
        "--out", default="build/gate", help="output directory for gate.json and gate.md (and gate.html over HTTP)"
    )
    b = r.add_mutually_exclusive_group()
    b.add_argument(
        "--baseline",
        metavar="DIR",
        help="gate run to compare with by `gate check`'s rules (default: the suite's stored baseline, "
        "results/gates/none for smoke)",
    )
    b.add_argument("--no-baseline", action="store_true", help="only the probes' own thresholds, no comparison")
    r.set_defaults(func=_run)
    f = gs.add_parser(
        "faults",
        help="run the suite on the clean engine and under every fault of timbench.spec.faults; "
        "write the detection matrix",
    )
    f.add_argument("--suite", default="smoke", help="suite name or path")
    f.add_argument("--out", default="build/gates", help="output directory (results/gates updates the committed one)")
    f.add_argument(
        "--clean-runs",
        type=int,
        default=0,
        metavar="N",
        help="also rerun the clean engine with N other seeds and count false alarms (default 0)",
    )
    f.set_defaults(func=_faults)
    m = gs.add_parser(
        "matrix",
        help="one table of several releases' gate runs (or their install errors) and "
        "what changed between consecutive ones (make gate-matrix)",
    )
    m.add_argument(
        "dirs",
        nargs="+",
        metavar="DIR",
        help="release dirs in order: each a `gate run --out DIR` (gate.json) or an error.txt",
    )
    m.add_argument("--out", required=True, help="where matrix.json and matrix.md go")
    m.set_defaults(func=_matrix)
    c = gs.add_parser(
        "check", help="compare a candidate gate.json with a baseline: exit 0 pass, 1 regression, 2 incomparable"
    )
    c.add_argument("baseline", help="baseline gate.json or its directory")
    c.add_argument("candidate", help="candidate gate.json or its directory")
    c.add_argument("--json", action="store_true", help="print the verdict as one JSON object")
    c.set_defaults(func=_check)


def _run(args) -> int:
    from .run import run_gate  # deferred: torch is heavy
    from .suite import load_suite  # deferred: torch is heavy

    http = args.engine.strip().startswith("openai=")
    if http != bool(args.trainer):
        raise ValueError(
            "--engine openai=URL and --trainer hf=DIR go together: an HTTP server's tokens are scored by your trainer"
            if http
            else "--trainer hf=DIR needs --engine openai=URL (timbench's "
            "own engines are scored by timbench's exact trainer)"
        )
    if args.allow_remote and not http:
        raise ValueError("--allow-remote applies to --engine openai=URL only")
    suite = load_suite(args.suite)
    # An HTTP run's default baseline is none: the suite's stored one is timbench's engine on timbench's checkpoints.
    where = None if args.no_baseline else args.baseline or (None if http else suite.baseline)
    base = where and _baseline(load_report(where), suite, where)  # read first: --out may be the baseline's dir
    say = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    if http:
        from .http_run import run_http_gate  # deferred: torch is heavy

        report = run_http_gate(args.engine, args.trainer, suite, args.out, args.allow_remote, progress=say)
    else:
        report = run_gate(args.engine, suite, args.out, progress=say)
    rows = report["probes"]
    failed = [
        f"{r['model']} {r['probe']}" for r in rows if not r["passed"] and not r.get("error") and not r.get("not_tested")
    ]
    erred = {}  # model -> its rows that erred: one entry per model (an engine that cannot start errs them all)
    for r in rows:
        if r.get("error"):
            erred.setdefault(r["model"], []).append(r)
    regressed = [f["line"] for f in (check(base, report)[1] if base else []) if f["kind"] == "regression"]
    skipped = [r for r in rows if r.get("not_tested")]
    notes = [f"{sum(r['passed'] for r in rows)} of {len(rows)} probes pass"] if erred or skipped else []
    notes += [f"not tested: {', '.join(r['probe'] for r in skipped)}"] if skipped else []
    notes += [f"{m}: {len(e)} probe(s) erred, first {e[0]['probe']}: {e[0]['error']}" for m, e in erred.items()]
    if base:
        notes.append(f"{len(regressed) or 'no'} regression(s) against {where}")
    else:
        notes.append(
            "no baseline compared"
            if args.no_baseline or http
            else f"suite {suite.name} has no stored baseline (--baseline DIR compares with one)"
        )
    head = "FAIL: " + ", ".join(failed) if failed else "ERROR" if erred else "FAIL" if regressed else "PASS"
    print(
        "\n".join(
            regressed
            + [
                f"gate {suite.name} v{suite.version}: {head}; {'; '.join(notes)} "
                f"({report['seconds']:.0f}s; {args.out}/gate.md)"
            ]
        )
    )
    return 2 if erred else 1 if failed or regressed else 0


def _baseline(base: dict, suite, where) -> dict:
    """The baseline, refused before any probe runs when it is of another suite or version."""
    bi = base["identity"]
    if (bi["suite"], bi["suite_version"]) != (suite.name, suite.version):
        raise ValueError(
            f"baseline {where} is suite {bi['suite']} v{bi['suite_version']}, this run is "
            f"{suite.name} v{suite.version}: give --baseline DIR of the same suite and version, or "
            "--no-baseline"
        )
    return base


def _check(args) -> int:
    code, found = check(load_report(args.baseline), load_report(args.candidate))
    if args.json:
        print(json.dumps({"exit": code, "findings": found}))
    else:
        print("\n".join([f["line"] for f in found] + ([] if code else ["gate check: no regression"])))
    return code


def _faults(args) -> int:
    from .run import detection_matrix  # deferred: torch is heavy
    from .suite import load_suite  # deferred: torch is heavy

    if args.clean_runs < 0:
        raise ValueError(f"--clean-runs must be >= 0, got {args.clean_runs}")
    doc = detection_matrix(
        load_suite(args.suite),
        args.out,
        clean_runs=args.clean_runs,
        progress=lambda m: print(m, file=sys.stderr, flush=True),
    )
    missed = [f for f, row in doc["faults"].items() if f != "none" and row["gate_passed"]]
    clean_failed = not doc["faults"]["none"]["gate_passed"]
    print(
        f"detection matrix: {len(doc['faults']) - 1} faults, missed: {', '.join(missed) or 'none'}; clean engine "
        f"{'FAILED' if clean_failed else 'passed'}; false alarms in {len(doc['clean_reruns'])} clean reruns: "
        f"{sum(bool(r['failed']) for r in doc['clean_reruns'])} ({args.out}/detection.md)"
    )
    return 1 if missed or clean_failed else 0


def _matrix(args) -> int:
    from .matrix import write  # deferred: torch is heavy

    doc = write(args.dirs, args.out)
    print(f"gate matrix: {', '.join(r['name'] + ' ' + r['verdict'] for r in doc['releases'])} ({args.out}/matrix.md)")
    return 0
