"""The small defects a newcomer met submitting a remedy, one test each, each failing before its fix:
did-you-mean for a mistyped remedy, a FILE.py without :Class naming its classes, sub-command errors naming the
choices, `track list` and `submit` telling a track with committed results from one without, a refused grid run
leaving no .lock, the submission's regenerate command being runnable, a plug-in whose step raises stopping before
any cell, and the README's plug-in example (RemedyBatch fields, keep=) staying true to the code."""

import re
import shlex
import shutil
from pathlib import Path

import pytest
import torch
from plugin_text import readme_plugin

from timbench.cli import main
from timbench.remedies import ENTRY_POINT_GROUP, RemedyBatch, resolve

REPO = Path(__file__).resolve().parents[1]

TWO_CLASSES = """
from timbench.remedies import Remedy, finish

class Alpha(Remedy):
    name = "alpha"
    def __call__(self, batch):
        return finish(batch)

class Beta(Remedy):
    name = "beta"
    def __call__(self, batch):
        return finish(batch)
"""

RAISES = """
from timbench.remedies import Remedy

class Boom(Remedy):
    name = "boom"
    def __call__(self, batch):
        raise RuntimeError("boom at step 0")
"""


@pytest.fixture
def repo(monkeypatch):
    """The CLI as the README runs it: from the repository root (tracks are bench/tracks/NAME.yaml)."""
    monkeypatch.chdir(REPO)
    return REPO


def _one_error_line(err: str, command: str) -> str:
    lines = [x for x in err.splitlines() if x.strip()]
    assert lines and lines[-1].startswith(f"timbench {command}: error: "), err
    assert "Traceback" not in err, err
    return lines[-1]


def test_a_mistyped_remedy_names_the_closest(repo, tmp_path, capsys):
    with pytest.raises(ValueError, match=r"unknown remedy 'tis_tokn'; did you mean tis_token\b") as e:
        resolve("tis_tokn")
    # the entry-point group by its name, not the f-string placeholder printed literally
    assert "{ENTRY_POINT_GROUP}" not in str(e.value) and f"group {ENTRY_POINT_GROUP}," in str(e.value)
    with pytest.raises(ValueError, match=r"unknown trl remedy 'trl:sequence_mas'; did you mean trl:sequence_mask\? "):
        resolve("trl:sequence_mas")
    # the README's submit with a typo: one line, before any preflight (no replay, no directory)
    out = tmp_path / "s"
    assert main(["submit", "trl:sequence_mas", "--track", "mini", "--out", str(out)]) == 2
    line = _one_error_line(capsys.readouterr().err, "submit")
    assert "did you mean trl:sequence_mask?" in line and not out.exists()


def test_a_plugin_file_without_its_class_lists_the_classes(tmp_path):
    f = tmp_path / "two.py"
    f.write_text(TWO_CLASSES)
    with pytest.raises(
        ValueError,
        match=re.escape(
            f"remedy '{f}': a file plug-in is named FILE.py:CLASS; remedies defined there: {f}:Alpha, {f}:Beta"
        ),
    ):
        resolve(str(f))


@pytest.mark.parametrize(
    "argv, choices", [(["remedies"], "{list}"), (["track"], "{run,list}"), (["gate"], "{run,faults,matrix,check}")]
)
def test_a_missing_subcommand_names_the_choices(argv, choices, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2
    assert f"the following arguments are required: {choices}" in err, err
    assert "_command" not in err, err  # argparse's internal dest (remedies_command), never shown


def test_an_invalid_subcommand_names_the_choices(capsys):
    with pytest.raises(SystemExit):
        main(["remedies", "show", "tis_token"])
    err = capsys.readouterr().err
    assert "argument {list}: invalid choice: 'show' (choose from list)" in err.replace("'list'", "list"), err
    assert "_command" not in err, err


def test_track_list_says_which_tracks_have_committed_results(repo, capsys):
    assert main(["track", "list"]) == 0
    lines = {ln.split()[0]: ln for ln in capsys.readouterr().out.splitlines()}
    assert not (REPO / "results/tracks/standard/track.json").exists()  # what the line below is about
    assert (
        "no committed results yet (make them: timbench track run standard --out results/tracks/standard)"
        in lines["standard"]
    )
    assert "committed:" not in lines["standard"]
    assert "committed: none, tis_token" in lines["mini"]


def test_submit_claims_committed_results_only_where_there_are_some(repo, tmp_path, capsys):
    # standard lists tis_token among its remedies but has no committed directory: that is what is said
    assert main(["submit", "tis_token", "--track", "standard", "--out", str(tmp_path / "a")]) == 2
    line = _one_error_line(capsys.readouterr().err, "submit")
    assert "already has committed results" not in line
    assert "no committed results for track standard at results/tracks/standard" in line
    assert main(["submit", "tis_token", "--track", "mini", "--out", str(tmp_path / "b")]) == 2
    line = _one_error_line(capsys.readouterr().err, "submit")
    assert "remedy 'tis_token' already has committed results on track mini (results/tracks/mini)" in line


def test_a_refused_grid_run_leaves_no_lock(repo, tmp_path, capsys):
    out = tmp_path / "other"
    out.mkdir()
    shutil.copy(REPO / "results/tracks/mini/cells.json", out / "cells.json")  # another grid's directory
    assert main(["grid", "run", "bench/grids/quick.yaml", "--out", str(out)]) == 2
    assert "was written by a different grid" in _one_error_line(capsys.readouterr().err, "grid")
    assert sorted(p.name for p in out.iterdir()) == ["cells.json"]  # no .lock left behind, nothing else written


def test_the_regenerate_command_is_the_spec_the_user_ran(repo, tmp_path):
    from timbench.submit.run import regenerate_command
    from timbench.submit.track import load_track

    plug = tmp_path / "my dir" / "mask_remedy.py"
    cmd = regenerate_command(f"{plug}:MaskRemedy", load_track("mini"), tmp_path / "out", {"bound": 0.5, "mode": "a b"})
    # FILE.py:CLASS (a name@hash label is no spec any command accepts), the track's name, every remedy_arg
    assert shlex.split(cmd) == [
        "timbench",
        "submit",
        f"{plug}:MaskRemedy",
        "--track",
        "mini",
        "--out",
        str(tmp_path / "out"),
        "--set",
        "remedy_args.bound=0.5",
        "--set",
        'remedy_args.mode="a b"',
    ]
    track_file = tmp_path / "mytrack.yaml"
    shutil.copy(REPO / "bench/tracks/mini.yaml", track_file)
    # a track given as a file is named by that file
    assert f"--track {track_file} " in regenerate_command("tis_seq", load_track(str(track_file)), tmp_path, {})


def test_a_plugin_that_raises_stops_in_the_preflight_before_any_cell(repo, tmp_path, capsys, monkeypatch):
    import timbench.runners.driver as driver

    def no_cells(*a, **k):
        raise AssertionError("a cell was run although the preflight saw the remedy's step raise")

    monkeypatch.setattr(driver, "run_cells", no_cells)
    plug = tmp_path / "boom.py"
    plug.write_text(RAISES)
    out = tmp_path / "s"
    assert main(["submit", f"{plug}:Boom", "--track", "mini", "--out", str(out)]) == 2
    line = _one_error_line(capsys.readouterr().err, "submit")
    assert line.endswith("raised RuntimeError: boom at step 0; no cell was run"), line
    assert f"remedy {plug}:Boom: one step on the preflight's synthetic batch" in line
    assert not out.exists()


def test_the_readme_masking_plugin_matches_the_code():
    # The documented RemedyBatch fields are its real ones, in its order; finish's keywords are its real ones
    import dataclasses
    import inspect

    from timbench.remedies import finish

    text = " ".join((REPO / "docs" / "guides" / "remedy.md").read_text().split())
    doc = re.search(r"`batch` is a `RemedyBatch`.*?instead of reweighting", text).group(0)
    fields = [f.name for f in dataclasses.fields(RemedyBatch)]
    assert fields == ["old_logprobs", "rollout_logprobs", "advantages", "mask", "group_size"]
    at = [doc.find(f"`{f}`") for f in fields]
    assert -1 not in at and at == sorted(at), doc
    kw = [p for p in inspect.signature(finish).parameters if p != "batch"]
    assert f"`finish(batch, {', '.join(k + '=' for k in kw)})`" in doc, doc
    # ... and its masking example runs as written: keep= drops the tokens past the bound, weights stay 1
    ns = {}
    exec(compile(readme_plugin("mask_remedy.py"), "docs/guides/remedy.md:mask_remedy.py", "exec"), ns)
    remedy = ns["MaskRemedy"](bound=0.5)
    old = torch.zeros(2, 3, dtype=torch.float32)
    rollout = torch.tensor([[0.0, -0.4, -0.9], [0.7, 0.0, 0.0]])
    mask = torch.tensor([[True, True, True], [True, True, False]])
    res = remedy(RemedyBatch(old, rollout, torch.tensor([1.0, -1.0]), mask, group_size=2))
    assert res.mask.tolist() == [[True, True, False], [False, True, False]]
    assert res.weights is None
    assert res.metrics["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(2 / 5)
