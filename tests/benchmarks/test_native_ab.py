"""``benchmarks/native_ab.py``: the native kernel of this tree against a git revision's, both
built into one process under their own op names and timed interleaved."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "native_ab.py"


def _in_git_checkout() -> bool:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True).returncode == 0
    except OSError:
        return False


pytestmark = pytest.mark.skipif(not _in_git_checkout(), reason="needs a git checkout")


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=ROOT, capture_output=True, text=True, timeout=900)


def test_an_unknown_revision_is_refused_naming_it():
    result = run("--against", "no-such-revision-here")
    assert result.returncode != 0
    assert "no-such-revision-here:spherenet/kernels/native/sphere_adam.cpp" in result.stderr


@pytest.mark.slow
def test_both_builds_run_and_each_mode_prints_its_times_and_ratio():
    from spherenet.kernels import native

    ok, why = native.native_status()
    if not ok:
        pytest.skip(f"the native kernel cannot be built here: {why}")
    result = run("--against", "HEAD", "--rounds", "2", "--elements", "8192", "--d", "64")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "float32 elements in rows of 64" in lines[0]
    for mode in ("row v: HEAD", "element v: HEAD"):
        (line,) = [line for line in lines if line.startswith(mode)]
        ratio = float(line.rsplit(" ", 1)[-1])
        assert 0 < ratio < 100
    # HEAD's kernel against itself, both from the same tensors: the values must agree bit for bit
    assert lines[-1] == "the same values, bit for bit, after 4 steps: yes"
