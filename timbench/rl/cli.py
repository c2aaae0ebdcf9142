"""`timbench train CONFIG.yaml --out DIR [--remedy SPEC] [--set KEY=VALUE ...]`."""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path

from ..remedies.deadline import PLUGIN_CALL_TIMEOUT_S
from ..remedies.identity import is_file_spec
from ..util.atomic import atomic_write, check_output_dir
from ..util.readfile import read_yaml


def _cmd_train(args) -> int:
    from .config import load_config  # deferred: torch is heavy
    from .loop import NonFiniteError, run  # deferred: torch is heavy

    check_output_dir(args.out)
    overrides = list(args.set or []) + ([f"remedy={args.remedy}"] if args.remedy else [])
    if not 0 <= args.plugin_timeout < float("inf"):  # also refuses NaN
        raise ValueError(
            f"--plugin-timeout must be >= 0 seconds and finite (0 = no limit), got {args.plugin_timeout:g}"
        )
    _refuse_a_results_plugin(args, overrides)
    try:
        cfg = load_config(args.config, overrides)  # imports a plug-in: its own error is a failed run below
        summary = run(cfg, args.out, progress=not args.quiet, plugin_timeout=args.plugin_timeout)
    except NonFiniteError as e:
        print(f"timbench train: run failed: {e}", file=sys.stderr)
        return 1
    except (ValueError, KeyError, OSError):
        raise  # the CLI's one-line errors (bad input, refused writes), exit 2
    except Exception as e:  # noqa: BLE001 - e.g. a plug-in remedy that raises: one line, the traceback kept
        from .rundir import one_line  # deferred: torch is heavy

        where = Path(args.out) / "error.txt"
        atomic_write(where, traceback.format_exc())
        print(f"timbench train: run failed: {one_line(e)} (traceback in {where})", file=sys.stderr)
        return 1
    print(json.dumps(summary, sort_keys=True))
    return 0


RUN_MARKERS = ("status.json", "summary.json", "manifest.json", "cell.json")
"""Files a run writes beside its config.yaml: a config among them was taken from a results directory."""


def _refuse_a_results_plugin(args, overrides: list[str]) -> None:
    """Refuse (one line) a config taken from a run directory (someone else's results) that names a plug-in file,
    unless --allow-plugins: `train` would import and run that file. A remedy given on the command line is the
    caller's own choice."""
    if args.config is None or args.allow_plugins or any(o.startswith("remedy=") for o in overrides):
        return
    here = Path(args.config).resolve().parent
    if not any((here / n).is_file() for n in RUN_MARKERS):
        return
    doc = read_yaml(Path(args.config), "config file")
    remedy = doc.get("remedy") if isinstance(doc, dict) else None
    if isinstance(remedy, str) and is_file_spec(remedy):
        raise ValueError(
            f"{args.config} comes from a run directory and names plug-in file {remedy}: a plug-in is "
            "code run with your rights; read it, then rerun with --allow-plugins to run it"
        )


def add_parser(sub) -> None:
    t = sub.add_parser("train", help="run one RL training run from a YAML config")
    t.add_argument("config", nargs="?", help="run config YAML (e.g. bench/runs/baseline.yaml); default: all defaults")
    t.add_argument("--out", required=True, help="run directory (resumed if it holds a checkpoint)")
    t.add_argument("--set", action="append", metavar="KEY=VALUE", help="override, e.g. engine.kernels=torch")
    t.add_argument(
        "--remedy",
        metavar="SPEC",
        help="mismatch remedy: a name from `timbench remedies list`, FILE.py:CLASS or pkg.module:CLASS",
    )
    t.add_argument("--quiet", action="store_true", help="no progress bar")
    t.add_argument(
        "--plugin-timeout",
        type=float,
        default=PLUGIN_CALL_TIMEOUT_S,
        metavar="SECONDS",
        help="a plug-in remedy's hook call running longer fails the run "
        f"(default {PLUGIN_CALL_TIMEOUT_S:g}; 0 = no limit)",
    )
    t.add_argument(
        "--allow-plugins",
        action="store_true",
        help="run the plug-in remedy file (path.py:Class) named by a config.yaml taken from a run "
        "directory: a plug-in is code run with your rights",
    )
    t.set_defaults(func=_cmd_train)
