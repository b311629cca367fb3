"""MkDocs hook: the site's pages link into the repository as the repository's own files do.

The pages under ``docs/`` are written with links that resolve in the repository (a GitHub view,
an editor): ``../BENCHMARKS.md#...``, ``../benchmarks/results/.../multiplier.png``,
``../tests/system/test_faults.py``. This hook makes the same links resolve on the site:

- ``README.md`` (the site's home page), ``CHANGELOG.md``, ``BENCHMARKS.md`` (the lab notebook)
  and everything under ``benchmarks/results/`` (the study tables and plots) join the site, read
  in place, not copied into ``docs/``;
- each relative link of a page is resolved against the page's place in the repository and
  rewritten relative to its place on the site;
- a link to a repository file the site does not publish (a test, a source file) becomes its
  label in code font; a link to a file that does not exist is left as written, so that
  ``mkdocs build --strict`` reports it.
"""

from __future__ import annotations

import logging
import posixpath
import re
from pathlib import Path

from mkdocs.structure.files import File, InclusionLevel

log = logging.getLogger("mkdocs.hooks.repo_files")

#: repository path (a file, or a folder taken whole) -> its path on the site
PUBLISHED = {
    "README.md": "index.md",
    "CHANGELOG.md": "changelog.md",
    "BENCHMARKS.md": "BENCHMARKS.md",
    "benchmarks/results": "benchmarks/results",
}
#: published pages that are in the nav; the study tables are reached by links only
IN_NAV = ("README.md", "CHANGELOG.md", "BENCHMARKS.md")

TARGET = re.compile(r"\]\((?P<target>[^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)


def _root(config) -> Path:
    return Path(config.config_file_path).resolve().parent


def on_files(files, config):
    root = _root(config)
    for entry in PUBLISHED:
        path = root / entry
        for source in sorted([path] if path.is_file() else (p for p in path.rglob("*") if p.is_file())):
            repo = source.relative_to(root).as_posix()
            inclusion = InclusionLevel.UNDEFINED if repo in IN_NAV else InclusionLevel.NOT_IN_NAV
            files.append(File.generated(config, _site_path(repo), abs_src_path=str(source), inclusion=inclusion))
    return files


def _repo_path(page, root: Path) -> str:
    """Where the page's source lives in the repository (``docs/x.md``, ``BENCHMARKS.md``)."""
    return Path(page.file.abs_src_path).resolve().relative_to(root).as_posix()


def _site_path(repo_path: str) -> str | None:
    if repo_path.startswith("docs/"):
        return repo_path[len("docs/") :]
    for entry, site in PUBLISHED.items():
        if repo_path == entry or repo_path.startswith(entry + "/"):
            return site + repo_path[len(entry) :]
    return None


def _label_start(text: str, close: int) -> int | None:
    """The index of the ``[`` that opens the link label closed at ``close`` (brackets nest)."""
    depth = 0
    for i in range(close - 1, max(-1, close - 2000), -1):
        char = text[i]
        if char == "\n" and text[i - 1 : i + 1] == "\n\n":
            return None  # labels do not span paragraphs
        if char == "]":
            depth += 1
        elif char == "[":
            if depth == 0:
                return i
            depth -= 1
    return None


def _rewrite(text: str, page, root: Path) -> str:
    here = _repo_path(page, root)
    site_dir = posixpath.dirname(page.file.src_uri)

    def link(label: str, target: str, image: bool) -> str | None:
        """The link's new markdown, or None to leave it as written."""
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith(("#", "/")):
            return None  # a web address, an anchor of this page, a site-absolute path
        path, _, anchor = target.partition("#")
        repo_target = posixpath.normpath(posixpath.join(posixpath.dirname(here), path))
        if repo_target.startswith("../") or not (root / repo_target).exists():
            return None  # outside the repository or missing: mkdocs reports it
        site = _site_path(repo_target)
        if site is None and image:
            return None  # an image must be published: mkdocs reports it
        if site is None:  # a repository file the site does not publish
            return label if label.startswith("`") else f"`{label}`"
        new = posixpath.relpath(site, site_dir or ".") + (f"#{anchor}" if anchor else "")
        return f"[{label}]({new})"

    def links(prose: str) -> str:
        out, last = [], 0
        for match in TARGET.finditer(prose):
            start = _label_start(prose, match.start())
            if start is None or start < last:
                continue
            image = start > 0 and prose[start - 1] == "!"
            new = link(prose[start + 1 : match.start()], match.group("target"), image)
            if new is None:
                continue
            out.append(prose[last:start])
            out.append(new)
            last = match.end()
        out.append(prose[last:])
        return "".join(out)

    pieces, last = [], 0
    for fence in FENCE.finditer(text):  # links inside code blocks are code, not links
        pieces.append(links(text[last : fence.start()]))
        pieces.append(fence.group(0))
        last = fence.end()
    pieces.append(links(text[last:]))
    return "".join(pieces)


def on_page_markdown(markdown, page, config, files):
    return _rewrite(markdown, page, _root(config))
