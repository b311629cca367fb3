"""The MLP's activations: the gated SwiGLU, ``u * SiLU(v)`` (eq. 19; ``v`` is the gate), and the
ungated squared ReLU, ``relu(x)**2`` (the MLP of the released Normalized-Nemotron models).

SwiGLU has three implementations under one signature ``(u, v)`` (:mod:`spherenet.kernels.resolve` picks):
``"reference"`` plain autograd; ``"torch"`` (what ``"auto"`` takes) one
``torch.autograd.Function`` that keeps ``u`` and ``v`` and recomputes ``SiLU(v)`` in the backward
pass (instead of keeping all three), computed in at least float32 and returned in the inputs'
dtype; ``"triton"`` one kernel forward and one backward
(:mod:`spherenet.kernels.activation_triton`). The squared ReLU has the same three rows under
``(x)``: its ``"torch"`` function keeps ``x`` alone and its gradient is ``2 relu(x)``. Neither op
has a native (C++) implementation: each is one element-wise pass, which the fused torch function
already is on CPU. Another activation of the MLP is added here, as its own op with the same rows.

Equation numbers are those of Loshchilov et al., "nGPT: Normalized Transformer with
Representation Learning on the Hypersphere" (2024).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from .arguments import check_broadcast
from .resolve import Op

__all__ = ["SWIGLU", "swiglu", "swiglu_reference", "swiglu_fused", "RELU2", "relu2", "relu2_reference", "relu2_fused"]


def swiglu_reference(u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """``u * SiLU(v)`` (eq. 19), in plain autograd."""
    return u * F.silu(v)


def _swiglu_values(u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    dtype = torch.promote_types(u.dtype, v.dtype)
    work = torch.promote_types(dtype, torch.float32)
    return (u.to(work) * F.silu(v.to(work))).to(dtype)


class _SwiGLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, u, v):
        ctx.save_for_backward(u, v)
        return _swiglu_values(u, v)

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


def swiglu_fused(u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """``u * SiLU(v)`` (eq. 19), keeping ``u`` and ``v`` for the backward pass and recomputing
    ``SiLU(v)``, instead of keeping ``u``, ``v`` and ``SiLU(v)``. Without gradients, the forward
    pass alone (no autograd function)."""
    if not torch.is_grad_enabled():
        return _swiglu_values(u, v)
    return _SwiGLU.apply(u, v)


def _swiglu_triton(u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    from . import activation_triton  # imports Triton: on first use only

    return activation_triton.swiglu(u, v)


SWIGLU = Op(
    "swiglu",
    implementations={"reference": swiglu_reference, "torch": swiglu_fused, "triton": _swiglu_triton},
    auto={"*": "torch"},
    # the kernels compute in float32 over same-shaped u and v (no broadcasting)
    takes={"triton": lambda u, v: torch.float64 not in (u.dtype, v.dtype) and u.shape == v.shape},
)


def swiglu(u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """``u * SiLU(v)`` (eq. 19; ``v`` is the gate). ``u`` and ``v`` broadcast."""
    try:
        return SWIGLU(u, v)
    except Exception:
        check_broadcast("swiglu", "u, v", u, v)  # a ValueError naming the shapes, where they are the cause
        raise


def relu2_reference(x: torch.Tensor) -> torch.Tensor:
    """``relu(x)**2``, in plain autograd."""
    return F.relu(x) ** 2


def _relu2_values(x: torch.Tensor) -> torch.Tensor:
    return F.relu(x.to(torch.promote_types(x.dtype, torch.float32))).square().to(x.dtype)


class _ReLU2(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return _relu2_values(x)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        work = torch.promote_types(grad.dtype, torch.float32)
        return (grad.to(work) * (2 * F.relu(x.to(work)))).to(x.dtype)


def relu2_fused(x: torch.Tensor) -> torch.Tensor:
    """``relu(x)**2``, keeping only ``x`` for the backward pass (gradient ``2 relu(x)``), computed
    in at least float32 and returned in ``x``'s dtype. Without gradients, the forward pass alone."""
    if not torch.is_grad_enabled():
        return _relu2_values(x)
    return _ReLU2.apply(x)


def _relu2_triton(x: torch.Tensor) -> torch.Tensor:
    from . import activation_triton  # imports Triton: on first use only

    return activation_triton.relu2(x)


RELU2 = Op(
    "relu2",
    implementations={"reference": relu2_reference, "torch": relu2_fused, "triton": _relu2_triton},
    auto={"*": "torch"},
    takes={"triton": lambda x: x.dtype != torch.float64},  # the kernels compute in float32
)


def relu2(x: torch.Tensor) -> torch.Tensor:
    """``relu(x)**2``, the squared ReLU (ungated: ``x`` is the up projection)."""
    return RELU2(x)
