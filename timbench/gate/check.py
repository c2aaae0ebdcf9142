"""`timbench gate check BASELINE CANDIDATE`: the regressions of a candidate's gate.json against a baseline's.

Exit codes: 0 no regression, 1 regressions (each named with both sides' numbers and the rule), 2 the two
are not comparable (another suite or suite version, or a candidate without some of the baseline's probe
results) or a probe erred in the candidate and nothing regressed. Exact probes compare verdicts; the alignment
probe's mean |delta| also regresses when it grows past 1.5x the baseline's (plus 1e-12, so an exact 0.0
baseline flags any nonzero value: a release that switches its rollouts to bf16 stays within the 0.1 bound of
`gate run` and fails here). Over HTTP the logprob-semantics probe also regresses when what the logprobs fit
changes while both pass (renormalised over the top-p nucleus -> the full distribution: a trainer built for the old
convention now mismatches). Findings that do not change the exit code: `improved` (a probe that failed in the
baseline passes now) and, between two HTTP runs, `context` (the two scored different checkpoints, so a change
may be the weights', not the server's). Each finding is a dict with the fields `--json` prints (kind, model,
probe, metric, baseline, candidate, rule) and `line`, the sentence the command prints: one per changed probe.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..util import manifest

GROWTH = 1.5
ALIGNMENT_RULE = f"mean_abs_diff <= {GROWTH}x the baseline's + 1e-12"
VERDICT_RULE = "a probe that passes in the baseline passes in the candidate"
SEMANTICS_RULE = "what the returned logprobs fit is the baseline's"
SEMANTICS_KEYS = ("fits", "top_p_fits")
"""logprob_semantics numbers whose change is a regression even when both runs pass."""
INFORMATIONAL = ("improved", "context")
"""Finding kinds that leave the exit code alone."""
ROW_KEYS = ("model", "probe", "passed", "numbers")


def load_report(path, identity_keys=("suite", "suite_version")) -> dict:
    """A gate.json (or its directory), checked to hold what `timbench gate run` writes: an identity with
    `identity_keys` and at least one probe row; a one-line ValueError naming what is missing otherwise."""
    p = Path(path)
    p = p / "gate.json" if p.is_dir() else p
    if not p.is_file():
        raise FileNotFoundError(f"{p}: no gate.json (run `timbench gate run ... --out DIR` first)")
    manifest.refuse_changed(p.parent, [p.name], "gate run")
    try:
        doc = json.loads(p.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        where = f"{e.msg} at line {e.lineno}" if isinstance(e, json.JSONDecodeError) else "not UTF-8 text"
        raise ValueError(f"{p}: not a gate.json ({where})") from None
    if not isinstance(doc, dict):
        raise ValueError(
            f"{p}: not a gate.json (a JSON {type(doc).__name__}; `timbench gate run` writes an object "
            "with identity and probes)"
        )
    ident = doc.get("identity")
    missing = [k for k in ("identity", "probes") if k not in doc]
    if not missing:
        missing = [k for k in identity_keys if k not in ident] if isinstance(ident, dict) else ["identity's fields"]
    if missing:
        raise ValueError(f"{p}: not a gate.json (missing {', '.join(missing)})")
    rows = doc["probes"]
    if not isinstance(rows, list):
        raise ValueError(f"{p}: not a gate.json (probes is a {type(rows).__name__}, not a list of probe rows)")
    bad = next((i for i, r in enumerate(rows) if not isinstance(r, dict) or any(k not in r for k in ROW_KEYS)), None)
    if bad is not None:
        raise ValueError(f"{p}: not a gate.json (probe row {bad} lacks one of {', '.join(ROW_KEYS)})")
    if not rows:
        raise ValueError(f"{p}: an empty gate run (no probe results); rerun `timbench gate run`")
    return doc


def check(base: dict, cand: dict) -> tuple[int, list[dict]]:
    """(exit code, findings): one per regression, per probe that erred in the candidate, or the one reason the
    two are incomparable."""
    bi, ci = base["identity"], cand["identity"]
    if (bi["suite"], bi["suite_version"]) != (ci["suite"], ci["suite_version"]):
        was, now = f"{bi['suite']} v{bi['suite_version']}", f"{ci['suite']} v{ci['suite_version']}"
        return 2, [
            _finding(
                "incomparable",
                None,
                None,
                "suite",
                was,
                now,
                "the same suite and suite version",
                f"incomparable: baseline is suite {was}, candidate is {now}",
            )
        ]
    was, now = bi.get("suite_sha256"), ci.get("suite_sha256")
    if was and now and was != now:  # runs made before suites were hashed have none: compared by name and version
        return 2, [
            _finding(
                "incomparable",
                None,
                None,
                "suite_sha256",
                was,
                now,
                "the same suite content",
                f"incomparable: both ran suite {bi['suite']} v{bi['suite_version']}, but its content "
                f"differs (sha256 {was[:12]} vs {now[:12]}): a suite edited without a new version",
            )
        ]
    have = {(r["model"], r["probe"]) for r in cand["probes"]}
    # A probe that erred or was not tested (an HTTP server without the capability) in the baseline has no result.
    results = [r for r in base["probes"] if not r.get("error") and not r.get("not_tested")]
    lack = [f"{r['model']} {r['probe']}" for r in results if (r["model"], r["probe"]) not in have]
    if lack:
        n = len(results)
        return 2, [
            _finding(
                "incomparable",
                None,
                None,
                "probes",
                n,
                n - len(lack),
                "the candidate has a result for every probe of the baseline",
                f"incomparable: the candidate lacks {len(lack)} of the baseline's {n} probe results "
                f"({', '.join(lack[:3])}{', ...' if len(lack) > 3 else ''}); a partial gate run is not "
                "checked",
            )
        ]
    old = {(r["model"], r["probe"]): r for r in base["probes"]}
    found = _context(bi, ci)
    for r in cand["probes"]:
        b = old.get((r["model"], r["probe"]))
        if b is None:
            continue
        m, p, where = r["model"], r["probe"], f"{r['model']} {r['probe']}"
        if r.get("not_tested"):
            if not b.get("not_tested"):
                found.append(
                    _finding(
                        "not compared",
                        m,
                        p,
                        "not_tested",
                        _verdict(b),
                        r["not_tested"],
                        "a probe that was not tested has no result to compare",
                        f"not compared: {where} was not tested in the candidate ({r['not_tested']})",
                    )
                )
        elif r.get("error"):
            found.append(
                _finding(
                    "not compared",
                    m,
                    p,
                    "error",
                    _verdict(b),
                    r["error"],
                    "a probe that erred has no result to compare",
                    f"not compared: {where} erred in the candidate ({r['error']})",
                )
            )
        elif b["passed"] and not r["passed"]:
            moved = (
                ", ".join(
                    f"{k} {_num(b['numbers'].get(k))} -> {_num(v)}"
                    for k, v in r["numbers"].items()
                    if b["numbers"].get(k) != v
                )
                or _numbers(r["numbers"])
                or "no numbers"
            )
            found.append(
                _finding(
                    "regression",
                    m,
                    p,
                    "passed",
                    True,
                    False,
                    VERDICT_RULE,
                    f"regression: {where} passed in the baseline and fails now: {moved}",
                )
            )
        elif not b["passed"] and r["passed"] and not b.get("not_tested") and not b.get("error"):
            found.append(
                _finding(
                    "improved",
                    m,
                    p,
                    "passed",
                    False,
                    True,
                    VERDICT_RULE,
                    f"improved: {where} failed in the baseline and passes now",
                )
            )
        elif p == "logprob_semantics" and any(_moved(b, r, k) for k in SEMANTICS_KEYS):
            k = next(k for k in SEMANTICS_KEYS if _moved(b, r, k))
            was, now = b["numbers"][k], r["numbers"][k]
            found.append(
                _finding(
                    "regression",
                    m,
                    p,
                    k,
                    was,
                    now,
                    SEMANTICS_RULE,
                    f"regression: {where} {k} {was} -> {now}: the returned logprobs are of another "
                    f"distribution than the baseline's (rule: {SEMANTICS_RULE})",
                )
            )
        elif p == "alignment" and "mean_abs_diff" in b["numbers"] and "mean_abs_diff" in r["numbers"]:
            was, now = b["numbers"]["mean_abs_diff"], r["numbers"]["mean_abs_diff"]
            if now > GROWTH * was + 1e-12:
                found.append(
                    _finding(
                        "regression",
                        m,
                        p,
                        "mean_abs_diff",
                        was,
                        now,
                        ALIGNMENT_RULE,
                        f"regression: {where} mean_abs_diff {was:.3g} -> {now:.3g} (rule: {ALIGNMENT_RULE})",
                    )
                )
    kinds = {f["kind"] for f in found} - set(INFORMATIONAL)
    return (1 if "regression" in kinds else 2 if kinds else 0), found


def _moved(b: dict, r: dict, key: str) -> bool:
    return key in b["numbers"] and key in r["numbers"] and b["numbers"][key] != r["numbers"][key]


def _context(bi: dict, ci: dict) -> list[dict]:
    """Between two HTTP runs (a server upgrade): a note when they scored different checkpoints."""
    was, now = bi.get("checkpoint_hash"), ci.get("checkpoint_hash")
    if was is None or now is None or was == now:
        return []
    return [
        _finding(
            "context",
            None,
            None,
            "checkpoint_hash",
            was,
            now,
            "a server upgrade is checked on one checkpoint",
            f"context: the runs scored different checkpoints ({bi.get('checkpoint')} {was} -> "
            f"{ci.get('checkpoint')} {now}): a change below may be the weights', not the server's",
        )
    ]


def _finding(kind, model, probe, metric, baseline, candidate, rule, line) -> dict:
    return {
        "kind": kind,
        "model": model,
        "probe": probe,
        "metric": metric,
        "baseline": baseline,
        "candidate": candidate,
        "rule": rule,
        "line": line,
    }


def _verdict(r) -> str:
    return "not tested" if r.get("not_tested") else "error" if r.get("error") else "pass" if r["passed"] else "fail"


def _num(x) -> str:
    return f"{x:.3g}" if isinstance(x, float) else str(x)


def _numbers(numbers: dict) -> str:
    return ", ".join(f"{k}={_num(v)}" for k, v in numbers.items())
