"""benchmarks/memory_plan.py: the 8B shape's exact parameter count and its per-GPU bytes."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
memory_plan = pytest.importorskip("memory_plan")


def test_eight_billion_shape_per_gpu_bytes():
    config = memory_plan.preset_config(memory_plan.PRESET_8B)
    d, v, layers, ff, q, kv = 4096, 131072, 32, 21504, 32 * 128, 8 * 128
    per_layer = q * d + 2 * kv * d + d * q + 2 * ff * d + q + 2 * d + ff  # matrices, s_qk, two alphas, s_uv
    expected = 2 * v * d + v + layers * per_layer  # embeddings, output layer, s_z
    gib = memory_plan.GIB
    for second_moment, values_per_weight in (("element", 4), ("row", 3)):
        result = memory_plan.plan(config, gpus=8, second_moment=second_moment, gpu_bytes=80 * gib, block_size=8192)
        assert result["parameters"] == expected == 8_054_276_096
        rows = {what: size for what, _, size in result["rows"]}
        persistent = rows["persistent, sharded"]
        # every dim 0 divides by 8: no padding; the row moment is one value per row (negligible here)
        assert persistent == pytest.approx(expected * values_per_weight * 4 / 8, rel=2e-3)
    assert rows["transient: bfloat16 weight casts saved for backward (no activation checkpointing)"] == 2 * (
        expected - v * d - v - layers * (q + 2 * d + ff)
    )
