"""The residual connection of nGPT: move the hidden state along the sphere towards a block's output.

The baseline adds a block's output to the hidden state (eq. 4, 5). nGPT instead treats the
normalized block output ``h_block`` (``h_A`` or ``h_M``) as a point suggested on the sphere and
takes a step from ``h`` towards it, of per-dimension size ``alpha`` (the "eigen learning rates",
Section 2.2.2), then retracts onto the sphere.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ..manifolds import lerp, riemannian_update, slerp
from . import fused
from .scale import SCALE_MODES, Scale

__all__ = ["SphericalResidual", "RESIDUAL_UPDATES"]

#: The update rules, by name. Each maps ``(h, h_block, alpha)`` to the new unit hidden state.
RESIDUAL_UPDATES = {
    "lerp": lerp,  # Norm(h + alpha (h_block - h)), eq. 10, 11 (the paper's choice)
    "slerp": slerp,  # geodesic interpolation, eq. 6
    "riemannian": riemannian_update,  # Norm(h - alpha (h (h . h_block) - h_block)), eq. 25, 26
}

# The same updates as single autograd functions that keep fewer activations (spherenet.layers.fused).
_FUSED_UPDATES = {
    "lerp": fused.lerp_normalize,
    "slerp": fused.slerp_normalize,
    "riemannian": fused.riemannian_normalize,
}


class SphericalResidual(nn.Module):
    """``h <- update(h, h_block; |alpha|)`` with learnable eigen learning rates ``alpha``.

    Args:
        dim: d_model, the size of the hidden state.
        update: ``"lerp"`` (eq. 10, 11), ``"slerp"`` (eq. 6) or ``"riemannian"`` (eq. 25, 26).
        alpha_init: the value alpha starts at (0.05, "in order of 1/n_layers", Section 2.6).
        alpha_scale: the stored scale of alpha (Section 2.5); ``None`` means ``1/sqrt(dim)``.
        alpha_mode: ``"vector"`` (one alpha per dimension, the paper's default), ``"scalar"``
            or ``"fixed"`` (Table 5).
        alpha_abs: use ``|alpha|`` in the forward pass (Appendix A.2, the paper's choice);
            ``False`` leaves alpha unconstrained (a variable-metric step that may go backwards).

    Inputs ``h`` and ``h_block`` are unit vectors along the last dimension (``h_block`` is
    ``Norm(ATTN(h))`` or ``Norm(MLP(h))``); the result is unit too.
    """

    def __init__(
        self,
        dim: int,
        update: str = "lerp",
        alpha_init: float = 0.05,
        alpha_scale: float | None = None,
        alpha_mode: str = "vector",
        alpha_abs: bool = True,
    ):
        super().__init__()
        if update not in RESIDUAL_UPDATES:
            raise ValueError(f"SphericalResidual update must be one of {tuple(RESIDUAL_UPDATES)}, got {update!r}")
        if alpha_mode not in SCALE_MODES:
            raise ValueError(f"SphericalResidual alpha_mode must be one of {SCALE_MODES}, got {alpha_mode!r}")
        if not isinstance(dim, int) or isinstance(dim, bool) or dim < 1:
            raise ValueError(f"SphericalResidual dim must be a positive int, got {dim!r}")
        self.dim, self.update, self.alpha_abs = dim, update, bool(alpha_abs)
        alpha_scale = 1 / math.sqrt(dim) if alpha_scale is None else alpha_scale
        self.alpha = Scale(dim, alpha_init, alpha_scale, mode=alpha_mode)

    def effective_alpha(self) -> torch.Tensor:
        """The step sizes used in the forward pass: ``|alpha|`` (or alpha), shape (dim,) or (1,)."""
        alpha = self.alpha()
        return alpha.abs() if self.alpha_abs else alpha

    def forward(self, h: torch.Tensor, h_block: torch.Tensor) -> torch.Tensor:
        updates = _FUSED_UPDATES if fused.is_enabled() else RESIDUAL_UPDATES
        return updates[self.update](h, h_block, self.effective_alpha())

    def extra_repr(self) -> str:
        return f"dim={self.dim}, update={self.update}, alpha_abs={self.alpha_abs}"
