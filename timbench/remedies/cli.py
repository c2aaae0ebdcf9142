"""`timbench remedies list [--json]`: the registered and installed remedies, their parameters and hooks."""

from __future__ import annotations

import json


def _hooks(h: dict) -> str:
    parts = [f"replay={h['replay']}"] if h["replay"] else []
    parts += [f"mode={h['mode']}"] if h.get("mode") else []
    parts += [f"{side}.{k}={v}" for side in ("engine", "trainer") for k, v in h[f"{side}_override"].items()]
    return ", ".join(parts) or "-"


def _cmd_list(args) -> int:
    from .registry import list_remedies  # deferred: torch is heavy

    rows = list_remedies()
    if args.json:
        print(json.dumps(rows, sort_keys=True))
        return 0
    for r in rows:
        params = ", ".join(f"{k}={v}" for k, v in r["params"].items()) or "-"
        print(f"{r['name']:18s} params: {params:28s} hooks: {_hooks(r['hooks'])}")
        print(f"    {r['doc']}")
    return 0


def add_parser(sub) -> None:
    r = sub.add_parser(
        "remedies",
        help="mismatch remedies (TIS, MIS, IcePop, rejection, routing replay, fp16; "
        "verl presets and TRL modes by their names)",
    )
    rsub = r.add_subparsers(dest="remedies_command", required=True)
    ls = rsub.add_parser("list", help="list remedies with their parameters (defaults) and hooks")
    ls.add_argument("--json", action="store_true", help="print one JSON list")
    ls.set_defaults(func=_cmd_list)
