"""The scaled linear map ``(x W^T) * scale``: ``u * s_u``, ``v * s_v sqrt(d)`` (eq. 20, 21) and
the logits ``z * s_z`` (eq. 3).

Two implementations under one signature ``(x, weight, scale)`` (:mod:`spherenet.kernels.resolve`
picks): ``"reference"`` scales the output; ``"torch"`` (what ``"auto"`` takes) folds the scale
into the weight. No Triton kernel: with the scale folded into the weight the work is the matmul's.

Equation numbers are those of Loshchilov et al., "nGPT: Normalized Transformer with
Representation Learning on the Hypersphere" (2024).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .arguments import check_linear
from .resolve import Op

__all__ = ["SCALED_LINEAR", "scaled_linear", "scaled_linear_reference", "scaled_linear_fused"]


def scaled_linear_reference(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``(x W^T) * scale``, in that order."""
    return F.linear(x, weight) * scale


def scaled_linear_fused(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``(x W^T) * scale``. With gradients enabled the scale is folded into the weight's rows,
    ``x (s W)^T``: one multiply of the weight instead of one of the output, and no output kept
    for the scale's gradient. Without, the output is scaled (cheaper for a few tokens, as in
    decoding). The result has the dtype of ``x W^T`` (bf16 under autocast in both cases)."""
    if torch.is_grad_enabled():
        return F.linear(x, weight * scale.unsqueeze(-1))
    y = F.linear(x, weight)
    return (y * scale).to(y.dtype)


SCALED_LINEAR = Op(
    "scaled_linear",
    implementations={"reference": scaled_linear_reference, "torch": scaled_linear_fused},
    auto={"*": "torch"},
)


def scaled_linear(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``(x W^T) * scale``, one factor per output feature. ``weight`` is ``(out_features,
    in_features)``; ``scale`` is ``(out_features,)``, ``(1,)`` or a scalar."""
    try:
        return SCALED_LINEAR(x, weight, scale)
    except Exception:
        check_linear("scaled_linear", x, weight, scale)  # a ValueError naming the shapes, where they are the cause
        raise
