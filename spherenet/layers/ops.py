"""nGPT's element-wise operations: one entry point each, and the one place that chooses the
implementation behind them.

The layers call only the functions below. Each has several implementations with the same
values and the same signature:

- ``"reference"``: plain autograd over :mod:`spherenet.manifolds` and ``torch`` (every
  intermediate kept for the backward pass). The readable definition, and what the others are
  tested against.
- ``"torch"`` (the default): the fused autograd functions of :mod:`spherenet.layers.fused`,
  which keep fewer activations and fold the scalings s_u, s_v, s_z into the weights.
- ``"triton"``: the Triton kernels of :mod:`spherenet.layers.triton_ops` for Norm, q/k Norm
  times s_qk, the LERP and Riemannian updates and SwiGLU, and of
  :mod:`spherenet.layers.triton_slerp` for the SLERP update (the ``"torch"`` functions for
  the scaled projections, whose scale is folded into the weight and so into the matmul, and for
  float64 tensors). Loaded on first use; on CPU tensors it needs
  Triton's interpreter (``TRITON_INTERPRET=1``).

An implementation is a row of :data:`IMPLEMENTATIONS` (an :class:`Implementation`, or a function
that builds one on first use); adding one is adding a row there, with a test against
``"reference"``. The choice is made here and nowhere else: at
import from the environment variable ``SPHERENET_KERNELS`` (default ``"torch"``), and for a
block of code with :func:`use`::

    with spherenet.layers.ops.use("reference"):
        loss = model(x).logsumexp(-1).mean()

Equation numbers are those of Loshchilov et al., "nGPT: Normalized Transformer with
Representation Learning on the Hypersphere" (2024).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
import torch.utils.checkpoint

from .. import manifolds
from . import fused

__all__ = [
    "IMPLEMENTATIONS",
    "Implementation",
    "active",
    "use",
    "checkpoint",
    "normalize",
    "qk_normalize",
    "residual_update",
    "swiglu",
    "scaled_linear",
]


@dataclass(frozen=True)
class Implementation:
    """One implementation of every element-wise operation (the signatures are the entry points')."""

    normalize: Callable
    qk_normalize: Callable
    residual_updates: dict[str, Callable]
    swiglu: Callable
    scaled_linear: Callable


def _qk_normalize_reference(x: torch.Tensor, s_qk: torch.Tensor, qk_norm: bool = True) -> torch.Tensor:
    return (manifolds.normalize(x) if qk_norm else x) * s_qk


def _qk_normalize_fused(x: torch.Tensor, s_qk: torch.Tensor, qk_norm: bool = True) -> torch.Tensor:
    return fused.scaled_normalize(x, s_qk) if qk_norm else x * s_qk


def _swiglu_reference(u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return u * F.silu(v)


def _scaled_linear_reference(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return F.linear(x, weight) * scale


IMPLEMENTATIONS: dict[str, Implementation | Callable[[], Implementation]] = {
    "reference": Implementation(
        normalize=manifolds.normalize,
        qk_normalize=_qk_normalize_reference,
        residual_updates={
            "lerp": manifolds.lerp,
            "slerp": manifolds.slerp,
            "riemannian": manifolds.riemannian_update,
        },
        swiglu=_swiglu_reference,
        scaled_linear=_scaled_linear_reference,
    ),
    "torch": Implementation(
        normalize=fused.normalize,
        qk_normalize=_qk_normalize_fused,
        residual_updates={
            "lerp": fused.lerp_normalize,
            "slerp": fused.slerp_normalize,
            "riemannian": fused.riemannian_normalize,
        },
        swiglu=fused.swiglu,
        scaled_linear=fused.scaled_linear,
    ),
}


def _triton() -> Implementation:
    from . import triton_ops, triton_slerp  # import Triton: only when this implementation is used

    return Implementation(
        normalize=triton_ops.normalize,
        qk_normalize=lambda x, s_qk, qk_norm=True: triton_ops.scaled_normalize(x, s_qk) if qk_norm else x * s_qk,
        residual_updates={
            "lerp": triton_ops.lerp_normalize,
            "slerp": triton_slerp.slerp_normalize,
            "riemannian": triton_ops.riemannian_normalize,
        },
        swiglu=triton_ops.swiglu,
        scaled_linear=fused.scaled_linear,
    )


IMPLEMENTATIONS["triton"] = _triton


def _from_environment() -> str:
    name = os.environ.get("SPHERENET_KERNELS", "").strip().lower() or "torch"
    if name not in IMPLEMENTATIONS:
        raise ValueError(f"SPHERENET_KERNELS={name!r} is not one of {', '.join(IMPLEMENTATIONS)}")
    return name


_active = _from_environment()


def active() -> str:
    """The name of the implementation the layers use now."""
    return _active


@contextlib.contextmanager
def use(name: str):
    """Within the ``with`` block the layers use the implementation ``name`` (a key of
    :data:`IMPLEMENTATIONS`); the previous one is restored on exit. Under ``torch.compile`` the
    choice is fixed when the graph is traced."""
    global _active
    if name not in IMPLEMENTATIONS:
        raise ValueError(f"kernel implementation must be one of {', '.join(IMPLEMENTATIONS)}, got {name!r}")
    previous, _active = _active, name
    try:
        yield
    finally:
        _active = previous


def _impl() -> Implementation:
    impl = IMPLEMENTATIONS[_active]
    if not isinstance(impl, Implementation):  # built on first use
        impl = IMPLEMENTATIONS[_active] = impl()
    return impl


def checkpoint(function, *args):
    """``torch.utils.checkpoint.checkpoint(function, *args, use_reentrant=False)`` whose
    recomputation in the backward pass uses the implementation of the forward pass (a backward
    run outside the forward's ``with use(...)`` block recomputes the same graph)."""
    if torch.compiler.is_compiling():
        return torch.utils.checkpoint.checkpoint(function, *args, use_reentrant=False)
    name = _active
    contexts = lambda: (contextlib.nullcontext(), use(name))  # noqa: E731  (forward, recomputation)
    return torch.utils.checkpoint.checkpoint(function, *args, use_reentrant=False, context_fn=contexts)


# ---------------------------------------------------------------- the entry points


def normalize(x: torch.Tensor) -> torch.Tensor:
    """``Norm(x) = x / ‖x‖`` over the last dimension: ``h_A = Norm(ATTN(h))``,
    ``h_M = Norm(MLP(h))`` (Table 1, eq. 10, 11)."""
    return _impl().normalize(x)


def qk_normalize(x: torch.Tensor, s_qk: torch.Tensor, qk_norm: bool = True) -> torch.Tensor:
    """``Norm(x) * s_qk`` for the queries or keys of a head (eq. 15, 16); ``qk_norm=False``
    drops the ``Norm`` (Table 6). ``s_qk`` broadcasts against ``x``."""
    return _impl().qk_normalize(x, s_qk, qk_norm)


def residual_update(update: str, h: torch.Tensor, h_block: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    """The hidden state moved on the sphere towards the block's output ``h_block`` by the eigen
    learning rates ``alpha``: ``"lerp"`` ``Norm(h + alpha (h_block - h))`` (eq. 10, 11),
    ``"slerp"`` (eq. 6, then ``Norm``) or ``"riemannian"``
    ``Norm(h - alpha (h (h · h_block) - h_block))`` (eq. 24-26)."""
    return _impl().residual_updates[update](h, h_block, alpha)


def swiglu(u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """``u * SiLU(v)`` (eq. 19; ``v`` is the gate)."""
    return _impl().swiglu(u, v)


def scaled_linear(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``(x W^T) * scale``, one factor per output feature: ``u * s_u``, ``v * s_v sqrt(d)``
    (eq. 20, 21) and the logits ``z * s_z`` (eq. 3). ``weight`` is ``(out_features,
    in_features)``; ``scale`` is ``(out_features,)`` or ``(1,)``."""
    return _impl().scaled_linear(x, weight, scale)
