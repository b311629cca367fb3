"""The residual updates of nGPT's hidden state on the sphere: LERP (eq. 10, 11), SLERP (eq. 6) and
the Riemannian update (eq. 24-26), each followed by ``Norm``.

Each update has three implementations under one signature ``(h, h_block, alpha)``
(:mod:`spherenet.kernels.resolve` picks):

- ``"reference"``: the definitions of :mod:`spherenet.manifolds` (``lerp``, ``slerp``,
  ``riemannian_update``), in plain autograd;
- ``"torch"`` (what ``"auto"`` takes): one ``torch.autograd.Function`` per update, keeping
  five tensors and recomputing the rest (:mod:`spherenet.kernels.residual_fused`);
- ``"triton"``: one kernel forward and one backward each (:mod:`spherenet.kernels.residual_triton`).

``alpha`` (the eigen learning rates) is a float or a tensor broadcasting against ``h``: shape
``(d,)`` or ``(1,)``.

Equation numbers are those of Loshchilov et al., "nGPT: Normalized Transformer with
Representation Learning on the Hypersphere" (2024).
"""

from __future__ import annotations

import torch

from .. import manifolds
from .arguments import check_update
from .norm import NORMALIZE, _normalize_values
from .residual_fused import _lerp_values, _riemannian_values, lerp_normalize, riemannian_normalize, slerp_normalize
from .resolve import Op

__all__ = [
    "UPDATES",
    "update_op",
    "residual_update",
    "normalized_update",
    "lerp_normalize",
    "slerp_normalize",
    "riemannian_normalize",
]


# ---------------------------------------------------------------- the ops


def _lerp_triton(h, h_block, alpha):
    from . import residual_triton  # imports Triton: on first use only

    return residual_triton.lerp_normalize(h, h_block, alpha)


def _slerp_triton(h, h_block, alpha):
    from . import residual_triton

    return residual_triton.slerp_normalize(h, h_block, alpha)


def _riemannian_triton(h, h_block, alpha):
    from . import residual_triton

    return residual_triton.riemannian_normalize(h, h_block, alpha)


def _triton_takes(h: torch.Tensor, h_block: torch.Tensor, alpha) -> bool:
    """Whether the Triton kernels take an update: they compute in float32, with ``alpha`` a tensor."""
    return (
        torch.float64 not in (h.dtype, h_block.dtype)
        and isinstance(alpha, torch.Tensor)
        and alpha.dtype != torch.float64
    )


#: update name -> its op; the references are :mod:`spherenet.manifolds`' definitions.
UPDATES: dict[str, Op] = {
    "lerp": Op(
        "lerp",
        implementations={"reference": manifolds.lerp, "torch": lerp_normalize, "triton": _lerp_triton},
        auto={"*": "torch"},
        takes={"triton": _triton_takes},
    ),
    "slerp": Op(
        "slerp",
        implementations={"reference": manifolds.slerp, "torch": slerp_normalize, "triton": _slerp_triton},
        auto={"*": "torch"},
        takes={"triton": _triton_takes},
    ),
    "riemannian": Op(
        "riemannian",
        implementations={
            "reference": manifolds.riemannian_update,
            "torch": riemannian_normalize,
            "triton": _riemannian_triton,
        },
        auto={"*": "torch"},
        takes={"triton": _triton_takes},
    ),
}


def residual_update(update: str, h: torch.Tensor, h_block: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    """The hidden state moved on the sphere towards the block's output ``h_block`` by the eigen
    learning rates ``alpha``: ``"lerp"`` ``Norm(h + alpha (h_block - h))`` (eq. 10, 11),
    ``"slerp"`` (eq. 6, then ``Norm``) or ``"riemannian"``
    ``Norm(h - alpha (h (h · h_block) - h_block))`` (eq. 24-26)."""
    op = _update_op("residual_update", update, h, h_block, alpha)
    try:
        return op(h, h_block, alpha)
    except Exception:
        # a ValueError naming the shapes where they are the cause, else the implementation's error
        check_update(f"residual_update({update!r})", h, h_block, alpha)
        raise


def update_op(update: str, caller: str = "update_op") -> Op:
    """The op of the update named ``update`` (``"lerp"``, ``"slerp"``, ``"riemannian"``): what a
    block looks up once, when it is built. A ``ValueError`` naming ``caller`` for another name."""
    op = UPDATES.get(update)
    if op is None:
        raise ValueError(f"{caller}: unknown update {update!r}; expected one of {', '.join(UPDATES)}")
    return op


def _update_op(caller: str, update: str | Op, h: torch.Tensor, block: torch.Tensor, alpha) -> Op:
    """The update's op (``update``: its name or the op), after the checks a failure would not
    reveal: the name, and an ``alpha`` of more than one dimension, which may broadcast past the
    points' shape (the definitions refuse that, where the fused functions would return the larger
    shape; the models' alpha is one dimension, which cannot)."""
    op = update if isinstance(update, Op) else update_op(update, caller)
    if isinstance(alpha, torch.Tensor) and alpha.dim() > 1:
        check_update(f"{caller}({op.name!r})", h, block, alpha)
    return op


#: the updates whose ``"torch"`` forward :func:`normalized_update` runs directly without gradients
_FORWARD_VALUES = {UPDATES["lerp"]: _lerp_values, UPDATES["riemannian"]: _riemannian_values}


def normalized_update(update: str | Op, h: torch.Tensor, block_out: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    """``residual_update(update, h, Norm(block_out), alpha)``: a sub-block's output normalized
    (``h_A = Norm(ATTN(h))``, ``h_M = Norm(MLP(h))``) and the hidden state moved towards it (eq.
    10, 11) in one call. ``update``: the update's name or its op (:func:`update_op`, as a block
    holds it). Without gradients, where both ops run ``"torch"``, their forward values are
    computed directly (no autograd function): the same values, fewer calls per token in decoding."""
    op = _update_op("normalized_update", update, h, block_out, alpha)
    try:
        values = _FORWARD_VALUES.get(op)
        if (
            values is not None
            and not torch.is_grad_enabled()
            and NORMALIZE.implementation_name(block_out) == "torch"
            and op.implementation_name(h, block_out, alpha) == "torch"
        ):
            return values(h, _normalize_values(block_out, None)[0], alpha, None)[0]
        return op(h, NORMALIZE(block_out), alpha)
    except Exception:
        check_update(f"normalized_update({op.name!r})", h, block_out, alpha)  # as residual_update
        raise
