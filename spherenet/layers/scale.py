"""Learnable scaling factors with the s_init / s_scale parametrization (Section 2.5)."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["Scale", "SCALE_MODES"]

SCALE_MODES = ("vector", "scalar", "fixed")


class Scale(nn.Module):
    """A scaling factor ``s`` stored at ``scale`` and used as ``s * (init / scale)`` (Section 2.5).

    Adam moves every stored element by about ``lr`` per step, so the effective learning rate of
    the used value is ``lr * init / scale``: ``scale = 1/sqrt(d_model)`` makes it move like an
    element of a unit vector of size d_model.

    ``mode``: ``"vector"`` (one learnable value per element, the paper's default),
    ``"scalar"`` (one learnable value, broadcast; Table 5), ``"fixed"`` (no parameter, the
    constant ``init``; Table 5). ``forward()`` returns the effective value, shape ``(size,)``
    or ``(1,)``.
    """

    def __init__(self, size: int, init: float = 1.0, scale: float = 1.0, mode: str = "vector"):
        super().__init__()
        if mode not in SCALE_MODES:
            raise ValueError(f"Scale mode must be one of {SCALE_MODES}, got {mode!r}")
        if not isinstance(size, int) or size < 1:
            raise ValueError(f"Scale size must be a positive int, got {size!r}")
        if not scale > 0:
            raise ValueError(f"Scale 'scale' (s_scale) must be > 0, got {scale!r}")
        self.size, self.init, self.scale, self.mode = size, float(init), float(scale), mode
        if mode == "fixed":
            self.register_buffer("value", torch.full((1,), self.init), persistent=False)
            self.param = None
        else:
            self.param = nn.Parameter(torch.empty(size if mode == "vector" else 1))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        with torch.no_grad():
            if self.param is not None:
                self.param.fill_(self.scale)
            else:  # the constant, e.g. after materializing from the meta device
                self.value.fill_(self.init)

    def forward(self) -> torch.Tensor:
        if self.param is None:
            return self.value
        return self.param * (self.init / self.scale)

    def extra_repr(self) -> str:
        return f"size={self.size}, init={self.init:g}, scale={self.scale:g}, mode={self.mode}"
