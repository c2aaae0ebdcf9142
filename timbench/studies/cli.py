"""The studies' commands: `timbench paper DIR`, `timbench claims DIR...`, `timbench early-warning DIR...` and
`timbench proxy-fidelity DIR...` (`timbench risk` is timbench.cli.risk).

    timbench paper results/paper [--out build/paper] [--endpoint final|last3|last-half|auc]
    timbench claims DIR... [--out build/claims]
    timbench early-warning DIR... [--out build/early_warning]
    timbench proxy-fidelity DIR... [--out build/proxy_fidelity] [--reference-model NAME]
"""

from __future__ import annotations

import argparse
import sys

from ..grid.endpoint import ENDPOINTS
from ..report.cli import default_out
from ..util.atomic import check_output_dir


def _written(command: str, out: str, write) -> int:
    """Refuse an unwritable `out` first (one line), then run `write()` and list the files it wrote."""
    check_output_dir(out)
    written = write()
    for p in written.values():
        print(p)
    print(f"timbench {command}: wrote {len(written)} files into {out}", file=sys.stderr)
    return 0


def _cmd_paper(args) -> int:
    from .paper import write_paper  # deferred: torch is heavy

    d = args.dir.rstrip("/")
    out = args.out or default_out(d, "build/paper")
    command = f"timbench paper {d}" + (f" --endpoint {args.endpoint}" if args.endpoint else "")
    return _written("paper", out, lambda: write_paper(d, command=command, out=out, endpoint=args.endpoint))


def add_paper_parser(sub) -> None:
    """Register `timbench paper DIR`."""
    p = sub.add_parser(
        "paper",
        help="the seed paper's figures F1-F5 + dose-response with seed bands, and a "
        "verdict per claim, from a grid result dir (results/paper)",
    )
    p.add_argument("dir", help="grid result directory (results/paper, from bench/grids/paper.yaml)")
    p.add_argument(
        "--out",
        help="where paper.md/.json and figures/ go (default: results/X -> build/X, "
        "else DIR itself; give --out results/X to update the committed files)",
    )
    p.add_argument(
        "--endpoint",
        type=_endpoint,
        help="read the verdicts at another endpoint than the grid's "
        "pre-registered one (final | last3 | last-half | auc); the page then says it is exploratory",
    )
    p.set_defaults(func=_cmd_paper)


def _endpoint(name: str) -> str:
    """argparse type: an endpoint name (argparse prints the one-line error and exits 2)."""
    if name not in ENDPOINTS:
        raise argparse.ArgumentTypeError(f"unknown endpoint {name!r}; valid: {', '.join(ENDPOINTS)}")
    return name


def _dirs_command(name: str, write, options: tuple[str, ...] = ()):
    """The handler of a `timbench NAME DIR... --out OUT [--OPTION V...]` report: `write(dirs, out, command=...,
    **options given)`; the command line it records names the options given, so it regenerates the same files."""

    def cmd(args) -> int:
        dirs = [d.rstrip("/") for d in args.dirs]
        given = {o: getattr(args, o) for o in options if getattr(args, o) is not None}
        command = (
            f"timbench {name} "
            + " ".join(dirs)
            + f" --out {args.out}"
            + "".join(f" --{o.replace('_', '-')} {v}" for o, v in given.items())
        )
        return _written(name, args.out, lambda: write(dirs, args.out, command=command, **given))

    return cmd


def _add_dirs_parser(sub, name: str, files: str, help: str, dirs_help: str, write, options: tuple[str, ...] = ()):
    p = sub.add_parser(name, help=help)
    p.add_argument("dirs", nargs="+", help=dirs_help)
    default = "build/" + name.replace("-", "_")
    p.add_argument(
        "--out",
        default=default,
        help=f"where {files} go (default {default}; give --out "
        f"results/{name.replace('-', '_')} to update the committed files)",
    )
    p.set_defaults(func=_dirs_command(name, write, options))
    return p


def add_claims_parser(sub) -> None:
    """Register `timbench claims DIR...`."""

    def write_claims(*a, **kw):  # imported on use: the report modules are slow to import
        from .claims import write_claims  # deferred: torch is heavy

        return write_claims(*a, **kw)

    _add_dirs_parser(
        sub,
        "claims",
        "claims.md/.json",
        "the field's published claims about mismatch (FP16, routing replay, TIS/MIS, IcePop, FP8-RL, "
        "TRIAGE, ...) checked against grid result dirs and alignment tables, one verdict per claim",
        "grid result dirs (results/paper, results/lowprec, ...) and alignment dirs (results/align)",
        write_claims,
    )


def add_early_warning_parser(sub) -> None:
    """Register `timbench early-warning DIR...`."""

    def write_early_warning(*a, **kw):
        from .early_warning import write_early_warning  # deferred: torch is heavy

        return write_early_warning(*a, **kw)

    _add_dirs_parser(
        sub,
        "early-warning",
        "early_warning.md/.json",
        "rank per-step metrics as early warnings of a collapse (lead in steps, false alarms; "
        "leave-one-seed-out envelopes) over grid result dirs",
        "grid result dirs (results/paper, results/nvfp4, ...)",
        write_early_warning,
    )


def add_proxy_fidelity_parser(sub) -> None:
    """Register `timbench proxy-fidelity DIR...`."""

    def write_fidelity(*a, **kw):
        from .fidelity import write_fidelity  # deferred: torch is heavy

        return write_fidelity(*a, **kw)

    p = _add_dirs_parser(
        sub,
        "proxy-fidelity",
        "fidelity.md/.json",
        "does each verdict (collapse or not, effect of a condition, remedy order) on the reference "
        "model survive the change to a smaller or other proxy model? Over grid dirs varying `model`",
        "grid result dirs whose cells vary the model axis (results/proxy_moe)",
        write_fidelity,
        options=("reference_model",),
    )
    p.add_argument(
        "--reference-model",
        help="the model the others are judged against (default: the first grid's first model, e.g. tiny-moe)",
    )
