"""The ``"torch"`` implementation of the SLERP residual update (eq. 6, then ``Norm``;
:mod:`spherenet.kernels.layer_ops` names it): one ``torch.autograd.Function`` keeping ``h``,
``h_block``, ``alpha``, the output and one norm per row, and recomputing the angle, the tangent
and the sines, with its backward pass written out (antipodal rows included). It follows
:mod:`spherenet.kernels.fused`'s conventions (smallest norm, float32 at least, output dtypes).

Equation numbers are those of Loshchilov et al., "nGPT: Normalized Transformer with
Representation Learning on the Hypersphere" (2024).
"""

from __future__ import annotations

import math

import torch
from torch.autograd.function import once_differentiable

from .. import manifolds
from ..manifolds.geodesic import ANTIPODAL_SIN, may_hold_any
from .fused import (
    _alpha_grad,
    _keep_for_backward,
    as_dtype,
    norm_backward,
    per_dtype,
    reuse,
    smallest_norm,
    tiny,
    work_dtype,
)

__all__ = ["slerp_normalize"]


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
