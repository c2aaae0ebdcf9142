"""`timbench claims DIR...`: the field's published claims about mismatch, each checked against committed results.

Reads every DIR (grid result dirs such as results/paper, results/lowprec, results/vllm_moe; alignment
dirs such as results/align; timbench.studies.claims_data), runs every rule of the registry
(timbench.studies.claims_rules.CLAIMS) and writes, atomically, claims.md (per claim: its source, the claim
as published, a headline verdict and each sub-claim with its numbers and rule) and claims.json (the same,
machine-readable) into OUT. The verdict words are `timbench paper`'s, plus "not testable here".

    timbench claims results/paper results/lowprec results/vllm_moe results/align --out results/claims
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from ..util.atomic import atomic_write
from . import claims_rules  # noqa: F401  (registers every claim)
from .claims_data import Evidence, load_evidence
from .claims_registry import CLAIMS, headline
from .paper_claims import family, sub_json


def run_claims(ev: Evidence) -> list[dict]:
    """Every registered claim decided on `ev`: {id, source, claim, verdict, rule, subclaims}."""
    out = []
    for c in CLAIMS:
        subs = family(c.id, c.rule(ev)).subs  # Holm over the claim's tests, then each sub-claim's word
        out.append(
            {
                "id": c.id,
                "source": c.source,
                "claim": c.text,
                "verdict": headline(subs),
                "rule": f"timbench.studies.claims_rules.{c.rule.__name__}",
                "subclaims": [sub_json(s) for s in subs],
            }
        )
    return out


def _markdown(claims: list[dict], ev: Evidence, command: str) -> str:
    grids = ", ".join(
        f"{n} ({ev.steps[n]} steps, {max(len(r) for r in d.rows.values())} seeds)" for n, d in ev.grids.items()
    )
    tables = sorted({r["table"] for r in ev.align})
    lines = [
        "# The field's claims about training-inference mismatch, checked at CPU scale",
        "",
        f"regenerate: `{command}`",
        "",
        f"grids: {grids or 'none'}; alignment tables: {', '.join(tables) or 'none'}",
        "",
        "Verdicts are decided by the rules in `timbench/studies/claims_rules.py` (each rule's docstring cites its "
        "source) and `timbench/report/verdict_rules.py`. Relative accuracy reads each grid's endpoint (default: "
        "mean eval accuracy T=1 over the last half of the run, a grid that declares none); each claim is a "
        "family whose tests are Holm-adjusted; intervals are 95% Student t over seeds, paired by seed where two "
        "settings are compared; a claim of no difference needs equivalence (TOST within half that grid's "
        "learning range); a grid whose baseline does not learn tests nothing (not tested). An alignment row is "
        "one seed (a demonstration). A claim's headline is its weakest central sub-claim. How to read a "
        "verdict: [docs/verdicts.md](../../docs/verdicts.md).",
        "",
        "| claim | source | verdict |",
        "|---|---|---|",
    ]
    lines += [f"| [{c['id']}](#{_anchor(c['id'])}) | {c['source']} | {c['verdict']} |" for c in claims]
    lines.append("")
    for c in claims:
        lines += [
            f"## {c['id']}",
            "",
            f"**{c['verdict']}**",
            "",
            f"Claim ({c['source']}): {c['claim']}",
            "",
            f"Rule: `{c['rule']}`",
            "",
        ]
        for s in c["subclaims"]:
            parts = [p for p in re.split(r"; | \| ", s["numbers"]) if p]
            extra = "" if s["central"] else " (context: does not set the headline)"
            lines.append(f"- **{s['verdict']}**: {s['text']}{extra}." + (f" {parts[0]}" if len(parts) == 1 else ""))
            lines += [f"  - {p}" for p in parts] if len(parts) > 1 else []
        lines.append("")
    return "\n".join(lines)


def _anchor(text: str) -> str:
    """GitHub's heading anchor: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^a-z0-9 -]", "", text.lower()).replace(" ", "-")


def write_claims(dirs: list[str | Path], out: str | Path, command: str | None = None) -> dict[str, Path]:
    """Write claims.md and claims.json for the evidence in `dirs` into `out`; returns what was written."""
    out = Path(out)
    ev = load_evidence(dirs)
    command = command or "timbench claims " + " ".join(str(d) for d in dirs) + f" --out {out}"
    claims = run_claims(ev)
    written = {"claims.md": out / "claims.md", "claims.json": out / "claims.json"}
    atomic_write(written["claims.md"], _markdown(claims, ev, command))
    doc = {
        "command": command,
        "grids": {n: ev.steps[n] for n in ev.grids},
        "align_tables": sorted({r["table"] for r in ev.align}),
        "claims": claims,
    }
    atomic_write(written["claims.json"], json.dumps(doc, indent=1, sort_keys=True, allow_nan=False) + "\n")
    return written
