"""`timbench submit REMEDY --track NAME [--out DIR]` and `timbench track run|list`.

timbench submit my_remedy.py:MyRemedy --track quick [--out DIR] [--set remedy_args.C=3] [--workers N]
timbench track run quick [--out results/tracks/quick] [--workers N]   # the committed remedies' results
timbench track list

It lives in the command layer, not in timbench.submit: it hands the library the runners' `run_cells`, and only the
command layer imports the runners (timbench.submit.run takes what it runs as an argument).
"""

from __future__ import annotations

import sys
from pathlib import Path

from ..grid.cli import add_workers_arg, default_workers
from ..report.seeds import NOTHING_TRAINED
from ..util.atomic import check_output_dir


def _remedy_args(items: list[str]) -> dict:
    from ..rl.config import apply_overrides  # deferred: torch is heavy

    for item in items:
        if not item.startswith("remedy_args."):
            raise ValueError(f"--set {item!r}: submit takes only remedy_args.NAME=VALUE (the track fixes the rest)")
    return apply_overrides({}, items).get("remedy_args", {})


def _cmd_submit(args) -> int:
    from ..runners.driver import run_cells  # deferred: torch is heavy
    from ..submit.run import submit  # deferred: torch is heavy

    if args.out:
        check_output_dir(args.out)
    rec = submit(
        args.remedy,
        args.track,
        args.out,
        args.committed,
        _remedy_args(args.set or []),
        workers=default_workers(args.workers),
        allow_results=args.allow_results,
        retry_failed=args.retry_failed,
        run_cells=run_cells,
    )
    print(rec["text"], end="")
    if rec["failed_cells"]:
        first = rec["failed_cells"][0]
        print(
            f"submit: {len(rec['failed_cells'])} of the submitted cells failed (first: {first}: "
            f"{rec['failed'].get(first) or 'not run'}); fix the remedy and rerun with --retry-failed",
            file=sys.stderr,
        )
        return 1
    return 0


def _cmd_track_run(args) -> int:
    from ..grid.layout import GridLock, cells_document, prepare, read_status  # deferred: torch is heavy
    from ..grid.spec import expand  # deferred: torch is heavy
    from ..report.leaderboard import write_report  # deferred: torch is heavy
    from ..runners.driver import run_cells  # deferred: torch is heavy
    from ..submit.run import mark_nothing_trained  # deferred: torch is heavy
    from ..submit.track import load_track, write_manifest  # deferred: torch is heavy

    track = load_track(args.track)
    # Like every regeneration: under build/ unless told --out results/... (the committed results submit reads).
    out = Path(args.out or Path("build") / track.committed_dir().relative_to("results"))
    check_output_dir(out)
    grid = track.spec(track.remedies)
    planned = expand(grid)
    with GridLock(out):
        prepare(out, grid, planned)
        write_manifest(track, out, cells_document(grid, planned))  # first: a killed run still has it
        cells = [c.to_dict() for c in planned]
        # Remedy by remedy (none first: it owns the reference cells), so a run cut short leaves whole remedies.
        workers = default_workers(args.workers, grid.workers)
        for remedy in track.remedies:
            run_cells([c for c in cells if c["axes"]["remedy"] == remedy], out, f"track {track.name} {remedy}", workers)
        # The same rule as for a submission: a remedy that trained on nothing is a failed (scored) cell.
        mark_nothing_trained(out, cells)
    write_report(out, command=f"timbench track run {args.track} --out {out}")
    statuses = {c["id"]: read_status(out, c["id"]) or {} for c in cells}
    failed = [i for i, st in statuses.items() if st.get("status") != "done" and st.get("error") != NOTHING_TRAINED]
    print(f"track {track.name} v{track.version}: {len(cells) - len(failed)}/{len(cells)} cells done -> {out}")
    return 1 if failed else 0


def _cmd_track_list(args) -> int:
    from ..grid.spec import expand  # deferred: torch is heavy
    from ..submit.track import MANIFEST, TRACKS_DIR, load_track  # deferred: torch is heavy

    for p in sorted(TRACKS_DIR.glob("*.yaml")):
        t = load_track(str(p))
        n = sum(1 for c in expand(t.spec(["none", "tis_token"])) if c.axes["remedy"] == "tis_token")
        if (t.committed_dir() / MANIFEST).is_file():
            have = f"committed: {', '.join(t.remedies)}"
        else:  # defined, not run: nothing to submit against until its results are made
            have = (
                f"no committed results yet (make them: timbench track run {t.name} --out {t.committed_dir()}); "
                f"its remedies: {', '.join(t.remedies)}"
            )
        print(f"{t.name:10s} v{t.version}  {n} cells per submitted remedy; {have}")
    return 0


def add_parser(sub) -> None:
    s = sub.add_parser("submit", help="score a remedy on a track: run its cells only, write the merged leaderboard")
    s.add_argument(
        "remedy",
        help="a remedy spec: name, verl:<preset>, trl:<mode>, file.py:Class, pkg.module:Class or an entry point",
    )
    s.add_argument("--track", required=True, help="track name (bench/tracks/NAME.yaml) or a track file")
    s.add_argument("--out", help="output directory (default build/submit/<track>/<remedy>)")
    s.add_argument("--committed", help="committed results to compare with (default results/tracks/<track>)")
    s.add_argument("--set", action="append", metavar="remedy_args.NAME=VALUE", help="a remedy parameter override")
    add_workers_arg(s)
    s.add_argument("--allow-results", action="store_true", help="allow --out under results/")
    s.add_argument(
        "--retry-failed",
        action="store_true",
        help="rerun the submitted cells that failed before (after fixing the plug-in) instead of keeping them",
    )
    s.set_defaults(func=_cmd_submit)

    t = sub.add_parser("track", help="standard cell sets remedies are scored on (bench/tracks/)")
    tsub = t.add_subparsers(dest="track_command", required=True)
    r = tsub.add_parser("run", help="run the track's committed remedies (resumable) and write its manifest")
    r.add_argument("track", help="track name or file")
    r.add_argument(
        "--out",
        help="results directory (default build/tracks/<track>; --out results/tracks/<track> "
        "updates the committed results that submit compares with)",
    )
    add_workers_arg(r)
    r.set_defaults(func=_cmd_track_run)
    ls = tsub.add_parser("list", help="the tracks and their cell counts")
    ls.set_defaults(func=_cmd_track_list)
