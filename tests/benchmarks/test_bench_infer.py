"""benchmarks/bench_infer.py: a smoke run at a tiny shape prints every model's row with its ratio
to Llama, and ``--device cuda`` without CUDA is refused in one line."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "bench_infer.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=REPO, env=env, capture_output=True, text=True)


@pytest.mark.slow
def test_a_smoke_run_prints_every_row_with_its_ratio_to_llama():
    done = _run("--small", "--threads", "1", "--rounds", "1")
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {line.split("|")[2].strip(): line for line in done.stdout.splitlines() if line.startswith("| eager")}
    assert sorted(rows) == sorted(["ngpt", "gpt", "llama", "ngpt-gqa", "ngpt-relu2", "ngpt-unfolded"])
    assert rows["llama"].count("(1.00x)") == 2 and rows["llama"].endswith("| - |")  # no spherenet generate
    for name in ("ngpt", "gpt", "ngpt-gqa", "ngpt-relu2", "ngpt-unfolded"):
        assert len(re.findall(r"\d+\.\d ms|\d+\.\d \(\d+\.\d\dx\)", rows[name])) == 3, rows[name]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without CUDA")
def test_cuda_without_a_gpu_is_refused_in_one_line():
    done = _run("--small", "--device", "cuda", "--dtype", "bf16")
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    assert "--device cuda: no CUDA device" in done.stderr
