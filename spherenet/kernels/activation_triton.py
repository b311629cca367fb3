"""SwiGLU, ``u * SiLU(v)`` (eq. 19), and the squared ReLU, ``relu(x)**2``, as Triton kernels: the
``"triton"`` implementations of :mod:`spherenet.kernels.layer_ops`, each op's kernels,
``torch.library.custom_op``, fake and wrapper together. Element-wise: a program takes
:data:`~spherenet.kernels.triton_helpers.ELEMENTS_PER_PROGRAM` elements and computes in float32. Float64
tensors, and SwiGLU's ``u`` and ``v`` of different shapes (broadcasting), are not sent here (the
ops' ``takes`` in :mod:`spherenet.kernels.layer_ops`).

Equation numbers are those of Loshchilov et al., "nGPT" (2024).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .triton_helpers import ELEMENTS_PER_PROGRAM, check_device, contiguous_like, on_device_of, warps

__all__ = ["swiglu", "relu2"]


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


@torch.library.custom_op("spherenet::swiglu", mutates_args=())
def _swiglu_op(u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    u1, v1 = u.contiguous().view(-1), v.contiguous().view(-1)
    out = torch.empty(u1.shape, dtype=torch.promote_types(u.dtype, v.dtype), device=u.device)
    with on_device_of(u1):
        _swiglu_fwd[(triton.cdiv(u1.numel(), ELEMENTS_PER_PROGRAM),)](
            u1, v1, out, u1.numel(), BLOCK=ELEMENTS_PER_PROGRAM, num_warps=warps(ELEMENTS_PER_PROGRAM)
        )
    return out.view(u.shape)


@_swiglu_op.register_fake
def _(u, v):
    return torch.empty(u.shape, dtype=torch.promote_types(u.dtype, v.dtype), device=u.device)


@torch.library.custom_op("spherenet::swiglu_backward", mutates_args=())
def _swiglu_backward_op(grad: torch.Tensor, u: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    g1, u1, v1 = grad.contiguous().view(-1), u.contiguous().view(-1), v.contiguous().view(-1)
    grad_u, grad_v = torch.empty_like(u1), torch.empty_like(v1)
    with on_device_of(g1):
        _swiglu_bwd[(triton.cdiv(u1.numel(), ELEMENTS_PER_PROGRAM),)](g1, u1, v1, grad_u, grad_v, u1.numel(), BLOCK=ELEMENTS_PER_PROGRAM, num_warps=warps(ELEMENTS_PER_PROGRAM))  # fmt: skip  # one launch
    return grad_u.view(u.shape), grad_v.view(v.shape)


@_swiglu_backward_op.register_fake
def _(grad, u, v):
    return contiguous_like(u), contiguous_like(v)


def _swiglu_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _swiglu_grad(ctx, grad):
    return _swiglu_backward_op(grad, *ctx.saved_tensors)


_swiglu_op.register_autograd(_swiglu_grad, setup_context=_swiglu_setup)


def swiglu(u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """``u * SiLU(v)`` (eq. 19); reference :func:`spherenet.kernels.layer_ops.swiglu_reference`."""
    check_device("swiglu", u, v)
    return _swiglu_op(u, v)


@triton.jit
def _relu2_fwd(X, OUT, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    r = tl.maximum(tl.load(X + offs, mask=mask, other=0.0).to(tl.float32), 0.0)
    tl.store(OUT + offs, (r * r).to(OUT.dtype.element_ty), mask=mask)


@triton.jit
def _relu2_bwd(G, X, GX, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    g = tl.load(G + offs, mask=mask, other=0.0).to(tl.float32)
    r = tl.maximum(tl.load(X + offs, mask=mask, other=0.0).to(tl.float32), 0.0)
    tl.store(GX + offs, (2.0 * g * r).to(GX.dtype.element_ty), mask=mask)


@torch.library.custom_op("spherenet::relu2", mutates_args=())
def _relu2_op(x: torch.Tensor) -> torch.Tensor:
    x1 = x.contiguous().view(-1)
    out = torch.empty_like(x1)
    with on_device_of(x1):
        _relu2_fwd[(triton.cdiv(x1.numel(), ELEMENTS_PER_PROGRAM),)](x1, out, x1.numel(), BLOCK=ELEMENTS_PER_PROGRAM, num_warps=warps(ELEMENTS_PER_PROGRAM))  # fmt: skip  # one launch
    return out.view(x.shape)


@_relu2_op.register_fake
def _(x):
    return contiguous_like(x)


@torch.library.custom_op("spherenet::relu2_backward", mutates_args=())
def _relu2_backward_op(grad: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    g1, x1 = grad.contiguous().view(-1), x.contiguous().view(-1)
    grad_x = torch.empty_like(x1)
    with on_device_of(g1):
        _relu2_bwd[(triton.cdiv(x1.numel(), ELEMENTS_PER_PROGRAM),)](g1, x1, grad_x, x1.numel(), BLOCK=ELEMENTS_PER_PROGRAM, num_warps=warps(ELEMENTS_PER_PROGRAM))  # fmt: skip  # one launch
    return grad_x.view(x.shape)


@_relu2_backward_op.register_fake
def _(grad, x):
    return contiguous_like(x)


def _relu2_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _relu2_grad(ctx, grad):
    return _relu2_backward_op(grad, *ctx.saved_tensors)


_relu2_op.register_autograd(_relu2_grad, setup_context=_relu2_setup)


def relu2(x: torch.Tensor) -> torch.Tensor:
    """``relu(x)**2``; reference :func:`spherenet.kernels.layer_ops.relu2_reference`."""
    check_device("relu2", x)
    return _relu2_op(x)
