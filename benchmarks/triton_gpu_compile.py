"""Compile spherenet's Triton kernels for a GPU on a machine without one, and report what the
compiler and ``ptxas`` say of each: whether it compiles, its registers and spilled bytes, and the
widths of its global loads.

Triton's interpreter (how the tests run the kernels on CPU) executes a kernel's Python body, so it
accepts code that the GPU compiler refuses and says nothing of registers or vector widths. This
script runs Triton's real compiler to PTX for an H100 (sm_90) and the ``ptxas`` that Triton ships
and uses for that GPU to machine code, with the launch configurations the library's launchers choose
(``spherenet.kernels.triton_helpers.blocks`` and ``warps``). It must run without ``TRITON_INTERPRET`` (the interpreter replaces ``@triton.jit``
functions), so the tests start it as a subprocess (tests/kernels/test_triton_compile.py).

Usage: python benchmarks/triton_gpu_compile.py FAMILY...   (layers, slerp, optimizer; one JSON object a
line on stdout per compiled configuration)
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile

if os.environ.get("TRITON_INTERPRET") == "1":
    sys.exit("benchmarks/triton_gpu_compile.py: unset TRITON_INTERPRET (it replaces the kernels by the interpreter's)")
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton 3.9's default, said aloud (it warns otherwise)

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.backends.nvidia.compiler import get_ptxas  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)  # H100 / H200
WIDTHS = (64, 1024, 4096)  # a q/k head, the paper's 0.5B d_model, a wide model
TYPES = {"fp32": tl.float32, "bf16": tl.bfloat16}


def compile_one(kernel, signature: dict, constexprs: dict, num_warps: int, label: dict) -> dict:
    """Compile ``kernel`` with argument types ``signature`` (pointers ``*fp32``, ints ``i32``,
    floats ``fp32``) and the given constexprs; pointers and ints divisible by 16 get Triton's
    divisibility hint, as its launcher gives them."""
    names = list(signature)
    attrs = {
        (names.index(name),): [["tt.divisibility", 16]]
        for name, kind in signature.items()
        if kind.startswith("*") or (kind == "i32" and constexprs.get(f"_{name}", 0) % 16 == 0)
    }
    constexprs = {k: v for k, v in constexprs.items() if not k.startswith("_")}
    for name in constexprs:
        signature[name] = "constexpr"
    record = dict(label, kernel=kernel.fn.__name__, num_warps=num_warps)
    try:
        compiled = triton.compile(
            ASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=attrs),
            target=TARGET,
            options={"num_warps": num_warps},
        )
    except Exception as error:  # the compiler's own message, for the test to show
        return dict(record, ok=False, error=f"{type(error).__name__}: {error}"[-2000:])
    ptx = compiled.asm["ptx"]
    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as f:
        f.write(ptx)
        f.flush()
        out = subprocess.run(
            [get_ptxas(90).path, "-v", "--gpu-name", "sm_90a", f.name, "-o", os.devnull], capture_output=True, text=True
        )
    info = out.stdout + out.stderr
    spills = [int(n) for n in re.findall(r"(\d+) bytes spill (?:stores|loads)", info)]
    registers = re.findall(r"Used (\d+) registers", info)
    return dict(
        record,
        ok=out.returncode == 0,
        error=None if out.returncode == 0 else info[-2000:],
        spill_bytes=sum(spills),
        registers=int(registers[0]) if registers else None,
        loads=sorted(set(re.findall(r"ld\.global(?:\.\w+)*", ptx))),
    )


def layers() -> list[dict]:
    from spherenet.kernels import activation_triton, norm_triton, residual_triton
    from spherenet.kernels import triton_helpers as _triton

    records = []
    for dtype, widths in (("bf16", WIDTHS), ("fp32", (1024,))):
        p = f"*{dtype}"
        for d in widths:
            block_d, rows = _triton.blocks(d)
            tile = {"BLOCK_D": block_d, "ROWS": rows, "_d": d}
            label = {"dtype": dtype, "d": d}
            rowwise = {"n_rows": "i32", "d": "i32", "tiny": "fp32"}
            heads = {"n_rows": "i32", "d": "i32", "tokens": "i32", "heads": "i32", "tiny": "fp32"}
            warps = _triton.warps(block_d * rows)
            records.append(compile_one(norm_triton._normalize_fwd, {"X": p, "Y": p, "NORM": "*fp32", **rowwise}, tile, warps, label))  # fmt: skip  # one kernel a line
            records.append(compile_one(norm_triton._normalize_bwd, {"G": p, "Y": p, "NORM": "*fp32", "GX": p, **rowwise}, tile, warps, label))  # fmt: skip  # one kernel a line
            records.append(compile_one(norm_triton._scaled_normalize_fwd, {"X": p, "SCALE": "*fp32", "Y": p, "OUT": p, "NORM": "*fp32", **heads}, tile, warps, label))  # fmt: skip  # one kernel a line
            records.append(compile_one(norm_triton._scaled_normalize_bwd, {"G": p, "Y": p, "NORM": "*fp32", "SCALE": "*fp32", "GX": p, **heads}, tile, warps, label))  # fmt: skip  # one kernel a line
            for riemannian in (False, True):
                update = dict(label, riemannian=riemannian)
                consts = dict(tile, RIEMANNIAN=riemannian)
                records.append(compile_one(residual_triton._residual_fwd, {"H": p, "B": p, "ALPHA": "*fp32", "Y": p, "NORM": "*fp32", **rowwise}, consts, warps, update))  # fmt: skip  # one kernel a line
                records.append(compile_one(residual_triton._residual_bwd, {"G": p, "H": p, "B": p, "ALPHA": "*fp32", "Y": p, "NORM": "*fp32", "GH": p, "GB": p, "GALPHA": "*fp32", **rowwise}, consts, warps, update))  # fmt: skip  # one kernel a line
        block = {"BLOCK": _triton.ELEMENTS_PER_PROGRAM}
        warps = _triton.warps(_triton.ELEMENTS_PER_PROGRAM)
        records.append(compile_one(activation_triton._swiglu_fwd, {"U": p, "V": p, "OUT": p, "n": "i32"}, block, warps, {"dtype": dtype}))  # fmt: skip  # one kernel a line
        records.append(compile_one(activation_triton._swiglu_bwd, {"G": p, "U": p, "V": p, "GU": p, "GV": p, "n": "i32"}, block, warps, {"dtype": dtype}))  # fmt: skip  # one kernel a line
        records.append(compile_one(activation_triton._relu2_fwd, {"X": p, "OUT": p, "n": "i32"}, block, warps, {"dtype": dtype}))  # fmt: skip  # one kernel a line
        records.append(compile_one(activation_triton._relu2_bwd, {"G": p, "X": p, "GX": p, "n": "i32"}, block, warps, {"dtype": dtype}))  # fmt: skip  # one kernel a line
    return records


def slerp() -> list[dict]:
    from spherenet.kernels import residual_triton
    from spherenet.kernels import triton_helpers as _triton

    records = []
    for dtype, widths in (("bf16", WIDTHS), ("fp32", (1024,))):
        p = f"*{dtype}"
        rowwise = {"n_rows": "i32", "d": "i32", "tiny": "fp32"}
        for d in widths:
            fwd_block, fwd_rows = _triton.blocks(d)
            bwd_block, bwd_rows, bwd_warps = residual_triton._slerp_backward_blocks(d)
            label = {"dtype": dtype, "d": d}
            records.append(compile_one(residual_triton._slerp_fwd, {"H": p, "B": p, "ALPHA": "*fp32", "Y": p, "NORM": "*fp32", **rowwise}, {"BLOCK_D": fwd_block, "ROWS": fwd_rows, "_d": d}, _triton.warps(fwd_block * fwd_rows), label))  # fmt: skip  # one kernel a line
            records.append(compile_one(residual_triton._slerp_bwd, {"G": p, "H": p, "B": p, "ALPHA": "*fp32", "Y": p, "NORM": "*fp32", "GH": p, "GB": p, "GALPHA": "*fp32", **rowwise}, {"BLOCK_D": bwd_block, "ROWS": bwd_rows, "_d": d}, bwd_warps, label))  # fmt: skip  # one kernel a line
    return records


def optimizer(aligned_too: bool = True) -> list[dict]:
    """The optimizer's row kernels; with ``aligned_too`` also without the alignment hint once, to
    show that the hint is what widens the loads."""
    from spherenet.kernels import sphere_rows_triton as kernel

    table = {"TABLE": "*i64", "WORK": "*i32"}
    records = []
    for dtype, widths in (("fp32", WIDTHS), ("bf16", (1024,))):
        for d in widths:
            block_d, rows, warps = kernel._blocks(d)
            for aligned in (True, False) if aligned_too and (dtype, d) == ("fp32", 1024) else (True,):
                tile = {"BLOCK_D": block_d, "ROWS": rows, "_d": d, "DTYPE": TYPES[dtype], "ALIGNED": aligned}
                label = {"dtype": dtype, "d": d, "aligned": aligned}
                for row_v, project in ((False, False), (True, True)):  # the paper's mode; the most work
                    records.append(compile_one(kernel._sphere_adam_rows, {**table, "SCALARS": "*fp32", "d": "i32", "beta1": "fp32", "beta2": "fp32", "eps": "fp32", "tiny": "fp32"}, dict(tile, ROW_V=row_v, PROJECT=project), warps, dict(label, row_v=row_v, project=project)))  # fmt: skip  # one kernel a line
                records.append(compile_one(kernel._muon_tail_rows, {**table, "SCALARS": "*fp32", "d": "i32", "tiny": "fp32"}, dict(tile, PROJECT=True), warps, label))  # fmt: skip  # one kernel a line
                records.append(compile_one(kernel._normalize_rows, {**table, "d": "i32", "tiny": "fp32"}, tile, warps, label))  # fmt: skip  # one kernel a line
    return records


FAMILIES = {"layers": layers, "slerp": slerp, "optimizer": optimizer}

if __name__ == "__main__":
    for family in sys.argv[1:] or list(FAMILIES):
        for record in FAMILIES[family]():
            print(json.dumps(dict(record, family=family)), flush=True)
