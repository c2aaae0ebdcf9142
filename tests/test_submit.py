"""`timbench submit` on a tiny track fixture (1 step, 2 seeds): only the new remedy's cells run, the merged
leaderboard ranks it with an interval and paired comparisons, bad remedies become failed cells, committed
results are never touched, and results made by another config or code are refused in one line."""

import hashlib
import io
import json
from pathlib import Path

import pytest
import yaml
from plugin_text import HALVE, HEADER

from timbench.cli import main
from timbench.runners.driver import run_cells
from timbench.submit.run import MASKED_ALL
from timbench.submit.run import submit as _submit
from timbench.submit.track import check_committed, load_track


def submit(*args, **kw):
    """The library's submit with the runner the CLI passes it."""
    return _submit(*args, run_cells=run_cells, **kw)


TRACK = {
    "track": "tiny",
    "version": 1,
    "remedies": ["none", "tis_token"],
    "grid": {
        "name": "track-tiny-v1",
        "base": {
            "steps": 1,
            "prompts_per_step": 2,
            "group_size": 2,
            "mini_batches": 1,
            "eval_every": 1,
            "eval_n": 2,
            "checkpoint_every": 1,
        },
        "axes": {"condition": ["baseline", "noise-g2"], "seed": [0, 1]},
        "reference": "baseline",
    },
}

PLUGINS = (
    HEADER
    + HALVE
    + """
class NaNWeights(Remedy):
    name = "nan_weights"
    doc = "returns NaN weights"
    def __call__(self, batch):
        return finish(batch, weights=torch.full_like(log_rho(batch), float("nan")))

class MaskAll(Remedy):
    name = "mask_all"
    doc = "masks every token"
    def __call__(self, batch):
        return finish(batch, keep=torch.zeros_like(batch.mask))
"""
)


def _digest(d: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(d.rglob("*")):
        if p.is_file():
            h.update(str(p.relative_to(d)).encode() + p.read_bytes())
    return h.hexdigest()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("track")
    (root / "tiny.yaml").write_text(yaml.safe_dump(TRACK))
    (root / "plugins.py").write_text(PLUGINS)
    committed = root / "committed"
    assert main(["track", "run", str(root / "tiny.yaml"), "--out", str(committed), "--workers", "2"]) == 0
    return root, committed


def test_track_run_writes_results_and_manifest(tiny):
    root, committed = tiny
    m = json.loads((committed / "track.json").read_text())
    assert m["track"] == "tiny" and m["fingerprint"]["config"]["steps"] == 1 and m["tasks"] == {"add-4d-v1": 1}
    assert m["replay_cell"] == "add-4d-v1.tiny-dense.noise-g2.none.recompute.grpo.s0"
    assert len(json.loads((committed / "cells.json").read_text())["cells"]) == 6  # 2 ref + 2x2 mismatched
    assert check_committed(load_track(str(root / "tiny.yaml")), committed) == []


def test_track_run_writes_under_build_unless_told_results(tmp_path, monkeypatch):
    """A regeneration writes under build/ by default (never over a committed result); the committed results only with
    --out results/..."""
    import timbench.runners.driver as driver

    ran = []
    monkeypatch.setattr(driver, "run_cells", lambda cells, out, *a, **k: ran.append(Path(out)))  # no training here
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(TRACK))
    monkeypatch.chdir(tmp_path)
    assert main(["track", "run", "tiny.yaml"]) == 1  # nothing ran, so its cells are not done
    assert set(ran) == {Path("build/tracks/tiny")} and (tmp_path / "build/tracks/tiny/track.json").is_file()
    assert not (tmp_path / "results").exists()


@pytest.mark.slow  # 30-90 s: CI runs it in the `slow` stage (make test-slow)
def test_submit_runs_only_the_new_cells_and_ranks_them(tiny, tmp_path, capsys):
    root, committed = tiny
    before = _digest(committed)
    out = tmp_path / "sub"
    assert (
        main(
            [
                "submit",
                f"{root / 'plugins.py'}:Halve",
                "--track",
                str(root / "tiny.yaml"),
                "--committed",
                str(committed),
                "--out",
                str(out),
                "--workers",
                "2",
            ]
        )
        == 0
    )
    captured = capsys.readouterr()
    text = captured.out
    assert "rank " in text and "vs none: paired difference" in text and "vs tis_token:" in text
    # the preflight's reproducibility probes report progress on stderr, one line per probe (a silent preflight looked
    # hung)
    probes = [line for line in captured.err.splitlines() if line.startswith("preflight: probes ")]
    assert [line[len("preflight: probes ") :].split(",")[0] for line in probes] == ["0/3", "1/3", "2/3", "3/3"]
    assert all("ETA " in line for line in probes[:3]) and "took " in probes[3]
    rec = json.loads((out / "submission.json").read_text())
    assert rec["of"] == 3 and [c["vs"] for c in rec["comparisons"]] == ["none", "tis_token"]
    assert all(len(c["seeds"]) == 2 and c["lo"] is not None for c in rec["comparisons"])
    # per condition too, so a loss under one condition is not hidden by an overall tie
    for c in rec["comparisons"]:
        assert [p["setting"] for p in c["by_setting"]] == ["noise-g2/recompute"]
        assert c["by_setting"][0]["remedy"]["mean"] is not None and c["by_setting"][0]["other"]["lo"] is not None
    assert "  - noise-g2/recompute: " in text and "paired difference" in text.split("noise-g2/recompute: ")[1]
    assert (out / "figures" / "remedy_scores.png").is_file()  # the forest plot, the submission highlighted
    # known by name@content hash, never by its path (an edited file at the same path is another remedy): ids, run dirs,
    # leaderboard, submission
    ident = f"halve@{hashlib.sha256((root / 'plugins.py').read_bytes()).hexdigest()[:8]}"
    new = [d.name for d in (out / "runs").iterdir() if "halve" in d.name]
    assert len(new) == 2  # noise-g2 x 2 seeds; the reference cells come from the committed results
    assert all(ident.replace("@", "-") in n for n in new)
    board = (out / "leaderboard.md").read_text()
    assert ident in board and "tis_token" in board and "none" in board
    assert rec["remedy"] == ident and f"# Submission: {ident} on track tiny" in text
    # ... except in the one command that regenerates it: a name@hash label is no spec any command accepts
    for f in ("leaderboard.md", "submission.md", "submission.json", "summary.csv"):
        body = (out / f).read_text()
        cmds = [ln for ln in body.splitlines() if "timbench submit " in ln]
        rest = "\n".join(ln for ln in body.splitlines() if "timbench submit " not in ln)
        assert "plugins.py" not in rest and "plugins-py" not in rest, f
        assert all(f"{root / 'plugins.py'}:Halve" in ln for ln in cmds), (f, cmds)
    # a plug-in's own `extra` metrics reach summary.csv and the submission
    header = (out / "summary.csv").read_text().splitlines()[0].split(",")
    assert header[-1] == "remedy_extra/halve/scale"
    assert rec["extra_metrics"] == {"halve/scale": {"mean": 0.5, "cells": 2, "by_setting": {"noise-g2/recompute": 0.5}}}
    assert "`halve/scale`: 0.5 over 2 cells (noise-g2/recompute 0.5)" in text
    assert _digest(committed) == before  # committed results untouched
    # a rerun with the same file moved elsewhere resumes: the same cells, nothing left to run, same verdict
    moved = tmp_path / "elsewhere" / "plugins.py"
    moved.parent.mkdir()
    moved.write_bytes((root / "plugins.py").read_bytes())
    stream = io.StringIO()
    rec2 = submit(f"{moved}:Halve", str(root / "tiny.yaml"), out, committed, stream=stream)
    assert "0 of 2 cells to run" in stream.getvalue()
    assert rec2["score"] == rec["score"] and rec2["remedy"] == ident


@pytest.mark.parametrize("cls, error", [("NaNWeights", "weights are NaN or infinite"), ("MaskAll", MASKED_ALL)])
def test_bad_submissions_become_failed_cells(tiny, tmp_path, cls, error):
    root, committed = tiny
    rec = submit(f"{root / 'plugins.py'}:{cls}", str(root / "tiny.yaml"), tmp_path / "sub", committed, workers=2)
    assert len(rec["failed"]) == 2 and all(error in e and "\n" not in e for e in rec["failed"].values())
    assert (tmp_path / "sub" / "leaderboard.md").is_file() and "FAILED" in rec["text"]
    if cls == "MaskAll":  # trained on nothing: an outcome, scored like a collapse (capped), not dropped
        assert rec["score"] is not None and rec["score"] <= 0.5
    else:  # a broken remedy has no score
        assert rec["score"] is None


@pytest.mark.slow  # 30-90 s: CI runs it in the `slow` stage (make test-slow)
def test_a_failed_submission_exits_1_and_retry_failed_reruns_it_after_the_fix(tiny, tmp_path, capsys):
    root, committed = tiny
    plugin = tmp_path / "mine.py"
    plugin.write_text(
        PLUGINS.replace("class Halve(Remedy):", "class Broken(Remedy):").replace(
            "torch.full_like(log_rho(batch), 0.5)", "torch.full_like(log_rho(batch), -1.0)"
        )
    )
    args = [
        "submit",
        f"{plugin}:Broken",
        "--track",
        str(root / "tiny.yaml"),
        "--committed",
        str(committed),
        "--out",
        str(tmp_path / "sub"),
        "--workers",
        "2",
    ]
    assert main(args) == 1  # every submitted cell failed (negative weights): not a success
    err = capsys.readouterr().err
    assert "2 of the submitted cells failed" in err and "--retry-failed" in err
    assert main(args) == 1  # without --retry-failed the stale failures stand
    assert "0 of 2 cells to run" in capsys.readouterr().err
    assert main(args + ["--retry-failed"]) == 1  # rerun, and the same file fails the same way
    assert "2 of 2 cells to run" in capsys.readouterr().err
    # the fixed file is another remedy (name@hash): not mixed into the broken version's board
    plugin.write_text(plugin.read_text().replace("-1.0)", "0.5)"))
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "holds halve@" in err and "another version of the plug-in file" in err
    assert main(args[:-4] + ["--out", str(tmp_path / "fixed"), "--workers", "2"]) == 0
    assert "2 of 2 cells to run" in capsys.readouterr().err


def test_bypass_presets_are_refused_on_a_recompute_track(tiny, tmp_path):
    root, committed = tiny
    with pytest.raises(ValueError, match="implies mode=bypass"):
        submit("verl:bypass_ppo_clip", str(root / "tiny.yaml"), tmp_path / "b", committed)
    assert not (tmp_path / "b").exists()


@pytest.mark.parametrize(
    "edit, message",
    [
        (
            lambda m: m["fingerprint"]["config"].update(steps=3),
            r"different track config: config key 'steps' \(3 vs 1\)",
        ),
        (lambda m: m.update(version=0), "track tiny version 0, the track file is version 1"),
        (lambda m: m["tasks"].update({"add-4d-v1": 0}), "task add-4d-v1 version 0, now version 1"),
        (lambda m: m.update(timbench_version="0.0.1"), "by timbench 0.0.1"),
    ],
)
def test_results_of_another_config_are_refused_naming_what_differs(tiny, tmp_path, edit, message):
    root, committed = tiny
    import shutil

    other = tmp_path / "other"
    shutil.copytree(committed, other)
    m = json.loads((other / "track.json").read_text())
    edit(m)
    (other / "track.json").write_text(json.dumps(m))
    with pytest.raises(ValueError, match=message) as e:
        submit(f"{root / 'plugins.py'}:Halve", str(root / "tiny.yaml"), tmp_path / "sub", other)
    assert "\n" not in str(e.value) and not (tmp_path / "sub").exists()


def test_other_code_is_refused_only_when_it_changes_results(tiny, tmp_path):
    root, committed = tiny
    import shutil

    other = tmp_path / "other"
    shutil.copytree(committed, other)
    m = json.loads((other / "track.json").read_text())
    m["code"] = "0123456789abcdef"
    (other / "track.json").write_text(json.dumps(m))
    track = load_track(str(root / "tiny.yaml"))
    said = []
    notes = check_committed(track, other, say=said.append)  # same results: the replayed step matches
    assert len(notes) == 1 and "logged every committed value unchanged" in notes[0]
    # the preflight says what it does while it runs, with counts
    assert len(said) == 2 and "step 0/1" in said[0] and said[1].startswith("preflight: step 1/1, took ")
    metrics = other / "runs" / m["replay_cell"] / "metrics.jsonl"
    lines = metrics.read_text().splitlines(keepends=True)
    first = json.loads(lines[0])
    # committed results made before a metric existed: a key logged only now is not a change
    newer = sorted(first)[-1]
    older = {k: v for k, v in first.items() if k != newer}
    metrics.write_text(json.dumps(older) + "\n" + "".join(lines[1:]))
    assert "unchanged" in check_committed(track, other)[0]
    # a committed value the code no longer reproduces is a change, named by key with both values
    key = next(k for k, v in sorted(first.items()) if isinstance(v, float) and v != 0.0)
    metrics.write_text(json.dumps(dict(first, **{key: first[key] * 2})) + "\n" + "".join(lines[1:]))
    with pytest.raises(
        ValueError,
        match=f"by other code .* changes results: a replay of cell .* differs from its "
        f"committed metrics.jsonl: step 0 {key}: ",
    ):
        check_committed(track, other)


def test_submit_guards(tiny, tmp_path, capsys):
    root, committed = tiny
    with pytest.raises(ValueError, match="already has committed results"):
        submit("tis_token", str(root / "tiny.yaml"), tmp_path / "s", committed)
    with pytest.raises(ValueError, match="is under results/"):
        submit("icepop", str(root / "tiny.yaml"), Path("results/tracks/x"), committed)
    with pytest.raises(FileNotFoundError, match="no committed results for track tiny"):
        submit("icepop", str(root / "tiny.yaml"), tmp_path / "s", tmp_path / "none")
    assert main(["submit", "icepop", "--track", "nope", "--out", str(tmp_path / "s")]) == 2
    assert "track 'nope' not found" in capsys.readouterr().err
    assert (
        main(
            [
                "submit",
                "icepop",
                "--track",
                str(root / "tiny.yaml"),
                "--committed",
                str(committed),
                "--out",
                str(tmp_path / "s"),
                "--set",
                "steps=3",
            ]
        )
        == 2
    )
    assert "submit takes only remedy_args" in capsys.readouterr().err


def test_submit_warns_when_a_plugin_step_depends_on_the_thread_count(tmp_path):
    from timbench.submit.repro import SETTINGS, is_plugin, reproducibility_warning

    (tmp_path / "plug.py").write_text(
        "import torch\nfrom timbench.remedies import Remedy, fexp, finish, fsum, log_rho\n"
        "class Threads(Remedy):  # its metric depends on the thread count, as a racy reduction's bits would\n"
        "    name = 'threads'\n"
        "    def __call__(self, batch):\n"
        "        return finish(batch, extra={'x': float(torch.get_num_threads())})\n"
        "class Fixed(Remedy):\n"
        "    name = 'fixed'\n"
        "    def __call__(self, batch):\n"
        "        w = fexp(log_rho(batch))\n"
        "        return finish(batch, weights=w, extra={'x': float(fsum(w * batch.mask))})\n"
    )
    two = SETTINGS[:2]  # 1 vs 2 threads: enough to tell them apart, at 2 processes each
    lines = []
    warning = reproducibility_warning(f"{tmp_path / 'plug.py'}:Threads", {}, settings=two, say=lines.append)
    assert warning and "2 threads" in warning and "fexp" in warning and "\n" not in warning
    # progress while it works: a line before the first probe and one per probe, with counts and an ETA
    assert [line.split(":")[1].strip().split(",")[0] for line in lines] == ["probes 0/2", "probes 1/2", "probes 2/2"]
    assert "ETA ?" in lines[0] and "ETA " in lines[1] and "1 thread done" in lines[1]
    assert "took " in lines[2] and "2 threads done" in lines[2]
    assert reproducibility_warning(f"{tmp_path / 'plug.py'}:Fixed", {}, settings=two) is None
    lines = []  # a probe that does not answer in time skips the check in one line (no traceback)
    assert (
        reproducibility_warning(f"{tmp_path / 'plug.py'}:Fixed", {}, timeout=0.01, settings=two, say=lines.append)
        is None
    )
    assert len(lines) == 2 and lines[1].startswith("preflight: probes 1/2, ")
    assert lines[1].endswith(": 1 thread: no answer in 0.01 s; check skipped")
    assert is_plugin("x.py:C") and is_plugin("pkg.mod:C") and not is_plugin("tis_token")
    assert not is_plugin("verl:decoupled_token_is") and not is_plugin("trl:token_mask")
