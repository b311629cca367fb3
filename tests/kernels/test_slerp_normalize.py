"""SLERP's fused autograd function, the ``"torch"`` implementation of the SLERP update (eq. 6,
then ``Norm``): the values of :func:`spherenet.manifolds.slerp` bit for bit (float32, float64),
its exact gradients for ``h``, ``h_block`` and ``alpha`` (gradcheck, and the definition's own
autograd) for every form of alpha, on regular, equal, nearly equal, nearly antipodal, antipodal
and off-sphere rows in one batch, and no more kept for the backward pass than LERP's function."""

from __future__ import annotations

import pytest
import torch
from model_references import unit

from spherenet import kernels
from spherenet.kernels import fused as fused_ops
from spherenet.kernels import slerp_fused
from spherenet.manifolds import normalize, slerp

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny tensors

D = 8
ALPHA_FORMS = ["vector", "scalar", "zero_dim", "per_row", "float"]
ALL_KINDS = ("regular", "equal", "near", "off_sphere", "near_antipodal", "antipodal", "antipodal_off_sphere", "regular")


def fused(h, h_block, alpha):
    return slerp_fused._SlerpNormalize.apply(h, h_block, alpha, None)


def alpha_of(form: str, dtype=torch.float64, rows: int = len(ALL_KINDS)):
    """alpha per dimension (signed, as with ``absolute=False``), one scalar (1,), a 0-d tensor,
    one per row and dimension, or a Python float."""
    g = torch.Generator().manual_seed(3)
    return {
        "vector": lambda: (torch.rand(D, generator=g, dtype=torch.float64) - 0.2).to(dtype),
        "scalar": lambda: torch.tensor([0.3], dtype=dtype),
        "zero_dim": lambda: torch.tensor(0.7, dtype=dtype),
        "per_row": lambda: (0.8 * torch.rand(rows, 1, D, generator=g, dtype=torch.float64)).to(dtype).squeeze(1),
        "float": lambda: 0.25,
    }[form]()


def rows(kinds=ALL_KINDS, gap=1e-4):
    """``(h, h_block)`` in float64, one row of each kind: random unit rows; h_block == h; h_block
    ``gap`` from h; both off the sphere (h_block a block's output, of norm 3); h_block ``gap``
    from -h; h_block == -h exactly; h_block == -2.5 h (antipodal, with theta < pi: the angle's
    gradient flows)."""
    h, b = unit(len(kinds), D, seed=1), unit(len(kinds), D, seed=2)
    step = unit(len(kinds), D, seed=4) * gap
    for i, kind in enumerate(kinds):
        if kind == "equal":
            b[i] = h[i]
        elif kind == "near":
            b[i] = normalize(h[i] + step[i])
        elif kind == "off_sphere":
            h[i], b[i] = 0.6 * h[i], 3.0 * b[i]
        elif kind == "near_antipodal":
            b[i] = normalize(-h[i] + step[i])
        elif kind == "antipodal":
            b[i] = -h[i]
        elif kind == "antipodal_off_sphere":
            b[i] = -2.5 * h[i]
    return h, b


def leaf(t):
    return t.detach().clone().requires_grad_(True) if isinstance(t, torch.Tensor) else t


def values_and_grads(fn, h, h_block, alpha, upstream):
    inputs = [leaf(t) for t in (h, h_block, alpha)]
    out = fn(*inputs)
    tensors = [t for t in inputs if isinstance(t, torch.Tensor)]
    return out, torch.autograd.grad(out, tensors, upstream.to(out.dtype))


def upstream_like(h):
    return torch.randn(h.shape, generator=torch.Generator().manual_seed(5), dtype=torch.float64)


# ----------------------------------------------------------------------- exact gradients


@pytest.mark.parametrize("alpha", ALPHA_FORMS)
def test_gradcheck(alpha):
    """Finite differences in float64 on every kind of row where SLERP is differentiable (not
    at h == -h_block, where it jumps to the fallback direction); nearly antipodal rows 1e-3
    from -h, where the second differences stay small enough for gradcheck's step."""
    h, b = rows(("regular", "equal", "near", "off_sphere", "near_antipodal", "regular"), gap=1e-3)
    a = leaf(alpha_of(alpha, rows=6))
    assert torch.autograd.gradcheck(fused, (leaf(h), leaf(b), a))


# ------------------------------------------------------------- the definition's autograd


@pytest.mark.parametrize("alpha", ALPHA_FORMS)
@pytest.mark.parametrize("antipodal", [True, False], ids=["with_antipodal_rows", "without"])
def test_float64_values_bitwise_and_gradients_of_the_definition(alpha, antipodal):
    """Values bit for bit; gradients those of spherenet.manifolds.slerp's autograd to float64's
    rounding, relative to each row's largest (the nearly antipodal row's are ~1e4, and the
    rounding of theta near pi alone moves them by ulp(pi) / sin(theta) ~ 4e-12 of that), with and
    without antipodal rows in the batch (the two branches, and the regular one alone)."""
    kinds = ALL_KINDS if antipodal else tuple(k for k in ALL_KINDS if not k.startswith("antipodal"))
    h, b = rows(kinds)
    a = alpha_of(alpha, rows=len(kinds))
    out, grads = values_and_grads(fused, h, b, a, upstream_like(h))
    ref, ref_grads = values_and_grads(slerp, h, b, a, upstream_like(h))
    assert torch.equal(out, ref)
    assert len(grads) == len(ref_grads)
    for got, want in zip(grads, ref_grads):
        assert got.shape == want.shape and torch.isfinite(got).all()
        scale = want.abs().amax(dim=-1, keepdim=True) if want.dim() == 2 else want.abs().max()
        assert ((got - want).abs() <= 1e-10 * scale + 1e-13).all(), ((got - want).abs() / scale).max()


@pytest.mark.parametrize("alpha", ALPHA_FORMS)
def test_float32_values_bitwise_and_gradients_as_close_to_float64_as_the_definitions(alpha):
    """In float32: the definition's values bit for bit; gradients against the float64
    definition's, no further off than the float32 definition's own (the nearly antipodal row,
    sin(theta) ~ 1e-4, loses digits in both)."""
    h, b = rows()
    a = alpha_of(alpha)
    a32 = a.float() if isinstance(a, torch.Tensor) else a
    out, grads = values_and_grads(fused, h.float(), b.float(), a32, upstream_like(h))
    ref, ref_grads = values_and_grads(slerp, h.float(), b.float(), a32, upstream_like(h))
    _, exact = values_and_grads(slerp, h, b, a, upstream_like(h))
    assert out.dtype == torch.float32 and torch.equal(out, ref)
    for got, ref_got, want in zip(grads, ref_grads, exact):
        assert got.dtype == ref_got.dtype
        scale = want.abs().amax(dim=-1, keepdim=True) if want.dim() == 2 else want.abs().max()
        error, ref_error = (got.double() - want).abs(), (ref_got.double() - want).abs()
        assert (error <= 2 * ref_error.amax(dim=-1, keepdim=True) + 1e-6 * scale).all(), (error / scale).max()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_equal_points_have_the_definitions_finite_gradients(dtype):
    """h == h_block in every row (theta = 0: no row takes the fallback branch), and every row
    1e-4 apart: finite gradients, those of the definition."""
    h = unit(5, D, seed=6).to(dtype)
    near = normalize(h + 1e-4 * unit(5, D, seed=7)).to(dtype)
    a = alpha_of("vector", dtype)
    tol = {"rtol": 1e-12, "atol": 1e-12} if dtype == torch.float64 else {"rtol": 1e-5, "atol": 1e-6}
    for b in (h.clone(), near):
        out, grads = values_and_grads(fused, h, b, a, upstream_like(h))
        ref, ref_grads = values_and_grads(slerp, h, b, a, upstream_like(h))
        assert torch.equal(out, ref)
        for got, want in zip(grads, ref_grads):
            assert torch.isfinite(got).all()
            torch.testing.assert_close(got, want, **tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_rows_are_the_same_whether_or_not_another_row_is_antipodal(dtype):
    """On CPU a batch without antipodal rows skips the fallback branch, forward and backward:
    the other rows' values and gradients are the same either way, bit for bit."""
    h, b = rows(("regular", "near", "regular", "off_sphere"))
    h, b = h.to(dtype), b.to(dtype)
    a = alpha_of("vector", dtype)
    h_mixed, b_mixed = torch.cat([h, h[:1]]), torch.cat([b, -h[:1]])
    upstream = upstream_like(h_mixed)
    out, (grad_h, grad_b, grad_a) = values_and_grads(fused, h, b, a, upstream[:4])
    mixed, (mixed_h, mixed_b, _) = values_and_grads(fused, h_mixed, b_mixed, a, upstream)
    assert torch.equal(out, mixed[:4]) and torch.equal(grad_h, mixed_h[:4]) and torch.equal(grad_b, mixed_b[:4])
    assert torch.isfinite(grad_a).all()


def test_broadcast_points_get_gradients_of_their_shape():
    """h shared by every row (shape (1, d)) against rows of h_block: the definition's gradients,
    summed over the broadcast rows."""
    h, b = unit(1, D, seed=8), unit(4, D, seed=9)
    a = alpha_of("vector")
    out, grads = values_and_grads(fused, h, b, a, upstream_like(b))
    ref, ref_grads = values_and_grads(slerp, h, b, a, upstream_like(b))
    assert torch.equal(out, ref)
    for got, want in zip(grads, ref_grads):
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_bf16_inputs_keep_the_definitions_dtypes_and_values():
    """bf16 rows computed in float32 and cast back, as the definition; the kept output is bf16,
    so gradients agree to bf16's rounding of each row's largest (the antipodal row's are ~4e3)."""
    h, b = rows(("regular", "near", "regular", "off_sphere", "antipodal", "antipodal_off_sphere"))
    h, b = h.bfloat16(), b.bfloat16()
    a = alpha_of("vector", torch.float32)  # float32, as the model's parameters
    out, grads = values_and_grads(fused, h, b, a, upstream_like(h))
    ref, ref_grads = values_and_grads(slerp, h, b, a, upstream_like(h))
    assert out.dtype == ref.dtype == torch.bfloat16 and torch.equal(out, ref)
    for got, want in zip(grads, ref_grads):
        assert got.dtype == want.dtype
        scale = want.float().abs().amax(dim=-1, keepdim=True) if want.dim() == 2 else want.abs().max()
        assert ((got.float() - want.float()).abs() <= 1e-2 * scale + 2e-2).all()


# ------------------------------------------------------------------------- what it keeps


def saved_bytes(fn, *inputs) -> int:
    """The bytes of the distinct storages autograd keeps for ``fn``'s backward pass."""
    storages = {}

    def pack(t):
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(*inputs)
    return sum(storages.values())


def test_keeps_what_lerp_keeps_and_is_the_default_with_gradients():
    """h, h_block, alpha, the output and one norm per row: LERP's function's bytes, a third of
    the definition's under plain autograd; the resolver's "auto" takes it when gradients are on."""
    h, b = leaf(unit(4, 64, 64, dtype=torch.float32, seed=10)), leaf(unit(4, 64, 64, dtype=torch.float32, seed=11))
    a = leaf(torch.rand(64) * 0.3)
    kept = saved_bytes(slerp_fused.slerp_normalize, h, b, a)
    assert kept == saved_bytes(fused_ops.lerp_normalize, h, b, a) == 3 * h.numel() * 4 + 4 * 64 + 4 * 4 * 64
    assert 3 * kept < saved_bytes(slerp, h, b, a)
    assert type(kernels.residual_update("slerp", h, b, a).grad_fn).__name__ == "_SlerpNormalizeBackward"
    with torch.no_grad():
        assert torch.equal(kernels.residual_update("slerp", h, b, a), slerp(h, b, a))
