"""The residual connection of nGPT: move the hidden state along the sphere towards a block's output.

The baseline adds a block's output to the hidden state (eq. 4, 5). nGPT instead treats the
normalized block output ``h_block`` (``h_A`` or ``h_M``) as a point suggested on the sphere and
takes a step from ``h`` towards it, of per-dimension size ``alpha`` (the "eigen learning rates",
Section 2.2.2), then retracts onto the sphere.
"""

from __future__ import annotations

import torch
from torch import nn

from .. import kernels
from ..manifolds import lerp, riemannian_update, slerp
from .scale import Scale, ScaleSpec

__all__ = ["SphericalResidual", "RESIDUAL_UPDATES", "ALPHA"]

#: The update rules, by name, as plain functions of :mod:`spherenet.manifolds` (the reference
#: implementation). Each maps ``(h, h_block, alpha)`` to the new unit hidden state; the layer
#: calls them through :func:`spherenet.kernels.residual_update`.
RESIDUAL_UPDATES = {
    "lerp": lerp,  # Norm(h + alpha (h_block - h)), eq. 10, 11 (the paper's choice)
    "slerp": slerp,  # geodesic interpolation, eq. 6
    "riemannian": riemannian_update,  # Norm(h - alpha (h (h . h_block) - h_block)), eq. 25, 26
}

#: The paper's alpha_A and alpha_M (Section 2.6, step 3): init 0.05 ("in order of 1/n_layers"),
#: scale 1/sqrt(d_model), one per dimension, used as |alpha| (Appendix A.2).
ALPHA = ScaleSpec(init=0.05, absolute=True)


class SphericalResidual(nn.Module):
    """``h <- update(h, h_block; |alpha|)`` with learnable eigen learning rates ``alpha``.

    Args:
        dim: d_model, the size of the hidden state.
        update: ``"lerp"`` (eq. 10, 11), ``"slerp"`` (eq. 6) or ``"riemannian"`` (eq. 25, 26).
        alpha: the :class:`ScaleSpec` of alpha (default :data:`ALPHA`, the paper's).
            ``alpha.absolute`` uses ``|alpha|`` in the forward pass (Appendix A.2);
            ``False`` leaves alpha unconstrained (a variable-metric step that may go backwards).

    Inputs ``h`` and ``h_block`` are unit vectors along the last dimension (``h_block`` is
    ``Norm(ATTN(h))`` or ``Norm(MLP(h))``); the result is unit too.
    """

    def __init__(self, dim: int, update: str = "lerp", alpha: ScaleSpec = ALPHA):
        super().__init__()
        if update not in RESIDUAL_UPDATES:
            raise ValueError(f"SphericalResidual update must be one of {tuple(RESIDUAL_UPDATES)}, got {update!r}")
        if not isinstance(dim, int) or isinstance(dim, bool) or dim < 1:
            raise ValueError(f"SphericalResidual dim must be a positive int, got {dim!r}")
        self.dim, self.update = dim, update
        self.alpha = Scale.from_spec(dim, alpha, d_model=dim)

    @property
    def alpha_abs(self) -> bool:
        """Whether the forward pass uses ``|alpha|`` (Appendix A.2)."""
        return self.alpha.absolute

    def effective_alpha(self) -> torch.Tensor:
        """The step sizes used in the forward pass: ``|alpha|`` (or alpha), shape (dim,) or (1,)."""
        return self.alpha()

    def forward(self, h: torch.Tensor, h_block: torch.Tensor) -> torch.Tensor:
        return kernels.residual_update(self.update, h, h_block, self.effective_alpha())

    def extra_repr(self) -> str:
        return f"dim={self.dim}, update={self.update}, alpha_abs={self.alpha_abs}"
