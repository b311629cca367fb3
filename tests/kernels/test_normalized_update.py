"""``normalized_update``: a sub-block's ``Norm`` and the residual update in one call (eq. 10, 11),
the values of the two ops one after the other, whatever implementation the resolver names."""

from __future__ import annotations

import pytest
import torch
from kernel_setting import kernels_set_to

from spherenet import kernels, manifolds
from spherenet.kernels.layer_ops import normalized_update, residual_update


def _inputs(dtype=torch.float32, scalar_alpha: bool = False):
    g = torch.Generator().manual_seed(0)
    h = manifolds.normalize(torch.randn(2, 5, 16, generator=g, dtype=dtype))
    out = 3.0 * torch.randn(2, 5, 16, generator=g, dtype=dtype)  # a block's output, not unit
    alpha = torch.rand(1 if scalar_alpha else 16, generator=g, dtype=dtype) * 0.3
    return h, out, alpha


@pytest.mark.parametrize("update", ["lerp", "slerp", "riemannian"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("scalar_alpha", [False, True])
def test_equals_normalize_then_update_bitwise(update, dtype, scalar_alpha):
    h, out, alpha = _inputs(dtype, scalar_alpha)
    with torch.no_grad():
        expected = residual_update(update, h, kernels.normalize(out), alpha)
        got = normalized_update(update, h, out, alpha)
    assert got.dtype == expected.dtype
    assert torch.equal(got, expected)


@pytest.mark.parametrize("update", ["lerp", "riemannian"])
def test_follows_the_resolver(update):
    h, out, alpha = _inputs()
    definition = {"lerp": manifolds.lerp, "riemannian": manifolds.riemannian_update}[update]
    with torch.no_grad(), kernels_set_to("reference"):
        got = normalized_update(update, h, out, alpha)
    assert torch.equal(got, definition(h, manifolds.normalize(out), alpha))


@pytest.mark.parametrize("update", ["lerp", "riemannian"])
def test_with_gradients_is_the_autograd_ops(update):
    h, out, alpha = _inputs(torch.float64)
    out.requires_grad_(True)
    alpha.requires_grad_(True)
    normalized_update(update, h, out, alpha).square().sum().backward()
    grads = out.grad.clone(), alpha.grad.clone()
    out.grad = alpha.grad = None
    residual_update(update, h, kernels.normalize(out), alpha).square().sum().backward()
    assert torch.equal(grads[0], out.grad) and torch.equal(grads[1], alpha.grad)
