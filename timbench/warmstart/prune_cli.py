"""`timbench prune-experts`: the command over timbench.warmstart.proxy (kept apart so the CLI parser needs no torch)."""

from __future__ import annotations

from ..metrics.schema import ACCURACY_GREEDY, ACCURACY_T1
from ..tasks import DEFAULT_TASK
from ..util.atomic import check_output_dir
from .cli import _band_arg


def _cmd(args) -> int:
    from .proxy import make_proxy  # deferred: torch is heavy

    check_output_dir(args.out)  # before the calibration and the recovery, not after
    card = make_proxy(
        args.model,
        args.task,
        args.keep,
        args.out,
        calib_n=args.calib_n,
        seed=args.seed,
        recover=args.recover,
        eval_n=args.eval_n,
        max_steps=args.max_steps,
        threads=args.threads,
        eval_every=args.eval_every,
        progress=not args.no_progress,
    )
    before = card["pruning"]["accuracy_before_recovery"]
    print(
        f"{args.out}: {card['model']} kept {card['pruning']['kept_experts']} "
        f"pruned acc_t1={before[ACCURACY_T1]:.3f}"
        + (f", recovered in {card['steps']} steps" if card["recovery"] else "")
        + f" acc_t1={card[ACCURACY_T1]:.3f} acc_greedy={card[ACCURACY_GREEDY]:.3f} (n={card['eval_n']})"
    )
    return 0


def add_parser(sub) -> None:
    """Register `timbench prune-experts` on the CLI's subparsers."""
    p = sub.add_parser("prune-experts", help="a smaller MoE proxy: keep each layer's most frequently routed experts")
    p.add_argument(
        "--model",
        default="tiny-moe",
        help="MoE preset (its shipped checkpoint for --task) or checkpoint directory (default tiny-moe)",
    )
    p.add_argument("--task", default=DEFAULT_TASK, help=f"task: calibration and eval problems (default {DEFAULT_TASK})")
    p.add_argument("--keep", type=int, required=True, help="experts kept per layer (1..num_experts)")
    p.add_argument("--out", required=True, help="checkpoint directory to write")
    p.add_argument("--calib-n", type=int, default=512, help="calibration problems (task.train_batch(seed, 0, n))")
    p.add_argument("--seed", type=int, default=0, help="calibration, recovery data and eval sampling seed")
    p.add_argument(
        "--recover",
        type=_band_arg,
        default=None,
        metavar="LO,HI",
        help="fine-tune the pruned model (as timbench warmstart) until its T=1 accuracy is in this band",
    )
    p.add_argument("--eval-n", type=int, default=512, help="eval problems for the accuracies on the card")
    p.add_argument("--max-steps", type=int, default=1000, help="with --recover: most fine-tune steps")
    p.add_argument("--eval-every", type=int, default=10, help="with --recover: steps between probe evaluations")
    p.add_argument("--threads", type=int, default=1, help="torch and numba threads")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_cmd)
