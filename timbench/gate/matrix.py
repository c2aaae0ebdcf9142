"""`timbench gate matrix DIR...`: one table of several engine releases' gate runs, and what changed between them.

Each DIR is one release's gate run (`timbench gate run --out DIR`: gate.json, and pip-freeze.txt when
`make gate-matrix` made it) or, for a release that could not be installed, imported or gated, an error.txt
holding that one-line error: that is the release's row, not a failure of the matrix. A probe that erred in a
gate run (an unsupported model) is an ERROR cell with its reason; the release's other probes stand. Package,
torch and transformers versions come from pip-freeze.txt when there is one (an error row has them too),
else from gate.json's identity. A raw_reload.json
(bench/gates/vllm_raw_reload.py) adds whether the release's own reload still has the bugs timbench's adapter
works around. Releases are compared in the order given, each with the one before it: verdicts and numbers that
moved, the identity that moved (engine version, torch, transformers), the raw reload bugs that appeared or went,
and `timbench gate check`'s verdict on the pair.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..util.atomic import atomic_write
from .check import check, load_report
from .run import format_numbers

IDENTITY_KEYS = ("engine_version", "torch", "torch_git", "suite", "suite_version", "engine_spec")
"""What a release row shows of gate.json's identity, and what a change line reports when it moves."""


def load_row(path) -> dict:
    """One release: {"name", "report" | "error", "transformers", "raw_reload"}; a one-line ValueError when DIR
    holds neither a gate.json nor an error.txt, or a file is malformed. error.txt wins over a gate.json:
    bench/gates/matrix.sh removes it when it starts, so it means the latest attempt failed."""
    d = Path(path)
    row = {"name": d.name, "report": None, "error": None, "pins": {}, "raw_reload": None}
    if (d / "raw_reload.json").is_file():
        try:
            row["raw_reload"] = json.loads((d / "raw_reload.json").read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"{d / 'raw_reload.json'}: not JSON ({e.msg} at line {e.lineno})") from None
    freeze = d / "pip-freeze.txt"
    if freeze.is_file():
        row["pins"] = {
            name.strip().lower(): v.strip()
            for name, v in (ln.split("==", 1) for ln in freeze.read_text().splitlines() if "==" in ln)
        }
    row["transformers"] = row["pins"].get("transformers")
    if (d / "error.txt").is_file():
        text = (d / "error.txt").read_text().strip()
        row["error"] = text.splitlines()[0] if text else "error.txt is empty"
    elif (d / "gate.json").is_file():
        rep = load_report(d, IDENTITY_KEYS)
        missing = [k for k in ("passed", "seconds") if k not in rep]
        if missing:
            raise ValueError(f"{d / 'gate.json'}: not a gate.json (missing {', '.join(missing)})")
        row["report"] = rep
    else:
        raise ValueError(
            f"{d}: no gate.json or error.txt (a matrix row is a `timbench gate run --out DIR` or "
            "a release's error.txt from bench/gates/matrix.sh)"
        )
    return row


def versions(row) -> tuple[str, str]:
    """(engine package and version, torch) of a release: pip-freeze.txt's pins where it names them, else its
    gate.json's identity; "-" where neither does (a release that could not even be installed)."""
    ident = (row["report"] or {}).get("identity", {})
    dist = next((k for k in row["pins"] if k == "vllm" or k.startswith("vllm-")), None)
    package = (
        f"{dist} {row['pins'][dist]}"
        if dist
        else f"{ident['engine_package']} {ident['engine_version']}"
        if ident
        else "-"
    )
    return package, row["pins"].get("torch") or ident.get("torch", "-")


def verdict(row) -> str:
    """A release's verdict: pass, FAIL, ERROR (no gate run), or the counts when some probes erred."""
    if row["report"] is None:
        return "ERROR"
    probes = row["report"]["probes"]
    erred = sum(bool(r.get("error")) for r in probes)
    if not erred:
        return "pass" if row["report"]["passed"] else "FAIL"
    failed = sum(not r["passed"] for r in probes) - erred
    counts = [(len(probes) - erred - failed, "pass"), (failed, "FAIL"), (erred, "ERROR")]
    return ", ".join(f"{n} {word}" for n, word in counts if n)


def changes(prev: dict, cur: dict) -> list[str]:
    """What moved from release `prev` to `cur`: identity, each probe's verdict and numbers, gate check's verdict."""
    if prev["report"] is None or cur["report"] is None:
        side = prev if prev["report"] is None else cur
        return [f"not comparable: {side['name']} has no gate run ({side['error']})"]
    a, b = prev["report"], cur["report"]
    lines = [
        f"{k}: {a['identity'][k]} -> {b['identity'][k]}" for k in IDENTITY_KEYS if a["identity"][k] != b["identity"][k]
    ]
    if prev["transformers"] != cur["transformers"]:
        lines.append(f"transformers: {prev['transformers']} -> {cur['transformers']}")
    for bug in sorted(set(prev["raw_reload"] or {}) | set(cur["raw_reload"] or {})):
        was, now = _raw(prev, bug), _raw(cur, bug)
        if was != now:
            lines.append(f"vLLM's own reload, {bug}: {was} -> {now}")
    old = {(r["model"], r["probe"]): r for r in a["probes"]}
    for r in b["probes"]:
        o = old.get((r["model"], r["probe"]))
        where = f"{r['model']} {r['probe']}"
        if o is None:
            lines.append(f"{where}: new probe ({_verdict(r)})")
            continue
        if _verdict(o) != _verdict(r):
            lines.append(f"{where}: {_verdict(o)} -> {_verdict(r)}")
        if o.get("error") or r.get("error"):
            continue  # an erred side has no numbers to move
        moved = {k: (o["numbers"].get(k), v) for k, v in r["numbers"].items() if o["numbers"].get(k) != v}
        if moved:
            lines.append(f"{where}: " + ", ".join(f"{k} {_num(x)} -> {_num(y)}" for k, (x, y) in moved.items()))
    code, found = check(a, b)
    regressions = sum(f["kind"] == "regression" for f in found)
    uncompared = sum(f["kind"] == "not compared" for f in found)  # improved / context findings leave the code alone
    lines.append(
        f"`timbench gate check {prev['name']} {cur['name']}`: exit {code}"
        + (
            ""
            if code == 0
            else " (incomparable)"
            if found[0]["kind"] == "incomparable"
            else " ("
            + "; ".join(
                f"{n} {what}" for n, what in ((regressions, "regression(s)"), (uncompared, "erred, not compared")) if n
            )
            + ")"
        )
    )
    return lines


def build(dirs) -> tuple[dict, str]:
    """(matrix.json document, matrix.md text) over the release dirs, in the order given."""
    from ..grid.same_run import distinct_dirs

    rows = [load_row(d) for d in distinct_dirs(dirs, "release directory")]
    if not rows:
        raise ValueError("gate matrix: no release directories given")
    keys = list(
        dict.fromkeys((r["model"], r["probe"]) for row in rows if row["report"] for r in row["report"]["probes"])
    )
    doc = {"releases": [], "changes": []}
    for row in rows:
        rep = row["report"]
        package, torch = versions(row)
        doc["releases"].append(
            {
                "name": row["name"],
                "error": row["error"],
                "package": package,
                "torch": torch,
                "transformers": row["transformers"],
                "raw_reload": row["raw_reload"],
                "verdict": verdict(row),
                "identity": rep and rep["identity"],
                "passed": rep and rep["passed"],
                "seconds": rep and rep["seconds"],
                "probes": rep
                and {
                    f"{r['model']} {r['probe']}": {
                        k: r.get(k) for k in ("passed", "numbers", "thresholds", "note", "error")
                    }
                    for r in rep["probes"]
                },
            }
        )
    for prev, cur in zip(rows, rows[1:]):
        doc["changes"].append({"from": prev["name"], "to": cur["name"], "lines": changes(prev, cur)})
    return doc, render(rows, keys, doc["changes"])


def render(rows, keys, moved) -> str:
    names = [r["name"] for r in rows]
    lines = [
        "Release matrix (`timbench gate matrix`, made by `make gate-matrix`): each release's gate run, every "
        "probe's verdict and numbers, and what changed between consecutive releases.",
        "",
        "| release | package version | torch | transformers | suite | gate | wall s |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        package, torch = versions(r)
        if r["report"] is None:
            lines.append(
                f"| {r['name']} | {package} | {torch} | {r['transformers'] or '-'} | - | **ERROR**: {r['error']} | - |"
            )
            continue
        i, word = r["report"]["identity"], verdict(r)
        lines.append(
            f"| {r['name']} | {package} | {torch} | {r['transformers'] or '-'} | {i['suite']} "
            f"v{i['suite_version']} | {word if word == 'pass' else '**' + word + '**'} | "
            f"{r['report']['seconds']:.0f} |"
        )
    lines += ["", "| model | probe | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]
    for model, probe in keys:
        cells = []
        for r in rows:
            hit = next(
                (p for p in (r["report"] or {}).get("probes", []) if (p["model"], p["probe"]) == (model, probe)), None
            )
            cells.append("ERROR" if r["report"] is None else "-" if hit is None else _cell(hit))
        lines.append(f"| {model} | {probe} | " + " | ".join(cells) + " |")
    bugs = list(dict.fromkeys(b for r in rows for b in (r["raw_reload"] or {})))
    if bugs:
        lines += [
            "",
            "vLLM's own in-memory reload with timbench's workaround for that bug off "
            "(bench/gates/vllm_raw_reload.py; the gate's weight_sync runs with the workarounds on):",
            "",
            "| bug | " + " | ".join(names) + " |",
            "|---|" + "---|" * len(names),
        ]
        lines += [
            f"| {b} | " + " | ".join(_raw(r, b, detail=True).replace("|", "\\|") for r in rows) + " |" for b in bugs
        ]
    lines += ["", "Changes between consecutive releases:"]
    for m in moved:
        lines += ["", f"- **{m['from']} -> {m['to']}**"] + [f"  - {ln}" for ln in m["lines"]]
    return "\n".join(lines) + "\n"


def _cell(r) -> str:
    """A probe's verdict, numbers and note (or its error) as one table cell (a `|` inside escaped)."""
    if r.get("error"):
        return f"**ERROR**: {r['error']}".replace("|", "\\|")
    text = (
        _verdict(r)
        + (f": {format_numbers(r['numbers'])}" if r["numbers"] else "")
        + (f" ({r['note']})" if r["note"] else "")
    )
    return text.replace("|", "\\|")


def _verdict(r) -> str:
    return "**ERROR**" if r.get("error") else "pass" if r["passed"] else "**FAIL**"


def _raw(row, bug, detail=False) -> str:
    """One raw reload check of a release: stale (with the sync error when `detail`), correct, or not run."""
    r = (row["raw_reload"] or {}).get(bug)
    if r is None:
        return "-"
    verdict = "not run" if r["stale"] is None else "**stale**" if r["stale"] else "correct"
    return f"{verdict}: {r['error']}" if detail and r["error"] else verdict


def _num(x) -> str:
    return f"{x:.3g}" if isinstance(x, float) else str(x)


def write(dirs, out) -> dict:
    """Build the matrix over `dirs` and write matrix.json / matrix.md under `out` (atomically)."""
    doc, text = build(dirs)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(out / "matrix.json", json.dumps(doc, indent=1, sort_keys=True) + "\n")
    atomic_write(out / "matrix.md", text)
    return doc
