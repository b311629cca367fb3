"""Triton kernels for nGPT's element-wise operations: the ``"triton"`` implementation of
:mod:`spherenet.layers.ops`.

Every operation is a row-wise map over the last dimension. A program takes a block of rows
(several for short rows such as a q/k head's ``d_k``), loads them once, computes in float32 and
stores the result in the output's dtype; the backward kernel reads what the forward saved and
writes the input gradients in one pass. Each op saves what :mod:`spherenet.layers.fused` saves:
the normalized output, one float32 norm per row and inputs the neighbouring layers keep anyway.
Per-column parameter gradients (alpha's, s_qk's) are summed from per-program partial sums.

The plain torch reference of each kernel is the function of the same name in
:mod:`spherenet.layers.fused` (values) and :mod:`spherenet.manifolds` (definitions); the tests
compare all three. Float64 tensors, which the kernels do not compute in, run the ``fused``
functions. Each kernel is a ``torch.library.custom_op`` with a fake implementation and an
autograd formula, so ``torch.compile(fullgraph=True)`` traces through it as one opaque node.
On CPU tensors the kernels run only under Triton's interpreter (``TRITON_INTERPRET=1``, set
before Triton is imported), which is how the tests run them.

Equation numbers are those of Loshchilov et al., "nGPT" (2024).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from . import fused

__all__ = ["normalize", "scaled_normalize", "lerp_normalize", "riemannian_normalize", "slerp_normalize", "swiglu"]

EPS = 1e-30  # ‖x‖ is clamped at this in float32, as spherenet.manifolds does
ELEMENTS_PER_PROGRAM = 4096


def _blocks(d: int) -> tuple[int, int]:
    """(BLOCK_D, ROWS): the row padded to a power of two, and rows per program."""
    block_d = triton.next_power_of_2(d)
    return block_d, max(1, min(64, ELEMENTS_PER_PROGRAM // block_d))


def _check_device(*tensors: torch.Tensor) -> None:
    if any(t.device.type == "cpu" for t in tensors) and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError(
            "the Triton kernels need CUDA tensors, or TRITON_INTERPRET=1 (set before Triton is imported) "
            "to run on CPU tensors"
        )


# ---------------------------------------------------------------- kernels


@triton.jit
def _tile(pid, n_rows, d, BLOCK_D: tl.constexpr, ROWS: tl.constexpr):
    rows = (pid * ROWS + tl.arange(0, ROWS)).to(tl.int64)
    cols = tl.arange(0, BLOCK_D)
    mask = (rows[:, None] < n_rows) & (cols[None, :] < d)
    return rows, cols, rows[:, None] * d + cols[None, :], mask


@triton.jit
def _normalize_fwd(X, Y, NORM, n_rows, d, eps, BLOCK_D: tl.constexpr, ROWS: tl.constexpr):
    rows, cols, offs, mask = _tile(tl.program_id(0), n_rows, d, BLOCK_D, ROWS)
    x = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
    norm = tl.sqrt(tl.sum(x * x, axis=1))
    tl.store(Y + offs, (x / tl.maximum(norm, eps)[:, None]).to(Y.dtype.element_ty), mask=mask)
    tl.store(NORM + rows, norm, mask=rows < n_rows)


@triton.jit
def _norm_grad(g, y, norm, eps):
    """Gradient of x / max(‖x‖, eps) from the output y: (g - y (y . g)) / ‖x‖ (g / eps below eps)."""
    dot = tl.where(norm >= eps, tl.sum(y * g, axis=1), 0.0)
    return (g - y * dot[:, None]) / tl.maximum(norm, eps)[:, None]


@triton.jit
def _normalize_bwd(G, Y, NORM, GX, n_rows, d, eps, BLOCK_D: tl.constexpr, ROWS: tl.constexpr):
    rows, cols, offs, mask = _tile(tl.program_id(0), n_rows, d, BLOCK_D, ROWS)
    g = tl.load(G + offs, mask=mask, other=0.0).to(tl.float32)
    y = tl.load(Y + offs, mask=mask, other=0.0).to(tl.float32)
    norm = tl.load(NORM + rows, mask=rows < n_rows, other=1.0)
    tl.store(GX + offs, _norm_grad(g, y, norm, eps).to(GX.dtype.element_ty), mask=mask)


@triton.jit
def _scaled_normalize_fwd(
    X, SCALE, Y, OUT, NORM, n_rows, d, tokens, heads, eps, BLOCK_D: tl.constexpr, ROWS: tl.constexpr
):
    rows, cols, offs, mask = _tile(tl.program_id(0), n_rows, d, BLOCK_D, ROWS)
    x = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
    norm = tl.sqrt(tl.sum(x * x, axis=1))
    y = (x / tl.maximum(norm, eps)[:, None]).to(Y.dtype.element_ty)  # rounded as it is saved
    head = (rows // tokens) % heads  # rows are (batch, head, token)
    scale = tl.load(SCALE + head[:, None] * d + cols[None, :], mask=mask, other=0.0)
    tl.store(Y + offs, y, mask=mask)
    tl.store(OUT + offs, (y.to(tl.float32) * scale).to(OUT.dtype.element_ty), mask=mask)
    tl.store(NORM + rows, norm, mask=rows < n_rows)


@triton.jit
def _scaled_normalize_bwd(
    G, Y, NORM, SCALE, GX, n_rows, d, tokens, heads, eps, BLOCK_D: tl.constexpr, ROWS: tl.constexpr
):
    rows, cols, offs, mask = _tile(tl.program_id(0), n_rows, d, BLOCK_D, ROWS)
    head = (rows // tokens) % heads
    scale = tl.load(SCALE + head[:, None] * d + cols[None, :], mask=mask, other=0.0)
    g = tl.load(G + offs, mask=mask, other=0.0).to(tl.float32) * scale
    y = tl.load(Y + offs, mask=mask, other=0.0).to(tl.float32)
    norm = tl.load(NORM + rows, mask=rows < n_rows, other=1.0)
    tl.store(GX + offs, _norm_grad(g, y, norm, eps).to(GX.dtype.element_ty), mask=mask)


@triton.jit
def _residual_fwd(H, B, ALPHA, Y, NORM, n_rows, d, eps, RIEMANNIAN: tl.constexpr, BLOCK_D: tl.constexpr, ROWS: tl.constexpr):  # fmt: skip  # one signature line per kernel
    rows, cols, offs, mask = _tile(tl.program_id(0), n_rows, d, BLOCK_D, ROWS)
    h = tl.load(H + offs, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(B + offs, mask=mask, other=0.0).to(tl.float32)
    alpha = tl.load(ALPHA + cols, mask=cols < d, other=0.0)[None, :]
    if RIEMANNIAN:  # h - alpha (h (h . b) - b), eq. 24-26
        s = h - alpha * (h * tl.sum(h * b, axis=1)[:, None] - b)
    else:  # h + alpha (b - h), eq. 10, 11
        s = h + alpha * (b - h)
    norm = tl.sqrt(tl.sum(s * s, axis=1))
    tl.store(Y + offs, (s / tl.maximum(norm, eps)[:, None]).to(Y.dtype.element_ty), mask=mask)
    tl.store(NORM + rows, norm, mask=rows < n_rows)


@triton.jit
def _residual_bwd(G, H, B, ALPHA, Y, NORM, GH, GB, GALPHA, n_rows, d, eps, RIEMANNIAN: tl.constexpr, BLOCK_D: tl.constexpr, ROWS: tl.constexpr):  # fmt: skip  # one signature line per kernel
    pid = tl.program_id(0)
    rows, cols, offs, mask = _tile(pid, n_rows, d, BLOCK_D, ROWS)
    h = tl.load(H + offs, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(B + offs, mask=mask, other=0.0).to(tl.float32)
    y = tl.load(Y + offs, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(G + offs, mask=mask, other=0.0).to(tl.float32)
    norm = tl.load(NORM + rows, mask=rows < n_rows, other=1.0)
    alpha = tl.load(ALPHA + cols, mask=cols < d, other=0.0)[None, :]
    gs = _norm_grad(g, y, norm, eps)  # the gradient of the un-normalized step s
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
    tl.store(GALPHA + pid * d + cols, tl.sum(grad_alpha, axis=0), mask=cols < d)  # this program's rows


# SLERP (eq. 6, then Norm). The angle is 2 atan2(‖a - b‖, ‖a + b‖) as in spherenet.manifolds.angle;
# Triton's core language has no atan2 (only its CUDA math library, which the interpreter lacks),
# so atan on [0, 1] is a series after the reduction atan(r) = pi/4 + atan((r - 1) / (r + 1)) for
# r > tan(pi/8): |z| <= 0.4143, and terms to z^21 leave an error below 1e-9.
PI = 3.141592653589793
ANTIPODAL_SIN = 1e-5  # sin(theta) below which a and b are antipodal, as spherenet.manifolds in float32


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
def _slerp_parts(a, b, cols, mask, eps):
    """Per row of the tile: the angle theta = angle(a, b) and the norms it comes from, a . b, the
    tangent u = b - (a . b) a, whether the row is antipodal, the index of the fallback axis, the
    fallback direction f and the norm of its unnormalized w (spherenet.manifolds.slerp)."""
    dot = tl.sum(a * b, axis=1)
    u = b - dot[:, None] * a
    sin_theta = tl.sqrt(tl.sum(u * u, axis=1))
    diff = tl.sqrt(tl.sum((a - b) * (a - b), axis=1))
    total = tl.sqrt(tl.sum((a + b) * (a + b), axis=1))
    ratio = tl.minimum(diff, total) / tl.maximum(tl.maximum(diff, total), eps)
    half = _atan_unit(ratio)
    theta = 2.0 * tl.where(diff > total, PI / 2 - half, half)
    antipodal = (sin_theta < ANTIPODAL_SIN) & (theta > PI / 2)
    axis = tl.argmin(tl.where(mask, tl.abs(a), float("inf")), axis=1)
    e = tl.where(cols[None, :] == axis[:, None], 1.0, 0.0)
    a_axis = tl.sum(a * e, axis=1)
    w = e - a_axis[:, None] * a
    w_norm = tl.maximum(tl.sqrt(tl.sum(w * w, axis=1)), eps)
    return theta, diff, total, dot, u, antipodal, e, a_axis, w / w_norm[:, None], w_norm


@triton.jit
def _slerp_fwd(H, B, ALPHA, Y, NORM, n_rows, d, eps, BLOCK_D: tl.constexpr, ROWS: tl.constexpr):
    rows, cols, offs, mask = _tile(tl.program_id(0), n_rows, d, BLOCK_D, ROWS)
    a = tl.load(H + offs, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(B + offs, mask=mask, other=0.0).to(tl.float32)
    alpha = tl.load(ALPHA + cols, mask=cols < d, other=0.0)[None, :]
    theta, _diff, _total, _dot, u, antipodal, _e, _a_axis, f, _w_norm = _slerp_parts(a, b, cols, mask, eps)
    theta_safe = tl.where(antipodal, 0.0, theta)[:, None]  # the regular branch's angle
    turn = alpha * theta[:, None]
    regular = tl.cos(turn) * a + (alpha * _sinc(alpha * theta_safe) / _sinc(theta_safe)) * u
    along = tl.cos(turn) * a + tl.sin(turn) * f
    s = tl.where(mask, tl.where(antipodal[:, None], along, regular), 0.0)
    norm = tl.sqrt(tl.sum(s * s, axis=1))
    tl.store(Y + offs, (s / tl.maximum(norm, eps)[:, None]).to(Y.dtype.element_ty), mask=mask)
    tl.store(NORM + rows, norm, mask=rows < n_rows)


@triton.jit
def _slerp_bwd(G, H, B, ALPHA, Y, NORM, GH, GB, GALPHA, n_rows, d, eps, BLOCK_D: tl.constexpr, ROWS: tl.constexpr):  # fmt: skip  # one signature line per kernel
    pid = tl.program_id(0)
    rows, cols, offs, mask = _tile(pid, n_rows, d, BLOCK_D, ROWS)
    a = tl.load(H + offs, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(B + offs, mask=mask, other=0.0).to(tl.float32)
    y = tl.load(Y + offs, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(G + offs, mask=mask, other=0.0).to(tl.float32)
    norm = tl.load(NORM + rows, mask=rows < n_rows, other=1.0)
    alpha = tl.load(ALPHA + cols, mask=cols < d, other=0.0)[None, :]
    theta, diff, total, dot, u, antipodal, e, a_axis, f, w_norm = _slerp_parts(a, b, cols, mask, eps)
    gs = tl.where(mask, _norm_grad(g, y, norm, eps), 0.0)  # the gradient of the unnormalized step
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
    d_theta = tl.where(anti, -alpha * sin_turn * a + alpha * cos_turn * f, -alpha * sin_turn * a + d_ratio_d_theta * u)
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
    scale = 2.0 * grad_theta / tl.maximum(diff * diff + total * total, eps)
    along_diff = tl.where(diff > 0, total / tl.where(diff > 0, diff, 1.0), 0.0)[:, None] * scale[:, None] * (a - b)
    along_total = tl.where(total > 0, diff / tl.where(total > 0, total, 1.0), 0.0)[:, None] * scale[:, None] * (a + b)
    grad_a += along_diff - along_total
    grad_b += -along_diff - along_total
    tl.store(GH + offs, grad_a.to(GH.dtype.element_ty), mask=mask)
    tl.store(GB + offs, grad_b.to(GB.dtype.element_ty), mask=mask)
    tl.store(GALPHA + pid * d + cols, tl.sum(tl.where(mask, gs * d_alpha, 0.0), axis=0), mask=cols < d)


@triton.jit
def _swiglu_fwd(U, V, OUT, n, BLOCK: tl.constexpr):
    offs = (tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)).to(tl.int64)
    mask = offs < n
    u = tl.load(U + offs, mask=mask, other=0.0).to(tl.float32)
    v = tl.load(V + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(OUT + offs, (u * v * tl.sigmoid(v)).to(OUT.dtype.element_ty), mask=mask)


@triton.jit
def _swiglu_bwd(G, U, V, GU, GV, n, BLOCK: tl.constexpr):
    offs = (tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)).to(tl.int64)
    mask = offs < n
    g = tl.load(G + offs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(U + offs, mask=mask, other=0.0).to(tl.float32)
    v = tl.load(V + offs, mask=mask, other=0.0).to(tl.float32)
    sig = tl.sigmoid(v)
    tl.store(GU + offs, (g * v * sig).to(GU.dtype.element_ty), mask=mask)
    tl.store(GV + offs, (g * u * sig * (1.0 + v * (1.0 - sig))).to(GV.dtype.element_ty), mask=mask)


# ---------------------------------------------------------------- custom ops


def _grid(n_rows: int, rows_per_program: int) -> tuple[int]:
    return (triton.cdiv(n_rows, rows_per_program),)


@torch.library.custom_op("spherenet::normalize", mutates_args=())
def _normalize_op(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    x2 = x.contiguous().view(-1, x.shape[-1])
    y, norm = torch.empty_like(x2), x2.new_empty(x2.shape[0], dtype=torch.float32)
    block_d, rows = _blocks(x2.shape[1])
    _normalize_fwd[_grid(x2.shape[0], rows)](x2, y, norm, x2.shape[0], x2.shape[1], EPS, BLOCK_D=block_d, ROWS=rows)
    return y.view(x.shape), norm


@torch.library.custom_op("spherenet::normalize_backward", mutates_args=())
def _normalize_backward_op(grad: torch.Tensor, y: torch.Tensor, norm: torch.Tensor) -> torch.Tensor:
    g2, y2 = grad.contiguous().view(-1, y.shape[-1]), y.contiguous().view(-1, y.shape[-1])
    gx = torch.empty_like(y2)
    block_d, rows = _blocks(y2.shape[1])
    _normalize_bwd[_grid(y2.shape[0], rows)](g2, y2, norm, gx, y2.shape[0], y2.shape[1], EPS, BLOCK_D=block_d, ROWS=rows)  # fmt: skip  # one launch
    return gx.view(y.shape)


@_normalize_op.register_fake
def _(x):
    return torch.empty_like(x), x.new_empty(x.numel() // x.shape[-1], dtype=torch.float32)


@_normalize_backward_op.register_fake
def _(grad, y, norm):
    return torch.empty_like(y)


def _normalize_setup(ctx, inputs, output):
    ctx.save_for_backward(*output)


def _normalize_grad(ctx, grad, _grad_norm):
    return _normalize_backward_op(grad, *ctx.saved_tensors)


_normalize_op.register_autograd(_normalize_grad, setup_context=_normalize_setup)


def normalize(x: torch.Tensor) -> torch.Tensor:
    """``Norm(x)`` over the last dimension (Table 1); reference :func:`spherenet.layers.fused.normalize`."""
    if x.dtype == torch.float64:
        return fused.normalize(x)
    _check_device(x)
    return _normalize_op(x)[0]


@torch.library.custom_op("spherenet::scaled_normalize", mutates_args=())
def _scaled_normalize_op(x: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    _, heads, tokens, d = x.shape
    x2 = x.contiguous().view(-1, d)
    y = torch.empty_like(x2)
    out = torch.empty(x2.shape, dtype=torch.promote_types(x.dtype, scale.dtype), device=x.device)
    norm = x2.new_empty(x2.shape[0], dtype=torch.float32)
    block_d, rows = _blocks(d)
    _scaled_normalize_fwd[_grid(x2.shape[0], rows)](x2, scale, y, out, norm, x2.shape[0], d, tokens, heads, EPS, BLOCK_D=block_d, ROWS=rows)  # fmt: skip  # one launch
    return out.view(x.shape), y.view(x.shape), norm


@torch.library.custom_op("spherenet::scaled_normalize_backward", mutates_args=())
def _scaled_normalize_backward_op(
    grad: torch.Tensor, y: torch.Tensor, norm: torch.Tensor, scale: torch.Tensor
) -> torch.Tensor:
    _, heads, tokens, d = y.shape
    g2, y2 = grad.contiguous().view(-1, d), y.contiguous().view(-1, d)
    gx = torch.empty_like(y2)
    block_d, rows = _blocks(d)
    _scaled_normalize_bwd[_grid(y2.shape[0], rows)](g2, y2, norm, scale, gx, y2.shape[0], d, tokens, heads, EPS, BLOCK_D=block_d, ROWS=rows)  # fmt: skip  # one launch
    return gx.view(y.shape)


@_scaled_normalize_op.register_fake
def _(x, scale):
    out = torch.empty(x.shape, dtype=torch.promote_types(x.dtype, scale.dtype), device=x.device)
    return out, torch.empty_like(x), x.new_empty(x.numel() // x.shape[-1], dtype=torch.float32)


@_scaled_normalize_backward_op.register_fake
def _(grad, y, norm, scale):
    return torch.empty_like(y)


def _scaled_normalize_setup(ctx, inputs, output):
    ctx.save_for_backward(output[1], output[2], inputs[1])


def _scaled_normalize_grad(ctx, grad, _grad_y, _grad_norm):
    y, norm, scale = ctx.saved_tensors
    grad_scale = (grad * y).sum(dim=(0, 2)).to(scale.dtype)  # over batch and tokens: (heads, d)
    return _scaled_normalize_backward_op(grad, y, norm, scale), grad_scale


_scaled_normalize_op.register_autograd(_scaled_normalize_grad, setup_context=_scaled_normalize_setup)


def scaled_normalize(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``Norm(x) * s_qk`` for q or k of shape ``(B, H, T, d_k)`` with ``s_qk`` of shape
    ``(H, 1, d_k)`` or ``(1,)`` (eq. 15, 16); reference :func:`spherenet.layers.fused.scaled_normalize`."""
    if x.dtype == torch.float64 or x.ndim != 4:
        return fused.scaled_normalize(x, scale)
    _check_device(x)
    heads, d = x.shape[1], x.shape[3]
    per_head = scale.reshape(heads, d) if scale.numel() == heads * d else scale.reshape(1, 1).expand(heads, d)
    out = _scaled_normalize_op(x, per_head.float().contiguous())[0]
    return out.to(torch.promote_types(x.dtype, scale.dtype))


@torch.library.custom_op("spherenet::residual_update", mutates_args=())
def _residual_op(h: torch.Tensor, h_block: torch.Tensor, alpha: torch.Tensor, riemannian: bool) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip  # one signature line per op
    d = h.shape[-1]
    h2, b2 = h.contiguous().view(-1, d), h_block.contiguous().view(-1, d)
    y, norm = torch.empty_like(h2), h2.new_empty(h2.shape[0], dtype=torch.float32)
    block_d, rows = _blocks(d)
    _residual_fwd[_grid(h2.shape[0], rows)](h2, b2, alpha, y, norm, h2.shape[0], d, EPS, RIEMANNIAN=riemannian, BLOCK_D=block_d, ROWS=rows)  # fmt: skip  # one launch
    return y.view(h.shape), norm


@torch.library.custom_op("spherenet::residual_update_backward", mutates_args=())
def _residual_backward_op(grad: torch.Tensor, h: torch.Tensor, h_block: torch.Tensor, alpha: torch.Tensor, y: torch.Tensor, norm: torch.Tensor, riemannian: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip  # one signature line per op
    d = h.shape[-1]
    h2, b2 = h.contiguous().view(-1, d), h_block.contiguous().view(-1, d)
    g2, y2 = grad.contiguous().view(-1, d), y.contiguous().view(-1, d)
    grad_h, grad_b = torch.empty_like(h2), torch.empty_like(b2)
    block_d, rows = _blocks(d)
    grid = _grid(h2.shape[0], rows)
    partial = h2.new_empty((grid[0], d), dtype=torch.float32)
    _residual_bwd[grid](g2, h2, b2, alpha, y2, norm, grad_h, grad_b, partial, h2.shape[0], d, EPS, RIEMANNIAN=riemannian, BLOCK_D=block_d, ROWS=rows)  # fmt: skip  # one launch
    return grad_h.view(h.shape), grad_b.view(h_block.shape), partial.sum(0)


@_residual_op.register_fake
def _(h, h_block, alpha, riemannian):
    return torch.empty_like(h), h.new_empty(h.numel() // h.shape[-1], dtype=torch.float32)


@_residual_backward_op.register_fake
def _(grad, h, h_block, alpha, y, norm, riemannian):
    return torch.empty_like(h), torch.empty_like(h_block), alpha.new_empty(alpha.shape)


def _residual_setup(ctx, inputs, output):
    h, h_block, alpha, riemannian = inputs
    ctx.save_for_backward(h, h_block, alpha, *output)
    ctx.riemannian = riemannian


def _residual_grad(ctx, grad, _grad_norm):
    grads = _residual_backward_op(grad, *ctx.saved_tensors, ctx.riemannian)
    return *grads, None


_residual_op.register_autograd(_residual_grad, setup_context=_residual_setup)


def _residual(h: torch.Tensor, h_block: torch.Tensor, alpha, riemannian: bool, reference) -> torch.Tensor:
    if torch.float64 in (h.dtype, h_block.dtype) or not isinstance(alpha, torch.Tensor) or alpha.dtype == torch.float64:
        return reference(h, h_block, alpha)
    _check_device(h, h_block)
    d = h.shape[-1]
    per_column = alpha.float().expand(d).contiguous() if alpha.numel() == 1 else alpha.float().reshape(d)
    return _residual_op(h, h_block.to(h.dtype), per_column, riemannian)[0]


def lerp_normalize(h: torch.Tensor, h_block: torch.Tensor, alpha) -> torch.Tensor:
    """``Norm(h + alpha (h_block - h))`` (eq. 10, 11); reference :func:`spherenet.layers.fused.lerp_normalize`.
    ``alpha``: a tensor of shape ``(d,)`` or ``(1,)``."""
    return _residual(h, h_block, alpha, False, fused.lerp_normalize)


def riemannian_normalize(h: torch.Tensor, h_block: torch.Tensor, alpha) -> torch.Tensor:
    """``Norm(h - alpha (h (h · h_block) - h_block))`` (eq. 24-26); reference
    :func:`spherenet.layers.fused.riemannian_normalize`."""
    return _residual(h, h_block, alpha, True, fused.riemannian_normalize)


@torch.library.custom_op("spherenet::slerp_update", mutates_args=())
def _slerp_op(h: torch.Tensor, h_block: torch.Tensor, alpha: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    d = h.shape[-1]
    h2, b2 = h.contiguous().view(-1, d), h_block.contiguous().view(-1, d)
    y, norm = torch.empty_like(h2), h2.new_empty(h2.shape[0], dtype=torch.float32)
    block_d, rows = _blocks(d)
    _slerp_fwd[_grid(h2.shape[0], rows)](h2, b2, alpha, y, norm, h2.shape[0], d, EPS, BLOCK_D=block_d, ROWS=rows)
    return y.view(h.shape), norm


@torch.library.custom_op("spherenet::slerp_update_backward", mutates_args=())
def _slerp_backward_op(grad: torch.Tensor, h: torch.Tensor, h_block: torch.Tensor, alpha: torch.Tensor, y: torch.Tensor, norm: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip  # one signature line per op
    d = h.shape[-1]
    h2, b2 = h.contiguous().view(-1, d), h_block.contiguous().view(-1, d)
    g2, y2 = grad.contiguous().view(-1, d), y.contiguous().view(-1, d)
    grad_h, grad_b = torch.empty_like(h2), torch.empty_like(b2)
    block_d, rows = _blocks(d)
    grid = _grid(h2.shape[0], rows)
    partial = h2.new_empty((grid[0], d), dtype=torch.float32)
    _slerp_bwd[grid](g2, h2, b2, alpha, y2, norm, grad_h, grad_b, partial, h2.shape[0], d, EPS, BLOCK_D=block_d, ROWS=rows)  # fmt: skip  # one launch
    return grad_h.view(h.shape), grad_b.view(h_block.shape), partial.sum(0)


@_slerp_op.register_fake
def _(h, h_block, alpha):
    return torch.empty_like(h), h.new_empty(h.numel() // h.shape[-1], dtype=torch.float32)


@_slerp_backward_op.register_fake
def _(grad, h, h_block, alpha, y, norm):
    return torch.empty_like(h), torch.empty_like(h_block), alpha.new_empty(alpha.shape)


def _slerp_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs, *output)


def _slerp_grad(ctx, grad, _grad_norm):
    return _slerp_backward_op(grad, *ctx.saved_tensors)


_slerp_op.register_autograd(_slerp_grad, setup_context=_slerp_setup)


def slerp_normalize(h: torch.Tensor, h_block: torch.Tensor, alpha) -> torch.Tensor:
    """The SLERP residual update (eq. 6, then ``Norm``) with per-dimension ``alpha``, antipodal
    rows included; reference :func:`spherenet.layers.fused.slerp_normalize`
    (:func:`spherenet.manifolds.slerp`). Keeps what :func:`lerp_normalize` keeps and recomputes
    the angle, sines and tangent in the backward pass."""
    if torch.float64 in (h.dtype, h_block.dtype) or not isinstance(alpha, torch.Tensor) or alpha.dtype == torch.float64:
        return fused.slerp_normalize(h, h_block, alpha)
    _check_device(h, h_block)
    d = h.shape[-1]
    per_column = alpha.float().expand(d).contiguous() if alpha.numel() == 1 else alpha.float().reshape(d)
    return _slerp_op(h, h_block.to(h.dtype), per_column)[0]


@torch.library.custom_op("spherenet::swiglu", mutates_args=())
def _swiglu_op(u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    u1, v1 = u.contiguous().view(-1), v.contiguous().view(-1)
    out = torch.empty(u1.shape, dtype=torch.promote_types(u.dtype, v.dtype), device=u.device)
    _swiglu_fwd[(triton.cdiv(u1.numel(), ELEMENTS_PER_PROGRAM),)](u1, v1, out, u1.numel(), BLOCK=ELEMENTS_PER_PROGRAM)
    return out.view(u.shape)


@torch.library.custom_op("spherenet::swiglu_backward", mutates_args=())
def _swiglu_backward_op(grad: torch.Tensor, u: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    g1, u1, v1 = grad.contiguous().view(-1), u.contiguous().view(-1), v.contiguous().view(-1)
    grad_u, grad_v = torch.empty_like(u1), torch.empty_like(v1)
    _swiglu_bwd[(triton.cdiv(u1.numel(), ELEMENTS_PER_PROGRAM),)](g1, u1, v1, grad_u, grad_v, u1.numel(), BLOCK=ELEMENTS_PER_PROGRAM)  # fmt: skip  # one launch
    return grad_u.view(u.shape), grad_v.view(v.shape)


@_swiglu_op.register_fake
def _(u, v):
    return torch.empty(u.shape, dtype=torch.promote_types(u.dtype, v.dtype), device=u.device)


@_swiglu_backward_op.register_fake
def _(grad, u, v):
    return torch.empty_like(u), torch.empty_like(v)


def _swiglu_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _swiglu_grad(ctx, grad):
    return _swiglu_backward_op(grad, *ctx.saved_tensors)


_swiglu_op.register_autograd(_swiglu_grad, setup_context=_swiglu_setup)


def swiglu(u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """``u * SiLU(v)`` (eq. 19); reference :func:`spherenet.layers.fused.swiglu`."""
    if torch.float64 in (u.dtype, v.dtype) or u.shape != v.shape:
        return fused.swiglu(u, v)
    _check_device(u, v)
    return _swiglu_op(u, v)
