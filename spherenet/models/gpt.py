"""The baseline GPT of the nGPT paper (Section 2): pre-norm, RMSNorm, RoPE, SwiGLU, untied.

Kept deliberately plain, since it is half of every comparison: ``h += ATTN(RMSNorm(h))``,
``h += MLP(RMSNorm(h))`` (eq. 4, 5), a final RMSNorm, and untied input/output embeddings.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..layers import GPTBlock, KVCache, RMSNorm, RotaryEmbedding
from . import common
from .hub import HubMixin

__all__ = ["GPTConfig", "GPT"]


@dataclass
class GPTConfig:
    """Sizes of the baseline. Init: normal ``init_std`` for every matrix, and
    ``init_std / sqrt(2 n_layers)`` for the output projections W_o and W_o_mlp (A.5)."""

    vocab_size: int
    n_layers: int
    d_model: int
    n_heads: int
    d_mlp: int | None = None  # None -> 4 * d_model
    max_seq_len: int = 1024
    rope_base: float = 10000.0
    causal: bool = True
    init_std: float = 0.02
    norm_eps: float = 1e-5

    def __post_init__(self):
        common.check_transformer_shape(self)
        common.check_positive_field(self, "init_std")
        common.check_positive_field(self, "norm_eps")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads


class GPT(nn.Module, HubMixin):
    """The baseline Transformer decoder: ``h = E_in[ids]``, L pre-norm blocks, RMSNorm,
    logits ``z = E_out h`` (eq. 1)."""

    config_class = GPTConfig  # save_pretrained / from_pretrained (spherenet.models.hub)
    model_type = "gpt"
    architecture = "GPT"

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = c = config
        self.embed_in = nn.Embedding(c.vocab_size, c.d_model)
        self.rope = RotaryEmbedding(
            c.head_dim, c.rope_base, initial_length=c.max_seq_len
        )  # shared by all blocks, stateless
        self.blocks = nn.ModuleList(
            GPTBlock(c.d_model, c.n_heads, c.d_mlp, rope=self.rope, causal=c.causal, norm_eps=c.norm_eps)
            for _ in range(c.n_layers)
        )
        self.norm_out = RMSNorm(c.d_model, c.norm_eps)
        self.embed_out = nn.Linear(c.d_model, c.vocab_size, bias=False)  # untied from embed_in
        self.activation_checkpointing = False  # set_activation_checkpointing
        self.init_weights()

    def get_input_embeddings(self) -> nn.Module:
        """``embed_in`` (the Hugging Face name for the input embedding)."""
        return self.embed_in

    def get_output_embeddings(self) -> nn.Module:
        """``embed_out``, the output layer (the Hugging Face name; Muon leaves it to Adam)."""
        return self.embed_out

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

    def forward(self, input_ids: torch.Tensor, kv_caches: list[KVCache] | None = None) -> torch.Tensor:
        """Token ids ``(B, T)`` -> logits ``(B, T, vocab_size)``; ``kv_caches`` as in
        :meth:`spherenet.models.NGPT.forward`."""
        if kv_caches is not None and len(kv_caches) != len(self.blocks):
            raise ValueError(f"kv_caches has {len(kv_caches)} entries, the model has {len(self.blocks)} blocks")
        offset = 0 if kv_caches is None else kv_caches[0].length
        common.check_input_ids(input_ids, self.config.max_seq_len, offset)
        common.assert_ids_in_vocab(input_ids, self.config.vocab_size)  # device-side: no host sync
        caches = kv_caches if kv_caches is not None else [None] * len(self.blocks)

        h = self.embed_in(input_ids)
        for block, cache in zip(self.blocks, caches):
            if self.activation_checkpointing and cache is None and torch.is_grad_enabled():
                h = checkpoint(block, h, use_reentrant=False)  # keep h only; recompute in backward
            else:
                h = block(h, cache=cache)
        h = self.norm_out(h)
        return self.embed_out(h)

    def set_activation_checkpointing(self, enabled: bool = True) -> None:
        """Activation checkpointing per block: in training forwards (gradients enabled, no KV
        caches) each block keeps only its input for the backward pass and recomputes its forward
        there (``torch.utils.checkpoint``, non-reentrant: works under DDP, FSDP2 and
        ``torch.compile``). Same loss and gradients, less activation memory, one more forward."""
        self.activation_checkpointing = bool(enabled)

    def generate(
        self,
        input_ids: torch.Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        generator: torch.Generator | None = None,
        eos_token_id: int | None = None,
        stop=None,
    ) -> torch.Tensor:
        """Sample up to ``max_new_tokens`` tokens after ``input_ids`` with a KV cache, sliding
        past the context; see :func:`spherenet.models.common.generate`."""
        return common.generate(self, input_ids, max_new_tokens, temperature, top_k, generator, eos_token_id, stop)
