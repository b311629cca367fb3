"""The benchmark scripts, loaded as modules for their tests: each test module gets its own copy
(its own module name), with ``benchmarks/`` on ``sys.path`` for the scripts' sibling imports."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _script(request: pytest.FixtureRequest, script: str):
    name = f"{Path(script).stem}__{request.module.__name__.rsplit('.', 1)[-1]}"
    sys.path.insert(0, str(BENCHMARKS))
    try:
        spec = importlib.util.spec_from_file_location(name, BENCHMARKS / script)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # a dataclass of the script looks its module up there
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(name, None)
        sys.path.remove(str(BENCHMARKS))


@pytest.fixture(scope="module")
def budget(request):
    """benchmarks/budget.py"""
    yield from _script(request, "budget.py")


@pytest.fixture(scope="module")
def scaling(request):
    """benchmarks/scaling.py"""
    yield from _script(request, "scaling.py")


@pytest.fixture(scope="module")
def convergence(request):
    """benchmarks/convergence.py"""
    yield from _script(request, "convergence.py")


@pytest.fixture(scope="module")
def budget_pairs(request):
    """benchmarks/budget_pairs.py"""
    yield from _script(request, "budget_pairs.py")


@pytest.fixture(scope="module")
def forward_path(request):
    """benchmarks/forward_path.py"""
    yield from _script(request, "forward_path.py")
