"""The residual updates of nGPT's hidden state on the sphere: LERP (eq. 10, 11), SLERP (eq. 6) and
the Riemannian update (eq. 24-26), each followed by ``Norm``.

Each update has three implementations under one signature ``(h, h_block, alpha)``
(:mod:`spherenet.kernels.resolve` picks):

- ``"reference"``: the definitions of :mod:`spherenet.manifolds` (``lerp``, ``slerp``,
  ``riemannian_update``), in plain autograd;
- ``"torch"`` (what ``"auto"`` takes): one ``torch.autograd.Function`` for LERP and the
  Riemannian update, keeping ``h``, ``h_block`` (both kept by their neighbours already), the
  output and one norm per row, and recomputing the small differences; SLERP is the reference under
  ``torch.utils.checkpoint``;
- ``"triton"``: one kernel forward and one backward each (:mod:`spherenet.kernels.residual_triton`).

``alpha`` (the eigen learning rates) is a float or a tensor broadcasting against ``h``: shape
``(d,)`` or ``(1,)``. The fused functions follow :mod:`spherenet.kernels.norm`'s conventions
(smallest norm, float32 at least, output dtypes).

Equation numbers are those of Loshchilov et al., "nGPT: Normalized Transformer with
Representation Learning on the Hypersphere" (2024).
"""

from __future__ import annotations

import torch
import torch.utils.checkpoint
from torch.autograd.function import once_differentiable

from .. import manifolds
from ..manifolds.geodesic import work_dtype
from .norm import NORMALIZE, _normalize_values, as_dtype, norm_backward, norm_forward, tiny
from .resolve import Op, resolve

__all__ = [
    "UPDATES",
    "residual_update",
    "normalized_update",
    "lerp_normalize",
    "slerp_normalize",
    "riemannian_normalize",
]


# ---------------------------------------------------------------- fused autograd


def _alpha_grad(grad: torch.Tensor, alpha) -> torch.Tensor | None:
    return grad.sum_to_size(alpha.shape).to(alpha.dtype) if isinstance(alpha, torch.Tensor) else None


def _lerp_values(h, h_block, alpha, eps) -> tuple[torch.Tensor, torch.Tensor, float]:
    """``(Norm(h + alpha (h_block - h)) in h's dtype, the row norms, the smallest norm)``."""
    work = work_dtype(h, h_block, alpha)
    eps = tiny(work, eps)
    alpha_w = as_dtype(alpha, work) if isinstance(alpha, torch.Tensor) else alpha
    y, norm = norm_forward(torch.lerp(as_dtype(h, work), as_dtype(h_block, work), alpha_w), eps)
    return as_dtype(y, h.dtype), norm, eps


def _riemannian_values(h, h_block, alpha, eps) -> tuple[torch.Tensor, torch.Tensor, float]:
    """``(Norm(h - alpha (h (h . h_block) - h_block)) in h's dtype, the row norms, the smallest norm)``."""
    work = work_dtype(h, h_block, alpha)
    eps = tiny(work, eps)
    hw, bw = as_dtype(h, work), as_dtype(h_block, work)
    alpha_w = as_dtype(alpha, work) if isinstance(alpha, torch.Tensor) else alpha
    g = hw * (hw * bw).sum(dim=-1, keepdim=True) - bw  # eq. 24
    y, norm = norm_forward(hw - alpha_w * g, eps)
    return as_dtype(y, h.dtype), norm, eps


class _LerpNormalize(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, h_block, alpha, eps):
        y, norm, eps = _lerp_values(h, h_block, alpha, eps)
        ctx.save_for_backward(h, h_block, alpha if isinstance(alpha, torch.Tensor) else None, y, norm)
        ctx.alpha, ctx.eps = alpha, eps  # alpha: the Python float, when it is one
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        h, h_block, alpha_t, y, norm = ctx.saved_tensors
        alpha = ctx.alpha if alpha_t is None else alpha_t.to(norm.dtype)
        grad_sum = norm_backward(grad, y, norm, ctx.eps)  # of h + alpha (h_block - h)
        need_h, need_block, need_alpha = ctx.needs_input_grad[:3]
        grad_h = (grad_sum * (1 - alpha)).to(h.dtype) if need_h else None
        grad_block = (grad_sum * alpha).to(h_block.dtype) if need_block else None
        grad_alpha = None
        if need_alpha:
            step = h_block.to(norm.dtype) - h.to(norm.dtype)
            grad_alpha = _alpha_grad(grad_sum * step, alpha_t)
        return grad_h, grad_block, grad_alpha, None


def lerp_normalize(h: torch.Tensor, h_block: torch.Tensor, alpha, eps: float | None = None) -> torch.Tensor:
    """nGPT's residual update ``Norm(h + alpha (h_block - h))`` (eq. 10, 11; LERP of eq. 7, 8
    then retraction), the values of :func:`spherenet.manifolds.lerp`. Keeps ``h``, ``h_block``,
    the output and one norm per row; ``h_block - h`` is recomputed for alpha's gradient. Without
    gradients, the forward pass alone (no autograd function)."""
    if not torch.is_grad_enabled():
        return _lerp_values(h, h_block, alpha, eps)[0]
    return _LerpNormalize.apply(h, h_block, alpha, eps)


class _RiemannianNormalize(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, h_block, alpha, eps):
        y, norm, eps = _riemannian_values(h, h_block, alpha, eps)
        ctx.save_for_backward(h, h_block, alpha if isinstance(alpha, torch.Tensor) else None, y, norm)
        ctx.alpha, ctx.eps = alpha, eps
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        h, h_block, alpha_t, y, norm = ctx.saved_tensors
        work = norm.dtype
        alpha = ctx.alpha if alpha_t is None else alpha_t.to(work)
        hw, bw = h.to(work), h_block.to(work)
        cos = (hw * bw).sum(dim=-1, keepdim=True)
        gs = norm_backward(grad, y, norm, ctx.eps)  # of s = h - alpha (h (h . b) - b)
        alpha_gs = gs * alpha
        w = (alpha_gs * hw).sum(dim=-1, keepdim=True)  # sum_i gs_i alpha_i h_i
        need_h, need_block, need_alpha = ctx.needs_input_grad[:3]
        grad_h = (gs - alpha_gs * cos - bw * w).to(h.dtype) if need_h else None
        grad_block = (alpha_gs - hw * w).to(h_block.dtype) if need_block else None
        grad_alpha = _alpha_grad(gs * (bw - hw * cos), alpha_t) if need_alpha else None
        return grad_h, grad_block, grad_alpha, None


def riemannian_normalize(h: torch.Tensor, h_block: torch.Tensor, alpha, eps: float | None = None) -> torch.Tensor:
    """The Riemannian residual update ``Norm(h - alpha (h (h · h_block) - h_block))`` (eq. 24-26),
    the values of :func:`spherenet.manifolds.riemannian_update`; keeps what
    :func:`lerp_normalize` keeps and recomputes ``h · h_block``. Without gradients, the forward
    pass alone."""
    if not torch.is_grad_enabled():
        return _riemannian_values(h, h_block, alpha, eps)[0]
    return _RiemannianNormalize.apply(h, h_block, alpha, eps)


def slerp_normalize(h: torch.Tensor, h_block: torch.Tensor, alpha) -> torch.Tensor:
    """The SLERP residual update (eq. 6, then ``Norm``), :func:`spherenet.manifolds.slerp` itself
    under ``torch.utils.checkpoint``: its many intermediates (angle, sines, tangent, both
    branches) are recomputed in the backward pass from ``h``, ``h_block`` and ``alpha``, which
    are kept anyway. One more evaluation of the update, for the non-default update only; without
    gradients, the definition alone."""
    if not torch.is_grad_enabled():
        return manifolds.slerp(h, h_block, alpha)
    return torch.utils.checkpoint.checkpoint(manifolds.slerp, h, h_block, alpha, use_reentrant=False)


# ---------------------------------------------------------------- the ops


def _lerp_triton(h, h_block, alpha):
    from . import residual_triton  # imports Triton: on first use only

    return residual_triton.lerp_normalize(h, h_block, alpha)


def _slerp_triton(h, h_block, alpha):
    from . import residual_triton

    return residual_triton.slerp_normalize(h, h_block, alpha)


def _riemannian_triton(h, h_block, alpha):
    from . import residual_triton

    return residual_triton.riemannian_normalize(h, h_block, alpha)


def _triton_takes(h: torch.Tensor, h_block: torch.Tensor, alpha) -> bool:
    """Whether the Triton kernels take an update: they compute in float32, with ``alpha`` a tensor."""
    return (
        torch.float64 not in (h.dtype, h_block.dtype)
        and isinstance(alpha, torch.Tensor)
        and alpha.dtype != torch.float64
    )


#: update name -> its op; the references are :mod:`spherenet.manifolds`' definitions.
UPDATES: dict[str, Op] = {
    "lerp": Op(
        "lerp",
        implementations={"reference": manifolds.lerp, "torch": lerp_normalize, "triton": _lerp_triton},
        auto={"*": "torch"},
        takes={"triton": _triton_takes},
    ),
    "slerp": Op(
        "slerp",
        implementations={"reference": manifolds.slerp, "torch": slerp_normalize, "triton": _slerp_triton},
        auto={"*": "torch"},
        takes={"triton": _triton_takes},
    ),
    "riemannian": Op(
        "riemannian",
        implementations={
            "reference": manifolds.riemannian_update,
            "torch": riemannian_normalize,
            "triton": _riemannian_triton,
        },
        auto={"*": "torch"},
        takes={"triton": _triton_takes},
    ),
}


def residual_update(update: str, h: torch.Tensor, h_block: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    """The hidden state moved on the sphere towards the block's output ``h_block`` by the eigen
    learning rates ``alpha``: ``"lerp"`` ``Norm(h + alpha (h_block - h))`` (eq. 10, 11),
    ``"slerp"`` (eq. 6, then ``Norm``) or ``"riemannian"``
    ``Norm(h - alpha (h (h · h_block) - h_block))`` (eq. 24-26)."""
    return UPDATES[update](h, h_block, alpha)


#: the updates whose ``"torch"`` forward :func:`normalized_update` runs directly without gradients
_FORWARD_VALUES = {"lerp": _lerp_values, "riemannian": _riemannian_values}


def normalized_update(update: str, h: torch.Tensor, block_out: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    """``residual_update(update, h, Norm(block_out), alpha)``: a sub-block's output normalized
    (``h_A = Norm(ATTN(h))``, ``h_M = Norm(MLP(h))``) and the hidden state moved towards it (eq.
    10, 11) in one call. Without gradients, where both ops resolve to ``"torch"``, their forward
    values are computed directly (no autograd function, one resolution each): the same values,
    fewer calls per token in decoding."""
    values = _FORWARD_VALUES.get(update)
    if values is not None and not torch.is_grad_enabled():
        device = h.device.type
        if (
            resolve(NORMALIZE, None, device, (block_out,)) == "torch"
            and resolve(UPDATES[update], None, device, (h, block_out, alpha)) == "torch"
        ):
            return values(h, _normalize_values(block_out, None)[0], alpha, None)[0]
    return UPDATES[update](h, NORMALIZE(block_out), alpha)
