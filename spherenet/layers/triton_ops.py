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

The SLERP update's kernels are in :mod:`spherenet.layers.triton_slerp`, which builds on the
helpers here.

Equation numbers are those of Loshchilov et al., "nGPT" (2024).
"""

from __future__ import annotations

import contextlib
import os

import torch
import triton
import triton.language as tl

from . import fused

__all__ = ["normalize", "scaled_normalize", "lerp_normalize", "riemannian_normalize", "swiglu"]

EPS = 1e-30  # ‖x‖ is clamped at this in float32, as spherenet.manifolds does
ELEMENTS_PER_PROGRAM = 4096
WARP_ELEMENTS = 512  # elements of a program per warp: 16 per thread
MAX_PROGRAMS = 1024  # backward kernels with per-column partial sums (a few per SM of a large GPU)


def _blocks(d: int, elements: int = ELEMENTS_PER_PROGRAM) -> tuple[int, int]:
    """(BLOCK_D, ROWS): the row padded to a power of two, and rows per program."""
    block_d = triton.next_power_of_2(d)
    return block_d, max(1, min(64, elements // block_d))


def _warps(elements: int, per_warp: int = WARP_ELEMENTS) -> int:
    """Warps for a program of ``elements`` (a power of two): enough threads that each holds a
    few values per tensor in registers (no spilling at the tiles used; tests/test_triton_compile.py)."""
    return max(4, min(16, elements // per_warp))


def _check_device(*tensors: torch.Tensor) -> None:
    if any(t.device.type == "cpu" for t in tensors) and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError(
            "the Triton kernels need CUDA tensors, or TRITON_INTERPRET=1 (set before Triton is imported) "
            "to run on CPU tensors"
        )


def _on_device_of(t: torch.Tensor):
    """Triton launches on the current CUDA device: make it ``t``'s for the launch."""
    return torch.cuda.device(t.device) if t.device.type == "cuda" else contextlib.nullcontext()


def _contiguous_like(t: torch.Tensor) -> torch.Tensor:
    """What a kernel returns for an input like ``t``: a new contiguous tensor (the fake
    implementations must report the real strides, which ``empty_like`` of a view does not)."""
    return torch.empty(t.shape, dtype=t.dtype, device=t.device)


def _programs(n_blocks: int) -> int:
    """Programs of a backward kernel that sums a per-column gradient: at most
    ``MAX_PROGRAMS``, each taking every ``n``-th block of rows, so the partial sums are
    ``programs x d`` floats however many rows there are."""
    return max(1, min(n_blocks, MAX_PROGRAMS))


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
    cols = tl.arange(0, BLOCK_D)
    alpha = tl.load(ALPHA + cols, mask=cols < d, other=0.0)[None, :]
    grad_alpha_sum = tl.zeros((BLOCK_D,), dtype=tl.float32)
    for block in range(pid, tl.cdiv(n_rows, ROWS), tl.num_programs(0)):  # every n-th block of rows
        rows, cols, offs, mask = _tile(block, n_rows, d, BLOCK_D, ROWS)
        h = tl.load(H + offs, mask=mask, other=0.0).to(tl.float32)
        b = tl.load(B + offs, mask=mask, other=0.0).to(tl.float32)
        y = tl.load(Y + offs, mask=mask, other=0.0).to(tl.float32)
        g = tl.load(G + offs, mask=mask, other=0.0).to(tl.float32)
        norm = tl.load(NORM + rows, mask=rows < n_rows, other=1.0)
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
        grad_alpha_sum += tl.sum(grad_alpha, axis=0)
    tl.store(GALPHA + pid.to(tl.int64) * d + cols, grad_alpha_sum, mask=cols < d)  # this program's rows


@triton.jit
def _swiglu_fwd(U, V, OUT, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    u = tl.load(U + offs, mask=mask, other=0.0).to(tl.float32)
    v = tl.load(V + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(OUT + offs, (u * v * tl.sigmoid(v)).to(OUT.dtype.element_ty), mask=mask)


@triton.jit
def _swiglu_bwd(G, U, V, GU, GV, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
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
    with _on_device_of(x2):
        _normalize_fwd[_grid(x2.shape[0], rows)](
            x2, y, norm, x2.shape[0], x2.shape[1], EPS, BLOCK_D=block_d, ROWS=rows, num_warps=_warps(block_d * rows)
        )
    return y.view(x.shape), norm


@torch.library.custom_op("spherenet::normalize_backward", mutates_args=())
def _normalize_backward_op(grad: torch.Tensor, y: torch.Tensor, norm: torch.Tensor) -> torch.Tensor:
    g2, y2 = grad.contiguous().view(-1, y.shape[-1]), y.contiguous().view(-1, y.shape[-1])
    gx = torch.empty_like(y2)
    block_d, rows = _blocks(y2.shape[1])
    with _on_device_of(g2):
        _normalize_bwd[_grid(y2.shape[0], rows)](g2, y2, norm, gx, y2.shape[0], y2.shape[1], EPS, BLOCK_D=block_d, ROWS=rows, num_warps=_warps(block_d * rows))  # fmt: skip  # one launch
    return gx.view(y.shape)


@_normalize_op.register_fake
def _(x):
    return _contiguous_like(x), x.new_empty(x.numel() // x.shape[-1], dtype=torch.float32)


@_normalize_backward_op.register_fake
def _(grad, y, norm):
    return _contiguous_like(y)


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
    with _on_device_of(x2):
        _scaled_normalize_fwd[_grid(x2.shape[0], rows)](x2, scale, y, out, norm, x2.shape[0], d, tokens, heads, EPS, BLOCK_D=block_d, ROWS=rows, num_warps=_warps(block_d * rows))  # fmt: skip  # one launch
    return out.view(x.shape), y.view(x.shape), norm


@torch.library.custom_op("spherenet::scaled_normalize_backward", mutates_args=())
def _scaled_normalize_backward_op(
    grad: torch.Tensor, y: torch.Tensor, norm: torch.Tensor, scale: torch.Tensor
) -> torch.Tensor:
    _, heads, tokens, d = y.shape
    g2, y2 = grad.contiguous().view(-1, d), y.contiguous().view(-1, d)
    gx = torch.empty_like(y2)
    block_d, rows = _blocks(d)
    with _on_device_of(g2):
        _scaled_normalize_bwd[_grid(y2.shape[0], rows)](g2, y2, norm, scale, gx, y2.shape[0], d, tokens, heads, EPS, BLOCK_D=block_d, ROWS=rows, num_warps=_warps(block_d * rows))  # fmt: skip  # one launch
    return gx.view(y.shape)


@_scaled_normalize_op.register_fake
def _(x, scale):
    out = torch.empty(x.shape, dtype=torch.promote_types(x.dtype, scale.dtype), device=x.device)
    return out, _contiguous_like(x), x.new_empty(x.numel() // x.shape[-1], dtype=torch.float32)


@_scaled_normalize_backward_op.register_fake
def _(grad, y, norm, scale):
    return _contiguous_like(y)


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
    with _on_device_of(h2):
        _residual_fwd[_grid(h2.shape[0], rows)](h2, b2, alpha, y, norm, h2.shape[0], d, EPS, RIEMANNIAN=riemannian, BLOCK_D=block_d, ROWS=rows, num_warps=_warps(block_d * rows))  # fmt: skip  # one launch
    return y.view(h.shape), norm


@torch.library.custom_op("spherenet::residual_update_backward", mutates_args=())
def _residual_backward_op(grad: torch.Tensor, h: torch.Tensor, h_block: torch.Tensor, alpha: torch.Tensor, y: torch.Tensor, norm: torch.Tensor, riemannian: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip  # one signature line per op
    d = h.shape[-1]
    h2, b2 = h.contiguous().view(-1, d), h_block.contiguous().view(-1, d)
    g2, y2 = grad.contiguous().view(-1, d), y.contiguous().view(-1, d)
    grad_h, grad_b = torch.empty_like(h2), torch.empty_like(b2)
    block_d, rows = _blocks(d)
    programs = _programs(_grid(h2.shape[0], rows)[0])
    partial = h2.new_empty((programs, d), dtype=torch.float32)
    with _on_device_of(h2):
        _residual_bwd[(programs,)](g2, h2, b2, alpha, y2, norm, grad_h, grad_b, partial, h2.shape[0], d, EPS, RIEMANNIAN=riemannian, BLOCK_D=block_d, ROWS=rows, num_warps=_warps(block_d * rows))  # fmt: skip  # one launch
    return grad_h.view(h.shape), grad_b.view(h_block.shape), partial.sum(0)


@_residual_op.register_fake
def _(h, h_block, alpha, riemannian):
    return _contiguous_like(h), h.new_empty(h.numel() // h.shape[-1], dtype=torch.float32)


@_residual_backward_op.register_fake
def _(grad, h, h_block, alpha, y, norm, riemannian):
    return _contiguous_like(h), _contiguous_like(h_block), alpha.new_empty(alpha.shape)


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


@torch.library.custom_op("spherenet::swiglu", mutates_args=())
def _swiglu_op(u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    u1, v1 = u.contiguous().view(-1), v.contiguous().view(-1)
    out = torch.empty(u1.shape, dtype=torch.promote_types(u.dtype, v.dtype), device=u.device)
    with _on_device_of(u1):
        _swiglu_fwd[(triton.cdiv(u1.numel(), ELEMENTS_PER_PROGRAM),)](
            u1, v1, out, u1.numel(), BLOCK=ELEMENTS_PER_PROGRAM
        )
    return out.view(u.shape)


@torch.library.custom_op("spherenet::swiglu_backward", mutates_args=())
def _swiglu_backward_op(grad: torch.Tensor, u: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    g1, u1, v1 = grad.contiguous().view(-1), u.contiguous().view(-1), v.contiguous().view(-1)
    grad_u, grad_v = torch.empty_like(u1), torch.empty_like(v1)
    with _on_device_of(g1):
        _swiglu_bwd[(triton.cdiv(u1.numel(), ELEMENTS_PER_PROGRAM),)](g1, u1, v1, grad_u, grad_v, u1.numel(), BLOCK=ELEMENTS_PER_PROGRAM, num_warps=_warps(ELEMENTS_PER_PROGRAM))  # fmt: skip  # one launch
    return grad_u.view(u.shape), grad_v.view(v.shape)


@_swiglu_op.register_fake
def _(u, v):
    return torch.empty(u.shape, dtype=torch.promote_types(u.dtype, v.dtype), device=u.device)


@_swiglu_backward_op.register_fake
def _(grad, u, v):
    return _contiguous_like(u), _contiguous_like(v)


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
