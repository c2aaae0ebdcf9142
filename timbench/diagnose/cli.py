"""`timbench diagnose`: one condition (text or --json, figures with --out) or a table of them (--table)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ..util.atomic import atomic_write, check_output_dir


def _cmd(args) -> int:
    if args.table:
        from .table import run_table  # deferred: torch is heavy

        out = args.out or "build/diagnose"  # a regeneration: results/diagnose only when told --out results/diagnose
        check_output_dir(out)
        run_table(args.table, out, progress=lambda m: print(m, file=sys.stderr))
        return 0
    from ..model import load_model  # deferred: torch is heavy
    from ..spec.keys import parse_spec  # deferred: torch is heavy
    from .run import diagnose  # deferred: torch is heavy
    from .table import resolve_model  # deferred: torch is heavy

    engine = parse_spec(args.engine, "engine spec", side="engine")
    trainer = parse_spec(args.trainer, "trainer spec", side="trainer")
    if args.out:
        check_output_dir(args.out)
    model = load_model(resolve_model(args.model), seed=args.seed)
    report = diagnose(model, engine, trainer, seed=args.seed, temperature=args.temperature, per_key=not args.no_keys)
    if args.out:
        from .figures import draw_all  # deferred: matplotlib is heavy

        out = Path(args.out)
        atomic_write(out / "diagnose.json", json.dumps(report, indent=1, sort_keys=True) + "\n")
        draw_all([(f"{report['engine']} | {report['trainer']}", report)], out)
    if args.json:
        print(json.dumps(report, sort_keys=True))
    else:
        _summary(report)
    return 0


def _f(x) -> str:
    return "-" if x is None else f"{x:.3g}"


def _summary(r: dict) -> None:
    a = r["attribution"]
    print(
        f"{r['model']}: engine {r['engine']} vs trainer {r['trainer']}, {r['tokens']} tokens, "
        f"reference {r['reference']}"
    )
    for k in ("e_engine", "e_trainer", "gap"):
        print(f"  {k:10s} mean|.| {a[k]['mean_abs']:.3g}  rms {a[k]['rms']:.3g}  max {a[k]['max_abs']:.3g}")
    print(
        f"  correlation {a['correlation']}  gap^2/(e_engine^2+e_trainer^2) {a['quadrature_ratio']}  "
        f"best model {a['best_model']}"
    )
    for k in r.get("keys", {}).get("keys", []):
        print(
            f"  key {k['side']}:{k['key']:24s} rms {k['rms']:.3g}  share {_f(k['share'])}  gap share "
            + ("- (set on both sides)" if k["shared"] else _f(k["gap_share"]))
        )
    print(
        "  |gap| by reference probability: "
        + ", ".join(f"{b['bucket']}: {b['mean_abs_gap']:.2g}" for b in r["views"]["probability"] if b["tokens"])
    )
    print(f"  argmax flip rate {r['views']['argmax_flip_rate']}")
    if "routing_disagreement_by_layer" in r["views"]:
        print(f"  routing disagreement by layer {r['views']['routing_disagreement_by_layer']['engine_vs_trainer']}")
    if "layers" in r:
        print(
            f"  first differing level: {r['layers']['most_common_first_level']}  "
            + ", ".join(f"{lv['level']} {lv['max_abs_diff']:.2g}" for lv in r["layers"]["levels"])
        )


def add_parser(sub) -> None:
    d = sub.add_parser("diagnose", help="attribute engine vs trainer mismatch to sides, keys, tokens and layers")
    d.add_argument(
        "--model",
        default="tiny-dense",
        help="preset, checkpoint directory or shipped warm start (e.g. add-4d-v1-tiny-dense)",
    )
    d.add_argument("--engine", default="kernels=exact", help="engine spec, e.g. kernels=torch,dtype=bf16")
    d.add_argument("--trainer", default="kernels=exact", help="trainer spec (dtype=fp64 is the reference itself)")
    d.add_argument("--seed", type=int, default=0, help="model init and sampling seed")
    d.add_argument("--temperature", type=float, default=1.0, help="sampling temperature of the rollouts")
    d.add_argument("--json", action="store_true", help="print one JSON object")
    d.add_argument(
        "--out",
        help="write diagnose.json and one figure per view here (with --table: results dir, "
        "default build/diagnose; --out results/diagnose updates the committed one)",
    )
    d.add_argument("--no-keys", action="store_true", help="skip the one-key-at-a-time attribution")
    d.add_argument("--table", help="YAML table of models and named conditions (e.g. bench/diagnose.yaml)")
    d.set_defaults(func=_cmd)
