"""``Norm`` and ``Norm(x) * s_qk`` as Triton kernels: the ``"triton"`` implementation of
:mod:`spherenet.kernels.layer_ops`, each op's kernels, ``torch.library.custom_op``, fake and wrapper
together.

A program takes a tile of whole rows (:func:`spherenet.kernels.triton_helpers.blocks`), loads them once,
computes in float32 and stores in the output's dtype; the backward kernel reads what the forward
saved (the normalized output and one float32 norm per row, as the fused functions do) and writes
the input gradient in one pass. ``torch.compile(fullgraph=True)`` traces each op as one opaque
node. Float64 tensors, which the kernels do not compute in, are not sent here (the op's
``takes`` in :mod:`spherenet.kernels.layer_ops`).

Equation numbers are those of Loshchilov et al., "nGPT" (2024).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .triton_helpers import TINY, blocks, check_device, contiguous_like, norm_grad, on_device_of, tile, warps

__all__ = ["normalize", "scaled_normalize"]


# ---------------------------------------------------------------- Norm (Table 1)


@triton.jit
def _normalize_fwd(X, Y, NORM, n_rows, d, tiny, BLOCK_D: tl.constexpr, ROWS: tl.constexpr):
    rows, cols, offs, mask = tile(tl.program_id(0), n_rows, d, BLOCK_D, ROWS)
    x = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
    norm = tl.sqrt(tl.sum(x * x, axis=1))
    tl.store(Y + offs, (x / tl.maximum(norm, tiny)[:, None]).to(Y.dtype.element_ty), mask=mask)
    tl.store(NORM + rows, norm, mask=rows < n_rows)


@triton.jit
def _normalize_bwd(G, Y, NORM, GX, n_rows, d, tiny, BLOCK_D: tl.constexpr, ROWS: tl.constexpr):
    rows, cols, offs, mask = tile(tl.program_id(0), n_rows, d, BLOCK_D, ROWS)
    g = tl.load(G + offs, mask=mask, other=0.0).to(tl.float32)
    y = tl.load(Y + offs, mask=mask, other=0.0).to(tl.float32)
    norm = tl.load(NORM + rows, mask=rows < n_rows, other=1.0)
    tl.store(GX + offs, norm_grad(g, y, norm, tiny).to(GX.dtype.element_ty), mask=mask)


@torch.library.custom_op("spherenet::normalize", mutates_args=())
def _normalize_op(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    x2 = x.contiguous().view(-1, x.shape[-1])
    y, norm = torch.empty_like(x2), x2.new_empty(x2.shape[0], dtype=torch.float32)
    block_d, rows = blocks(x2.shape[1])
    with on_device_of(x2):
        _normalize_fwd[(triton.cdiv(x2.shape[0], rows),)](
            x2, y, norm, x2.shape[0], x2.shape[1], TINY, BLOCK_D=block_d, ROWS=rows, num_warps=warps(block_d * rows)
        )
    return y.view(x.shape), norm


@_normalize_op.register_fake
def _(x):
    return contiguous_like(x), x.new_empty(x.numel() // x.shape[-1], dtype=torch.float32)


@torch.library.custom_op("spherenet::normalize_backward", mutates_args=())
def _normalize_backward_op(grad: torch.Tensor, y: torch.Tensor, norm: torch.Tensor) -> torch.Tensor:
    g2, y2 = grad.contiguous().view(-1, y.shape[-1]), y.contiguous().view(-1, y.shape[-1])
    gx = torch.empty_like(y2)
    block_d, rows = blocks(y2.shape[1])
    with on_device_of(g2):
        _normalize_bwd[(triton.cdiv(y2.shape[0], rows),)](g2, y2, norm, gx, y2.shape[0], y2.shape[1], TINY, BLOCK_D=block_d, ROWS=rows, num_warps=warps(block_d * rows))  # fmt: skip  # one launch
    return gx.view(y.shape)


@_normalize_backward_op.register_fake
def _(grad, y, norm):
    return contiguous_like(y)


def _normalize_setup(ctx, inputs, output):
    ctx.save_for_backward(*output)


def _normalize_grad(ctx, grad, _grad_norm):
    return _normalize_backward_op(grad, *ctx.saved_tensors)


_normalize_op.register_autograd(_normalize_grad, setup_context=_normalize_setup)


def normalize(x: torch.Tensor) -> torch.Tensor:
    """``Norm(x)`` over the last dimension (Table 1); reference :func:`spherenet.manifolds.normalize`."""
    check_device("normalize", x)
    return _normalize_op(x)[0]


# ---------------------------------------------------------------- Norm(q) * s_qk, Norm(k) * s_qk (eq. 15, 16)


@triton.jit
def _scaled_normalize_fwd(
    X, SCALE, Y, OUT, NORM, n_rows, d, tokens, heads, tiny, BLOCK_D: tl.constexpr, ROWS: tl.constexpr
):
    rows, cols, offs, mask = tile(tl.program_id(0), n_rows, d, BLOCK_D, ROWS)
    x = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
    norm = tl.sqrt(tl.sum(x * x, axis=1))
    y = (x / tl.maximum(norm, tiny)[:, None]).to(Y.dtype.element_ty)  # rounded as it is saved
    head = (rows // tokens) % heads  # rows are (batch, head, token)
    scale = tl.load(SCALE + head[:, None] * d + cols[None, :], mask=mask, other=0.0)
    tl.store(Y + offs, y, mask=mask)
    tl.store(OUT + offs, (y.to(tl.float32) * scale).to(OUT.dtype.element_ty), mask=mask)
    tl.store(NORM + rows, norm, mask=rows < n_rows)


@triton.jit
def _scaled_normalize_bwd(
    G, Y, NORM, SCALE, GX, n_rows, d, tokens, heads, tiny, BLOCK_D: tl.constexpr, ROWS: tl.constexpr
):
    rows, cols, offs, mask = tile(tl.program_id(0), n_rows, d, BLOCK_D, ROWS)
    head = (rows // tokens) % heads
    scale = tl.load(SCALE + head[:, None] * d + cols[None, :], mask=mask, other=0.0)
    g = tl.load(G + offs, mask=mask, other=0.0).to(tl.float32) * scale
    y = tl.load(Y + offs, mask=mask, other=0.0).to(tl.float32)
    norm = tl.load(NORM + rows, mask=rows < n_rows, other=1.0)
    tl.store(GX + offs, norm_grad(g, y, norm, tiny).to(GX.dtype.element_ty), mask=mask)


@torch.library.custom_op("spherenet::scaled_normalize", mutates_args=())
def _scaled_normalize_op(x: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    _, heads, tokens, d = x.shape
    x2 = x.contiguous().view(-1, d)
    y = torch.empty_like(x2)
    out = torch.empty(x2.shape, dtype=torch.promote_types(x.dtype, scale.dtype), device=x.device)
    norm = x2.new_empty(x2.shape[0], dtype=torch.float32)
    block_d, rows = blocks(d)
    with on_device_of(x2):
        _scaled_normalize_fwd[(triton.cdiv(x2.shape[0], rows),)](x2, scale, y, out, norm, x2.shape[0], d, tokens, heads, TINY, BLOCK_D=block_d, ROWS=rows, num_warps=warps(block_d * rows))  # fmt: skip  # one launch
    return out.view(x.shape), y.view(x.shape), norm


@_scaled_normalize_op.register_fake
def _(x, scale):
    out = torch.empty(x.shape, dtype=torch.promote_types(x.dtype, scale.dtype), device=x.device)
    return out, contiguous_like(x), x.new_empty(x.numel() // x.shape[-1], dtype=torch.float32)


@torch.library.custom_op("spherenet::scaled_normalize_backward", mutates_args=())
def _scaled_normalize_backward_op(
    grad: torch.Tensor, y: torch.Tensor, norm: torch.Tensor, scale: torch.Tensor
) -> torch.Tensor:
    _, heads, tokens, d = y.shape
    g2, y2 = grad.contiguous().view(-1, d), y.contiguous().view(-1, d)
    gx = torch.empty_like(y2)
    block_d, rows = blocks(d)
    with on_device_of(g2):
        _scaled_normalize_bwd[(triton.cdiv(y2.shape[0], rows),)](g2, y2, norm, scale, gx, y2.shape[0], d, tokens, heads, TINY, BLOCK_D=block_d, ROWS=rows, num_warps=warps(block_d * rows))  # fmt: skip  # one launch
    return gx.view(y.shape)


@_scaled_normalize_backward_op.register_fake
def _(grad, y, norm, scale):
    return contiguous_like(y)


def _scaled_normalize_setup(ctx, inputs, output):
    ctx.save_for_backward(output[1], output[2], inputs[1])


def _scaled_normalize_grad(ctx, grad, _grad_y, _grad_norm):
    y, norm, scale = ctx.saved_tensors
    grad_scale = (grad * y).sum(dim=(0, 2)).to(scale.dtype)  # over batch and tokens: (heads, d)
    return _scaled_normalize_backward_op(grad, y, norm, scale), grad_scale


_scaled_normalize_op.register_autograd(_scaled_normalize_grad, setup_context=_scaled_normalize_setup)


def scaled_normalize(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``Norm(x) * s_qk`` for q or k of shape ``(B, H, T, d_k)`` with ``s_qk`` of shape
    ``(H, 1, d_k)`` or ``(1,)`` (eq. 15, 16); reference
    :func:`spherenet.kernels.layer_ops.scaled_normalize_reference`."""
    check_device("scaled_normalize", x)
    heads, d = x.shape[1], x.shape[3]
    per_head = scale.reshape(heads, d) if scale.numel() == heads * d else scale.reshape(1, 1).expand(heads, d)
    out = _scaled_normalize_op(x, per_head.float().contiguous())[0]
    return out.to(torch.promote_types(x.dtype, scale.dtype))
