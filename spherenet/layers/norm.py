"""RMSNorm, the baseline GPT's normalization (Section 2.2.1). nGPT has none of it."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["RMSNorm"]


class RMSNorm(nn.Module):
    """``x / rms(x) * gain``: rescales every vector to norm ``sqrt(dim)`` (before the gain), then
    multiplies each dimension by a learnable gain initialized to 1. No bias.

    ``eps`` is added to the mean square before the square root.
    """

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        if not isinstance(dim, int) or isinstance(dim, bool) or dim < 1:
            raise ValueError(f"RMSNorm dim must be a positive int, got {dim!r}")
        if not eps >= 0:
            raise ValueError(f"RMSNorm eps must be >= 0, got {eps!r}")
        self.dim, self.eps = dim, float(eps)
        self.weight = nn.Parameter(torch.ones(dim))

    def reset_parameters(self) -> None:
        with torch.no_grad():
            self.weight.fill_(1.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (self.dim,), self.weight, self.eps)

    def extra_repr(self) -> str:
        return f"{self.dim}, eps={self.eps:g}"
