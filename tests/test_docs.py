"""The README and the docs site stay whole: every page in the nav, the generated reference fresh, every link resolving.

The full check is `mkdocs build --strict` (CI stage "docs", `make docs`); these tests cover what can drift without
mkdocs installed, in the default suite, in seconds.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)


class _Loader(yaml.SafeLoader):
    """mkdocs.yml holds `!!python/...` tags (the toc slugify function); the nav needs none of them."""


_Loader.add_multi_constructor("tag:yaml.org,2002:python/", lambda loader, suffix, node: None)


def _nav_pages(nav) -> list[str]:
    out = []
    for item in nav:
        value = next(iter(item.values())) if isinstance(item, dict) else item
        out += _nav_pages(value) if isinstance(value, list) else [value]
    return out


def _gen_reference():
    spec = importlib.util.spec_from_file_location("gen_reference", DOCS / "gen_reference.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _links(path: Path) -> list[str]:
    """Relative link targets of a markdown file, outside fenced code, without their #fragment."""
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    return [
        t.split("#")[0]
        for t in LINK.findall(text)
        if "://" not in t and not t.startswith(("#", "/", "mailto:")) and t.split("#")[0]
    ]


def test_every_docs_page_is_in_the_nav_and_every_nav_entry_exists():
    config = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=_Loader)
    nav = _nav_pages(config["nav"])
    pages = sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md"))
    assert sorted(set(nav)) == sorted(nav), "a page is twice in the nav"
    assert sorted(nav) == pages, (
        f"not in the nav: {sorted(set(pages) - set(nav))}; in the nav but missing: {sorted(set(nav) - set(pages))}"
    )
    assert config["strict"] is True
    assert all(
        config["validation"][k] == "warn"
        for k in ("omitted_files", "absolute_links", "unrecognized_links", "anchors", "not_found")
    )


def test_generated_reference_pages_are_fresh():
    assert _gen_reference().stale(DOCS) == [], "run `make docs-ref` and commit docs/reference/"


def test_stale_reference_page_is_detected(tmp_path):
    """The freshness check can fail: an edited copy of a reference page is reported by name."""
    shutil.copytree(DOCS / "reference", tmp_path / "reference")
    page = tmp_path / "reference" / "spec-keys.md"
    page.write_text(page.read_text() + "\nhand edit\n")
    assert _gen_reference().stale(tmp_path) == ["spec-keys.md"]


def test_gen_reference_check_exit_code():
    r = subprocess.run([sys.executable, str(DOCS / "gen_reference.py"), "--check"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("page", ["README.md"] + sorted(str(p.relative_to(ROOT)) for p in DOCS.rglob("*.md")))
def test_relative_links_resolve(page):
    """Every relative link of the README and of the docs pages names a file in the repository (on disk, as a code
    host shows it; mkdocs checks anchors too)."""
    path = ROOT / page
    missing = [t for t in _links(path) if not (path.parent / t).resolve().exists()]
    assert not missing, f"{page}: links to missing files: {missing}"


def test_readme_is_short_and_its_commands_exist():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    makefile = (ROOT / "Makefile").read_text()
    for target in ("quick", "test", "docs", "paper"):
        assert f"make {target}" in text
        assert re.search(rf"^{target}:", makefile, re.M), f"Makefile has no `{target}` target"
    assert ".venv/bin/timbench" in text and "source .venv/bin/activate" in text


def test_readme_timbench_commands_parse():
    """Each `timbench ...` command the README gives in backticks is accepted by the CLI's parser (not run)."""
    from timbench.cli import build_parser

    commands = re.findall(r"`timbench ([a-z][^`]*)`", (ROOT / "README.md").read_text())
    assert len(commands) >= 3
    parser = build_parser()
    for cmd in commands:
        if cmd.split()[0] == "compare" or len(cmd.split()) == 1:
            continue  # a command's bare name, or quoted as what `make quick` runs (on directories the run makes)
        args = parser.parse_args(cmd.split())
        assert callable(args.func), cmd
