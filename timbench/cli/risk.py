"""`timbench risk`: the committed outcomes nearest to a measured mismatch, and the validation of the map.

    timbench risk --mean-abs-delta 0.041 [--stat k3_kl=0.002 ...] [--mode recompute|bypass] [--json]
    timbench risk --align results/align/align_lowprec.json [--row "bf16 engine"]
    timbench risk --gate results/gates/raw_logprobs/gate.json
    timbench risk --validate --out results/risk

Inputs are read (and refused in one line) before any grid is, so bad input answers at once.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ..util.atomic import atomic_write, check_output_dir

DEFAULT_OUT = "build/risk"


def _int(raw: str, flag: str) -> int:
    try:
        v = int(raw)
    except ValueError:
        v = 0
    if v < 1:
        raise ValueError(f"{flag} {raw!r}: expected a whole number >= 1")
    return v


def _queries(args) -> list[tuple[str, dict]]:
    from ..gate.placement import from_gate  # deferred: torch is heavy
    from ..studies import risk_input  # deferred: torch is heavy

    kinds = [
        k
        for k, given in (
            ("--mean-abs-delta/--stat", args.mean_abs_delta is not None or args.stat),
            ("--align", args.align),
            ("--gate", args.gate),
            ("--validate", args.validate),
        )
        if given
    ]
    if len(kinds) != 1:
        raise ValueError(
            ("give only one of " if kinds else "give one of ")
            + "--mean-abs-delta X / --stat NAME=VALUE, --align TABLE.json, --gate gate.json, --validate"
            + (f" (got {', '.join(kinds)})" if len(kinds) > 1 else "")
        )
    if args.row and not args.align:
        raise ValueError("--row selects rows of an --align table; give --align TABLE.json")
    if args.align:
        return risk_input.from_align(args.align, args.row)
    if args.gate:
        return from_gate(args.gate)
    if args.validate:
        return []
    return risk_input.from_numbers(args.stat or [], args.mean_abs_delta)


def _validate(args, rows) -> int:
    from ..studies.risk import safe_levels, the_map, units, validity  # deferred: torch is heavy
    from ..studies.risk_data import mapped  # deferred: torch is heavy
    from ..studies.risk_text import map_markdown, validation_markdown  # deferred: torch is heavy
    from ..studies.risk_validate import validate  # deferred: torch is heavy

    out = (args.out or DEFAULT_OUT).rstrip("/")
    check_output_dir(out)
    command = "timbench risk --validate" + (f" --results {args.results}" if args.results else "") + f" --out {out}"
    v = validate(mapped(rows))
    v["command"] = command
    Path(out).mkdir(parents=True, exist_ok=True)
    atomic_write(Path(out) / "validation.json", json.dumps(v, indent=1, sort_keys=True) + "\n")
    atomic_write(Path(out) / "validation.md", validation_markdown(v, command))
    settings = the_map(rows)
    safe, lim = safe_levels(settings), validity(units(rows))
    atomic_write(
        Path(out) / "map.json",
        json.dumps(
            {"command": command, "safe_levels": safe, "settings": settings, "validity": lim}, indent=1, sort_keys=True
        )
        + "\n",
    )
    atomic_write(Path(out) / "map.md", map_markdown(settings, safe, lim, command))
    for o in v["outcomes"].values():
        print(f"{o['definition']}: {o['verdict']}")
    print(f"timbench risk: wrote validation.json/.md and map.json/.md into {out}", file=sys.stderr)
    return 0


def _cmd_risk(args) -> int:
    mode = args.mode
    if mode is not None and mode not in ("recompute", "bypass"):
        raise ValueError(f"--mode {mode!r}: valid: recompute, bypass")
    k = _int(args.nearest, "--nearest")
    if args.out and not args.validate:
        raise ValueError("--out is where --validate writes; a query prints its answer")
    queries = _queries(args)
    from ..studies.risk import answer, safe_levels, the_map, units, validity  # deferred: torch is heavy
    from ..studies.risk_data import ROOT, gather  # deferred: torch is heavy

    rows = gather(args.results or ROOT)
    if args.validate:
        return _validate(args, rows)
    answers, skipped = [], []
    for label, q in queries:
        try:
            answers.append(answer(q, rows, mode=mode, k=k, label=label))
        except ValueError as e:
            if len(queries) == 1:
                raise
            skipped.append((label, str(e)))
    if not answers:  # every row of a table out of range: the first reason, in one line
        raise ValueError(f"{skipped[0][1]} ({len(skipped)} rows, none mapped)")
    lim = validity(units(rows))
    safe = {m: s for m, s in safe_levels(the_map(rows)).items() if mode in (None, m)}
    if args.json:
        print(
            json.dumps(
                {
                    "answers": answers,
                    "not_mapped": [{"label": lab, "why": w} for lab, w in skipped],
                    "safe_levels": safe,
                    "validity": lim,
                },
                sort_keys=True,
            )
        )
    else:
        from ..studies.risk_text import answer_text  # deferred: torch is heavy

        sys.stdout.write(answer_text(answers, skipped, lim, safe))
    return 0


def add_risk_parser(sub) -> None:
    """Register `timbench risk` (importing nothing heavy: the parser must answer --help at once)."""
    p = sub.add_parser(
        "risk",
        help="what a measured mismatch did in the committed grids: nearest settings, their "
        "outcomes with intervals, remedies that helped, the map's validity limits",
    )
    p.add_argument(
        "--mean-abs-delta",
        dest="mean_abs_delta",
        metavar="X",
        help="measured mean |log pi_train - log pi_rollout| per token",
    )
    p.add_argument(
        "--stat",
        action="append",
        metavar="NAME=VALUE",
        help="another measured statistic (repeatable), e.g. k3_kl=0.002, argmax_flips=0.01; an unknown "
        "NAME lists the valid ones (docs/risk.md)",
    )
    p.add_argument("--align", metavar="TABLE.json", help="a `timbench align` output (results/align/*.json)")
    p.add_argument("--row", metavar="TEXT", help="with --align: only rows whose 'model: condition' contains TEXT")
    p.add_argument("--gate", metavar="gate.json", help="a `timbench gate run` output (its alignment probe)")
    p.add_argument("--mode", help="recompute or bypass (default: both)")
    p.add_argument("--nearest", default="3", metavar="K", help="settings shown per mode (default 3)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--results", metavar="DIR", help="the grids to read (default: the checkout's results/)")
    p.add_argument(
        "--validate",
        action="store_true",
        help="rank the statistics leave-one-condition-out; writes validation.md/.json and the map "
        "(map.md/.json: every committed setting, what level was safe) into --out",
    )
    p.add_argument(
        "--out",
        help=f"with --validate: output directory (default {DEFAULT_OUT}; "
        "--out results/risk updates the committed page)",
    )
    p.set_defaults(func=_cmd_risk)
