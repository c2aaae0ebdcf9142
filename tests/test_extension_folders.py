"""The extension folders stay usable: every grid, track and gate suite in bench/ loads (and a grid expands to cells)
without running anything, each extension folder's README names tests and docs pages that exist, and the unit
tier's guard holds."""

import re
from pathlib import Path

import pytest

from timbench.gate.suite import load_suite
from timbench.grid.spec import expand, load_grid
from timbench.submit.track import load_track

pytestmark = pytest.mark.unit  # builds no model (make test-unit)

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = [
    "bench",
    "bench/grids",
    "bench/gates",
    "bench/tracks",
    "tasks",
    "runners",
    "timbench/remedies",
    "timbench/gate",
]


@pytest.mark.parametrize("path", sorted(p.name for p in (ROOT / "bench" / "grids").glob("*.yaml")))
def test_every_grid_spec_expands_to_cells(path):
    cells = expand(load_grid(ROOT / "bench" / "grids" / path))
    assert cells and len({c.id for c in cells}) == len(cells)


@pytest.mark.parametrize("path", sorted(p.name for p in (ROOT / "bench" / "tracks").glob("*.yaml")))
def test_every_track_loads(path):
    track = load_track(str(ROOT / "bench" / "tracks" / path))
    assert track.name == Path(path).stem


@pytest.mark.parametrize("path", sorted(p.name for p in (ROOT / "bench" / "gates").glob("*.yaml")))
def test_every_gate_suite_loads(path):
    suite = load_suite(str(ROOT / "bench" / "gates" / path))
    assert suite.name == Path(path).stem and suite.probes


@pytest.mark.parametrize("folder", FOLDERS)
def test_each_extension_folder_has_a_readme_whose_tests_and_links_exist(folder):
    text = (ROOT / folder / "README.md").read_text()
    tests = re.findall(r"`((?:tests|bench)/[\w/]+\.py)`", text)
    missing = [t for t in tests if not (ROOT / t).is_file()]
    assert not missing, f"{folder}/README.md names tests that do not exist: {missing}"
    links = [t.split("#")[0] for t in re.findall(r"\]\(([^)]+)\)", text) if "://" not in t]
    broken = [t for t in links if not (ROOT / folder / t).resolve().exists()]
    assert not broken, f"{folder}/README.md links to missing files: {broken}"
    assert folder == "bench" or any("docs/" in t for t in links), f"{folder}/README.md links no docs page"


def test_a_unit_test_that_builds_a_model_fails():
    """tests/conftest.py's guard keeps the unit tier model-free: this file is marked `unit`, so a model is refused."""
    from timbench.model import PRESETS, Qwen3ForCausalLM

    with pytest.raises(AssertionError, match="a `unit` test built a model"):
        Qwen3ForCausalLM(PRESETS["tiny-dense"], seed=0)
