"""The documentation site (mkdocs.yml) builds strictly, its API reference lists every public
name, and its link hook maps the repository's links onto the site. Needs the docs extra
(``pip install -e ".[docs]"``); skipped without it."""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ["manifolds", "layers", "models", "io", "optim", "kernels", "data", "checkpoint", "train", "hf", "analysis"]


def _hook():
    pytest.importorskip("mkdocs")
    sys.path.insert(0, str(ROOT / "docs" / "hooks"))
    try:
        return importlib.import_module("repo_files")
    finally:
        sys.path.pop(0)


def _page(src_uri: str, abs_src_path: Path):
    return SimpleNamespace(file=SimpleNamespace(src_uri=src_uri, abs_src_path=str(abs_src_path)))


def test_the_hook_maps_repository_links_onto_the_site():
    hook = _hook()
    guide = _page("guides/training.md", ROOT / "docs" / "guides" / "training.md")
    text = (
        "[notebook](../../BENCHMARKS.md#the-gpu-plan) [plot](../../benchmarks/results/convergence.png) "
        "[`test_two_agents`](../../tests/system/test_two_nodes.py) [paper](../paper.md) "
        "[missing](../../nothing.md) [web](https://example.org/a.md) [here](#configs)\n"
        "```\n[in code](../../README.md)\n```\n"
    )
    out = hook._rewrite(text, guide, ROOT)
    assert "[notebook](../BENCHMARKS.md#the-gpu-plan)" in out
    assert "[plot](../benchmarks/results/convergence.png)" in out
    assert "`test_two_agents`" in out and "tests/system" not in out  # not published: code font, no link
    assert "[paper](../paper.md)" in out
    assert "[missing](../../nothing.md)" in out  # left for mkdocs to report
    assert "[web](https://example.org/a.md)" in out and "[here](#configs)" in out
    assert "[in code](../../README.md)" in out  # code blocks are not rewritten
    readme = _page("index.md", ROOT / "README.md")
    out = hook._rewrite(
        "[a](docs/guides/training.md#configs) [b](BENCHMARKS.md) [c](examples/own_model.py)", readme, ROOT
    )
    assert out == "[a](guides/training.md#configs) [b](BENCHMARKS.md) `c`"


def test_a_label_with_brackets_is_one_link():
    hook = _hook()
    page = _page("reliability.md", ROOT / "docs" / "reliability.md")
    text = "x `[0, 256)` | [`test_a[rank0]`, `[rank1]`](../tests/system/test_faults.py) |"
    assert hook._rewrite(text, page, ROOT) == "x `[0, 256)` | `test_a[rank0]`, `[rank1]` |"


@pytest.mark.slow  # a full build: 20-80 s
def test_the_site_builds_strictly_and_the_api_pages_list_every_public_name(tmp_path):
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocstrings_handlers.python")
    site = tmp_path / "site"
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    missing = []
    for package in PACKAGES:
        module = importlib.import_module(f"spherenet.{package}")
        html = (site / "api" / package / "index.html").read_text()
        anchors = set(re.findall(r'id="(spherenet\.[\w.]+)"', html))
        missing += [
            f"spherenet.{package}.{name}"
            for name in module.__all__
            if f"spherenet.{package}.{name}" not in anchors
            and not any(a.startswith(f"spherenet.{package}.{name}.") for a in anchors)
        ]
    assert not missing, f"public names without an entry in the API reference: {missing}"
    for name in ("RiemannianAdam", "SphereLinear", "NGPT", "SphereCallback"):
        assert any(f'id="spherenet.{p}.{name}"' in (site / "api" / p / "index.html").read_text() for p in PACKAGES)
    home = (site / "index.html").read_text()
    assert "The first two commands" in home and "from_preset" in home  # the README is the home page
