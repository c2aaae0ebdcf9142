"""Hostile inputs for plug-ins: a plug-in whose import or __init__ raises is the plug-in's failure, and
a run directory's config.yaml naming a plug-in file runs it only when asked (docs/reliability.md)."""

import pytest
import yaml

from timbench.cli import main
from timbench.model import PRESETS, Qwen3ForCausalLM, save_checkpoint


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    d = tmp_path_factory.mktemp("ckpt")
    save_checkpoint(Qwen3ForCausalLM(PRESETS["tiny-dense"], seed=2), d)
    return d


def _args(ckpt, out, *extra):
    return ["train", "--out", str(out), "--quiet", *extra] + [
        a
        for o in (
            f"model={ckpt}",
            "steps=1",
            "prompts_per_step=4",
            "group_size=4",
            "mini_batches=2",
            "eval_every=1",
            "eval_n=16",
        )
        for a in ("--set", o)
    ]


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


INIT_RAISES = """from timbench.remedies import Remedy

class Oserr(Remedy):
    name = 'oserr'
    doc = 'its __init__ raises an OSError'
    def __init__(self, **kw):
        open('/nonexistent/plugin-data')
    def __call__(self, batch):
        raise AssertionError('not reached')

class Keyerr(Remedy):
    name = 'keyerr'
    doc = 'its __init__ raises a KeyError'
    def __init__(self, **kw):
        {}['missing']
    def __call__(self, batch):
        raise AssertionError('not reached')
"""


@pytest.mark.parametrize("cls,raised", [("Oserr", "FileNotFoundError"), ("Keyerr", "KeyError: 'missing'")])
def test_a_plugins_init_raising_is_the_plugins_failure(ckpt, tmp_path, capsys, cls, raised):
    (tmp_path / "p.py").write_text(INIT_RAISES)
    out = tmp_path / "run"
    assert main(_args(ckpt, out, "--remedy", f"{tmp_path / 'p.py'}:{cls}")) == 1
    line = _one_line(capsys)
    assert f"remedy {tmp_path / 'p.py'}:{cls}: __init__ raised {raised}" in line
    assert "the plug-in's error, not the command's" in line and "run failed" in line
    assert "Traceback" in (out / "error.txt").read_text()


@pytest.mark.parametrize(
    "body,raised", [("open('/nonexistent/plugin-data')", "FileNotFoundError"), ("{}['missing']", "KeyError: 'missing'")]
)
def test_a_plugin_module_raising_on_import_is_the_plugins_failure(ckpt, tmp_path, capsys, body, raised):
    (tmp_path / "p.py").write_text(body + "\n")
    out = tmp_path / "run"
    assert main(_args(ckpt, out, "--remedy", f"{tmp_path / 'p.py'}:X")) == 1
    line = _one_line(capsys)
    assert f"p.py: importing it raised {raised}" in line and "the plug-in's error" in line
    assert (out / "error.txt").is_file()


def test_a_plugin_missing_a_dependency_is_still_bad_input(ckpt, tmp_path, capsys):
    (tmp_path / "p.py").write_text("import no_such_module_here\n")
    assert main(_args(ckpt, tmp_path / "run", "--remedy", f"{tmp_path / 'p.py'}:X")) == 2
    assert "failed to import: ModuleNotFoundError" in _one_line(capsys)


def test_a_run_dirs_config_naming_a_plugin_file_needs_allow_plugins(ckpt, tmp_path, capsys):
    marker = tmp_path / "pwned"
    (tmp_path / "evil.py").write_text(
        f"import pathlib\npathlib.Path({str(marker)!r}).touch()\nraise SystemExit('imported')\n"
    )
    run = tmp_path / "results" / "runs" / "c1"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(yaml.safe_dump({"remedy": f"{tmp_path / 'evil.py'}:E"}))
    (run / "status.json").write_text('{"status": "finished", "error": null}')  # a run wrote this dir
    assert main(["train", str(run / "config.yaml")] + _args(ckpt, tmp_path / "new")[1:]) == 2
    line = _one_line(capsys)
    assert not marker.exists()
    assert "evil.py:E" in line and "code run with your rights" in line and "--allow-plugins" in line
    # with the flag it is imported (and fails as the plug-in's own error, having run)
    assert main(["train", str(run / "config.yaml"), "--allow-plugins"] + _args(ckpt, tmp_path / "new")[1:]) == 1
    assert marker.exists()
