"""benchmarks/kv_cache.py reads the bytes of the caches the model fills: at a tiny shape, the
meta count and the real check agree with the cache's size (2 x layers x kv heads x context x
head_dim x bytes), and grouping divides it by n_heads / n_kv_heads."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_kv_cache_bytes_of_a_tiny_shape():
    shape = ["--d-model", "32", "--layers", "3", "--heads", "4", "--kv-heads", "1", "--head-dim", "6"]
    args = [*shape, "--d-mlp", "48", "--vocab", "16", "--context", "40", "--real-context", "8", "--dtype", "fp32"]
    cmd = [sys.executable, str(REPO / "benchmarks" / "kv_cache.py"), *args]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    gqa, mha = 2 * 3 * 1 * 40 * 6 * 4, 2 * 3 * 4 * 40 * 6 * 4
    rows = [line for line in done.stdout.splitlines() if line.startswith(("| GQA", "| MHA"))]
    assert f"({gqa:,} B)" in rows[0] and rows[0].count(f"({gqa:,} B)") == 2  # meta and real
    assert f"({mha:,} B)" in rows[1] and rows[1].count(f"({mha:,} B)") == 2
    assert "2 x (1, 1, 40, 6)" in rows[0] and "MHA / GQA: 4.00x" in done.stdout
