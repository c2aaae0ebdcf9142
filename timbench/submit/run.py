"""`timbench submit`: run one remedy's cells of a track and place it on the track's merged leaderboard.

Steps: load the track; check that the committed results (results/tracks/<track>/) were made by this track
version, config, tasks and code (timbench.submit.track.check_committed: one-line refusal naming what
differs); copy them into OUT (timbench.grid.merge), add the new remedy's cells to OUT/cells.json and run
only those (resumable: a rerun skips finished cells); turn a finished cell that masked every token at every
step into a failed cell; write the leaderboard (timbench grid report) and submission.md / submission.json
with the new remedy's rank, score interval and paired comparisons against `none` and against the best
committed remedy. A remedy that crashes or returns NaN weights fails its cells with the loop's one-line
error; the other cells still run. OUT is never under results/ unless asked (`allow_results`).
"""

from __future__ import annotations

import json
import re
import shlex
import sys
from pathlib import Path

from ..grid.layout import GridLock, read_status, run_dir, write_status
from ..grid.merge import merge
from ..grid.spec import expand
from ..remedies import load_remedy
from ..remedies.identity import comparable_cell, other_version, remedy_identity
from ..report.leaderboard import fmt_interval, remedy_ranking, write_report
from ..report.results import load_results
from ..report.seeds import NOTHING_TRAINED
from ..report.summary import summarize
from ..rl.config import from_dict
from ..util.atomic import atomic_write
from ..util.readfile import read_json
from .extras import markdown_lines, plugin_metrics
from .paired import paired, paired_by_setting
from .repro import is_plugin, reproducibility_warning
from .track import MANIFEST, TRACKS_DIR, check_committed, load_track

MASKED_ALL = NOTHING_TRAINED  # the report scores such a cell like a collapse (timbench.report.seeds)


def default_out(track: str, remedy: str) -> Path:
    return Path("build/submit") / track / (re.sub(r"[^A-Za-z0-9_.+-]+", "-", remedy).strip("-") or "remedy")


def _under_results(out: Path) -> bool:
    return Path("results").resolve() in [out.resolve(), *out.resolve().parents]


def plan_cells(track, remedy: str, remedy_args: dict) -> list[dict]:
    """The new remedy's cells of the track (cells.json entries), each config validated now (one-line errors)."""
    label = remedy_identity(remedy)  # a plug-in file's cells are name@hash cells (remedies.identity)
    cells = [c.to_dict() for c in expand(track.spec(["none", remedy])) if c.axes["remedy"] == label]
    for c in cells:
        c["config"]["remedy_args"] = dict(remedy_args)
        from_dict(dict(c["config"]), f"cell {c['id']}")  # the remedy's parameters, checked before anything runs
    return cells


def masked_everything(out: Path, cid: str) -> bool:
    """True when every logged step of a finished cell masked all its tokens (rollout_rs_masked_fraction 1)."""
    path = run_dir(out, cid) / "metrics.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.is_file() else []
    return bool(rows) and all(r.get("rollout_corr/rollout_rs_masked_fraction") == 1.0 for r in rows)


def mark_nothing_trained(out: Path, cells: list[dict]) -> None:
    """Fail every done cell whose remedy masked every token at every step, committed and submitted alike."""
    for c in cells:
        st = read_status(out, c["id"]) or {}
        if st.get("status") == "done" and masked_everything(out, c["id"]):
            write_status(out, c["id"], "failed", MASKED_ALL, st.get("wall_s", 0.0), st.get("attempts", 1))


def submit(
    remedy: str,
    track_name: str,
    out: str | Path | None = None,
    committed: str | Path | None = None,
    remedy_args: dict | None = None,
    workers: int = 1,
    allow_results: bool = False,
    stream=None,
    retry_failed: bool = False,
    *,
    run_cells,
) -> dict:
    """Run `remedy` on the track into `out` and write the merged leaderboard; returns the submission record
    (with `failed_cells`: the submitted cells that did not finish). `retry_failed` reruns failed cells (after a
    fixed plug-in) instead of keeping their failure. `run_cells` runs them (`timbench.runners.driver.run_cells`,
    passed in by the CLI: the library never imports the runners)."""
    stream = stream or sys.stderr
    track = load_track(track_name)
    committed = Path(committed) if committed else track.committed_dir()
    label = remedy_identity(remedy)  # what cells, directories and the submission name: never a file's path
    out = Path(out) if out else default_out(track.name, label)
    if _under_results(out) and not allow_results:
        raise ValueError(
            f"--out {out} is under results/; submissions go elsewhere (default build/submit/...) unless --allow-results"
        )
    if out.resolve() == committed.resolve():
        raise ValueError(f"--out {out} is the committed results directory; give another one")
    if (out / "cells.json").is_file():  # an edited plug-in is another remedy: do not mix its versions in one board
        earlier = other_version(label, {c["axes"]["remedy"] for c in read_json(out / "cells.json")["cells"]})
        if earlier:
            raise ValueError(
                f"{out} holds {earlier}, another version of the plug-in file (now {label}); use another --out"
            )
    if label in track.remedies and (committed / MANIFEST).is_file():
        raise ValueError(f"remedy {label!r} already has committed results on track {track.name} ({committed})")
    load_remedy(remedy, dict(remedy_args or {}))  # a mistyped name or parameter: one line now, not after the preflight
    print(
        f"submit {label} on track {track.name}: preflight of the committed results {committed}", file=stream, flush=True
    )

    def say(line: str) -> None:  # preflight progress: flushed, so a user sees each line as it happens
        print(line, file=stream, flush=True)

    notes = check_committed(track, committed, say=say)
    if is_plugin(remedy):  # a plug-in's maths must be CPU- and thread-independent like the built-ins'
        print(
            f"submit {label}: checking that one step gives the same bytes under 1/2 threads and portable "
            "kernels (3 short processes)",
            file=stream,
            flush=True,
        )
        warning = reproducibility_warning(remedy, dict(remedy_args or {}), say=say)
        if warning:
            print(warning, file=stream, flush=True)
    cells = plan_cells(track, remedy, dict(remedy_args or {}))
    committed_ids = {c["id"] for c in read_json(committed / "cells.json")["cells"]}
    missing = sorted({c["reference"] for c in cells if c["reference"]} - committed_ids)
    if missing:
        raise ValueError(f"committed results {committed} lack the reference cell {missing[0]}")
    with GridLock(out, "timbench submit"):  # before anything is written to out
        merge([committed], out)  # out gets the committed cells (or already holds them from an earlier run)
        doc = read_json(out / "cells.json")
        have = {c["id"]: c for c in doc["cells"]}
        for c in cells:  # a plug-in file moved since the last run is the same cell (comparable_cell)
            if c["id"] in have and comparable_cell(have[c["id"]]) != comparable_cell(c):
                raise ValueError(
                    f"{out} already holds cell {c['id']} with another config (other remedy_args?); use another --out"
                )
        mine = {c["id"]: c for c in cells}  # the file's current path, where the runs load it from
        doc["cells"] = [mine.get(c["id"], c) for c in doc["cells"]] + [c for c in cells if c["id"] not in have]
        atomic_write(out / "cells.json", json.dumps(doc, indent=1, sort_keys=True) + "\n")
        for note in notes:
            print(f"note: {note}", file=stream)
        run_cells(
            cells,
            out,
            f"submit {label}",
            workers,
            retry_failed=retry_failed,
            stream=stream,
            announce=lambda n: print(
                f"submit {label} on track {track.name}: {n} of {len(cells)} cells to run -> {out}", file=stream
            ),
        )
        mark_nothing_trained(out, cells)
        record = write_submission(
            out, label, track, cells, committed, command=regenerate_command(remedy, track, out, remedy_args or {})
        )
    # A cell that crashed (not one whose remedy masked everything: that is a scored result) fails the submission.
    record["failed_cells"] = [cid for cid, err in record["failed"].items() if MASKED_ALL not in str(err)]
    return record


def _iv(iv) -> dict:
    return {"mean": iv.mean, "lo": iv.lo, "hi": iv.hi}


def regenerate_command(spec: str, track, out: Path, remedy_args: dict) -> str:
    """The command that remakes this submission as the user ran it: the remedy spec (a plug-in's FILE.py:CLASS,
    not its name@hash label, which no command accepts), the track file and every remedy parameter."""
    sets = "".join(f" --set {shlex.quote(f'remedy_args.{k}={json.dumps(v)}')}" for k, v in sorted(remedy_args.items()))
    track_arg = track.name if track.path.resolve() == (TRACKS_DIR / f"{track.name}.yaml").resolve() else track.path
    return (
        f"timbench submit {shlex.quote(spec)} --track {shlex.quote(str(track_arg))} --out {shlex.quote(str(out))}{sets}"
    )


def write_submission(
    out: Path, remedy: str, track, cells: list[dict], committed: Path, command: str | None = None
) -> dict:
    write_report(out, command=command or f"timbench submit {remedy} --track {track.name} --out {out}", highlight=remedy)
    rows = summarize(load_results(out))
    ranked = remedy_ranking(rows)
    rank = next(i for i, e in enumerate(ranked) if e["remedy"] == remedy)
    entry = ranked[rank]
    # the best built-in is one whose cells all trained: a remedy that failed or masked everything is no bar
    builtins = [
        e
        for e in ranked
        if e["remedy"] in track.remedies and e["remedy"] != "none" and e["score"] is not None and not e["incomplete"]
    ]
    best = builtins[0]["remedy"] if builtins else None
    comparisons = [paired(rows, remedy, other) for other in ["none"] + ([best] if best else [])]
    per_setting = {c["b"]: paired_by_setting(rows, remedy, c["b"]) for c in comparisons}
    failed = [
        (c["id"], (read_status(out, c["id"]) or {}).get("error"))
        for c in cells
        if (read_status(out, c["id"]) or {}).get("status") != "done"
    ]
    lines = [
        f"# Submission: {remedy} on track {track.name} (version {track.version})",
        "",
        f"Committed results: `{committed}`; leaderboard: `{out}/leaderboard.md`.",
        "",
        f"- rank {entry['rank']} of {len(ranked)} (a tie unless its interval separates it from the next)"
        + f"; score {fmt_interval(entry['interval'])} (95% CI, {entry['seeds']} seeds, "
        f"{entry['collapses']}/{entry['cells']} cells collapsed)",
    ]
    for cmp in comparisons:
        diffs = ", ".join(f"{d:+.3f}" for d in cmp["diffs"]) or "-"
        lines.append(
            f"- vs {cmp['b']}: paired difference {fmt_interval(cmp['interval'])} over seeds "
            f"{', '.join(map(str, cmp['seeds'])) or '-'} (per seed {diffs}): **{cmp['verdict']}**"
        )
        for c in per_setting[cmp["b"]]:  # per condition: an overall tie can hide a loss under one of them
            lines.append(
                f"  - {c['setting']}: {remedy} {fmt_interval(c['a_interval'])} vs {cmp['b']} "
                f"{fmt_interval(c['b_interval'])}; paired difference {fmt_interval(c['interval'])}: "
                f"**{c['verdict']}**"
            )
    extras = plugin_metrics(rows, remedy)
    lines += markdown_lines(extras)
    for cid, err in failed:
        lines.append(f"- FAILED {cid}: {err or 'not run'}")
    text = "\n".join(lines) + "\n"
    atomic_write(out / "submission.md", text)
    record = {
        "remedy": remedy,
        "track": track.name,
        "track_version": track.version,
        "rank": rank + 1,
        "rank_label": entry["rank"],
        "of": len(ranked),
        "score": entry["score"],
        "score_lo": entry["interval"].lo,
        "score_hi": entry["interval"].hi,
        "tied_with": entry["tied_with"],
        "failed": dict(failed),
        "extra_metrics": extras,
        "comparisons": [
            {
                "vs": c["b"],
                "seeds": c["seeds"],
                "diffs": c["diffs"],
                "mean": c["interval"].mean,
                "lo": c["interval"].lo,
                "hi": c["interval"].hi,
                "verdict": c["verdict"],
                "by_setting": [
                    {
                        "setting": p["setting"],
                        "seeds": p["seeds"],
                        "diffs": p["diffs"],
                        "mean": p["interval"].mean,
                        "lo": p["interval"].lo,
                        "hi": p["interval"].hi,
                        "verdict": p["verdict"],
                        "remedy": _iv(p["a_interval"]),
                        "other": _iv(p["b_interval"]),
                    }
                    for p in per_setting[c["b"]]
                ],
            }
            for c in comparisons
        ],
    }
    atomic_write(out / "submission.json", json.dumps(record, indent=1, sort_keys=True) + "\n")
    return record | {"text": text}
