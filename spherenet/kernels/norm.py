"""``Norm`` and the queries' and keys' ``Norm(x) * s_qk``: nGPT's normalizations of hidden states.

Each op has three implementations under one signature (:mod:`spherenet.kernels.resolve` picks):

- ``"reference"``: :func:`spherenet.manifolds.normalize`, in plain autograd;
- ``"torch"`` (what ``"auto"`` takes): one ``torch.autograd.Function`` that keeps, for the
  backward pass, the normalized output (which the next layer keeps anyway) and one norm per row
  instead of ``x``, with the backward of ``y = x / ‖x‖`` in terms of the output::

      grad_x = (g - y (y · g)) / ‖x‖

- ``"triton"``: one kernel forward and one backward (:mod:`spherenet.kernels.norm_triton`), for
  the calls its ``takes`` admits (not float64; q/k of shape ``(B, H, T, d_k)``); the resolver
  sends the rest to ``"torch"``.

The fused functions follow :mod:`spherenet.manifolds.geodesic` exactly: the same smallest norm
(``‖x‖`` clamped at 1e-30 in float32, 1e-300 in float64; below it no gradient flows through the
norm, as with ``clamp_min``), computation in at least float32 (bf16/fp16 inputs upcast, the saved
output in the output's dtype) and the same output dtypes, so bf16 autocast needs no
``custom_fwd``. They are not twice differentiable.

Equation numbers are those of Loshchilov et al., "nGPT: Normalized Transformer with
Representation Learning on the Hypersphere" (2024).
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from .. import manifolds
from ..manifolds.geodesic import TINY, work_dtype
from .arguments import check_broadcast
from .resolve import Op

__all__ = [
    "NORMALIZE",
    "QK_NORMALIZE",
    "normalize",
    "qk_normalize",
    "normalize_reference",
    "normalize_fused",
    "scaled_normalize_reference",
    "scaled_normalize_fused",
]


# ---------------------------------------------------------------- references


def normalize_reference(x: torch.Tensor) -> torch.Tensor:
    """``Norm(x) = x / ‖x‖`` (Table 1): :func:`spherenet.manifolds.normalize`."""
    return manifolds.normalize(x)


def scaled_normalize_reference(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``Norm(x) * s_qk`` (eq. 15, 16)."""
    return manifolds.normalize(x) * scale


# ---------------------------------------------------------------- fused autograd


def as_dtype(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``x.to(dtype)``, skipping the call where ``x`` has it already (decoding makes many)."""
    return x if x.dtype == dtype else x.to(dtype)


def per_dtype(table: dict[torch.dtype, float]):
    """``dtype -> table[dtype]`` (``TINY`` and the like), whose values are constants to
    ``torch.compile``: with ``dynamic=True`` a float read from a module's table is otherwise a
    symbolic input, which an autograd function cannot carry from its forward into its backward (a
    torch.compile limitation)."""
    return torch.compiler.assume_constant_result(lambda dtype: table[dtype])


smallest_norm = per_dtype(TINY)


def tiny(work: torch.dtype, eps: float | None) -> float:
    """The smallest norm divided by in ``work`` (``eps`` when given)."""
    return smallest_norm(work) if eps is None else float(eps)


def reuse(buffer: torch.Tensor) -> torch.Tensor | None:
    """``buffer`` as the ``out=`` of an op in eager mode, to reuse a temporary; None (a fresh
    result) under ``torch.compile``, which fuses the arithmetic anyway and refuses an ``out=``
    that is not contiguous (a buffer takes its inputs' strides)."""
    return None if torch.compiler.is_compiling() else buffer


def norm_forward(xw: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x / max(‖x‖, eps), ‖x‖)`` over the last dimension, in ``xw``'s dtype."""
    norm = torch.linalg.vector_norm(xw, dim=-1, keepdim=True)
    return xw / norm.clamp_min(eps), norm


def norm_backward(grad: torch.Tensor, y: torch.Tensor, norm: torch.Tensor, eps: float) -> torch.Tensor:
    """Gradient of ``x / max(‖x‖, eps)`` with respect to ``x``, from the output ``y`` and the
    row norms, in ``norm``'s dtype: ``(g - y (y · g)) / ‖x‖``; where ``‖x‖ < eps`` the norm is
    the constant eps and only ``g / eps`` remains."""
    work = norm.dtype
    g, y = grad.to(work), y.to(work)
    buffer = y * g  # one full-size buffer, reused for the result (on CPU a fresh tensor costs more than the arithmetic)
    dot = torch.where(norm >= eps, buffer.sum(dim=-1, keepdim=True), 0.0)
    return torch.addcmul(g, y, dot, value=-1.0, out=reuse(buffer)).div_(norm.clamp_min(eps))


def _normalize_values(x: torch.Tensor, eps: float | None) -> tuple[torch.Tensor, torch.Tensor, float]:
    """``(Norm(x) in x's dtype, the row norms, the smallest norm)``: the fused forward pass."""
    work = work_dtype(x)
    eps = tiny(work, eps)
    y, norm = norm_forward(as_dtype(x, work), eps)
    return as_dtype(y, x.dtype), norm, eps


class _Normalize(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, eps):
        y, norm, eps = _normalize_values(x, eps)
        ctx.save_for_backward(y, norm)
        ctx.eps = eps
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        y, norm = ctx.saved_tensors
        return norm_backward(grad, y, norm, ctx.eps).to(y.dtype), None


def normalize_fused(x: torch.Tensor, eps: float | None = None) -> torch.Tensor:
    """``Norm(x)``, the values of :func:`spherenet.manifolds.normalize`, keeping the output and
    one norm per row for the backward pass instead of ``x``. Without gradients, the forward
    pass alone (no autograd function: less overhead per call, as in decoding)."""
    if not torch.is_grad_enabled():
        return _normalize_values(x, eps)[0]
    return _Normalize.apply(x, eps)


class _ScaledNormalize(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, scale, eps):
        y, norm, eps = _normalize_values(x, eps)
        ctx.save_for_backward(y, norm, scale)
        ctx.eps = eps
        return y * scale

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        y, norm, scale = ctx.saved_tensors
        grad_x = grad_scale = None
        if ctx.needs_input_grad[0]:
            grad_x = norm_backward(grad * scale, y, norm, ctx.eps).to(y.dtype)
        if ctx.needs_input_grad[1]:
            grad_scale = (grad * y).sum_to_size(scale.shape).to(scale.dtype)
        return grad_x, grad_scale, None


def scaled_normalize_fused(x: torch.Tensor, scale: torch.Tensor, eps: float | None = None) -> torch.Tensor:
    """``Norm(x) * scale`` (eq. 15, 16; ``scale = s_qk``, shaped to broadcast against ``x``).
    Keeps ``Norm(x)``, the row norms and ``scale`` for the backward pass; the result has the
    dtype of ``Norm(x) * scale``. Without gradients, the forward pass alone."""
    if not torch.is_grad_enabled():
        return _normalize_values(x, eps)[0] * scale
    return _ScaledNormalize.apply(x, scale, eps)


# ---------------------------------------------------------------- the ops


def _normalize_triton(x: torch.Tensor) -> torch.Tensor:
    from . import norm_triton  # imports Triton: on first use only

    return norm_triton.normalize(x)


def _scaled_normalize_triton(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    from . import norm_triton

    return norm_triton.scaled_normalize(x, scale)


NORMALIZE = Op(
    "normalize",
    implementations={"reference": normalize_reference, "torch": normalize_fused, "triton": _normalize_triton},
    auto={"*": "torch"},
    takes={"triton": lambda x: x.dtype != torch.float64},  # the kernels compute in float32
)
QK_NORMALIZE = Op(
    "qk_normalize",
    implementations={
        "reference": scaled_normalize_reference,
        "torch": scaled_normalize_fused,
        "triton": _scaled_normalize_triton,
    },
    auto={"*": "torch"},
    takes={"triton": lambda x, scale: x.dtype != torch.float64 and x.ndim == 4},  # per-head scales of (B, H, T, d_k)
)


def normalize(x: torch.Tensor) -> torch.Tensor:
    """``Norm(x) = x / ‖x‖`` over the last dimension: ``h_A = Norm(ATTN(h))``,
    ``h_M = Norm(MLP(h))`` (Table 1, eq. 10, 11)."""
    return NORMALIZE(x)


def qk_normalize(x: torch.Tensor, s_qk: torch.Tensor, qk_norm: bool = True) -> torch.Tensor:
    """``Norm(x) * s_qk`` for the queries or keys of a head (eq. 15, 16); ``qk_norm=False``
    drops the ``Norm`` (Table 6). ``s_qk`` broadcasts against ``x``."""
    try:
        return QK_NORMALIZE(x, s_qk) if qk_norm else x * s_qk
    except Exception:
        check_broadcast("qk_normalize", "x, s_qk", x, s_qk)  # a ValueError naming the shapes, where they are the cause
        raise
