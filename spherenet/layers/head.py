"""A classifier head on the sphere: cosine-similarity logits with a learned scale per class.

nGPT's logits are ``z = (E_out h) * s_z`` (eq. 1, 3): each is the cosine between the unit hidden
state and a unit class vector, scaled by a learnable ``s_z`` (a cosine alone is stuck in
[-1, 1], too flat for a confident softmax). The same construction classifies any
representation: a sequence's pooled state, an image embedding.
"""

from __future__ import annotations

import torch
from torch import nn

from .. import kernels
from .config import S_Z, ScaleSpec
from .sphere import Scale, SphereLinear

__all__ = ["SphereClassifier"]


class SphereClassifier(nn.Module):
    """``logits = cos(x, w_c) * s_c`` for every class ``c``: unit class vectors ``w_c`` (declared
    on the sphere, so the sphere optimizers keep them unit) and scales ``s_c`` (a
    :class:`ScaleSpec`, default nGPT's s_z, :data:`spherenet.layers.config.S_Z`).

    ``x``: ``(..., d_model)``. ``normalize_input`` (default True) takes ``Norm(x)`` first; pass
    False when ``x`` is unit already (an nGPT hidden state). Returns ``(..., n_classes)``.
    """

    is_output_layer = True  # an output layer: Muon leaves it to Adam (spherenet.optim.hidden_matrices)

    def __init__(self, d_model: int, n_classes: int, *, scale: ScaleSpec = S_Z, normalize_input: bool = True):
        super().__init__()
        self.weight = SphereLinear(d_model, n_classes, sphere="in")
        self.scale = Scale.from_spec(n_classes, scale, d_model)
        self.normalize_input = bool(normalize_input)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.normalize_input:
            x = kernels.normalize(x)
        return self.weight(x, out_scale=self.scale())

    def extra_repr(self) -> str:
        return f"normalize_input={self.normalize_input}"
