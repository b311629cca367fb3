"""The ``"torch"`` implementations of nGPT's layer ops (:mod:`spherenet.kernels.layer_ops` names
them): one ``torch.autograd.Function`` each, keeping fewer tensors for the backward pass than plain
autograd and recomputing the rest (each function's docstring says what it keeps); without
gradients, the forward values alone (no autograd function: fewer calls per token, as in decoding).
SLERP's is in :mod:`spherenet.kernels.slerp_fused`. The backward of ``y = x / ‖x‖`` is taken in
terms of the output: ``grad_x = (g - y (y · g)) / ‖x‖``.

They follow :mod:`spherenet.manifolds` exactly: the same smallest norm (``‖x‖`` clamped at 1e-30
in float32, 1e-300 in float64; below it no gradient flows through the norm, as with
``clamp_min``), computation in at least float32 (bf16/fp16 inputs upcast, the saved output in the
output's dtype) and the same output dtypes, so bf16 autocast needs no ``custom_fwd``. They are not
twice differentiable. Equation numbers: Loshchilov et al., "nGPT: Normalized Transformer with
Representation Learning on the Hypersphere" (2024).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from ..manifolds.geodesic import TINY

__all__ = [
    "normalize_fused",
    "scaled_normalize_fused",
    "lerp_normalize",
    "riemannian_normalize",
    "swiglu_fused",
    "relu2_fused",
    "scaled_linear_fused",
]


def work_dtype(*tensors) -> torch.dtype:
    """The dtype the ops compute in: float64 if any of ``tensors`` is, else float32
    (:func:`spherenet.manifolds.geodesic.work_dtype`'s rule, which the definitions follow)."""
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.dtype == torch.float64:
            return torch.float64
    return torch.float32


# ---------------------------------------------------------------- Norm, q/k Norm (Table 1, eq. 15, 16)


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


# ---------------------------------------------------------------- LERP (eq. 10, 11), Riemannian (eq. 24-26)


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


# ---------------------------------------------------------------- SwiGLU (eq. 19), the squared ReLU


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


# ---------------------------------------------------------------- the scaled linear (eq. 3, 20, 21)


def scaled_linear_fused(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``(x W^T) * scale``. With gradients enabled the scale is folded into the weight's rows,
    ``x (s W)^T``: one multiply of the weight instead of one of the output, and no output kept
    for the scale's gradient. Without, the output is scaled (cheaper for a few tokens, as in
    decoding). The result has the dtype of ``x W^T`` (bf16 under autocast in both cases)."""
    if torch.is_grad_enabled():
        return F.linear(x, weight * scale.unsqueeze(-1))
    y = F.linear(x, weight)
    return (y * scale).to(y.dtype)
