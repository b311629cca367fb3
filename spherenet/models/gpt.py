"""The baseline GPT of the nGPT paper (Section 2): pre-norm, RMSNorm, RoPE, SwiGLU, untied; every
part of it, top to bottom.

Kept deliberately plain, since it is half of every comparison:

- :class:`GPTAttention`: ``nn.Linear`` projections, RoPE, softmax scale ``1/sqrt(d_k)`` (eq.
  12-14); the heads, RoPE, masks and SDPA call are :class:`spherenet.layers.attention.Attention`'s.
- :class:`GPTMLP` (SwiGLU, eq. 17-19) or :class:`GPTReLU2MLP` (``mlp="relu2"``), picked by
  :func:`gpt_mlp`.
- :class:`GPTBlock`: ``h += ATTN(RMSNorm(h))``, ``h += MLP(RMSNorm(h))`` (eq. 4, 5).
- :class:`GPT`: ``E_in[ids]``, the blocks (:class:`spherenet.models.common.LanguageModel`), a
  final RMSNorm, logits ``E_out h`` with untied input/output embeddings.

The config is :class:`GPTConfig`, first below.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .. import kernels
from ..layers import KVCache, RMSNorm, RotaryEmbedding
from ..layers.attention import Attention
from ..layers.config import check_positive_field, check_transformer_shape, gpt_softmax_scale
from .common import LanguageModel
from .generation import GenerationMixin

__all__ = ["GPTConfig", "GPTAttention", "GPTMLP", "GPTReLU2MLP", "gpt_mlp", "gpt_attention", "GPTBlock", "GPT"]

# ---------------------------------------------------------------------------------------------
# Config


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
    n_kv_heads: int | None = None  # grouped-query attention; None -> n_heads
    head_dim: int | None = None  # None -> d_model // n_heads
    mlp: str = "swiglu"  # "swiglu" (eq. 17-19) | "relu2" (squared ReLU, no gate)
    init_std: float = 0.02
    norm_eps: float = 1e-5

    def __post_init__(self):
        check_transformer_shape(self)
        check_positive_field(self, "init_std")
        check_positive_field(self, "norm_eps")


# ---------------------------------------------------------------------------------------------
# Attention (eq. 12-14)


class GPTAttention(Attention):
    """The baseline's multi-head attention (eq. 12-14): ``nn.Linear`` projections without bias,
    RoPE on q and k, softmax scale ``1/sqrt(d_k)``; grouped-query with ``n_kv_heads < n_heads``.

    Weights keep ``nn.Linear``'s default init; :class:`spherenet.models.GPT` re-initializes
    them (normal 0.02, and 0.02/sqrt(2L) for ``w_o``).
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        *,
        n_kv_heads: int | None = None,
        head_dim: int | None = None,
        rope: RotaryEmbedding | None = None,
        rope_base: float = 10000.0,
        causal: bool = True,
    ):
        super().__init__(d_model, n_heads, rope, rope_base, causal, n_kv_heads, head_dim)
        self.softmax_scale = gpt_softmax_scale(self.head_dim)
        inner, kv_inner = self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim
        self.w_q = nn.Linear(d_model, inner, bias=False)
        self.w_k = nn.Linear(d_model, kv_inner, bias=False)
        self.w_v = nn.Linear(d_model, kv_inner, bias=False)
        self.w_o = nn.Linear(inner, d_model, bias=False)

    def extra_repr(self) -> str:
        return (
            f"d_model={self.d_model}, n_heads={self.n_heads}, n_kv_heads={self.n_kv_heads}, head_dim={self.head_dim}, "
            f"causal={self.causal}"
        )


def gpt_attention(config: GPTConfig, rope: RotaryEmbedding | None, attention: type = GPTAttention, **options):
    """``attention`` (the baseline's self-attention, or a class built on it: the cross-attention
    of :mod:`spherenet.models.encoder_decoder`) with the heads of ``config``; ``options``: the
    class's own (``causal``, ``cross_positions``)."""
    c = config
    heads = dict(n_kv_heads=c.n_kv_heads, head_dim=c.head_dim, rope=rope, rope_base=c.rope_base)
    return attention(c.d_model, c.n_heads, **heads, **options)


# ---------------------------------------------------------------------------------------------
# MLP (eq. 17-19)


class GPTMLP(nn.Module):
    """The baseline SwiGLU MLP: ``u = h W_u``, ``v = h W_v`` (eq. 17),
    ``h_M = (u * SiLU(v)) W_o_mlp`` (eq. 18, 19). No biases.

    ``w_v`` is the gate: its output goes through SiLU. Weights keep ``nn.Linear``'s default
    init; :class:`spherenet.models.GPT` re-initializes them (normal 0.02, and 0.02/sqrt(2L) for
    ``w_o``).
    """

    def __init__(self, d_model: int, d_mlp: int):
        super().__init__()
        self.w_u = nn.Linear(d_model, d_mlp, bias=False)
        self.w_v = nn.Linear(d_model, d_mlp, bias=False)
        self.w_o = nn.Linear(d_mlp, d_model, bias=False)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.w_o(self.w_u(h) * F.silu(self.w_v(h)))


class GPTReLU2MLP(nn.Module):
    """The baseline's squared-ReLU MLP, no gate and no biases: ``h_M = ReLU(h W_u)^2 W_o_mlp``.

    Weights keep ``nn.Linear``'s default init; :class:`spherenet.models.GPT` re-initializes them.
    """

    def __init__(self, d_model: int, d_mlp: int):
        super().__init__()
        self.w_u = nn.Linear(d_model, d_mlp, bias=False)
        self.w_o = nn.Linear(d_mlp, d_model, bias=False)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.w_o(kernels.relu2(self.w_u(h)))


def gpt_mlp(config: GPTConfig) -> nn.Module:
    """The MLP ``config.mlp`` names: :class:`GPTMLP` (``"swiglu"``) or :class:`GPTReLU2MLP` (``"relu2"``)."""
    if config.mlp == "relu2":
        return GPTReLU2MLP(config.d_model, config.d_mlp)
    return GPTMLP(config.d_model, config.d_mlp)


# ---------------------------------------------------------------------------------------------
# Block (eq. 4, 5)


class GPTBlock(nn.Module):
    """One baseline layer, pre-norm (eq. 4, 5)::

        h <- h + ATTN(RMSNorm(h))
        h <- h + MLP(RMSNorm(h))

    The residual stream itself is never normalized (the model applies a final RMSNorm).
    """

    def __init__(self, config: GPTConfig, rope: RotaryEmbedding | None = None):
        super().__init__()
        if not isinstance(config, GPTConfig):
            raise TypeError(f"GPTBlock takes an GPTConfig, got {config!r}")
        c = self.config = config
        self.norm_attn = RMSNorm(c.d_model, c.norm_eps)
        self.attn = gpt_attention(c, rope, causal=c.causal)
        self.norm_mlp = RMSNorm(c.d_model, c.norm_eps)
        self.mlp = gpt_mlp(c)

    def forward(
        self,
        h: torch.Tensor,
        cache: KVCache | None = None,
        attn_mask: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        h = h + self.attn(self.norm_attn(h), cache=cache, attn_mask=attn_mask, positions=positions)
        return h + self.mlp(self.norm_mlp(h))


# ---------------------------------------------------------------------------------------------
# Model: embedding, blocks, final RMSNorm, logits (eq. 1)


class GPT(LanguageModel, GenerationMixin):
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
