"""gate.html: one self-contained page of a gate run's gate.json (the leaderboards' inline-CSS style, no links out).

The verdict, what was gated (server, model, trainer, checkpoint hash, machine), one table row per probe (its
verdict with the note, its numbers, the condition it passes under; failed rows marked), and, for an HTTP run,
where the measured mismatch sits among the committed conditions (gate.placement). Pure: gate.json's dict in, the
page out; every text value is escaped by report.html.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from html import escape

from ..report.html import page, table_html
from .run import format_numbers, pass_condition, verdict


@dataclass
class _Table:
    title: str
    headers: list[str]
    rows: list[list[str]] = field(default_factory=list)
    note: str = ""


def _verdict(r: dict) -> str:
    if r.get("not_tested"):
        return f"not tested: {r['not_tested']}"
    if r.get("error"):
        return f"failed: error {r['error']}"
    word = "pass" if r["passed"] else "failed"  # report.html marks a row whose cell starts with "failed"
    return word + (f" ({r['note']})" if r.get("note") else "")


def render_gate_html(report: dict) -> str:
    ident = report["identity"]
    what = [
        f"Suite {ident['suite']} v{ident['suite_version']}: {verdict(report)}.",
        f"Engine {ident['engine_spec']} ({ident.get('engine_package')} {ident.get('engine_version')}); "
        f"torch {ident.get('torch')}; {(ident.get('machine') or {}).get('cpu', 'machine not recorded')}; "
        f"fingerprint {ident.get('fingerprint')}.",
    ]
    if "trainer_spec" in ident:
        what.append(
            f"Served model {ident['served_model']}, trainer {ident['trainer_spec']} (checkpoint "
            f"{ident['checkpoint_hash']}, transformers {ident['transformers']})."
        )
    probes = _Table("Probes", ["model", "probe", "verdict", "numbers", "passes when"])
    for r in report["probes"]:
        judged = not r.get("not_tested") and not r.get("error")
        probes.rows.append(
            [
                str(r["model"]),
                r["probe"],
                _verdict(r),
                format_numbers(r["numbers"]) if judged else "-",
                pass_condition(r.get("thresholds") or {}) if judged else "-",
            ]
        )
    body = [table_html(probes)]
    found = report.get("placement") or []
    if found:
        items = []
        for f in found:
            lines = "".join(f"<li>{escape(x)}</li>" for x in f["lines"])
            items.append(f"<li>{escape(str(f['model']))}<ul>{lines}</ul></li>")
        body.append(
            '<h2 id="placement">Where this mismatch sits among timbench\'s committed conditions</h2>\n'
            f"<ul>{''.join(items)}</ul>"
        )
    return page(f"timbench gate: {ident['suite']} v{ident['suite_version']}", what, body)
