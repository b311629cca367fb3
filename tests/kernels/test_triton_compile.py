"""Every Triton kernel compiled for an H100 (sm_90) on this CPU-only machine, with the launch
configurations the library chooses: it must compile (the interpreter runs code the GPU compiler
refuses), keep its values in registers (no spilling), and read and write 16 bytes at a time.
benchmarks/triton_gpu_compile.py does the compiling, in a subprocess without TRITON_INTERPRET."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

pytest.importorskip("triton")

pytestmark = pytest.mark.slow
ROOT = pathlib.Path(__file__).resolve().parents[2]

# SLERP's backward keeps about 20 values per element live; a row of 4096 in one program cannot
# fit the registers without a loop over column chunks, so it spills there (BENCHMARKS.md).
KNOWN_SPILLS = {("_slerp_bwd", 4096)}


def compiled(family: str) -> list[dict]:
    try:
        from triton.backends.nvidia.compiler import get_ptxas

        ptxas = get_ptxas(90).path
    except Exception as error:  # a Triton without its NVIDIA backend
        pytest.skip(f"Triton's NVIDIA backend is unavailable: {error}")
    if not os.path.exists(ptxas):
        pytest.skip(f"Triton ships no ptxas here ({ptxas})")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "triton_gpu_compile.py"), family],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    records = [json.loads(line) for line in out.stdout.splitlines()]
    assert records, out.stderr[-3000:]
    return records


def describe(record: dict) -> str:
    keys = ("kernel", "dtype", "d", "aligned", "row_v", "riemannian", "num_warps", "registers", "spill_bytes")
    return " ".join(f"{k}={record[k]}" for k in keys if k in record)


@pytest.mark.parametrize("family", ["layers", "slerp", "optimizer"])
def test_every_kernel_compiles_for_an_h100_in_registers_with_16_byte_accesses(family):
    records = compiled(family)
    failed = [f"{describe(r)}: {r['error']}" for r in records if not r["ok"]]
    assert not failed, "\n".join(failed)
    spilled = [describe(r) for r in records if r["spill_bytes"] and (r["kernel"], r.get("d")) not in KNOWN_SPILLS]
    assert not spilled, "spills registers:\n" + "\n".join(spilled)
    narrow = [describe(r) for r in records if r.get("aligned", True) and "ld.global.v4.b32" not in r["loads"]]
    assert not narrow, "loads narrower than 16 bytes:\n" + "\n".join(narrow)
    if family == "optimizer":
        # A pointer read from the kernel's table has no known alignment: without ALIGNED the
        # compiler emits one-element loads (why the launcher checks alignment and says so).
        unaligned = [r for r in records if not r["aligned"]]
        assert unaligned
        assert all(not any(".v" in load for load in r["loads"]) for r in unaligned), [describe(r) for r in unaligned]
