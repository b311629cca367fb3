"""Transformer blocks: nGPT's (eq. 10, 11) and the baseline's pre-norm block (eq. 4, 5).

Both are self-attention blocks; ``forward(h, cache=None)`` takes the hidden state of shape
``(B, T, d_model)`` and an optional :class:`KVCache` for the block's attention.
"""

from __future__ import annotations

import torch
from torch import nn

from . import ops
from .attention import S_QK, GPTAttention, KVCache, NGPTAttention
from .mlp import GPTMLP, NGPTMLP, S_U, S_V
from .norm import RMSNorm
from .residual import ALPHA, SphericalResidual
from .rotary import RotaryEmbedding
from .scale import ScaleSpec

__all__ = ["NGPTBlock", "GPTBlock"]


class NGPTBlock(nn.Module):
    """One nGPT layer: the hidden state ``h`` stays on the unit sphere throughout::

        h_A = Norm(ATTN(h));   h <- Norm(h + alpha_A (h_A - h))      (eq. 10)
        h_M = Norm(MLP(h));    h <- Norm(h + alpha_M (h_M - h))      (eq. 11)

    (with ``update="lerp"``; ``"slerp"`` and ``"riemannian"`` swap in eq. 6 or eq. 24-26). No
    RMSNorm/LayerNorm anywhere. ``rope`` may be shared between blocks (it holds no state that
    needs saving). ``alpha_attn``, ``alpha_mlp``: the :class:`ScaleSpec` of alpha_A, alpha_M;
    ``qk_norm``, ``s_qk`` go to :class:`NGPTAttention`, ``s_u``, ``s_v`` to :class:`NGPTMLP`.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_mlp: int | None = None,
        *,
        rope: RotaryEmbedding | None = None,
        rope_base: float = 10000.0,
        causal: bool = True,
        update: str = "lerp",
        alpha_attn: ScaleSpec = ALPHA,
        alpha_mlp: ScaleSpec = ALPHA,
        qk_norm: bool = True,
        s_qk: ScaleSpec = S_QK,
        s_u: ScaleSpec = S_U,
        s_v: ScaleSpec = S_V,
    ):
        super().__init__()
        d_mlp = 4 * d_model if d_mlp is None else d_mlp
        self.attn = NGPTAttention(
            d_model, n_heads, rope=rope, rope_base=rope_base, causal=causal, qk_norm=qk_norm, s_qk=s_qk
        )
        self.residual_attn = SphericalResidual(d_model, update, alpha_attn)
        self.mlp = NGPTMLP(d_model, d_mlp, s_u=s_u, s_v=s_v)
        self.residual_mlp = SphericalResidual(d_model, update, alpha_mlp)

    def forward(self, h: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        h_attn = ops.normalize(self.attn(h, cache=cache))  # h_A = Norm(ATTN(h))
        h = self.residual_attn(h, h_attn)  # eq. 10
        h_mlp = ops.normalize(self.mlp(h))  # h_M = Norm(MLP(h))
        h = self.residual_mlp(h, h_mlp)  # eq. 11
        return h


class GPTBlock(nn.Module):
    """One baseline layer, pre-norm (eq. 4, 5)::

        h <- h + ATTN(RMSNorm(h))
        h <- h + MLP(RMSNorm(h))

    The residual stream itself is never normalized (the model applies a final RMSNorm).
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_mlp: int | None = None,
        *,
        rope: RotaryEmbedding | None = None,
        rope_base: float = 10000.0,
        causal: bool = True,
        norm_eps: float = 1e-5,
    ):
        super().__init__()
        d_mlp = 4 * d_model if d_mlp is None else d_mlp
        self.norm_attn = RMSNorm(d_model, norm_eps)
        self.attn = GPTAttention(d_model, n_heads, rope=rope, rope_base=rope_base, causal=causal)
        self.norm_mlp = RMSNorm(d_model, norm_eps)
        self.mlp = GPTMLP(d_model, d_mlp)

    def forward(self, h: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        h = h + self.attn(self.norm_attn(h), cache=cache)
        h = h + self.mlp(self.norm_mlp(h))
        return h
