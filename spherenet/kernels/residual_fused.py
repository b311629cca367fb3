"""The ``"torch"`` implementations of the residual updates of :mod:`spherenet.kernels.residual`:
one ``torch.autograd.Function`` per update (LERP, eq. 10, 11; the Riemannian update, eq. 24-26;
SLERP, eq. 6; each followed by ``Norm``), keeping ``h``, ``h_block`` (both kept by their
neighbours already), ``alpha``, the output and one norm per row, and recomputing the rest: the
small differences (LERP, Riemannian), the angle, tangent and sines (SLERP, whose backward is
written out, antipodal rows included). They follow :mod:`spherenet.kernels.norm`'s conventions
(smallest norm, float32 at least, output dtypes); without gradients, the forward values alone.

Equation numbers are those of Loshchilov et al., "nGPT: Normalized Transformer with
Representation Learning on the Hypersphere" (2024).
"""

from __future__ import annotations

import math

import torch
from torch.autograd.function import once_differentiable

from .. import manifolds
from ..manifolds.geodesic import ANTIPODAL_SIN, may_hold_any, work_dtype
from .norm import as_dtype, norm_backward, norm_forward, per_dtype, reuse, smallest_norm, tiny

__all__ = ["lerp_normalize", "slerp_normalize", "riemannian_normalize"]


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


def _keep_for_backward(ctx, values, h, h_block, alpha, eps) -> torch.Tensor:
    """The fused functions' forward: ``values(h, h_block, alpha, eps)``'s output, keeping ``h``,
    ``h_block``, ``alpha`` (a tensor; a Python float on ``ctx``), the output and the row norms."""
    y, norm, eps = values(h, h_block, alpha, eps)
    ctx.save_for_backward(h, h_block, alpha if isinstance(alpha, torch.Tensor) else None, y, norm)
    ctx.alpha, ctx.eps = alpha, eps
    return y


class _LerpNormalize(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, h_block, alpha, eps):
        return _keep_for_backward(ctx, _lerp_values, h, h_block, alpha, eps)

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
        return _keep_for_backward(ctx, _riemannian_values, h, h_block, alpha, eps)

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


#: theta below which the backward pass takes R = sin(alpha theta) / sin(theta) as alpha (off by a
#: relative theta**2 / 6 at most) and dR/dtheta as 0 (its term dR/dtheta u is about theta**2):
#: both below the dtype's rounding
_SMALL_ANGLE = {torch.float64: 1.5e-8, torch.float32: 3.5e-4}
_small_angle, _antipodal_sin = per_dtype(_SMALL_ANGLE), per_dtype(ANTIPODAL_SIN)
_pi = torch.compiler.assume_constant_result(lambda: math.pi)  # a constant under compile, as per_dtype's values


def _slerp_angle(aw: torch.Tensor, bw: torch.Tensor):
    """``(theta, |a - b|, |a + b|, a . b, u, antipodal)``, the values of spherenet.manifolds.slerp
    (the same operations): ``theta = 2 atan2(|a - b|, |a + b|)``, the tangent ``u = b - (a . b) a``
    and the rows with ``|u| < 1e-5`` (1e-12 in float64) and ``theta > pi/2``. One buffer for
    the full-size intermediates, ``u`` the last (on CPU a fresh tensor costs more than the
    arithmetic)."""
    buffer = aw - bw
    diff = buffer.norm(dim=-1, keepdim=True)
    total = torch.add(aw, bw, out=reuse(buffer)).norm(dim=-1, keepdim=True)
    theta = 2 * torch.atan2(diff, total)
    dot = torch.mul(aw, bw, out=reuse(buffer)).sum(dim=-1, keepdim=True)
    u = torch.sub(bw, torch.mul(dot, aw, out=reuse(buffer)), out=reuse(buffer))
    antipodal = (u.norm(dim=-1, keepdim=True) < _antipodal_sin(aw.dtype)) & (theta > _pi() / 2)
    return theta, diff, total, dot, u, antipodal


def _fallback(aw: torch.Tensor):
    """``(f, e, a_k, |w|)``: spherenet.manifolds.slerp's fallback direction ``f = w / |w|``,
    ``w = e - a_k a``, ``e`` the axis of a's smallest absolute component, ``a_k = a . e``."""
    axis = aw.abs().argmin(dim=-1, keepdim=True)
    e = torch.zeros_like(aw).scatter_(-1, axis, 1.0)
    a_axis = (aw * e).sum(dim=-1, keepdim=True)
    w = e - a_axis * aw
    w_norm = w.norm(dim=-1, keepdim=True)
    return w / w_norm.clamp_min(smallest_norm(aw.dtype)), e, a_axis, w_norm


def _times(x: torch.Tensor, y) -> torch.Tensor:
    """``x * y``, in ``x`` where it has the product's shape (``x`` is a temporary)."""
    if not isinstance(y, torch.Tensor) or x.shape == torch.broadcast_shapes(x.shape, y.shape):
        return x.mul_(y)
    return x * y


def _slerp_values(h, h_block, alpha, eps) -> tuple[torch.Tensor, torch.Tensor, float]:
    """``(Norm(SLERP(h, h_block; alpha)) in h's dtype, the row norms, the smallest norm)``: the
    operations of spherenet.manifolds.slerp, the same values bit for bit (eq. 6 in the tangent
    form ``cos(alpha theta) h + alpha sinc(alpha theta) / sinc(theta) u``, the fallback
    direction on antipodal rows), with fewer temporaries."""
    work = work_dtype(h, h_block, alpha)
    eps = tiny(work, eps)
    aw, bw = as_dtype(h, work), as_dtype(h_block, work)
    alpha_w = as_dtype(alpha, work) if isinstance(alpha, torch.Tensor) else alpha
    theta, _diff, _total, _dot, u, antipodal = _slerp_angle(aw, bw)
    any_antipodal = may_hold_any(antipodal)
    theta_safe = torch.where(antipodal, torch.zeros_like(theta), theta)
    turn = alpha_w * theta
    turn_safe = alpha_w * theta_safe if any_antipodal else turn  # the same values where no row is antipodal
    ratio = _times(torch.sinc(turn_safe / _pi()), alpha_w).div_(torch.sinc(theta_safe / _pi()))
    along = torch.cos(turn) * aw + torch.sin(turn) * _fallback(aw)[0] if any_antipodal else None
    s = u.mul_(ratio).add_(_times(turn.cos_(), aw))  # ratio u + cos(alpha theta) a
    if along is not None:
        s = torch.where(antipodal, along, s)
    norm = torch.linalg.vector_norm(s, dim=-1, keepdim=True)
    return as_dtype(s.div_(norm.clamp_min(eps)), h.dtype), norm, eps


class _SlerpNormalize(torch.autograd.Function):
    """``Norm(s)``, ``s = cos(alpha theta) a + R u`` with ``R = sin(alpha theta) / sin(theta)``
    (``a = h``, ``b = h_block``, ``u = b - (a . b) a``, ``theta = 2 atan2(|a - b|, |a + b|)``) or,
    on antipodal rows, ``s = cos(alpha theta) a + sin(alpha theta) f``. The backward pass::

        ds/dtheta = -alpha sin(alpha theta) a + dR/dtheta u,  dR/dtheta = (alpha cos(alpha theta) - R cos(theta)) / sin(theta)
        ds/dalpha = -theta sin(alpha theta) a + cos(alpha theta) / sinc(theta) u

    then through ``u``, ``f = w / |w|`` (``w = e - (a . e) a``) and the two norms of theta, with
    few temporaries (in-place where a tensor is the backward's own)."""  # noqa: E501  # the formula on one line

    @staticmethod
    def forward(ctx, h, h_block, alpha, eps):
        return _keep_for_backward(ctx, _slerp_values, h, h_block, alpha, eps)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        h, h_block, alpha_t, y, norm = ctx.saved_tensors
        work = norm.dtype
        alpha = torch.tensor(ctx.alpha, dtype=work, device=norm.device) if alpha_t is None else alpha_t.to(work)
        aw, bw = h.to(work), h_block.to(work)
        theta, diff, total, dot, u, antipodal = _slerp_angle(aw, bw)
        gs = norm_backward(grad, y, norm, ctx.eps)  # of s, before Norm
        turn = alpha * theta
        cos_turn = torch.cos(turn)
        sin_turn = turn.sin_()
        # per row; antipodal rows (theta_safe = 0) get the small angle's finite values
        theta_safe = torch.where(antipodal, 0.0, theta)
        sinc_theta = torch.sinc(theta_safe / _pi())
        small = theta_safe < _small_angle(work)
        inv_sin = torch.where(small, 0.0, 1 / (theta_safe * sinc_theta))
        ratio = (sin_turn * inv_sin).addcmul_(small.to(work), alpha)  # R; alpha below the small angle
        d_ratio = (alpha * cos_turn).addcmul_(ratio, torch.cos(theta_safe), value=-1).mul_(inv_sin)  # dR/dtheta
        gs_a = gs * aw
        gs_a_sin = gs_a * sin_turn
        gs_u = u.mul_(gs)
        buffer = _times(d_ratio, gs_u).addcmul_(gs_a_sin, alpha, value=-1)
        grad_theta = buffer.sum(dim=-1, keepdim=True)
        grad_alpha = None
        if ctx.needs_input_grad[2]:
            grad_alpha = (
                torch.mul(gs_u, cos_turn, out=reuse(buffer)).div_(sinc_theta).addcmul_(gs_a_sin, theta, value=-1)
            )
        grad_dot = -gs_a.mul_(ratio).sum(dim=-1, keepdim=True)  # of a . b in u
        grad_a = torch.mul(gs, torch.addcmul(cos_turn, ratio, dot, value=-1), out=reuse(gs_a)).addcmul_(bw, grad_dot)
        grad_b = torch.mul(gs, ratio, out=reuse(gs_u)).addcmul_(aw, grad_dot)
        if may_hold_any(antipodal):  # s = cos(alpha theta) a + sin(alpha theta) f
            f, e, a_axis, w_norm = _fallback(aw)
            gs_f_cos = gs * f * cos_turn
            grad_theta = torch.where(antipodal, (alpha * (gs_f_cos - gs_a_sin)).sum(dim=-1, keepdim=True), grad_theta)
            if grad_alpha is not None:
                grad_alpha = torch.where(antipodal, theta * (gs_f_cos - gs_a_sin), grad_alpha)
            grad_w = norm_backward(sin_turn * gs, f, w_norm, smallest_norm(work))  # f = w / |w|
            grad_a_along = cos_turn * gs - a_axis * grad_w - e * (aw * grad_w).sum(dim=-1, keepdim=True)
            grad_a = torch.where(antipodal, grad_a_along, grad_a)
            grad_b = torch.where(antipodal, 0.0, grad_b)
        # theta = 2 atan2(|a - b|, |a + b|); no gradient through a zero norm, as torch's norm
        scale = 2 * grad_theta / (diff.square() + total.square()).clamp_min(smallest_norm(work))
        along_diff = torch.where(diff > 0, total / torch.where(diff > 0, diff, 1.0), 0.0) * scale  # times a - b
        along_total = torch.where(total > 0, diff / torch.where(total > 0, total, 1.0), 0.0) * scale  # times a + b
        need_h, need_block = ctx.needs_input_grad[:2]
        grad_h = grad_block = None
        if need_h:
            grad_h = grad_a.addcmul_(aw, along_diff - along_total).addcmul_(bw, along_diff + along_total, value=-1)
            grad_h = grad_h.to(h.dtype)
        if need_block:
            grad_block = grad_b.addcmul_(aw, along_diff + along_total, value=-1).addcmul_(bw, along_diff - along_total)
            grad_block = grad_block.to(h_block.dtype)
        return grad_h, grad_block, None if grad_alpha is None else _alpha_grad(grad_alpha, alpha_t), None


def slerp_normalize(h: torch.Tensor, h_block: torch.Tensor, alpha) -> torch.Tensor:
    """The SLERP residual update (eq. 6, then ``Norm``), the values of
    :func:`spherenet.manifolds.slerp` (the same operations: bit for bit in float32 and float64).
    Keeps what :func:`lerp_normalize` keeps; the backward pass recomputes the angle, the tangent
    ``u``, the sines and, for antipodal rows, the fallback direction, and differentiates the
    tangent form ``cos(alpha theta) h + alpha sinc(alpha theta) / sinc(theta) u`` by hand (below
    a small angle the ratio is alpha and its derivative 0: finite at ``h == h_block``). Antipodal
    rows are handled inside the function, both branches joined by ``torch.where`` as in the
    definition (no synchronization on CUDA); on CPU the fallback branch is skipped when no row is
    antipodal. Without gradients, the definition itself (its shape checks included)."""
    if not torch.is_grad_enabled():
        return manifolds.slerp(h, h_block, alpha)
    return _SlerpNormalize.apply(h, h_block, alpha, None)
