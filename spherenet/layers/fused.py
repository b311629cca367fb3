"""Fused forward/backward passes of nGPT's element-wise operations, lean in saved activations.

Plain autograd keeps, for every small op of ``Norm(h + alpha (h_A - h))``, the op's inputs:
the difference ``h_A - h``, the un-normalized sum, the un-normalized q and k, the raw ``u`` and
``v`` of the MLP before their scalings. The functions here compute the same values in one
``torch.autograd.Function`` each and keep, for the backward pass, only the normalized output
(which the next layer keeps anyway, so it costs nothing extra), the inputs that are already
kept elsewhere, and one norm per row; ``1/‖x‖`` and the small differences are recomputed. The
backward of ``y = x / ‖x‖`` in terms of the output::

    grad_x = (g - y (y · g)) / ‖x‖

They follow :mod:`spherenet.manifolds.geodesic` exactly: the same ``eps`` (``‖x‖`` clamped at
1e-30 in float32, 1e-300 in float64; below it no gradient flows through the norm, as with
``clamp_min``), computation in at least float32 (bf16/fp16 inputs upcast; the saved output
stays in the output's dtype) and the same output dtypes, so bf16 autocast needs no
``custom_fwd``: nothing here is an autocast-listed op. They are not twice differentiable.

They are the ``"torch"`` implementation of :mod:`spherenet.layers.ops`, the layers' default;
the layers call them through that module, never directly.

Equation numbers are those of Loshchilov et al., "nGPT: Normalized Transformer with
Representation Learning on the Hypersphere" (2024).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch.autograd.function import once_differentiable

from ..manifolds.geodesic import TINY, _work_dtype, slerp

__all__ = [
    "normalize",
    "scaled_normalize",
    "lerp_normalize",
    "riemannian_normalize",
    "slerp_normalize",
    "swiglu",
    "scaled_linear",
]


def _eps(work: torch.dtype, eps: float | None) -> float:
    return TINY[work] if eps is None else float(eps)


def _norm_forward(xw: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x / max(‖x‖, eps), ‖x‖)`` over the last dimension, in ``xw``'s dtype."""
    norm = torch.linalg.vector_norm(xw, dim=-1, keepdim=True)
    return xw / norm.clamp_min(eps), norm


def _norm_backward(grad: torch.Tensor, y: torch.Tensor, norm: torch.Tensor, eps: float) -> torch.Tensor:
    """Gradient of ``x / max(‖x‖, eps)`` with respect to ``x``, from the output ``y`` and the
    row norms, in ``norm``'s dtype: ``(g - y (y · g)) / ‖x‖``; where ``‖x‖ < eps`` the norm is
    the constant eps and only ``g / eps`` remains."""
    work = norm.dtype
    g, y = grad.to(work), y.to(work)
    dot = (y * g).sum(dim=-1, keepdim=True)
    dot = torch.where(norm >= eps, dot, 0.0)
    return torch.addcmul(g, y, dot, value=-1.0) / norm.clamp_min(eps)


class _Normalize(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, eps):
        work = _work_dtype(x)
        eps = _eps(work, eps)
        y, norm = _norm_forward(x.to(work), eps)
        y = y.to(x.dtype)
        ctx.save_for_backward(y, norm)
        ctx.eps = eps
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        y, norm = ctx.saved_tensors
        return _norm_backward(grad, y, norm, ctx.eps).to(y.dtype), None


def normalize(x: torch.Tensor, eps: float | None = None) -> torch.Tensor:
    """``Norm(x) = x / ‖x‖`` over the last dimension (Table 1: ``h_A = Norm(ATTN(h))``,
    ``h_M = Norm(MLP(h))``); the values of :func:`spherenet.manifolds.normalize`, keeping the
    output and one norm per row for the backward pass instead of ``x``."""
    return _Normalize.apply(x, eps)


class _ScaledNormalize(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, scale, eps):
        work = _work_dtype(x)
        eps = _eps(work, eps)
        y, norm = _norm_forward(x.to(work), eps)
        y = y.to(x.dtype)
        ctx.save_for_backward(y, norm, scale)
        ctx.eps = eps
        return y * scale

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        y, norm, scale = ctx.saved_tensors
        grad_x = grad_scale = None
        if ctx.needs_input_grad[0]:
            grad_x = _norm_backward(grad * scale, y, norm, ctx.eps).to(y.dtype)
        if ctx.needs_input_grad[1]:
            grad_scale = (grad * y).sum_to_size(scale.shape).to(scale.dtype)
        return grad_x, grad_scale, None


def scaled_normalize(x: torch.Tensor, scale: torch.Tensor, eps: float | None = None) -> torch.Tensor:
    """``Norm(x) * scale``, the query/key normalization of eq. 15, 16 (``scale = s_qk``, shaped to
    broadcast against ``x``). Keeps ``Norm(x)``, the row norms and ``scale`` for the backward
    pass; the result has the dtype of ``Norm(x) * scale``."""
    return _ScaledNormalize.apply(x, scale, eps)


def _alpha_grad(grad: torch.Tensor, alpha) -> torch.Tensor | None:
    return grad.sum_to_size(alpha.shape).to(alpha.dtype) if isinstance(alpha, torch.Tensor) else None


class _LerpNormalize(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, h_block, alpha, eps):
        work = _work_dtype(h, h_block, alpha)
        eps = _eps(work, eps)
        alpha_w = alpha.to(work) if isinstance(alpha, torch.Tensor) else alpha
        y, norm = _norm_forward(torch.lerp(h.to(work), h_block.to(work), alpha_w), eps)
        y = y.to(h.dtype)
        ctx.save_for_backward(h, h_block, alpha if isinstance(alpha, torch.Tensor) else None, y, norm)
        ctx.alpha, ctx.eps = alpha, eps  # alpha: the Python float, when it is one
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        h, h_block, alpha_t, y, norm = ctx.saved_tensors
        alpha = ctx.alpha if alpha_t is None else alpha_t.to(norm.dtype)
        grad_sum = _norm_backward(grad, y, norm, ctx.eps)  # of h + alpha (h_block - h)
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
    then retraction), the values of :func:`spherenet.manifolds.lerp`. ``alpha`` is a float or a
    tensor broadcasting against ``h`` (the eigen learning rates, shape ``(d,)`` or ``(1,)``).

    Keeps ``h``, ``h_block`` (both kept by their neighbours already), the output and one norm per
    row; ``h_block - h`` is recomputed for alpha's gradient."""
    return _LerpNormalize.apply(h, h_block, alpha, eps)


class _RiemannianNormalize(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, h_block, alpha, eps):
        work = _work_dtype(h, h_block, alpha)
        eps = _eps(work, eps)
        hw, bw = h.to(work), h_block.to(work)
        alpha_w = alpha.to(work) if isinstance(alpha, torch.Tensor) else alpha
        g = hw * (hw * bw).sum(dim=-1, keepdim=True) - bw  # eq. 24
        y, norm = _norm_forward(hw - alpha_w * g, eps)
        y = y.to(h.dtype)
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
        gs = _norm_backward(grad, y, norm, ctx.eps)  # of s = h - alpha (h (h . b) - b)
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
    :func:`lerp_normalize` keeps and recomputes ``h · h_block``."""
    return _RiemannianNormalize.apply(h, h_block, alpha, eps)


def slerp_normalize(h: torch.Tensor, h_block: torch.Tensor, alpha) -> torch.Tensor:
    """The SLERP residual update (eq. 6, then ``Norm``), :func:`spherenet.manifolds.slerp` itself
    under ``torch.utils.checkpoint``: its many intermediates (angle, sines, tangent, both
    branches) are recomputed in the backward pass from ``h``, ``h_block`` and ``alpha``, which
    are kept anyway. One more evaluation of the update, for the non-default update only."""
    return torch.utils.checkpoint.checkpoint(slerp, h, h_block, alpha, use_reentrant=False)


class _SwiGLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, u, v):
        dtype = torch.promote_types(u.dtype, v.dtype)
        work = torch.promote_types(dtype, torch.float32)
        ctx.save_for_backward(u, v)
        return (u.to(work) * F.silu(v.to(work))).to(dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        u, v = ctx.saved_tensors
        work = torch.promote_types(grad.dtype, torch.float32)
        grad, vw = grad.to(work), v.to(work)
        grad_u = grad_v = None
        if ctx.needs_input_grad[0]:
            grad_u = (grad * F.silu(vw)).to(u.dtype)
        if ctx.needs_input_grad[1]:
            grad_v = torch.ops.aten.silu_backward(grad * u.to(work), vw).to(v.dtype)
        return grad_u, grad_v


def swiglu(u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """``u * SiLU(v)`` (eq. 19), computed in at least float32 and returned in the inputs' dtype.
    Keeps ``u`` and ``v`` for the backward pass and recomputes ``SiLU(v)``, instead of keeping
    ``u``, ``v`` and ``SiLU(v)``."""
    return _SwiGLU.apply(u, v)


def scaled_linear(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``(x W^T) * scale`` (eq. 3, 20, 21). With gradients enabled the scale is folded into the
    weight's rows, ``x (s W)^T``: one multiply of the weight instead of one of the output, and no
    output kept for the scale's gradient. Without, the output is scaled (cheaper for a few tokens,
    as in decoding). The result has the dtype of ``x W^T`` (bf16 under autocast in both cases)."""
    if torch.is_grad_enabled():
        return F.linear(x, weight * scale.unsqueeze(-1))
    y = F.linear(x, weight)
    return (y * scale).to(y.dtype)
