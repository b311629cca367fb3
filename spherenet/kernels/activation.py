"""The MLP's gated activation, SwiGLU: ``u * SiLU(v)`` (eq. 19; ``v`` is the gate).

Three implementations under one signature ``(u, v)`` (:mod:`spherenet.kernels.resolve` picks):
``"reference"`` plain autograd; ``"torch"`` (what ``"auto"`` takes) one
``torch.autograd.Function`` that keeps ``u`` and ``v`` and recomputes ``SiLU(v)`` in the backward
pass (instead of keeping all three), computed in at least float32 and returned in the inputs'
dtype; ``"triton"`` one kernel forward and one backward
(:mod:`spherenet.kernels.activation_triton`). Another activation of the MLP is added here, as its
own op with the same three rows.

Equation numbers are those of Loshchilov et al., "nGPT: Normalized Transformer with
Representation Learning on the Hypersphere" (2024).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from .resolve import Op

__all__ = ["SWIGLU", "swiglu", "swiglu_reference", "swiglu_fused"]


def swiglu_reference(u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """``u * SiLU(v)`` (eq. 19), in plain autograd."""
    return u * F.silu(v)


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


def swiglu_fused(u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """``u * SiLU(v)`` (eq. 19), keeping ``u`` and ``v`` for the backward pass and recomputing
    ``SiLU(v)``, instead of keeping ``u``, ``v`` and ``SiLU(v)``."""
    return _SwiGLU.apply(u, v)


def _swiglu_triton(u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    from . import activation_triton  # imports Triton: on first use only

    return activation_triton.swiglu(u, v)


SWIGLU = Op(
    "swiglu",
    implementations={"reference": swiglu_reference, "torch": swiglu_fused, "triton": _swiglu_triton},
    auto={"*": "torch"},
)


def swiglu(u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """``u * SiLU(v)`` (eq. 19; ``v`` is the gate)."""
    return SWIGLU.pick(u.device.type)(u, v)
