"""Moving points along the unit sphere: the hidden-state updates of nGPT.

Same layout as :mod:`spherenet.manifolds.sphere`: the last dimension is the vector; leading
dimensions are batch. ``alpha`` is a Python float or a tensor that broadcasts against the input
(nGPT's per-dimension eigen learning rates are a tensor of shape ``(d,)``).

Equation numbers are those of Loshchilov et al., "nGPT: Normalized Transformer with
Representation Learning on the Hypersphere" (2024).

Every function computes in at least float32 (bf16/fp16 inputs are upcast, the result cast
back), and is free of NaN/inf in the forward and backward pass, including a == b and a == -b.
"""

from __future__ import annotations

import math

import torch

__all__ = [
    "normalize",
    "tangent",
    "angle",
    "lerp",
    "slerp",
    "riemannian_update",
    "check_points",
    "in_func_transform",
    "func_transform_active",
    "peek_transform",
    "may_hold_any",
    "TINY",
    "ANTIPODAL_SIN",
    "work_dtype",
]

#: The smallest norm divided by, per dtype (below it ``Norm`` divides by this instead): for the
#: computations here, in float32 or float64, and for the optimizers' rows in every dtype.
TINY = {torch.float64: 1e-300, torch.float32: 1e-30, torch.float16: 1e-7, torch.bfloat16: 1e-30}
#: Below this sin(theta), per work dtype, a and b are antipodal: the geodesic from a to b is not
#: unique (slerp's fallback direction; the fused SLERP implementations use the same values).
ANTIPODAL_SIN = {torch.float64: 1e-12, torch.float32: 1e-5}


#: ``peek_transform()``: the innermost active ``torch.func`` transform, None outside them (a C
#: function: no Python frame per call; absent from a torch: never active)
peek_transform = getattr(torch._C._functorch, "peek_interpreter_stack", None) or (lambda: None)


def func_transform_active() -> bool:
    """Whether a ``torch.func`` transform (``vmap``, ``grad``, ``jvp``, ...) is active, also while
    ``torch.compile`` traces one (dynamo traces the stack: it holds the transform there). An
    operation with no batching rule, such as ``torch._assert_async``, must stand aside then."""
    return peek_transform() is not None


def in_func_transform() -> bool:
    """Whether a ``torch.func`` transform is running this code eagerly: it may not read a tensor's
    values on the host, and it batches and differentiates plain torch operations only. False under
    ``torch.compile``, which traces the transforms itself."""
    # the stack first: cheaper than is_compiling
    return func_transform_active() and not torch.compiler.is_compiling()


def may_hold_any(mask: torch.Tensor) -> bool:
    """False only where the host can tell, at no cost, that no entry of ``mask`` is set: on CPU,
    outside ``torch.compile`` and ``torch.func``'s transforms (which may not read values on the
    host). Elsewhere True, so that a branch selected by ``torch.where`` is computed without a
    synchronization. Used to skip slerp's antipodal branch when no row needs it."""
    return mask.device.type != "cpu" or torch.compiler.is_compiling() or in_func_transform() or bool(mask.any())


def work_dtype(*tensors) -> torch.dtype:
    """The dtype the updates compute in: float64 if any of ``tensors`` is, else float32 (the
    fused kernels of :mod:`spherenet.kernels` follow it)."""
    dtypes = [t.dtype for t in tensors if isinstance(t, torch.Tensor)]
    return torch.float64 if torch.float64 in dtypes else torch.float32


def _broadcast(x: tuple, y: tuple) -> tuple | None:
    """The shape ``x`` and ``y`` broadcast to, None when they do not (no exception: traceable)."""
    n = max(len(x), len(y))
    x, y = (1,) * (n - len(x)) + tuple(x), (1,) * (n - len(y)) + tuple(y)
    if any(i != j and 1 not in (i, j) for i, j in zip(x, y)):
        return None
    return tuple(max(i, j) if 1 in (i, j) else i for i, j in zip(x, y))


def check_points(op: str, a: torch.Tensor, b: torch.Tensor, alpha=None, names: str = "a, b") -> None:
    """A ValueError naming the shapes when ``a`` and ``b`` are not vectors of one size that
    broadcast, or a tensor ``alpha`` does not broadcast to them (instead of torch's size message
    from inside the arithmetic)."""
    first, second = names.split(", ")
    shape = _broadcast(a.shape, b.shape) if a.dim() and b.dim() and a.shape[-1] == b.shape[-1] else None
    if shape is None:
        raise ValueError(
            f"{op}: {first} has shape {tuple(a.shape)} and {second} {tuple(b.shape)}: both must be vectors along "
            "the last dimension, of one size, whose leading dimensions broadcast"
        ) from None  # where an op calls it after its own failure: this message replaces torch's
    if isinstance(alpha, torch.Tensor) and _broadcast(alpha.shape, shape) != shape:
        raise ValueError(
            f"{op}: alpha has shape {tuple(alpha.shape)}, which does not broadcast to the points' {shape} "
            "(a scalar, or one per dimension: the last dimension's size)"
        ) from None


def _up(x, dtype):
    return x.to(dtype) if isinstance(x, torch.Tensor) else x


def _dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a * b).sum(dim=-1, keepdim=True)


def normalize(x: torch.Tensor, eps: float | None = None) -> torch.Tensor:
    """``Norm(x) = x / ‖x‖`` over the last dimension, with no learnable gain.

    This is the retraction onto the sphere (Section 2.2.2). A zero vector has no direction: it
    maps to zero (the norm is clamped at ``eps``) rather than to NaN.
    """
    work = work_dtype(x)
    xw = x.to(work)
    eps = TINY[work] if eps is None else eps
    return (xw / xw.norm(dim=-1, keepdim=True).clamp_min(eps)).to(x.dtype)


def tangent(a: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Projection of ``u`` onto the tangent space of the sphere at ``a``: ``u - (a·u) a``.

    ``a`` must be unit. Idempotent: ``tangent(a, tangent(a, u)) == tangent(a, u)``.
    """
    check_points("tangent", a, u, names="a, u")
    work = work_dtype(a, u)
    aw, uw = a.to(work), u.to(work)
    return (uw - _dot(aw, uw) * aw).to(torch.promote_types(a.dtype, u.dtype))


def angle(a: torch.Tensor, b: torch.Tensor, keepdim: bool = False) -> torch.Tensor:
    """Geodesic distance ``theta = arccos(a·b)`` in [0, pi] between unit vectors.

    Computed as ``2 atan2(‖a - b‖, ‖a + b‖)``, which equals arccos(a·b) for unit vectors but
    stays accurate near 0 and pi, where arccos loses half the digits and has an infinite
    derivative. Inputs slightly off the sphere are fine.
    """
    check_points("angle", a, b)
    work = work_dtype(a, b)
    aw, bw = a.to(work), b.to(work)
    theta = 2 * torch.atan2((aw - bw).norm(dim=-1, keepdim=keepdim), (aw + bw).norm(dim=-1, keepdim=keepdim))
    return theta.to(torch.promote_types(a.dtype, b.dtype))


def lerp(a: torch.Tensor, b: torch.Tensor, alpha) -> torch.Tensor:
    """LERP then retract: ``Norm(a + alpha (b - a))`` (eq. 7, 8; nGPT's update, eq. 10, 11).

    With ``a = h`` and ``b = h_A`` (or ``h_M``), this is the paper's default residual update.
    For a == -b and alpha == 0.5 the sum is zero and so is the result (no direction exists).
    """
    check_points("lerp", a, b, alpha)
    work = work_dtype(a, b, alpha)
    aw, bw = a.to(work), b.to(work)
    return normalize(aw + _up(alpha, work) * (bw - aw)).to(a.dtype)


def riemannian_update(a: torch.Tensor, b: torch.Tensor, alpha) -> torch.Tensor:
    """The Riemannian variable-metric step of Appendix A.3 (eq. 24-26).

    ``g = a (a·b) - b`` is the Euclidean "gradient" ``a - b`` projected onto the tangent space
    at ``a`` (eq. 24); the step is ``Norm(a - alpha g)`` (eq. 25, 26), ``Norm`` being the
    retraction. For a == ±b the projected gradient is zero and the result is ``a``.
    """
    check_points("riemannian_update", a, b, alpha)
    work = work_dtype(a, b, alpha)
    aw, bw = a.to(work), b.to(work)
    g = aw * _dot(aw, bw) - bw
    return normalize(aw - _up(alpha, work) * g).to(a.dtype)


def _fallback_direction(a: torch.Tensor) -> torch.Tensor:
    """A unit tangent vector at ``a``, fixed and deterministic: the direction, within the tangent
    space, of the coordinate axis on which ``a`` has its smallest absolute component."""
    axis = a.detach().abs().argmin(dim=-1, keepdim=True)
    e = torch.zeros_like(a).scatter(-1, axis, 1.0)  # not in place: vmap batches it
    w = e - _dot(a, e) * a
    return w / w.norm(dim=-1, keepdim=True).clamp_min(TINY[a.dtype])


def slerp(a: torch.Tensor, b: torch.Tensor, alpha) -> torch.Tensor:
    """Spherical linear interpolation (Shoemake 1985; eq. 6), then retraction.

    ``SLERP(a, b; alpha) = sin((1-alpha) theta)/sin(theta) a + sin(alpha theta)/sin(theta) b``
    with ``theta = angle(a, b)``, evaluated in the equivalent tangent form
    ``cos(alpha theta) a + sin(alpha theta)/sin(theta) (b - (a·b) a)``. For a scalar alpha the
    point lies on the geodesic, at angle ``alpha theta`` from ``a``; with a tensor alpha the
    coefficients are applied per dimension and the result retracted with ``Norm``.

    Numerics: ``sin(alpha theta)/sin(theta)`` is evaluated as ``alpha sinc(alpha theta) /
    sinc(theta)``, exact and smooth as theta -> 0 (including a == b exactly, where the result is
    a). Antipodal points (sin(theta) < 1e-5 in float32, 1e-12 in float64, with a·b < 0) have no
    unique geodesic: then the path is the great circle from ``a`` towards a fixed tangent
    direction, that of the coordinate axis least aligned with ``a``; alpha = 1 still gives -a = b.
    """
    check_points("slerp", a, b, alpha)
    work = work_dtype(a, b, alpha)
    aw, bw = a.to(work), b.to(work)
    alpha = _up(alpha, work)
    theta = angle(aw, bw, keepdim=True)
    u = bw - _dot(aw, bw) * aw  # tangent at a, ‖u‖ = sin(theta)
    sin_theta = u.norm(dim=-1, keepdim=True)
    antipodal = (sin_theta < ANTIPODAL_SIN[work]) & (theta > math.pi / 2)

    # Regular branch; theta is replaced where antipodal so that no inf/NaN reaches the backward
    # pass through the unselected side of torch.where.
    theta_safe = torch.where(antipodal, torch.zeros_like(theta), theta)
    sinc = lambda x: torch.sinc(x / math.pi)  # noqa: E731  sin(x)/x, smooth at 0
    ratio = alpha * sinc(alpha * theta_safe) / sinc(theta_safe)  # sin(alpha theta)/sin(theta)
    regular = torch.cos(alpha * theta) * aw + ratio * u

    # Antipodal branch: rotate by alpha*theta towards the fallback direction. Skipped where the
    # host can tell no row needs it (may_hold_any): a third of the op's time, forward and
    # backward; the result and gradients are the same, since torch.where would select the
    # regular branch everywhere and send the other zeros.
    if not may_hold_any(antipodal):
        return normalize(regular).to(a.dtype)
    along = torch.cos(alpha * theta) * aw + torch.sin(alpha * theta) * _fallback_direction(aw)
    out = torch.where(antipodal, along, regular)
    return normalize(out).to(a.dtype)
