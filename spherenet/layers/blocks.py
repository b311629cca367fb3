"""Decoder-only Transformer blocks: nGPT's (eq. 10, 11) and the baseline's pre-norm block (eq. 4, 5).

A block takes the model's config (:class:`~spherenet.layers.config.NGPTConfig` or
:class:`~spherenet.layers.config.GPTConfig`) and a :class:`RotaryEmbedding` it may share with
the other blocks. ``forward(h, cache=None, attn_mask=None, positions=None)`` takes the hidden
state of shape ``(B, T, d_model)``, an optional :class:`KVCache` for the self-attention, its
``attn_mask`` (SDPA's convention, combined with the causal mask) and RoPE's ``positions``
(``(B, T)``; default: after the cached tokens). The blocks of encoder-decoder models, with
cross-attention, are in :mod:`spherenet.layers.cross_attention`.
"""

from __future__ import annotations

import torch
from torch import nn

from .. import kernels
from .attention import GPTAttention, KVCache, NGPTAttention
from .config import GPTConfig, NGPTConfig
from .mlp import gpt_mlp, ngpt_mlp
from .norm import RMSNorm
from .rotary import RotaryEmbedding
from .scale import Scale, ScaleSpec

__all__ = ["NGPTBlock", "GPTBlock"]


def self_attention(config: NGPTConfig | GPTConfig, rope: RotaryEmbedding | None) -> NGPTAttention | GPTAttention:
    """The self-attention of a layer of ``config``: nGPT's for an ``NGPTConfig``, the
    baseline's for a ``GPTConfig`` (its own rotary table when ``rope`` is None)."""
    c = config
    sizes = dict(n_kv_heads=c.n_kv_heads, head_dim=c.head_dim, rope=rope, rope_base=c.rope_base, causal=c.causal)
    if isinstance(c, NGPTConfig):
        return NGPTAttention(c.d_model, c.n_heads, **sizes, qk_norm=c.qk_norm, s_qk=c.s_qk)
    return GPTAttention(c.d_model, c.n_heads, **sizes)


def residual_alpha(config: NGPTConfig, spec: ScaleSpec) -> nn.ModuleDict:
    """An eigen learning rate of ``spec`` (eq. 10, 11), held in a ModuleDict so that its saved
    name is ``<residual>.alpha``."""
    return nn.ModuleDict({"alpha": Scale.from_spec(config.d_model, spec, config.d_model)})


class NGPTBlock(nn.Module):
    """One nGPT layer: the hidden state ``h`` stays on the unit sphere throughout::

        h_A = Norm(ATTN(h));   h <- Norm(h + alpha_A (h_A - h))      (eq. 10)
        h_M = Norm(MLP(h));    h <- Norm(h + alpha_M (h_M - h))      (eq. 11)

    with ``config.update == "lerp"``; ``"slerp"`` and ``"riemannian"`` swap in eq. 6 or eq.
    24-26 (:func:`spherenet.kernels.residual_update`). ``alpha_A``, ``alpha_M``: the eigen
    learning rates (Section 2.2.2), :class:`Scale` s of ``config.alpha_attn``, ``.alpha_mlp``,
    held as ``residual_attn.alpha`` and ``residual_mlp.alpha``. No RMSNorm/LayerNorm anywhere.
    """

    def __init__(self, config: NGPTConfig, rope: RotaryEmbedding | None = None):
        super().__init__()
        if not isinstance(config, NGPTConfig):
            raise TypeError(f"NGPTBlock takes an NGPTConfig, got {config!r}")
        c = self.config = config
        self.attn = self_attention(c, rope)
        self.residual_attn = residual_alpha(c, c.alpha_attn)
        self.mlp = ngpt_mlp(c)
        self.residual_mlp = residual_alpha(c, c.alpha_mlp)

    def forward(
        self,
        h: torch.Tensor,
        cache: KVCache | None = None,
        attn_mask: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        update = self.config.update
        attn = self.attn(h, cache=cache, attn_mask=attn_mask, positions=positions)
        h_attn = kernels.normalize(attn)  # h_A = Norm(ATTN(h))
        h = kernels.residual_update(update, h, h_attn, self.residual_attn.alpha())  # eq. 10
        h_mlp = kernels.normalize(self.mlp(h))  # h_M = Norm(MLP(h))
        return kernels.residual_update(update, h, h_mlp, self.residual_mlp.alpha())  # eq. 11


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
        self.attn = self_attention(c, rope)
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
