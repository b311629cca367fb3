"""nGPT, the normalized Transformer (Loshchilov et al. 2024), as a decoder-only language model.

Every matrix is a stack of unit vectors along its d_model-sized side (a geoopt
``ManifoldParameter`` on the Sphere, declared by the layer that owns it), and the hidden state
stays on the unit sphere through every block (Table 1). The config, with the paper's defaults,
is :class:`spherenet.layers.config.NGPTConfig`; one layer is :class:`spherenet.layers.NGPTBlock`.
"""

from __future__ import annotations

import torch

from ..layers import NGPTBlock, NGPTConfig, Scale, SphereEmbedding, SphereLinear
from ..layers.linear import scaled
from .common import LanguageModel

__all__ = ["NGPTConfig", "NGPT"]


class NGPT(LanguageModel):
    """The normalized Transformer.

    ``h = E_in[ids]`` (unit rows), then L blocks ``h <- Norm(h + alpha (Norm(block(h)) - h))``
    (eq. 10, 11), then logits ``z = (E_out h) * s_z`` (eq. 1, 3): cosine similarities, each
    scaled by its vocabulary entry's s_z. No final normalization (h is already unit).
    """

    config_class = NGPTConfig  # save_pretrained / from_pretrained (spherenet.models.hub)
    model_type = "ngpt"
    architecture = "NGPT"

    def __init__(self, config: NGPTConfig):
        c = config
        super().__init__(c, SphereEmbedding(c.vocab_size, c.d_model), NGPTBlock)  # E_input, unit rows
        self.embed_out = SphereLinear(c.d_model, c.vocab_size, sphere="in")  # E_output, unit rows
        self.s_z = Scale.from_spec(c.vocab_size, c.s_z, c.d_model)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        logits = scaled(self.embed_out, h, self.s_z)  # z = (E_out h) * s_z, eq. 1, 3 (folded in eval)
        return logits.to(torch.promote_types(logits.dtype, self.s_z.source.dtype))

    def init_weights(self) -> None:
        """(Re)initialize every parameter: random unit vectors for the sphere weights, the
        paper's initial values for the scalings. For a model built on the meta device and then
        materialized with ``to_empty``. (Fixed scalings' constant buffers are refilled too.)"""
        for module in self.modules():
            if isinstance(module, (SphereLinear, SphereEmbedding, Scale)):
                module.reset_parameters()
