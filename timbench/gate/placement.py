"""Where a gate run's measured mismatch sits among timbench's committed conditions (`timbench risk` on gate.json).

`from_gate(path)` reads a gate run's gate.json (or its directory) into `timbench risk` queries: the alignment
probe's rows, one per model, from a suite whose YAML (bench/gates) runs the alignment probe.

`placement(report, rows)` maps each alignment probe row of a gate report (mean |delta|, k3 as `timbench risk`
reads them: risk_input's gate rows) onto the committed grids (risk_data rows) with `risk.answer`, and keeps, per
rollout mode, the nearest committed setting and what it did over its seeds. Each finding is one sentence that
carries the scale caveat with it (the committed grids are CPU-scale models on one task), so no line of gate.md
reads as a prediction for the user's model. A mismatch outside the committed dose range (an exact-enough server
below it, a broken one above it) is not placed: the reason says so. Pure: the rows are passed in.
"""

from __future__ import annotations

from pathlib import Path

from ..studies.risk import MODES, answer, units, validity
from ..studies.risk_data import DOSE
from ..studies.risk_input import _align_query
from ..util.readfile import read_yaml
from .check import load_report

SCALE = (
    "at CPU scale (models of {models} on {tasks}, {lo:.3g}-{hi:.3g} committed mean |delta|), with no committed "
    "evidence that it transfers to larger models"
)
"""The caveat every placed sentence ends with (risk.validity's first caveat, filled in from the rows)."""


def _caveat(v: dict) -> str:
    lo, hi = v["dose_mean_abs_delta"] or (0.0, 0.0)
    return SCALE.format(models=", ".join(v["models"]), tasks=", ".join(v["tasks"]), lo=lo, hi=hi)


def _sentence(mode: str, s: dict, caveat: str) -> str:
    o = s["outcome"]
    lost = "-" if o["accuracy_lost"] is None else f"{o['accuracy_lost']:.3f}"
    ci = o["accuracy_lost_ci"]
    ci = f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci and ci[0] is not None else ""
    return (
        f"{mode}: nearest committed setting {s['grid']} / {s['model']} / {s['condition']} ({s['kind']}; mean "
        f"|delta| {s['stats'][DOSE]:.3g}, distance {s['distance']:.2f} log10) lost {lost}{ci} of the "
        f"zero-mismatch accuracy and collapsed in {o['collapsed']}/{o['seeds']} seeds over {o['steps']} steps, "
        f"{caveat}"
    )


def placement(report: dict, rows: list) -> list[dict]:
    """Per alignment row of `report` (a gate.json document): {model, query, placed, lines, nearest} where
    `nearest` is {mode: the nearest committed setting (risk.answer's entry, remedies left out)}; or, not placed,
    {model, query, placed: False, lines: [the reason]}. `rows`: risk_data RiskRows (risk_data.gather())."""
    caveat = _caveat(validity(units(rows))) if rows else ""
    out = []
    for r in report.get("probes", []):
        if (
            r.get("probe") != "alignment"
            or not isinstance(r.get("numbers"), dict)
            or r.get("not_tested")
            or "mean_abs_diff" not in r["numbers"]
        ):
            continue
        model = r.get("model")
        try:
            q = _align_query(r["numbers"], f"gate.json model {model}")
        except ValueError as e:
            out.append({"model": model, "query": {}, "placed": False, "lines": [f"not placed: {e}"]})
            continue
        if not rows:
            out.append(
                {
                    "model": model,
                    "query": q,
                    "placed": False,
                    "lines": ["not placed: no committed grid results here (a checkout's results/ directory)"],
                }
            )
            continue
        try:
            ans = answer(q, rows, k=1)
        except ValueError as e:  # outside the committed dose range: refused, never extrapolated
            out.append({"model": model, "query": q, "placed": False, "lines": [f"not placed: {e}"]})
            continue
        near = {m: {k: v for k, v in ss[0].items() if k != "remedies"} for m, ss in ans["nearest"].items() if ss}
        out.append(
            {
                "model": model,
                "query": q,
                "placed": True,
                "nearest": near,
                "lines": [_sentence(m, s, caveat) for m, s in near.items()],
            }
        )
    return out


def render_placement(found: list[dict]) -> str:
    """gate.md's section: per model, its mismatch and one sentence per rollout mode."""
    if not found:
        return ""
    lines = [
        "",
        "## Where this mismatch sits among timbench's committed conditions",
        "",
        f"Nearest committed setting per rollout mode ({'; '.join(f'{m}: {w}' for m, w in MODES.items())}); "
        "`timbench risk --gate DIR` gives the full answer with remedies.",
        "",
    ]
    for f in found:
        q = ", ".join(f"{k} {v:.3g}" for k, v in f["query"].items())
        lines.append(f"- {f['model']}" + (f" ({q})" if q else "") + ":")
        lines += [f"  - {x}" for x in f["lines"]]
    return "\n".join(lines) + "\n"


def gate_suites() -> list[str]:
    """Gate suites (bench/gates/*.yaml) that run the alignment probe: the gate.json files `risk` understands."""
    from .suite import SUITES_DIR  # deferred: tokenizers is heavy

    out = []
    for f in sorted(SUITES_DIR.glob("*.yaml")) if SUITES_DIR.is_dir() else []:
        doc = read_yaml(f, "gate suite") or {}
        if isinstance(doc, dict) and "alignment" in (doc.get("probes") or {}):
            out.append(str(doc.get("name", f.stem)))
    return out


def from_gate(path: str | Path) -> list[tuple[str, dict]]:
    """The alignment probe rows of a gate run (one query per model)."""
    doc = load_report(path)
    suite = doc["identity"].get("suite")
    known = gate_suites()
    if suite not in known:
        raise ValueError(
            f"{path}: a gate run of suite {suite!r}; `timbench risk` understands the suites with the "
            f"alignment probe: {', '.join(known)}"
        )
    rows = [r for r in doc["probes"] if r.get("probe") == "alignment"]
    rows = [r for r in rows if isinstance(r.get("numbers"), dict) and "mean_abs_diff" in r["numbers"]]
    if not rows:
        raise ValueError(
            f"{path}: no alignment probe result (suite {suite}); rerun `timbench gate run` with a suite "
            f"that has it: {', '.join(known)}"
        )
    out = []
    for r in rows:
        q = _align_query(r["numbers"], f"{path} model {r.get('model')}")
        out.append((f"gate {suite}, {r.get('model')} (alignment probe)", q))
    return out
