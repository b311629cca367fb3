"""The baseline GPT of the nGPT paper (Section 2): pre-norm, RMSNorm, RoPE, SwiGLU, untied.

Kept deliberately plain, since it is half of every comparison: ``h += ATTN(RMSNorm(h))``,
``h += MLP(RMSNorm(h))`` (eq. 4, 5; :class:`spherenet.layers.GPTBlock`), a final RMSNorm, and
untied input/output embeddings. The config is :class:`spherenet.layers.config.GPTConfig`.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ..layers import GPTBlock, GPTConfig, RMSNorm
from .common import LanguageModel

__all__ = ["GPTConfig", "GPT"]


class GPT(LanguageModel):
    """The baseline Transformer decoder: ``h = E_in[ids]``, L pre-norm blocks, RMSNorm,
    logits ``z = E_out h`` (eq. 1)."""

    config_class = GPTConfig  # save_pretrained / from_pretrained (spherenet.models.hub)
    model_type = "gpt"
    architecture = "GPT"

    def __init__(self, config: GPTConfig):
        c = config
        super().__init__(c, nn.Embedding(c.vocab_size, c.d_model), GPTBlock)
        self.norm_out = RMSNorm(c.d_model, c.norm_eps)
        self.embed_out = nn.Linear(c.d_model, c.vocab_size, bias=False)  # untied from embed_in
        self.init_weights()

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        return self.embed_out(self.norm_out(h))

    def init_weights(self) -> None:
        """Normal(0, init_std) for embeddings and every matrix; init_std / sqrt(2 L) for the
        output projections W_o and W_o_mlp (Radford et al. 2018; A.5); RMSNorm gains 1."""
        std = self.config.init_std
        out_std = std / math.sqrt(2 * self.config.n_layers)
        with torch.no_grad():
            for module in self.modules():
                if isinstance(module, (nn.Linear, nn.Embedding)):
                    nn.init.normal_(module.weight, mean=0.0, std=std)
                elif isinstance(module, RMSNorm):
                    module.reset_parameters()
            for block in self.blocks:
                nn.init.normal_(block.attn.w_o.weight, mean=0.0, std=out_std)
                nn.init.normal_(block.mlp.w_o.weight, mean=0.0, std=out_std)
