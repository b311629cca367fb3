"""The fused autograd functions of spherenet.kernels (the ops' "torch" implementations): exact
gradients (gradcheck, float64),
the values and gradients of the plain autograd versions (float32, float64, bf16, every alpha
shape, zero norms), and fewer bytes kept for the backward pass in the model."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from kernel_setting import kernels_set_to
from model_references import unit

from spherenet import kernels
from spherenet.kernels import fused, layer_ops
from spherenet.manifolds import lerp, normalize, riemannian_update
from spherenet.models import preset_config
from spherenet.models.gpt import GPT
from spherenet.models.ngpt import NGPT

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny tensors


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def alphas(d, dtype):
    """Every form the residual update takes alpha in: per dimension, one scalar (1,), a 0-d
    tensor, a tensor broadcasting over rows, a Python float; signed (alpha_abs=False)."""
    g = _gen(7)
    return {
        "vector": (0.5 * torch.rand(d, generator=g) - 0.1).to(dtype),
        "scalar": torch.tensor([0.3], dtype=dtype),
        "zero_dim": torch.tensor(0.2, dtype=dtype),
        "per_row": (0.4 * torch.rand(3, 1, d, generator=g)).to(dtype),
        "float": 0.25,
    }


def leaf(t):
    return t.detach().clone().requires_grad_(True) if isinstance(t, torch.Tensor) else t


def grads_of(fn, inputs, grad_out_seed=0):
    """Output and the gradients of <output, G> for a fixed random G, for the tensor inputs."""
    inputs = [leaf(t) for t in inputs]
    out = fn(*inputs)
    g = torch.randn(out.shape, generator=_gen(grad_out_seed), dtype=torch.float64).to(out.dtype)
    tensors = [t for t in inputs if isinstance(t, torch.Tensor)]
    return out, torch.autograd.grad(out, tensors, g)


def assert_same(fused_fn, plain_fn, inputs, **tol):
    out, grads = grads_of(fused_fn, inputs)
    ref, ref_grads = grads_of(plain_fn, inputs)
    assert out.dtype == ref.dtype
    torch.testing.assert_close(out, ref, **tol)
    for got, want in zip(grads, ref_grads):
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want, **tol)


def plain_scaled_normalize(x, s):
    return normalize(x) * s


def plain_swiglu(u, v):
    return u * F.silu(v)


def plain_relu2(x):
    return torch.where(x > 0, x * x, torch.zeros_like(x))


UPDATES = {"lerp": (fused.lerp_normalize, lerp), "riemannian": (fused.riemannian_normalize, riemannian_update)}
TOL = {torch.float64: {"rtol": 1e-12, "atol": 1e-12}, torch.float32: {"rtol": 2e-5, "atol": 2e-6}}


# ----------------------------------------------------------------------- exact gradients


@pytest.mark.parametrize("update", UPDATES)
@pytest.mark.parametrize("alpha", ["vector", "scalar", "zero_dim", "per_row", "float"])
def test_residual_update_gradcheck(update, alpha):
    h, b = unit(3, 4, 6, seed=1), unit(3, 4, 6, seed=2)
    a = leaf(alphas(6, torch.float64)[alpha])
    assert torch.autograd.gradcheck(UPDATES[update][0], (leaf(h), leaf(b), a))


@pytest.mark.parametrize("scale_shape", [(3, 1, 5), (1,)])
def test_norm_scaled_norm_and_activations_gradcheck(scale_shape):
    x = leaf(torch.randn(2, 3, 4, 5, dtype=torch.float64, generator=_gen(0)))
    s = leaf(torch.rand(scale_shape, dtype=torch.float64, generator=_gen(1)) + 0.5)
    v = leaf(torch.randn(2, 3, 4, 5, dtype=torch.float64, generator=_gen(2)))
    assert torch.autograd.gradcheck(fused.normalize_fused, (x,))
    assert torch.autograd.gradcheck(fused.scaled_normalize_fused, (x, s))
    assert torch.autograd.gradcheck(fused.swiglu_fused, (x, v))
    assert torch.autograd.gradcheck(fused.relu2_fused, (x,))


# ------------------------------------------------------------------- same as plain autograd


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("update", UPDATES)
@pytest.mark.parametrize("alpha", ["vector", "scalar", "zero_dim", "per_row", "float"])
def test_residual_update_matches_plain(dtype, update, alpha):
    h, b = unit(3, 4, 16, dtype=dtype, seed=3), unit(3, 4, 16, dtype=dtype, seed=4)
    assert_same(*UPDATES[update], (h, b, alphas(16, dtype)[alpha]), **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("scale_shape", [(4, 1, 8), (1,)])
def test_norm_scaled_norm_and_activations_match_plain(dtype, scale_shape):
    x = 3 * torch.randn(2, 4, 5, 8, dtype=dtype, generator=_gen(5))
    s = torch.rand(scale_shape, dtype=torch.float64, generator=_gen(6)).to(dtype) + 0.5
    v = torch.randn(2, 4, 5, 8, dtype=dtype, generator=_gen(7))
    assert_same(fused.normalize_fused, normalize, (x,), **TOL[dtype])
    assert_same(fused.scaled_normalize_fused, plain_scaled_normalize, (x, s), **TOL[dtype])
    assert_same(fused.swiglu_fused, plain_swiglu, (x, v), **TOL[dtype])
    assert_same(fused.relu2_fused, plain_relu2, (x,), **TOL[dtype])
    assert_same(layer_ops.relu2_reference, plain_relu2, (x,), **TOL[dtype])


def test_relu2_values_and_gradients_are_exact_in_float64():
    """relu(x)**2 and its gradient 2 relu(x), written out: zero at and below 0 (the gradient too)."""
    x = torch.tensor([-2.0, -1e-300, 0.0, 1e-300, 0.5, 3.0], dtype=torch.float64)
    want = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.25, 9.0], dtype=torch.float64)  # (1e-300)**2 underflows
    upstream = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, -6.0], dtype=torch.float64)
    want_grad = upstream * torch.tensor([0.0, 0.0, 0.0, 2e-300, 1.0, 6.0], dtype=torch.float64)
    for fn in (layer_ops.relu2_reference, fused.relu2_fused, kernels.relu2):
        x_leaf = leaf(x)
        out = fn(x_leaf)
        (grad,) = torch.autograd.grad(out, x_leaf, upstream)
        assert out.dtype == grad.dtype == torch.float64
        torch.testing.assert_close(out, want, rtol=1e-15, atol=0)
        torch.testing.assert_close(grad, want_grad, rtol=1e-15, atol=0)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_zero_and_tiny_norms_behave_as_the_plain_clamp(dtype):
    """A zero row maps to zero and its gradient is g / eps (no gradient through the clamped
    norm); rows just above and below eps follow the plain ``clamp_min`` too; LERP between
    antipodal points at alpha 1/2 sums to zero."""
    eps = 1e-30 if dtype == torch.float32 else 1e-300
    x = torch.randn(4, 6, dtype=dtype, generator=_gen(8))
    x[0] = 0
    x[1] = x[1] / x[1].norm() * eps * 0.5
    x[2] = x[2] / x[2].norm() * eps * 4
    out, grads = grads_of(fused.normalize_fused, (x,))
    ref, ref_grads = grads_of(normalize, (x,))
    assert torch.isfinite(grads[0]).all()
    torch.testing.assert_close(out, ref, rtol=1e-6, atol=0)
    torch.testing.assert_close(grads[0], ref_grads[0], rtol=1e-5, atol=0)

    h = unit(2, 6, dtype=dtype, seed=9)
    for fused_fn, plain_fn in UPDATES.values():
        out, grads = grads_of(fused_fn, (h, -h, 0.5))
        ref, ref_grads = grads_of(plain_fn, (h, -h, 0.5))
        torch.testing.assert_close(out, ref, rtol=0, atol=1e-6)
        for got, want in zip(grads, ref_grads):
            assert torch.isfinite(got).all()
            torch.testing.assert_close(got, want, rtol=1e-5, atol=0)


def test_bf16_inputs_keep_the_plain_dtypes_and_values():
    """bf16 inputs are computed in float32 and cast back like the plain functions; the saved
    output is bf16, so gradients agree to bf16 rounding."""
    tol = {"rtol": 2e-2, "atol": 2e-2}
    h, b = unit(3, 8, 32, dtype=torch.bfloat16, seed=10), unit(3, 8, 32, dtype=torch.bfloat16, seed=11)
    alpha = torch.rand(32, generator=_gen(12)) * 0.3  # float32, as the model's parameters
    for pair in UPDATES.values():
        assert_same(*pair, (h, b, alpha), **tol)
    x = torch.randn(2, 4, 8, 16, generator=_gen(13)).bfloat16()
    s = torch.rand(4, 1, 16, generator=_gen(14)) + 0.5
    assert_same(fused.normalize_fused, normalize, (x,), **tol)
    assert_same(fused.scaled_normalize_fused, plain_scaled_normalize, (x, s), **tol)
    assert_same(fused.swiglu_fused, plain_swiglu, (x, 2 * x.flip(-1)), **tol)
    assert_same(fused.relu2_fused, plain_relu2, (x,), **tol)


def test_configure_sets_the_implementation_and_returns_the_previous_setting():
    assert kernels.setting() == "auto"
    x = torch.randn(3, 8, requires_grad=True)
    assert type(kernels.normalize(x).grad_fn).__name__ == "_NormalizeBackward"  # "auto": the fused function
    assert kernels.configure("reference") == "auto"
    try:
        assert kernels.setting() == "reference"
        assert type(kernels.normalize(x).grad_fn).__name__ == "DivBackward0"  # the kept decision was forgotten
        assert kernels.configure("torch") == "reference"
        assert kernels.setting() == "torch"
    finally:
        kernels.configure("auto")
    with pytest.raises(
        ValueError, match="kernel implementation must be one of auto, reference, torch, native, triton, got 'cuda'"
    ):
        kernels.configure("cuda")
    assert kernels.setting() == "auto"


def test_every_entry_point_dispatches_to_the_chosen_implementation(monkeypatch):
    """Each entry point calls the function of the chosen implementation, and only that one; the
    layer ops take their fused torch functions under "auto"."""
    calls = []
    record = lambda name: lambda *args: calls.append(name) or args[0]  # noqa: E731
    ops = {
        "normalize": kernels.layer_ops.NORMALIZE,
        "qk_normalize": kernels.layer_ops.QK_NORMALIZE,
        **kernels.layer_ops.UPDATES,
        "swiglu": kernels.layer_ops.SWIGLU,
        "relu2": kernels.layer_ops.RELU2,
        "scaled_linear": kernels.layer_ops.SCALED_LINEAR,
    }
    assert {name: op.auto for name, op in ops.items()} == {name: {"*": "torch"} for name in ops}
    for name, op in ops.items():
        monkeypatch.setitem(op.implementations, "reference", record(name))
    x = torch.ones(2, 4)
    with kernels_set_to("reference"):
        kernels.normalize(x)
        kernels.qk_normalize(x, x)
        for update in ("lerp", "slerp", "riemannian"):
            kernels.residual_update(update, x, x, x)
        kernels.swiglu(x, x)
        kernels.relu2(x)
        kernels.scaled_linear(x, x, x[:, 0])  # weight (2, 4), a scale per output feature
    assert calls == ["normalize", "qk_normalize", "lerp", "slerp", "riemannian", "swiglu", "relu2", "scaled_linear"]
    kernels.normalize(x)  # "auto": the fused function, not the recorder
    assert len(calls) == 8


@pytest.mark.slow
def test_the_environment_chooses_the_implementation_at_import():
    code = "import spherenet.kernels as kernels; print(kernels.setting())"
    env = dict(os.environ, SPHERENET_KERNELS="reference")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "reference"
    env["SPHERENET_KERNELS"] = "gpu"
    bad = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert (
        bad.returncode != 0
        and "SPHERENET_KERNELS must be one of auto, reference, torch, native, triton, got 'gpu'" in bad.stderr
    )


# --------------------------------------------------------------------------------- the model


def ngpt(dtype=torch.float64, **overrides):
    torch.manual_seed(0)
    config = preset_config("ngpt-tiny", vocab_size=64, d_model=32, n_heads=2, n_layers=2, max_seq_len=16, **overrides)
    model = NGPT(config).to(dtype)
    g = _gen(1)
    with torch.no_grad():  # scalings away from their constant inits: a wrong broadcast shows
        for p in model.parameters():
            if p.ndim == 1:
                p.mul_(1 + 0.5 * torch.rand(p.shape, generator=g, dtype=p.dtype))
    return model


def loss_and_grads(model, ids, fused_ops: bool, autocast: bool = False):
    with kernels_set_to("torch" if fused_ops else "reference"), torch.autocast("cpu", torch.bfloat16, enabled=autocast):
        logits = model(ids)
    loss = F.cross_entropy(logits.float().flatten(0, 1), ids.roll(-1, 1).flatten())
    return logits, torch.autograd.grad(loss, list(model.parameters()))


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"update": "riemannian"},
        {"update": "slerp"},
        {"qk_norm": False},
        {name: {"mode": "scalar"} for name in ("alpha_attn", "alpha_mlp", "s_qk", "s_u", "s_v", "s_z")},
        {
            **{name: {"mode": "fixed"} for name in ("s_qk", "s_u", "s_v", "s_z")},
            **{name: {"mode": "fixed", "absolute": False} for name in ("alpha_attn", "alpha_mlp")},
        },
    ],
    ids=["lerp", "riemannian", "slerp", "no_qk_norm", "scalar", "fixed"],
)
def test_model_matches_plain_autograd(overrides):
    model = ngpt(**overrides)
    ids = torch.randint(0, 64, (2, 16), generator=_gen(2))
    logits, grads = loss_and_grads(model, ids, True)
    ref_logits, ref_grads = loss_and_grads(model, ids, False)
    torch.testing.assert_close(logits, ref_logits, rtol=1e-12, atol=1e-12)
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def test_model_under_bf16_autocast_matches_plain():
    model = ngpt(torch.float32)
    ids = torch.randint(0, 64, (2, 16), generator=_gen(3))
    logits, grads = loss_and_grads(model, ids, True, autocast=True)
    ref_logits, ref_grads = loss_and_grads(model, ids, False, autocast=True)
    assert logits.dtype == ref_logits.dtype == torch.float32
    torch.testing.assert_close(logits, ref_logits, rtol=0.05, atol=0.05)
    for got, want in zip(grads, ref_grads):
        assert math.isfinite(got.sum().item())
        torch.testing.assert_close(got, want, rtol=0.1, atol=0.02 * want.abs().max().item())


@pytest.mark.parametrize("update", ["lerp", "riemannian", "slerp"])
def test_fused_model_keeps_fewer_activations_than_plain_and_than_gpt(update, saved_bytes):
    """The fused nGPT keeps ~0.6x the plain one's activations (LERP), and no more than GPT's at
    the same shape (the plain one keeps ~1.5x GPT's), whatever the residual update."""
    shape = dict(vocab_size=64, d_model=64, n_heads=2, n_layers=2, max_seq_len=64)
    torch.manual_seed(0)
    model = NGPT(preset_config("ngpt-tiny", update=update, **shape))
    gpt = GPT(preset_config("gpt-tiny", **shape))
    ids = torch.randint(0, 64, (4, 64), generator=_gen(4))
    with kernels_set_to("reference"):
        plain = saved_bytes(model, lambda: model(ids).sum().backward())
    lean = saved_bytes(model, lambda: model(ids).sum().backward())
    baseline = saved_bytes(gpt, lambda: gpt(ids).sum().backward())
    assert lean < 0.7 * plain, (lean, plain)
    assert lean <= baseline, (lean, baseline)


def test_scaled_sphere_linear_folds_only_with_gradients():
    """``SphereLinear(x, out_scale)`` scales W's rows when gradients are on and the output when
    off: the same values either way."""
    model = ngpt(torch.float64)
    layer, s = model.blocks[0].mlp.w_u, torch.rand(128, dtype=torch.float64, generator=_gen(5))
    x = torch.randn(3, 32, dtype=torch.float64, generator=_gen(6))
    with torch.no_grad():
        off = layer(x, out_scale=s)
    on = layer(x, out_scale=s)
    torch.testing.assert_close(on, off, rtol=1e-13, atol=1e-14)
    torch.testing.assert_close(on, layer(x) * s, rtol=1e-13, atol=1e-14)


# ---------------------------------------------------------------- under torch.compile


def strided(*shape):
    """A leaf of ``shape`` whose memory is laid out transposed (dims 1 and 2 swapped)."""
    data = torch.randn(shape[0], shape[2], shape[1], *shape[3:])
    return data.transpose(1, 2).requires_grad_()


OPS = {
    "normalize": lambda x, y, s: kernels.normalize(x),
    "qk_normalize": lambda x, y, s: kernels.qk_normalize(x, s),
    "lerp": lambda x, y, s: kernels.residual_update("lerp", kernels.normalize(x), kernels.normalize(y), s * 0.1),
    "slerp": lambda x, y, s: kernels.residual_update("slerp", kernels.normalize(x), kernels.normalize(y), s * 0.1),
    "riemannian": lambda x, y, s: kernels.residual_update(
        "riemannian", kernels.normalize(x), kernels.normalize(y), s * 0.1
    ),
    "swiglu": lambda x, y, s: kernels.swiglu(x, y),
    "relu2": lambda x, y, s: kernels.relu2(x),
}


@pytest.mark.parametrize("name", OPS)
def test_each_op_compiles_on_strided_inputs_with_its_eager_values_and_gradients(name):
    """The fused functions reuse their temporaries through ``out=`` in eager mode; under compile a
    buffer shaped like a transposed input is not contiguous, which ``out=`` may not be."""
    torch.manual_seed(0)
    x, y, s = strided(2, 3, 2, 8), strided(2, 3, 2, 8), (1 + torch.rand(8)).requires_grad_()
    grad = torch.randn(2, 3, 2, 8)

    def run(fn):
        out = fn(x, y, s)
        return (out, *torch.autograd.grad(out, (x, y, s), grad, allow_unused=True, materialize_grads=True))

    torch._dynamo.reset()
    compiled = torch.compile(OPS[name], fullgraph=True, backend="aot_eager")
    for got, expected in zip(run(compiled), run(OPS[name])):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["normalize", "qk_normalize", "lerp", "slerp", "riemannian"])
def test_each_fused_function_compiles_with_dynamic_shapes(name):
    """``torch.compile(dynamic=True)`` with the function called twice in one graph: the per-dtype
    constants (smallest norm, antipodal and small-angle thresholds, pi) stay constants there, not
    symbolic floats, which an autograd function cannot carry from its forward into its backward."""
    torch.manual_seed(0)
    x, y, s = (torch.randn(2, 3, 8, requires_grad=True) for _ in range(3))
    grad = torch.randn(2, 3, 8)

    def twice(x, y, s):
        return OPS[name](x, y, s) + OPS[name](2 * x, y, s)

    def run(fn):
        out = fn(x, y, s)
        return (out, *torch.autograd.grad(out, (x, y, s), grad, allow_unused=True, materialize_grads=True))

    torch._dynamo.reset()
    compiled = torch.compile(twice, fullgraph=True, dynamic=True, backend="aot_eager")
    for got, expected in zip(run(compiled), run(twice)):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_ngpt_trains_under_compile_with_dynamic_shapes():
    """The whole model (its queries and keys scaled by one computed s_qk, every fused function
    called per layer) under ``torch.compile(dynamic=True)``: its eager loss and gradients. The
    other updates' functions are compiled the same way above."""
    torch.manual_seed(0)
    model = NGPT(preset_config("ngpt-tiny", vocab_size=32, n_layers=1, max_seq_len=16))
    ids = torch.randint(0, 32, (2, 8))

    def loss_and_grads(run):
        model.zero_grad()
        loss = F.cross_entropy(run(ids).flatten(0, 1), ids.flatten())
        loss.backward()
        return [loss.detach()] + [p.grad.clone() for p in model.parameters()]

    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, dynamic=True, backend="aot_eager")
    for got, expected in zip(loss_and_grads(compiled), loss_and_grads(model)):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
