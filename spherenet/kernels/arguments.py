"""What the public ops check of their arguments, so that a mismatch is a ``ValueError`` naming
the op, the argument and the shapes whichever implementation ran, instead of torch's size message
from inside the arithmetic (or a Triton or native kernel's).

The layer ops run these checks only when an implementation has failed (nothing is added to a
call that works, as in decoding, where the ops run a few times per layer and token) and re-raise
the implementation's own error when the shapes are not the cause. The optimizer ops check first:
they update lists of tensors in place, and a failure half-way would leave a partial step.
Each check raises ``from None``: the message replaces torch's, it does not follow it."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..manifolds.geodesic import check_points

__all__ = ["check_update", "check_broadcast", "check_linear", "check_lists"]


def check_update(op: str, h: torch.Tensor, h_block: torch.Tensor, alpha) -> None:
    """``h`` and ``h_block``: vectors along the last dimension, of one size, whose leading
    dimensions broadcast; a tensor ``alpha`` broadcasts to them."""
    check_points(op, h, h_block, alpha, names="h, h_block")


def check_broadcast(op: str, names: str, *tensors: torch.Tensor) -> None:
    """The ``tensors`` (named by ``names``, comma-separated) broadcast against each other."""
    shapes = [tuple(t.shape) for t in tensors]
    try:
        torch.broadcast_shapes(*shapes)
    except RuntimeError:
        described = " and ".join(f"{n.strip()} {s}" for n, s in zip(names.split(","), shapes))
        raise ValueError(f"{op}: shapes {described} do not broadcast") from None


def check_linear(op: str, x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor) -> None:
    """``weight`` is ``(out_features, in_features)``, ``x`` ends in ``in_features`` and ``scale``
    is ``(out_features,)``, ``(1,)`` or a scalar."""
    if weight.dim() != 2:
        raise ValueError(
            f"{op}: weight has shape {tuple(weight.shape)}; expected (out_features, in_features)"
        ) from None
    if x.dim() == 0 or x.shape[-1] != weight.shape[1]:
        raise ValueError(
            f"{op}: input has shape {tuple(x.shape)} and weight {tuple(weight.shape)}: the input's last dimension "
            f"must be the weight's in_features ({weight.shape[1]})"
        ) from None
    if scale.shape not in ((), (1,), weight.shape[:1]):
        raise ValueError(
            f"{op}: scale has shape {tuple(scale.shape)}; expected ({weight.shape[0]},) (one per output feature), "
            "(1,) or a scalar"
        ) from None


def check_lists(op: str, names: str, *lists: Sequence, same_shape: int | None = None) -> None:
    """The ``lists`` (named by ``names``) are of one length, and the tensors of the first
    ``same_shape`` lists (all, by default) have, index by index, the shape of the first list's."""
    labels = [n.strip() for n in names.split(",")]
    lengths = [len(lst) for lst in lists]
    if len(set(lengths)) != 1:
        described = ", ".join(f"{n} {k}" for n, k in zip(labels, lengths))
        raise ValueError(f"{op}: lists of unequal lengths ({described})") from None
    for label, lst in list(zip(labels, lists))[1 : same_shape if same_shape is not None else len(lists)]:
        for i, (first, other) in enumerate(zip(lists[0], lst)):
            if first.shape != other.shape:
                raise ValueError(
                    f"{op}: {label}[{i}] has shape {tuple(other.shape)}, {labels[0]}[{i}] {tuple(first.shape)}: "
                    "they must match"
                ) from None
