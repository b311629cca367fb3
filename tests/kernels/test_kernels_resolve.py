"""The one resolver of spherenet.kernels: its order (argument, the setting: SPHERENET_KERNELS or
configure(), the op's auto table), its decisions kept per device type and dtype, its refusals,
and the shared Triton helpers' constants."""

import os
import subprocess
import sys

import pytest
import torch
from kernel_setting import kernels_set_to

from spherenet import kernels
from spherenet.kernels import resolve as resolve_module
from spherenet.kernels.resolve import Op, resolve

OP = Op("demo", implementations={"reference": 0, "torch": 1, "triton": 2}, auto={"cuda": "triton", "*": "torch"})


def test_auto_follows_the_device_table():
    assert resolve(OP, None, "cpu") == "torch"
    assert resolve(OP, "auto", "cuda") == "triton"
    assert resolve(OP, None, "xpu") == "torch"


def test_the_argument_beats_the_setting_which_beats_auto():
    with kernels_set_to("reference"):
        assert resolve(OP, None, "cuda") == "reference"
        assert resolve(OP, "triton", "cpu") == "triton"
        with kernels_set_to("auto"):
            assert resolve(OP, None, "cuda") == "triton"
        assert kernels.setting() == "reference"
    assert kernels.setting() == "auto"


def test_a_call_is_decided_once_per_device_type_and_dtype_until_configure():
    """The second call with the same device type and dtype goes straight to the kept decision;
    another dtype is decided on its own; configure() forgets them all."""
    from spherenet.kernels.layer_ops import run

    ran = []
    op = Op("demo", {"reference": lambda x: ran.append("reference") or x, "torch": lambda x: ran.append("torch") or x}, {"*": "torch"})  # fmt: skip  # one table
    run(op, torch.ones(2))
    run(op, torch.ones(2))
    assert list(op.decided) == [("cpu", torch.float32, False)] and ran == ["torch", "torch"]
    run(op, torch.ones(2, dtype=torch.float64))
    assert len(op.decided) == 2
    with kernels_set_to("reference"):
        assert op.decided == {}
        run(op, torch.ones(2))
    assert ran[-1] == "reference"
    run(op, torch.ones(2))
    assert ran[-1] == "torch"
    torch.func.vmap(lambda x: run(op, x))(torch.ones(3, 2))  # a torch.func transform: the reference, decided apart
    assert ran[-1] == "reference" and ("cpu", torch.float32, True) in op.decided


def test_a_scope_naming_an_implementation_the_op_lacks_takes_its_auto_choice():
    with kernels_set_to("native"):
        assert resolve(OP, None, "cuda") == "triton"
        assert resolve(OP, None, "cpu") == "torch"


def test_refusals_name_the_value_and_the_allowed_ones():
    with pytest.raises(ValueError, match=r"demo has no 'native' implementation; it has reference, torch, triton"):
        resolve(OP, "native", "cpu")
    with pytest.raises(ValueError, match=r"must be one of auto, reference, torch, native, triton, got 'cuda'"):
        resolve(OP, "cuda", "cpu")
    with pytest.raises(ValueError, match=r"got 'fast'"):
        kernels.configure("fast")
    with pytest.raises(ValueError, match=r"auto names \['native'\]"):
        Op("bad", implementations={"torch": 0}, auto={"*": "native"})
    with pytest.raises(ValueError, match=r"'\*' entry"):
        Op("bad", implementations={"torch": 0}, auto={"cpu": "torch"})
    with pytest.raises(ValueError, match=r"\['foreach'\] are not among"):
        Op("bad", implementations={"foreach": 0}, auto={"*": "foreach"})


def test_a_call_the_named_implementation_does_not_take_runs_torch():
    """The fallbacks are the resolver's: an op's ``takes`` predicate refuses a call, and the call
    runs "torch", whether the implementation was named or chosen."""
    op = Op("demo", {"reference": 0, "torch": 1, "triton": 2}, {"*": "triton"}, takes={"triton": lambda x: x > 0})
    assert resolve(op, None, "cpu", (1,)) == "triton"
    assert resolve(op, None, "cpu", (-1,)) == "torch"
    assert resolve(op, "triton", "cpu", (-1,)) == "torch"
    assert resolve(op, None, "cpu") == "triton"  # without the call's arguments: the table's choice
    with kernels_set_to("reference"):
        assert resolve(op, None, "cpu", (-1,)) == "reference"  # takes only speaks for its own names
    with pytest.raises(ValueError, match=r"takes names \['native'\]"):
        Op("bad", {"torch": 0}, {"*": "torch"}, takes={"native": bool})
    with pytest.raises(ValueError, match="needs a 'torch' implementation"):
        Op("bad", {"reference": 0}, {"*": "reference"}, takes={"reference": bool})


def test_the_layer_ops_send_what_triton_does_not_take_to_torch(monkeypatch):
    """float64, a Python float alpha, broadcast SwiGLU inputs and q/k not of 4 dimensions never reach a
    Triton module (which imports no family module back to fall back on): with the setting "triton" they
    run the fused torch functions, with their values."""
    from spherenet.kernels import fused, layer_ops

    ran = []
    for name in ("NORMALIZE", "QK_NORMALIZE", "SWIGLU", "RELU2"):
        op = getattr(layer_ops, name)
        monkeypatch.setattr(
            layer_ops, name, Op(op.name, {**op.implementations, "triton": ran.append}, op.auto, op.takes)
        )
    monkeypatch.setattr(layer_ops, "UPDATES", {k: Op(op.name, {**op.implementations, "triton": ran.append}, op.auto, op.takes) for k, op in layer_ops.UPDATES.items()})  # fmt: skip  # one table
    x = torch.randn(3, 8, dtype=torch.float64)
    with kernels_set_to("triton"):
        assert torch.equal(kernels.normalize(x), fused.normalize_fused(x))
        assert torch.equal(kernels.qk_normalize(x.float(), torch.ones(8)), fused.scaled_normalize_fused(x.float(), torch.ones(8)))  # fmt: skip  # one check
        assert torch.equal(kernels.relu2(x), fused.relu2_fused(x))
        assert torch.equal(kernels.swiglu(x.float(), x[:1].float()), fused.swiglu_fused(x.float(), x[:1].float()))
        h = fused.normalize_fused(x.float())
        assert torch.equal(kernels.residual_update("lerp", h, h.flip(0), 0.5), fused.lerp_normalize(h, h.flip(0), 0.5))
    assert ran == []


def _in_subprocess(code: str, value: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "SPHERENET_KERNELS": value}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


def test_the_environment_is_read_once_with_the_same_values():
    code = (
        "from spherenet.kernels.resolve import Op, resolve, setting\n"
        "op = Op('demo', {'reference': 0, 'torch': 1}, {'*': 'torch'})\n"
        "print(setting(), resolve(op, None, 'cpu'))"
    )
    assert _in_subprocess(code, "reference").stdout.split() == ["reference", "reference"]
    assert _in_subprocess(code, " Triton ").stdout.split() == ["triton", "torch"]  # lacks triton: auto
    bad = _in_subprocess(code, "foreach")
    assert bad.returncode != 0 and "SPHERENET_KERNELS must be one of auto, reference, torch" in bad.stderr


def test_the_optimizer_keeps_its_defaults_through_the_resolver():
    from spherenet.kernels.sphere_adam import SPHERE_ADAM

    def chosen(requested, device_type):
        return resolve_module.resolve(SPHERE_ADAM, requested, device_type)

    assert resolve_module.setting() == "auto"
    assert [chosen(None, d) for d in ("cpu", "cuda", "mps")] == ["native", "triton", "torch"]
    assert chosen("torch", "cuda") == "torch"
    assert chosen("triton", "cpu") == "triton"
    with kernels_set_to("torch"):  # SPHERENET_KERNELS=torch: torch alone, no C++ build and no Triton
        assert [chosen(None, d) for d in ("cpu", "cuda")] == ["torch", "torch"]
    with kernels_set_to("triton"):
        assert chosen(None, "cpu") == "triton"


def test_the_one_tiny_is_the_references():
    pytest.importorskip("triton")
    from spherenet.kernels import triton_helpers as _triton
    from spherenet.manifolds.geodesic import TINY

    assert _triton.TINY == TINY[torch.float32] == 1e-30


def test_tiles_and_warps_keep_both_callers_launch_shapes():
    pytest.importorskip("triton")
    from spherenet.kernels.triton_helpers import blocks, warps

    assert blocks(64) == (64, 64) and blocks(100) == (128, 32) and blocks(5000) == (8192, 1)
    assert blocks(3) == (4, 64)
    # layer ops: 4..16 warps from the tile; optimizer: 8..32 (its former max(8, min(32, BLOCK_D // 512)))
    for d in (1, 3, 64, 100, 768, 4096, 5000, 20000, 70000):
        block_d, rows = blocks(d)
        assert warps(block_d * rows, fewest=8, most=32) == max(8, min(32, block_d // 512))
    assert [warps(t) for t in (256, 2048, 4096, 8192, 65536)] == [4, 4, 8, 16, 16]


def test_every_triton_launch_names_its_warps():
    """Each ``kernel[grid](...)`` launch passes ``num_warps``: benchmarks/triton_gpu_compile.py
    compiles every kernel with the warps of :func:`warps`, which Triton's own default (4) would
    silently depart from."""
    import ast
    import pathlib

    launches = []
    for path in sorted(pathlib.Path(kernels.__file__).parent.glob("*_triton.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Subscript):
                name = ast.unparse(node.func.value)
                launches.append((path.name, name, any(k.arg == "num_warps" for k in node.keywords)))
    assert len(launches) >= 10, launches  # the walk found the launches
    assert [launch for launch in launches if not launch[2]] == []


def test_alignment_needs_every_address_and_row_on_16_bytes():
    pytest.importorskip("triton")
    from spherenet.kernels.triton_helpers import aligned

    assert aligned(1024, 4, [0, 4096, 16])
    assert not aligned(1024, 4, [0, 8])  # an address off 16 bytes
    assert not aligned(6, 2, [0, 16])  # rows of 12 bytes: the second row starts off 16 bytes
    assert aligned(8, 2, [])


def test_cpu_tensors_outside_the_interpreter_are_refused_with_the_op_named(monkeypatch):
    pytest.importorskip("triton")
    from spherenet.kernels.triton_helpers import check_device

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(RuntimeError, match=r"swiglu \(Triton\): CPU tensors need TRITON_INTERPRET=1.*; use X"):
        check_device("swiglu", torch.ones(2), hint="; use X")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    check_device("swiglu", torch.ones(2))
