"""The `timbench` command: one subcommand per job, each a thin layer over the library.

This package is the top of the import graph: it may import every other part, the runners included (it hands
`grid run`, `submit` and `track run` a backend), and nothing imports it (`timbench.cli:main` is the entry point).

Building the parser imports no torch/numba (each command imports its library when it runs, packages export
lazily: timbench.util.lazy), so `timbench --help`, `--version` and argument errors answer in well under a second.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from .. import __version__
from ..diagnose.cli import add_parser as add_diagnose
from ..fingerprint import add_parser as add_fingerprint  # cross-machine golden hashes
from ..gate.cli import add_parser as add_gate  # the release gate
from ..grid.cli import add_parser as add_grid
from ..grid.cli import add_workers_arg, default_workers
from ..remedies.cli import add_parser as add_remedies
from ..remedies.deadline import PluginError  # stdlib only: --help stays torch-free
from ..report.cli import add_compare_parser, add_report_parser
from ..rl.cli import add_parser as add_train
from ..runners.cli import add_run_parser
from ..studies.cli import (
    add_claims_parser,  # `timbench claims DIR...`: the field's other claims
    add_early_warning_parser,  # `timbench early-warning DIR...`
    add_paper_parser,  # `timbench paper DIR`: the paper's F1-F5 verdicts
    add_proxy_fidelity_parser,  # `timbench proxy-fidelity DIR...`
)
from ..util.atomic import check_output_dir, write_error
from ..util.provenance import dist_version, git_revision
from ..warmstart.cli import add_parser as add_warmstart
from ..warmstart.prune_cli import add_parser as add_prune  # `timbench prune-experts`: expert-pruned proxy models
from .risk import add_risk_parser  # `timbench risk`: the risk map over committed grids
from .submit import add_parser as add_submit  # `timbench submit` and `timbench track`


def _cmd_align(args) -> int:
    if args.table:
        from ..align_table import run_table  # deferred: torch is heavy

        out = args.out or "build/align"
        check_output_dir(out)
        run_table(
            args.table,
            out,
            progress=lambda m: print(m, file=sys.stderr, flush=True),
            workers=default_workers(args.workers),
        )
        return 0
    if not 0 <= args.temperature < float("inf"):
        raise ValueError(f"--temperature must be a finite number >= 0 (0 = greedy), got {args.temperature:g}")
    from ..rl.config import check_seed  # deferred: torch is heavy

    check_seed(args.seed, "--seed")
    from ..align import align  # deferred: torch is heavy
    from ..model import load_model  # deferred: torch is heavy
    from ..spec.keys import parse_spec  # deferred: torch is heavy

    engine = parse_spec(args.engine, "engine spec", side="engine")
    trainer = parse_spec(args.trainer, "trainer spec", side="trainer")
    model = load_model(args.model, seed=args.seed)
    report = align(model, engine, trainer, seed=args.seed, temperature=args.temperature)
    if args.json:
        print(json.dumps(report, sort_keys=True))
    else:
        for k, v in report.items():
            print(f"{k:20s} {v}")
    return 0


def version_text() -> str:
    """`timbench --version`: one line naming timbench's version, the git revision and the numeric stack."""
    rev = git_revision()
    stack = ", ".join(f"{n} {dist_version(n)}" for n in ("torch", "numba", "vllm"))
    return f"timbench {__version__}" + (f" (git {rev})" if rev else "") + f"; {stack}; python {sys.version.split()[0]}"


class _VersionAction(argparse.Action):
    def __init__(self, option_strings, dest, **kw):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=kw.get("help"))

    def __call__(self, parser, namespace, values, option_string=None):
        print(version_text())
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="timbench", description="Training-inference mismatch benchmark suite")
    p.add_argument("--version", action=_VersionAction, help="timbench, git revision, torch/numba/vLLM versions")
    sub = p.add_subparsers(dest="command", required=True)

    a = sub.add_parser("align", help="measure engine vs trainer logprob mismatch on a mixed workload")
    a.add_argument("--model", default="tiny-dense", help="preset (tiny-dense, tiny-moe) or checkpoint directory")
    a.add_argument("--engine", default="kernels=exact", help="engine spec, e.g. kernels=torch,dtype=bf16")
    a.add_argument("--trainer", default="kernels=exact", help="trainer spec")
    a.add_argument("--seed", type=int, default=0, help="model init and sampling seed")
    a.add_argument("--temperature", type=float, default=1.0, help="sampling temperature of the rollouts")
    a.add_argument("--json", action="store_true", help="print one JSON object")
    a.add_argument("--table", help="YAML table of conditions (e.g. bench/align_quick.yaml) to run instead")
    a.add_argument(
        "--out",
        help="with --table: output directory (default build/align; --out results/align updates the committed tables)",
    )
    add_workers_arg(a)  # with --table: rows in that many processes (threads each: cores // workers)
    a.set_defaults(func=_cmd_align)

    add_diagnose(sub)
    add_warmstart(sub)
    add_prune(sub)
    add_train(sub)
    add_remedies(sub)
    add_compare_parser(sub)
    grid_sub = add_grid(sub)  # plan; run and report join from their own packages
    add_run_parser(grid_sub)
    add_report_parser(grid_sub)

    add_paper_parser(sub)
    add_claims_parser(sub)
    add_early_warning_parser(sub)
    add_proxy_fidelity_parser(sub)
    add_risk_parser(sub)

    add_submit(sub)

    add_fingerprint(sub)
    add_gate(sub)

    try:
        from ..tasks.cli import add_parser as add_tasks  # deferred: optional (may be absent)

        add_tasks(sub)
    except ImportError:  # tasks package not installed alongside (should not happen in a full install)
        pass
    _name_subcommands(p)
    return p


def _name_subcommands(parser: argparse.ArgumentParser) -> None:
    """Every sub-command group is named by its choices ("required: {list}"), never by its internal dest
    ("required: remedies_command"), in usage lines and errors alike."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            if action.metavar is None:
                action.metavar = "{" + ",".join(action.choices) + "}"
            for child in dict.fromkeys(action.choices.values()):
                _name_subcommands(child)


def _closed_pipe() -> int:
    """stdout's reader went away (`timbench remedies list | head`): no traceback, and no second error when
    Python flushes stdout at exit (stdout is pointed at /dev/null, as the Python docs advise)."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    return 141  # 128 + SIGPIPE, what a shell reports for a command killed by a closed pipe


def main(argv=None) -> int:
    try:
        args = build_parser().parse_args(argv)
        try:
            return args.func(args) or 0
        except (ValueError, FileNotFoundError, KeyError) as e:  # SpecError is a ValueError
            msg = e.args[0] if isinstance(e, KeyError) and e.args else e
            print(f"timbench {args.command}: error: {msg}", file=sys.stderr)
            return 2
        except BrokenPipeError:
            raise  # a closed stdout (`| head`), handled below: not an error of the command
        except PluginError as e:  # a plug-in's own code raised while it was loaded: the plug-in failed, not the input
            print(f"timbench {args.command}: error: {e}", file=sys.stderr)
            return 1
        except OSError as e:  # a refused write (disk full, read-only, permissions): one line naming the path
            print(f"timbench {args.command}: error: {write_error(e, 'at', e.filename or '?')}", file=sys.stderr)
            return 2
    except BrokenPipeError:
        return _closed_pipe()
