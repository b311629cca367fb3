"""The Triton kernels of nGPT's element-wise operations (the *_triton modules of spherenet.kernels), forward
and backward, against float64 references of the paper's equations; then the whole model with
them against plain autograd, eagerly and under torch.compile(fullgraph=True). Without a GPU the
kernels run on CPU tensors under Triton's interpreter (tests/conftest.py sets TRITON_INTERPRET),
which has no bf16 arithmetic: these tests are float32."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

from kernel_setting import kernels_set_to

from spherenet import kernels  # noqa: E402
from spherenet.kernels import activation_triton, norm_triton, residual_triton  # noqa: E402
from spherenet.kernels import triton_helpers as _triton  # noqa: E402
from spherenet.manifolds import lerp, normalize, riemannian_update, slerp  # noqa: E402
from spherenet.models import preset_config  # noqa: E402
from spherenet.models.ngpt import NGPT  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
FP32 = {"rtol": 2e-5, "atol": 2e-6}


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def unit(*shape, seed: int) -> torch.Tensor:
    return normalize(torch.randn(*shape, generator=_gen(seed), dtype=torch.float64))


def check(kernel, reference, inputs: list[torch.Tensor], ref_dtype=torch.float64) -> None:
    """``kernel`` on float32 copies of ``inputs`` against ``reference`` on float64 ones (or
    ``ref_dtype``): the output and the gradient of every input, for a random upstream gradient."""
    ref_in = [t.detach().to(ref_dtype).requires_grad_() for t in inputs]
    got_in = [t.detach().float().to(DEVICE).requires_grad_() for t in inputs]
    want = reference(*ref_in)
    got = kernel(*got_in)
    assert got.dtype == torch.float32 and got.shape == want.shape
    torch.testing.assert_close(got.to(want.dtype).cpu(), want.detach(), **FP32)
    upstream = torch.randn(want.shape, generator=_gen(99), dtype=torch.float64)
    want_grads = torch.autograd.grad(want, ref_in, upstream.to(ref_dtype))
    got_grads = torch.autograd.grad(got, got_in, upstream.float().to(DEVICE))
    for g, w in zip(got_grads, want_grads):
        assert g.shape == w.shape
        torch.testing.assert_close(g.to(w.dtype).cpu(), w, rtol=1e-4, atol=1e-5 * max(1.0, w.abs().max().item()))


# Shapes: a row longer than a power of two (48), short rows as q/k heads (8), row counts that do
# not fill the last program.
ROWS = [(3, 5, 48), (37, 8), (2, 130)]


@pytest.mark.parametrize("shape", ROWS)
def test_normalize(shape):
    x = torch.randn(*shape, generator=_gen(1), dtype=torch.float64) * 3
    check(norm_triton.normalize, normalize, [x])


def test_normalize_of_a_zero_row_is_zero_with_the_references_gradient():
    """A zero row: the output is 0 and the gradient g / eps, as plain autograd's in float32
    (eps depends on the dtype, so the float64 reference is not the one to compare with)."""
    x = torch.randn(4, 16, generator=_gen(2))
    x[1] = 0.0
    got_x, ref_x = x.to(DEVICE).requires_grad_(), x.clone().requires_grad_()
    got, want = norm_triton.normalize(got_x), normalize(ref_x)
    assert got[1].abs().max().item() == 0.0
    torch.testing.assert_close(got.cpu(), want, **FP32)
    upstream = torch.randn(4, 16, generator=_gen(3))
    (got_grad,), (want_grad,) = (
        torch.autograd.grad(got, got_x, upstream.to(DEVICE)),
        torch.autograd.grad(want, ref_x, upstream),
    )
    assert torch.isfinite(got_grad).all()
    torch.testing.assert_close(got_grad.cpu(), want_grad, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("scale_shape", [(3, 1, 8), (1,)], ids=["per_head", "scalar"])
def test_scaled_normalize_is_eq_15_16_per_head(scale_shape):
    x = torch.randn(2, 3, 5, 8, generator=_gen(3), dtype=torch.float64)
    s_qk = torch.rand(*scale_shape, generator=_gen(4), dtype=torch.float64) + 0.5
    check(norm_triton.scaled_normalize, lambda x, s: normalize(x) * s, [x, s_qk])


@pytest.mark.parametrize("alpha_shape", [(48,), (1,)], ids=["per_dimension", "scalar"])
@pytest.mark.parametrize("update", ["lerp", "riemannian"])
def test_residual_updates_are_eq_10_11_and_24_26(update, alpha_shape):
    h, b = unit(6, 7, 48, seed=5), unit(6, 7, 48, seed=6)
    alpha = torch.rand(*alpha_shape, generator=_gen(7), dtype=torch.float64) * 0.4
    if update == "lerp":
        kernel, reference = residual_triton.lerp_normalize, lambda h, b, a: normalize(h + a * (b - h))  # eq. 10, 11
    else:
        kernel = residual_triton.riemannian_normalize
        reference = lambda h, b, a: normalize(h - a * (h * (h * b).sum(-1, keepdim=True) - b))  # noqa: E731  eq. 24-26
    check(kernel, reference, [h, b, alpha])
    # and the library's own definitions agree with the equations
    library = lerp if update == "lerp" else riemannian_update
    torch.testing.assert_close(library(h, b, alpha), reference(h, b, alpha), rtol=1e-12, atol=1e-12)


def slerp_eq_6(h, b, alpha):
    """Eq. 6 with per-dimension coefficients, then Norm: sin((1 - alpha) theta) / sin(theta) h +
    sin(alpha theta) / sin(theta) b, theta = arccos(h . b) (float64; h, b apart and not antipodal)."""
    theta = torch.arccos((h * b).sum(-1, keepdim=True).clamp(-1, 1))
    return normalize((torch.sin((1 - alpha) * theta) * h + torch.sin(alpha * theta) * b) / torch.sin(theta))


@pytest.mark.parametrize("alpha_shape", [(48,), (1,)], ids=["per_dimension", "scalar"])
@pytest.mark.parametrize("alpha_scale", [0.4, 3.0], ids=["small", "large"])
def test_slerp_is_eq_6(alpha_shape, alpha_scale):
    h, b = unit(6, 7, 48, seed=13), unit(6, 7, 48, seed=14)
    alpha = torch.rand(*alpha_shape, generator=_gen(15), dtype=torch.float64) * alpha_scale
    got = residual_triton.slerp_normalize(h.float().to(DEVICE), b.float().to(DEVICE), alpha.float().to(DEVICE))
    torch.testing.assert_close(got.double().cpu(), slerp_eq_6(h, b, alpha), **FP32)
    torch.testing.assert_close(slerp(h, b, alpha), slerp_eq_6(h, b, alpha), rtol=1e-12, atol=1e-12)
    # gradients: the library's float64 autograd (eq. 6 and the library's angle agree on the sphere,
    # not in their derivatives off it, which reach the inputs' radial components)
    check(residual_triton.slerp_normalize, slerp, [h, b, alpha])


@pytest.mark.parametrize("apart", [0.0, 1e-6, 1e-3, 0.3], ids=["equal", "1e-6", "1e-3", "0.3"])
def test_slerp_of_near_and_equal_points_is_the_librarys(apart):
    """theta -> 0, where sin(alpha theta) / sin(theta) and its derivative are evaluated by
    series: the values and gradients of the float64 library function (eq. 6's arccos form loses
    the digits there)."""
    h = unit(9, 40, seed=16)
    b = normalize(h + apart * torch.randn(9, 40, generator=_gen(17), dtype=torch.float64))
    alpha = torch.rand(40, generator=_gen(18), dtype=torch.float64)
    check(residual_triton.slerp_normalize, slerp, [h, b, alpha])


def test_slerp_of_antipodal_points_turns_towards_the_fallback_axis():
    """h_block = -h: no unique geodesic; the library's rule (turn towards the axis on which h is
    smallest) in value and gradient, in float32 and float64, and alpha = 1 lands on -h."""
    h = unit(5, 16, seed=19)
    alpha = torch.rand(16, generator=_gen(20), dtype=torch.float64)
    check(residual_triton.slerp_normalize, slerp, [h, -h, alpha], ref_dtype=torch.float32)
    check(residual_triton.slerp_normalize, slerp, [h, -h, alpha])
    one = torch.ones(16, device=DEVICE)
    landed = residual_triton.slerp_normalize(h.float().to(DEVICE), -h.float().to(DEVICE), one)
    torch.testing.assert_close(landed.cpu(), -h.float(), rtol=0, atol=1e-6)


def test_antipodal_inputs_stay_finite():
    """h_block = -h with alpha 0.5: the LERP step is the zero vector (Norm clamps it to 0), and
    its gradient is g / eps, as plain autograd's in float32 (eps depends on the dtype)."""
    h = unit(5, 16, seed=8)
    alpha = torch.full((16,), 0.5, dtype=torch.float64)
    check(residual_triton.lerp_normalize, lerp, [h, -h, alpha], ref_dtype=torch.float32)
    check(residual_triton.riemannian_normalize, riemannian_update, [h, -h, alpha], ref_dtype=torch.float32)
    assert residual_triton.lerp_normalize(h.float(), -h.float(), alpha.float()).abs().max().item() == 0.0


@pytest.mark.parametrize("shape", [(4, 33), (3, 4096 + 7)])
def test_swiglu_is_eq_19(shape):
    u = torch.randn(*shape, generator=_gen(9), dtype=torch.float64)
    v = torch.randn(*shape, generator=_gen(10), dtype=torch.float64) * 3
    check(activation_triton.swiglu, lambda u, v: u * F.silu(v), [u, v])


@pytest.mark.parametrize("shape", [(4, 33), (3, 4096 + 7)])
def test_relu2_is_the_squared_relu(shape):
    x = torch.randn(*shape, generator=_gen(13), dtype=torch.float64) * 3
    x[0, :3] = torch.tensor([0.0, -0.0, 1e-30])  # at the kink: value and gradient 0
    check(activation_triton.relu2, lambda x: F.relu(x) ** 2, [x])


def test_relu2_of_a_strided_view():
    """A transposed view (the kernel reads a contiguous copy) gives the values and gradients of the
    same elements in order."""
    x = (torch.randn(33, 5, generator=_gen(14), dtype=torch.float64) * 3).t()
    assert not x.is_contiguous()

    def kernel(x):
        assert not x.is_contiguous()
        return activation_triton.relu2(x)

    check(kernel, lambda x: F.relu(x) ** 2, [x])


def test_relu2_through_the_resolver_runs_the_kernel(monkeypatch):
    calls = []
    monkeypatch.setattr(activation_triton, "_relu2_op", lambda x: calls.append(x.shape) or F.relu(x) ** 2)
    x = torch.randn(3, 5, generator=_gen(15)).to(DEVICE)
    with kernels_set_to("triton"):
        kernels.relu2(x)
        kernels.relu2(x.double())  # float64: the fused torch function
    assert calls == [x.shape]


def test_relu2_traces_as_one_custom_op_forward_and_backward():
    """torch.compile(fullgraph=True) traces relu2 through its fakes and registered autograd: the
    eager values and gradients (aot_eager: the tracing, without generating code)."""
    x = (torch.randn(6, 5, generator=_gen(16)) * 3).to(DEVICE).t().requires_grad_()
    torch._dynamo.reset()
    compiled = torch.compile(activation_triton.relu2, fullgraph=True, backend="aot_eager")
    out = compiled(x)
    (grad,) = torch.autograd.grad(out, x, torch.ones_like(out))
    torch.testing.assert_close(out, F.relu(x.detach()) ** 2, rtol=1e-6, atol=0)
    torch.testing.assert_close(grad, 2 * F.relu(x.detach()), rtol=1e-6, atol=0)


def test_float64_runs_the_torch_functions():
    x = torch.randn(4, 8, dtype=torch.float64)
    with kernels_set_to("triton"):  # the resolver keeps float64 from the kernels
        torch.testing.assert_close(kernels.normalize(x), normalize(x), rtol=0, atol=0)


def tiny_ngpt(**overrides) -> NGPT:
    torch.manual_seed(0)
    config = preset_config("ngpt-tiny", vocab_size=64, d_model=32, n_heads=4, n_layers=2, max_seq_len=16, **overrides)
    return NGPT(config).to(DEVICE)


def loss_and_grads(model, ids, implementation):
    with kernels_set_to(implementation):
        logits = model(ids)
    loss = F.cross_entropy(logits.flatten(0, 1), ids.roll(-1, 1).flatten())
    return loss, torch.autograd.grad(loss, list(model.parameters()))


@pytest.mark.parametrize("update", ["lerp", "riemannian", "slerp"])
def test_model_with_triton_kernels_matches_plain_autograd(update):
    model = tiny_ngpt(update=update, alpha_mlp={"mode": "scalar"})
    ids = torch.randint(0, 64, (2, 16), generator=_gen(11)).to(DEVICE)
    loss, grads = loss_and_grads(model, ids, "triton")
    ref_loss, ref_grads = loss_and_grads(model, ids, "reference")
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6)
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-5)


@pytest.mark.slow
def test_compiled_fullgraph_traces_the_kernels():
    """torch.compile(fullgraph=True) sees each kernel as one custom op and gives the eager values."""
    model = tiny_ngpt()
    ids = torch.randint(0, 64, (2, 16), generator=_gen(12)).to(DEVICE)
    torch._dynamo.reset()
    with kernels_set_to("triton"):
        eager = model(ids)
        compiled = torch.compile(model, fullgraph=True)(ids)
    torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-5)


def test_cpu_tensors_without_the_interpreter_are_refused(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    if DEVICE == "cuda":
        pytest.skip("the check is for CPU tensors")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        norm_triton.normalize(torch.randn(2, 4))


@pytest.mark.parametrize("update", ["lerp", "riemannian", "slerp"])
def test_backward_of_many_row_blocks_on_few_programs_sums_alpha_over_all(update, monkeypatch):
    """The backward kernels with per-column partial sums run at most MAX_PROGRAMS programs, each
    looping over every n-th block of rows: with 2 programs over many blocks every row's gradient
    and alpha's whole sum are still those of eq. 6, 10-11 and 24-26."""
    monkeypatch.setattr(_triton, "MAX_PROGRAMS", 2)
    kernel = {"lerp": residual_triton.lerp_normalize, "riemannian": residual_triton.riemannian_normalize}
    reference = {"lerp": lerp, "riemannian": riemannian_update, "slerp": slerp}[update]
    rows, d = 203, 16  # 64 rows a program: 4 blocks, the last one part-filled, on 2 programs
    alpha = 0.05 + 0.1 * torch.rand(d, generator=_gen(21), dtype=torch.float64)
    check(
        lambda h, b, a: kernel.get(update, residual_triton.slerp_normalize)(h, b, a),
        lambda h, b, a: normalize(reference(h, b, a)),
        [unit(rows, d, seed=22), unit(rows, d, seed=23), alpha],
    )


@pytest.mark.parametrize(
    "op, make",
    [
        (norm_triton._normalize_op, lambda x: (x,)),
        (norm_triton._scaled_normalize_op, lambda x: (x, torch.rand(x.shape[1], x.shape[3]))),
        (residual_triton._residual_op, lambda x: (x, x.flip(0), torch.rand(x.shape[-1]), True)),
        (residual_triton._slerp_op, lambda x: (x, x.flip(0), torch.rand(x.shape[-1]))),
        (activation_triton._swiglu_op, lambda x: (x, x.flip(0))),
        (activation_triton._relu2_op, lambda x: (x,)),
        (activation_triton._relu2_backward_op, lambda x: (x.flip(0), x)),
    ],
    ids=["normalize", "scaled_normalize", "residual_update", "slerp_update", "swiglu", "relu2", "relu2_backward"],
)
def test_fake_implementations_report_what_the_kernels_return_for_strided_inputs(op, make):
    """torch.compile plans with the fake implementations: for an input that is a transposed view
    (as q and k of cross-attention are) they must give the kernels' contiguous outputs, or
    compiling fails on a stride mismatch. torch.library.opcheck compares the two."""
    x = torch.randn(2, 6, 3, 8, generator=_gen(31)).transpose(1, 2).to(DEVICE)  # (2, 3, 6, 8), strided
    assert not x.is_contiguous()
    torch.library.opcheck(op, make(x), test_utils=("test_schema", "test_faketensor"))
