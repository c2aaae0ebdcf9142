"""mkdocs hooks: repository files linked from the docs become part of the site, and stale reference pages fail.

The docs link committed results the way the repository holds them (`../../results/paper/paper.md` from
`docs/findings/paper.md`), so the same link works when the file is read on disk or on a code host. mkdocs only
knows files under `docs/`; without this hook every such link is "not found", which `strict: true` turns into a
failed build. Here every repository file a page links to (and, for a linked markdown page, every file that page
links to in turn) is added to the site under its repository path (`results/paper/paper.md` becomes
`results/paper/paper.html`), and the links are rewritten to it. mkdocs then validates them like any other link: a
link to a file that is not in the repository still fails the strict build.

`on_pre_build` also compares the generated reference pages (docs/gen_reference.py) with a fresh generation and
warns, failing a strict build, when a registry changed without `make docs-ref`.
"""

from __future__ import annotations

import logging
import os
import posixpath
import re
import sys

from mkdocs.structure.files import File, InclusionLevel

log = logging.getLogger("mkdocs.hooks.repo_links")

LINK = re.compile(r"(\]\()([^)\s]+)(\))")
"""A markdown link or image target: `[text](target)` / `![alt](target)`."""
FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)


def _repo(config) -> str:
    return os.path.dirname(os.path.abspath(config["docs_dir"]))


def _split(target: str) -> tuple[str, str]:
    path, _, frag = target.partition("#")
    return path, ("#" + frag if frag else "")


def _is_relative(path: str) -> bool:
    return bool(path) and "://" not in path and not path.startswith(("/", "mailto:"))


def _targets(text: str, page_repo_path: str):
    """Repository-relative paths of the relative link targets in a page (outside fenced code)."""
    for m in LINK.finditer(FENCE.sub("", text)):
        path, _ = _split(m.group(2))
        if _is_relative(path):
            yield posixpath.normpath(posixpath.join(posixpath.dirname(page_repo_path), path))


def _site_path(repo_path: str) -> str:
    """Where a repository file lives in the site: docs/ pages at the root, anything else under its own path."""
    return repo_path[len("docs/") :] if repo_path.startswith("docs/") else repo_path


def on_pre_build(config):
    here = os.path.dirname(os.path.abspath(__file__))
    if here not in sys.path:
        sys.path.insert(0, here)
    import gen_reference  # docs/gen_reference.py: imports timbench, so only when a build runs

    for name in gen_reference.stale(config["docs_dir"]):
        log.warning(f"docs/reference/{name} is stale against the registries: run `make docs-ref` and commit it")


def on_files(files, config):
    repo = _repo(config)
    queue = [("docs/" + f.src_uri, f.abs_src_path) for f in files.documentation_pages()]
    seen = set()
    while queue:
        repo_path, abs_path = queue.pop()
        with open(abs_path, encoding="utf-8") as fh:
            text = fh.read()
        for target in _targets(text, repo_path):
            if target.startswith("docs/") or target.startswith("..") or target in seen:
                continue  # pages of the site validate themselves; '..' leaves the repository: mkdocs warns
            seen.add(target)
            full = os.path.join(repo, target)
            if not os.path.isfile(full):
                continue  # left unresolved: mkdocs reports it as not found
            f = File(
                target, repo, config["site_dir"], config["use_directory_urls"], inclusion=InclusionLevel.NOT_IN_NAV
            )
            files.append(f)
            if target.endswith(".md"):
                queue.append((target, full))
    return files


def on_page_markdown(markdown, page, config, files):
    docs_dir = os.path.abspath(config["docs_dir"])
    inside = os.path.abspath(page.file.abs_src_path).startswith(docs_dir + os.sep)
    repo_path = ("docs/" + page.file.src_uri) if inside else page.file.src_uri
    here = posixpath.dirname(page.file.src_uri)

    def rewrite(m):
        path, frag = _split(m.group(2))
        if not _is_relative(path):
            return m.group(0)
        target = posixpath.normpath(posixpath.join(posixpath.dirname(repo_path), path))
        if target.startswith(".."):
            return m.group(0)
        return m.group(1) + posixpath.relpath(_site_path(target), here or ".") + frag + m.group(3)

    out, last = [], 0  # fenced code is left as it is
    for fm in FENCE.finditer(markdown):
        out.append(LINK.sub(rewrite, markdown[last : fm.start()]))
        out.append(fm.group(0))
        last = fm.end()
    out.append(LINK.sub(rewrite, markdown[last:]))
    return "".join(out)
