"""The residual updates (LERP, eq. 10, 11; SLERP, eq. 6; Riemannian, eq. 24-26; each then
``Norm``) as Triton kernels: the ``"triton"`` implementation of
:mod:`spherenet.kernels.layer_ops`, each update's kernels, ``torch.library.custom_op``, fake and
wrapper together.

A program takes a tile of whole rows (:func:`spherenet.kernels.triton_helpers.blocks`) and computes in
float32. The forward keeps what the fused functions keep (the inputs, the normalized output, one
norm per row); the backward kernel writes the gradients of ``h`` and ``h_block`` in one pass and
sums alpha's per-column gradient from per-program partial sums (at most
:data:`spherenet.kernels.triton_helpers.MAX_PROGRAMS` programs, each taking every ``n``-th block of
rows). SLERP's backward recomputes the angle, sines, tangent and fallback direction. The
references, antipodal rows and per-dimension ``alpha`` included, are :func:`spherenet.manifolds.lerp`,
:func:`~spherenet.manifolds.slerp` and :func:`~spherenet.manifolds.riemannian_update`. Float64
tensors and a Python float ``alpha`` are not sent here (the ops' ``takes`` in
:mod:`spherenet.kernels.layer_ops`).

Equation numbers are those of Loshchilov et al., "nGPT" (2024).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import triton_helpers as _triton
from .triton_helpers import TINY, blocks, check_device, contiguous_like, norm_grad, on_device_of, tile, warps

__all__ = ["lerp_normalize", "riemannian_normalize", "slerp_normalize"]


def _per_column(alpha: torch.Tensor, d: int) -> torch.Tensor:
    """``alpha`` of shape ``(d,)`` or ``(1,)`` as ``d`` contiguous float32 values."""
    return alpha.float().expand(d).contiguous() if alpha.numel() == 1 else alpha.float().reshape(d)


@triton.jit
def _backward_rows(block, G, H, B, Y, NORM, n_rows, d, BLOCK_D: tl.constexpr, ROWS: tl.constexpr):
    """What an update's backward kernel reads for block ``block`` of rows: its tile, then ``h``,
    ``h_block``, the saved output ``y`` and its gradient ``g`` (float32), and the saved row norms."""
    rows, cols, offs, mask = tile(block, n_rows, d, BLOCK_D, ROWS)
    h = tl.load(H + offs, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(B + offs, mask=mask, other=0.0).to(tl.float32)
    y = tl.load(Y + offs, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(G + offs, mask=mask, other=0.0).to(tl.float32)
    norm = tl.load(NORM + rows, mask=rows < n_rows, other=1.0)
    return rows, cols, offs, mask, h, b, y, g, norm


# ---------------------------------------------------------------- LERP (eq. 10, 11) and Riemannian (eq. 24-26)


@triton.jit
def _residual_fwd(H, B, ALPHA, Y, NORM, n_rows, d, tiny, RIEMANNIAN: tl.constexpr, BLOCK_D: tl.constexpr, ROWS: tl.constexpr):  # fmt: skip  # one signature line per kernel
    rows, cols, offs, mask = tile(tl.program_id(0), n_rows, d, BLOCK_D, ROWS)
    h = tl.load(H + offs, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(B + offs, mask=mask, other=0.0).to(tl.float32)
    alpha = tl.load(ALPHA + cols, mask=cols < d, other=0.0)[None, :]
    if RIEMANNIAN:  # h - alpha (h (h . b) - b), eq. 24-26
        s = h - alpha * (h * tl.sum(h * b, axis=1)[:, None] - b)
    else:  # h + alpha (b - h), eq. 10, 11
        s = h + alpha * (b - h)
    norm = tl.sqrt(tl.sum(s * s, axis=1))
    tl.store(Y + offs, (s / tl.maximum(norm, tiny)[:, None]).to(Y.dtype.element_ty), mask=mask)
    tl.store(NORM + rows, norm, mask=rows < n_rows)


@triton.jit
def _residual_bwd(G, H, B, ALPHA, Y, NORM, GH, GB, GALPHA, n_rows, d, tiny, RIEMANNIAN: tl.constexpr, BLOCK_D: tl.constexpr, ROWS: tl.constexpr):  # fmt: skip  # one signature line per kernel
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_D)
    alpha = tl.load(ALPHA + cols, mask=cols < d, other=0.0)[None, :]
    grad_alpha_sum = tl.zeros((BLOCK_D,), dtype=tl.float32)
    for block in range(pid, tl.cdiv(n_rows, ROWS), tl.num_programs(0)):  # every n-th block of rows
        rows, cols, offs, mask, h, b, y, g, norm = _backward_rows(block, G, H, B, Y, NORM, n_rows, d, BLOCK_D, ROWS)
        gs = norm_grad(g, y, norm, tiny)  # the gradient of the un-normalized step s
        if RIEMANNIAN:
            cos = tl.sum(h * b, axis=1)[:, None]
            alpha_gs = gs * alpha
            w = tl.sum(alpha_gs * h, axis=1)[:, None]
            grad_h = gs - alpha_gs * cos - b * w
            grad_b = alpha_gs - h * w
            grad_alpha = gs * (b - h * cos)
        else:
            grad_h = gs * (1.0 - alpha)
            grad_b = gs * alpha
            grad_alpha = gs * (b - h)
        tl.store(GH + offs, grad_h.to(GH.dtype.element_ty), mask=mask)
        tl.store(GB + offs, grad_b.to(GB.dtype.element_ty), mask=mask)
        grad_alpha_sum += tl.sum(grad_alpha, axis=0)
    tl.store(GALPHA + pid.to(tl.int64) * d + cols, grad_alpha_sum, mask=cols < d)  # this program's rows


@torch.library.custom_op("spherenet::residual_update", mutates_args=())
def _residual_op(h: torch.Tensor, h_block: torch.Tensor, alpha: torch.Tensor, riemannian: bool) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip  # one signature line per op
    d = h.shape[-1]
    h2, b2 = h.contiguous().view(-1, d), h_block.contiguous().view(-1, d)
    y, norm = torch.empty_like(h2), h2.new_empty(h2.shape[0], dtype=torch.float32)
    block_d, rows = blocks(d)
    with on_device_of(h2):
        _residual_fwd[(triton.cdiv(h2.shape[0], rows),)](h2, b2, alpha, y, norm, h2.shape[0], d, TINY, RIEMANNIAN=riemannian, BLOCK_D=block_d, ROWS=rows, num_warps=warps(block_d * rows))  # fmt: skip  # one launch
    return y.view(h.shape), norm


@torch.library.custom_op("spherenet::residual_update_backward", mutates_args=())
def _residual_backward_op(grad: torch.Tensor, h: torch.Tensor, h_block: torch.Tensor, alpha: torch.Tensor, y: torch.Tensor, norm: torch.Tensor, riemannian: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip  # one signature line per op
    d = h.shape[-1]
    h2, b2 = h.contiguous().view(-1, d), h_block.contiguous().view(-1, d)
    g2, y2 = grad.contiguous().view(-1, d), y.contiguous().view(-1, d)
    grad_h, grad_b = torch.empty_like(h2), torch.empty_like(b2)
    block_d, rows = blocks(d)
    programs = _triton.programs(triton.cdiv(h2.shape[0], rows))
    partial = h2.new_empty((programs, d), dtype=torch.float32)
    with on_device_of(h2):
        _residual_bwd[(programs,)](g2, h2, b2, alpha, y2, norm, grad_h, grad_b, partial, h2.shape[0], d, TINY, RIEMANNIAN=riemannian, BLOCK_D=block_d, ROWS=rows, num_warps=warps(block_d * rows))  # fmt: skip  # one launch
    return grad_h.view(h.shape), grad_b.view(h_block.shape), partial.sum(0)


@_residual_op.register_fake
def _(h, h_block, alpha, riemannian):
    return contiguous_like(h), h.new_empty(h.numel() // h.shape[-1], dtype=torch.float32)


@_residual_backward_op.register_fake
def _(grad, h, h_block, alpha, y, norm, riemannian):
    return contiguous_like(h), contiguous_like(h_block), alpha.new_empty(alpha.shape)


def _residual_setup(ctx, inputs, output):
    h, h_block, alpha, riemannian = inputs
    ctx.save_for_backward(h, h_block, alpha, *output)
    ctx.riemannian = riemannian


def _residual_grad(ctx, grad, _grad_norm):
    grads = _residual_backward_op(grad, *ctx.saved_tensors, ctx.riemannian)
    return *grads, None


_residual_op.register_autograd(_residual_grad, setup_context=_residual_setup)


def _residual(h: torch.Tensor, h_block: torch.Tensor, alpha, riemannian: bool) -> torch.Tensor:
    check_device("riemannian_normalize" if riemannian else "lerp_normalize", h, h_block)
    return _residual_op(h, h_block.to(h.dtype), _per_column(alpha, h.shape[-1]), riemannian)[0]


def lerp_normalize(h: torch.Tensor, h_block: torch.Tensor, alpha) -> torch.Tensor:
    """``Norm(h + alpha (h_block - h))`` (eq. 10, 11); reference :func:`spherenet.manifolds.lerp`.
    ``alpha``: a tensor of shape ``(d,)`` or ``(1,)``."""
    return _residual(h, h_block, alpha, False)


def riemannian_normalize(h: torch.Tensor, h_block: torch.Tensor, alpha) -> torch.Tensor:
    """``Norm(h - alpha (h (h · h_block) - h_block))`` (eq. 24-26); reference
    :func:`spherenet.manifolds.riemannian_update`."""
    return _residual(h, h_block, alpha, True)


# ---------------------------------------------------------------- SLERP (eq. 6)


# SLERP (eq. 6, then Norm). The angle is 2 atan2(‖a - b‖, ‖a + b‖) as in spherenet.manifolds.angle;
# Triton's core language has no atan2 (only its CUDA math library, which the interpreter lacks),
# so atan on [0, 1] is a series after the reduction atan(r) = pi/4 + atan((r - 1) / (r + 1)) for
# r > tan(pi/8): |z| <= 0.4143, and terms to z^21 leave an error below 1e-9.
# Globals a kernel reads must be tl.constexpr: the interpreter reads any Python float, the compiler
# for a GPU refuses the rest.
PI = tl.constexpr(3.141592653589793)
ANTIPODAL_SIN = tl.constexpr(1e-5)  # sin(theta) below which a and b are antipodal, as spherenet.manifolds in float32


@triton.jit
def _atan_unit(r):
    """atan(r) for 0 <= r <= 1."""
    big = r > 0.41421356237309503
    z = tl.where(big, (r - 1.0) / (r + 1.0), r)
    z2 = z * z
    series = 1.0 / 21.0
    series = -1.0 / 19.0 + z2 * series
    series = 1.0 / 17.0 + z2 * series
    series = -1.0 / 15.0 + z2 * series
    series = 1.0 / 13.0 + z2 * series
    series = -1.0 / 11.0 + z2 * series
    series = 1.0 / 9.0 + z2 * series
    series = -1.0 / 7.0 + z2 * series
    series = 1.0 / 5.0 + z2 * series
    series = -1.0 / 3.0 + z2 * series
    series = 1.0 + z2 * series
    return tl.where(big, 0.7853981633974483 + z * series, z * series)


@triton.jit
def _sinc(x):
    """sin(x) / x, 1 at 0."""
    small = tl.abs(x) < 1e-3
    safe = tl.where(small, 1.0, x)
    return tl.where(small, 1.0 - x * x / 6.0, tl.sin(safe) / safe)


@triton.jit
def _sinc_derivative(x):
    """d/dx sin(x) / x = (x cos x - sin x) / x^2, by its series below |x| = 0.5 (the direct form
    cancels there)."""
    small = tl.abs(x) < 0.5
    safe = tl.where(small, 1.0, x)
    x2 = x * x
    series = x * (-1.0 / 3.0 + x2 * (1.0 / 30.0 + x2 * (-1.0 / 840.0 + x2 * (1.0 / 45360.0 - x2 / 3991680.0))))
    return tl.where(small, series, (safe * tl.cos(safe) - tl.sin(safe)) / (safe * safe))


@triton.jit
def _slerp_parts(a, b, cols, mask, tiny):
    """Per row of the tile: the angle theta = angle(a, b) and the norms it comes from, a . b, the
    tangent u = b - (a . b) a, whether the row is antipodal, the index of the fallback axis, the
    fallback direction f and the norm of its unnormalized w (spherenet.manifolds.slerp)."""
    dot = tl.sum(a * b, axis=1)
    u = b - dot[:, None] * a
    sin_theta = tl.sqrt(tl.sum(u * u, axis=1))
    diff = tl.sqrt(tl.sum((a - b) * (a - b), axis=1))
    total = tl.sqrt(tl.sum((a + b) * (a + b), axis=1))
    ratio = tl.minimum(diff, total) / tl.maximum(tl.maximum(diff, total), tiny)
    half = _atan_unit(ratio)
    theta = 2.0 * tl.where(diff > total, PI / 2 - half, half)
    antipodal = (sin_theta < ANTIPODAL_SIN) & (theta > PI / 2)
    axis = tl.argmin(tl.where(mask, tl.abs(a), float("inf")), axis=1)
    e = tl.where(cols[None, :] == axis[:, None], 1.0, 0.0)
    a_axis = tl.sum(a * e, axis=1)
    w = e - a_axis[:, None] * a
    w_norm = tl.maximum(tl.sqrt(tl.sum(w * w, axis=1)), tiny)
    return theta, diff, total, dot, u, antipodal, e, a_axis, w / w_norm[:, None], w_norm


@triton.jit
def _slerp_fwd(H, B, ALPHA, Y, NORM, n_rows, d, tiny, BLOCK_D: tl.constexpr, ROWS: tl.constexpr):
    rows, cols, offs, mask = tile(tl.program_id(0), n_rows, d, BLOCK_D, ROWS)
    a = tl.load(H + offs, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(B + offs, mask=mask, other=0.0).to(tl.float32)
    alpha = tl.load(ALPHA + cols, mask=cols < d, other=0.0)[None, :]
    theta, _diff, _total, _dot, u, antipodal, _e, _a_axis, f, _w_norm = _slerp_parts(a, b, cols, mask, tiny)
    theta_safe = tl.where(antipodal, 0.0, theta)[:, None]  # the regular branch's angle
    turn = alpha * theta[:, None]
    regular = tl.cos(turn) * a + (alpha * _sinc(alpha * theta_safe) / _sinc(theta_safe)) * u
    along = tl.cos(turn) * a + tl.sin(turn) * f
    s = tl.where(mask, tl.where(antipodal[:, None], along, regular), 0.0)
    norm = tl.sqrt(tl.sum(s * s, axis=1))
    tl.store(Y + offs, (s / tl.maximum(norm, tiny)[:, None]).to(Y.dtype.element_ty), mask=mask)
    tl.store(NORM + rows, norm, mask=rows < n_rows)


@triton.jit
def _slerp_bwd(G, H, B, ALPHA, Y, NORM, GH, GB, GALPHA, n_rows, d, tiny, BLOCK_D: tl.constexpr, ROWS: tl.constexpr):  # fmt: skip  # one signature line per kernel
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_D)
    alpha = tl.load(ALPHA + cols, mask=cols < d, other=0.0)[None, :]
    grad_alpha_sum = tl.zeros((BLOCK_D,), dtype=tl.float32)
    for block in range(pid, tl.cdiv(n_rows, ROWS), tl.num_programs(0)):  # every n-th block of rows
        rows, cols, offs, mask, a, b, y, g, norm = _backward_rows(block, G, H, B, Y, NORM, n_rows, d, BLOCK_D, ROWS)
        theta, diff, total, dot, u, antipodal, e, a_axis, f, w_norm = _slerp_parts(a, b, cols, mask, tiny)
        gs = tl.where(mask, norm_grad(g, y, norm, tiny), 0.0)  # the gradient of the unnormalized step
        anti = antipodal[:, None]
        theta_safe = tl.where(antipodal, 0.0, theta)[:, None]
        th = theta[:, None]
        turn = alpha * th
        cos_turn, sin_turn = tl.cos(turn), tl.sin(turn)
        sinc_theta = _sinc(theta_safe)
        sinc_turn = _sinc(alpha * theta_safe)
        ratio = alpha * sinc_turn / sinc_theta
        # d step / d theta and d step / d alpha, per element, in each branch
        d_ratio_d_theta = alpha * (alpha * _sinc_derivative(alpha * theta_safe) * sinc_theta - sinc_turn * _sinc_derivative(theta_safe)) / (sinc_theta * sinc_theta)  # fmt: skip  # the quotient rule in one line
        d_theta = tl.where(
            anti, -alpha * sin_turn * a + alpha * cos_turn * f, -alpha * sin_turn * a + d_ratio_d_theta * u
        )
        d_alpha = tl.where(anti, th * (cos_turn * f - sin_turn * a), -th * sin_turn * a + cos_turn / sinc_theta * u)
        grad_theta = tl.sum(gs * d_theta, axis=1)
        # the regular branch through u = b - (a . b) a, the fallback one through f = w / |w|, w = e - a_k a
        grad_u = tl.where(anti, 0.0, ratio * gs)
        grad_f = tl.where(anti, sin_turn * gs, 0.0)
        grad_w = (grad_f - f * tl.sum(f * grad_f, axis=1)[:, None]) / w_norm[:, None]
        grad_dot = -tl.sum(grad_u * a, axis=1)[:, None]
        grad_a = cos_turn * gs - dot[:, None] * grad_u + grad_dot * b - a_axis[:, None] * grad_w - e * tl.sum(a * grad_w, axis=1)[:, None]  # fmt: skip  # every path to a, in the order above
        grad_b = grad_u + grad_dot * a
        # theta = 2 atan2(|a - b|, |a + b|)
        scale = 2.0 * grad_theta / tl.maximum(diff * diff + total * total, tiny)
        along_diff = tl.where(diff > 0, total / tl.where(diff > 0, diff, 1.0), 0.0)[:, None] * scale[:, None] * (a - b)
        along_total = (
            tl.where(total > 0, diff / tl.where(total > 0, total, 1.0), 0.0)[:, None] * scale[:, None] * (a + b)
        )
        grad_a += along_diff - along_total
        grad_b += -along_diff - along_total
        tl.store(GH + offs, grad_a.to(GH.dtype.element_ty), mask=mask)
        tl.store(GB + offs, grad_b.to(GB.dtype.element_ty), mask=mask)
        grad_alpha_sum += tl.sum(tl.where(mask, gs * d_alpha, 0.0), axis=0)
    tl.store(GALPHA + pid.to(tl.int64) * d + cols, grad_alpha_sum, mask=cols < d)


# The backward keeps about 20 values per element live: smaller tiles, and 8 elements a thread.
BACKWARD_ELEMENTS = 1024
BACKWARD_WARP_ELEMENTS = 256


def _slerp_backward_blocks(d: int) -> tuple[int, int, int]:
    """(BLOCK_D, ROWS, warps) of the backward kernel."""
    block_d, rows = blocks(d, BACKWARD_ELEMENTS)
    return block_d, rows, warps(block_d * rows, BACKWARD_WARP_ELEMENTS)


@torch.library.custom_op("spherenet::slerp_update", mutates_args=())
def _slerp_op(h: torch.Tensor, h_block: torch.Tensor, alpha: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    d = h.shape[-1]
    h2, b2 = h.contiguous().view(-1, d), h_block.contiguous().view(-1, d)
    y, norm = torch.empty_like(h2), h2.new_empty(h2.shape[0], dtype=torch.float32)
    block_d, rows = blocks(d)
    with on_device_of(h2):
        _slerp_fwd[(triton.cdiv(h2.shape[0], rows),)](
            h2, b2, alpha, y, norm, h2.shape[0], d, TINY, BLOCK_D=block_d, ROWS=rows, num_warps=warps(block_d * rows)
        )
    return y.view(h.shape), norm


@torch.library.custom_op("spherenet::slerp_update_backward", mutates_args=())
def _slerp_backward_op(grad: torch.Tensor, h: torch.Tensor, h_block: torch.Tensor, alpha: torch.Tensor, y: torch.Tensor, norm: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip  # one signature line per op
    d = h.shape[-1]
    h2, b2 = h.contiguous().view(-1, d), h_block.contiguous().view(-1, d)
    g2, y2 = grad.contiguous().view(-1, d), y.contiguous().view(-1, d)
    grad_h, grad_b = torch.empty_like(h2), torch.empty_like(b2)
    block_d, rows, n_warps = _slerp_backward_blocks(d)
    programs = _triton.programs(triton.cdiv(h2.shape[0], rows))
    partial = h2.new_empty((programs, d), dtype=torch.float32)
    with on_device_of(g2):
        _slerp_bwd[(programs,)](g2, h2, b2, alpha, y2, norm, grad_h, grad_b, partial, h2.shape[0], d, TINY, BLOCK_D=block_d, ROWS=rows, num_warps=n_warps)  # fmt: skip  # one launch
    return grad_h.view(h.shape), grad_b.view(h_block.shape), partial.sum(0)


@_slerp_op.register_fake
def _(h, h_block, alpha):
    return contiguous_like(h), h.new_empty(h.numel() // h.shape[-1], dtype=torch.float32)


@_slerp_backward_op.register_fake
def _(grad, h, h_block, alpha, y, norm):
    return contiguous_like(h), contiguous_like(h_block), alpha.new_empty(alpha.shape)


def _slerp_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs, *output)


def _slerp_grad(ctx, grad, _grad_norm):
    return _slerp_backward_op(grad, *ctx.saved_tensors)


_slerp_op.register_autograd(_slerp_grad, setup_context=_slerp_setup)


def slerp_normalize(h: torch.Tensor, h_block: torch.Tensor, alpha) -> torch.Tensor:
    """The SLERP residual update (eq. 6, then ``Norm``) with per-dimension ``alpha``, antipodal
    rows included; reference :func:`spherenet.manifolds.slerp`. Keeps what :func:`lerp_normalize` keeps and recomputes
    the angle, sines and tangent in the backward pass."""
    check_device("slerp_normalize", h, h_block)
    return _slerp_op(h, h_block.to(h.dtype), _per_column(alpha, h.shape[-1]))[0]
