"""`timbench warmstart`: the command over timbench.warmstart.run (kept apart so the CLI parser needs no torch)."""

from __future__ import annotations

import argparse

from ..metrics.schema import ACCURACY_GREEDY, ACCURACY_T1
from ..tasks import DEFAULT_TASK
from ..util.atomic import check_output_dir

DEFAULT_MODEL = "tiny-dense"  # the one definition (timbench.warmstart.run imports it)


def _band_arg(text: str) -> tuple[float, float]:
    from .run import WarmstartError, parse_band  # deferred: torch is heavy

    try:
        return parse_band(text)
    except WarmstartError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _cmd(args) -> int:
    from .run import warmstart  # deferred: torch is heavy

    check_output_dir(args.out)  # before minutes of training, not after
    card = warmstart(
        args.task,
        args.model,
        args.out,
        seed=args.seed,
        band=args.band,
        eval_n=args.eval_n,
        max_steps=args.max_steps,
        threads=args.threads,
        batch_size=args.batch_size,
        lr=args.lr,
        eval_every=args.eval_every,
        probe_n=args.probe_n,
        progress=not args.no_progress,
    )
    print(
        f"{args.out}: {card['task']} {card['model']} steps={card['steps']} "
        f"wall={card['wall_time_s']}s acc_t1={card[ACCURACY_T1]:.3f} "
        f"acc_greedy={card[ACCURACY_GREEDY]:.3f} (n={card['eval_n']})"
    )
    return 0


def add_parser(sub) -> None:
    """Register `timbench warmstart` on the CLI's subparsers."""
    w = sub.add_parser("warmstart", help="supervised warm start of a preset on a task, stopped inside an accuracy band")
    w.add_argument("--task", default=DEFAULT_TASK, help=f"task name (default {DEFAULT_TASK})")
    w.add_argument(
        "--model",
        default=DEFAULT_MODEL,
        help="preset: a name in timbench.model.config.PRESETS "
        "(tiny-dense, small-dense, medium-dense, tiny-moe, tiny-moe-e4, tiny-moe-e2)",
    )
    w.add_argument("--out", required=True, help="checkpoint directory to write")
    w.add_argument("--seed", type=int, default=0, help="init, data order and eval sampling seed")
    w.add_argument(
        "--band", type=_band_arg, default=(0.2, 0.6), metavar="LO,HI", help="target T=1 accuracy band (default 0.2,0.6)"
    )
    w.add_argument("--eval-n", type=int, default=256, help="eval problems for the final accuracies")
    w.add_argument("--max-steps", type=int, default=1000, help="stop after this many SFT steps if never in band")
    w.add_argument("--threads", type=int, default=2, help="torch and numba threads")
    w.add_argument("--batch-size", type=int, default=128, help="problems per SFT step")
    w.add_argument("--lr", type=float, default=1e-3, help="AdamW learning rate")
    w.add_argument("--eval-every", type=int, default=10, help="steps between probe evaluations")
    w.add_argument("--probe-n", type=int, default=128, help="eval problems in each probe")
    w.add_argument("--no-progress", action="store_true", help="no progress bar")
    w.set_defaults(func=_cmd)
