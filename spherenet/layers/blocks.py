"""Transformer blocks: nGPT's (eq. 10, 11) and the baseline's pre-norm block (eq. 4, 5).

``forward(h, cache=None, attn_mask=None, context=None, context_mask=None, cross_cache=None)``
takes the hidden state of shape ``(B, T, d_model)``, an optional :class:`KVCache` for the
self-attention and its ``attn_mask`` (SDPA's convention, combined with the causal mask). A block
built with ``cross_attention=True`` (a decoder block of an encoder-decoder model) also attends
to ``context`` (``(B, S, d_model)``, the encoder's output) between its self-attention and its
MLP, with ``context_mask`` and its own cache ``cross_cache``.
"""

from __future__ import annotations

import torch
from torch import nn

from .. import kernels
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

    ``cross_attention=True`` adds a cross-attention step with its own update, in the form of
    eq. 10: ``h_C = Norm(CROSS(h, context))``, ``h <- Norm(h + alpha_C (h_C - h))``
    (``alpha_cross``, default as alpha_A), before the MLP; ``context`` should lie on the sphere
    too (an nGPT encoder's output does). ``cross_positions``: see :class:`NGPTAttention`.
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
        cross_attention: bool = False,
        alpha_cross: ScaleSpec = ALPHA,
        cross_positions: bool = False,
    ):
        super().__init__()
        d_mlp = 4 * d_model if d_mlp is None else d_mlp
        self.attn = NGPTAttention(
            d_model, n_heads, rope=rope, rope_base=rope_base, causal=causal, qk_norm=qk_norm, s_qk=s_qk
        )
        self.residual_attn = SphericalResidual(d_model, update, alpha_attn)
        self.cross_attn = self.residual_cross = None
        if cross_attention:
            self.cross_attn = NGPTAttention(
                d_model, n_heads, rope=self.attn.rope, causal=False, cross_positions=cross_positions, qk_norm=qk_norm, s_qk=s_qk
            )  # fmt: skip  # one constructor call
            self.residual_cross = SphericalResidual(d_model, update, alpha_cross)
        self.mlp = NGPTMLP(d_model, d_mlp, s_u=s_u, s_v=s_v)
        self.residual_mlp = SphericalResidual(d_model, update, alpha_mlp)

    def forward(
        self,
        h: torch.Tensor,
        cache: KVCache | None = None,
        attn_mask: torch.Tensor | None = None,
        context: torch.Tensor | None = None,
        context_mask: torch.Tensor | None = None,
        cross_cache: KVCache | None = None,
    ) -> torch.Tensor:
        position = 0 if cache is None else cache.length
        h_attn = kernels.normalize(self.attn(h, cache=cache, attn_mask=attn_mask))  # h_A = Norm(ATTN(h))
        h = self.residual_attn(h, h_attn)  # eq. 10
        if _cross_inputs(self, context, cross_cache):
            h_cross = self.cross_attn(
                h, context=context, cache=cross_cache, attn_mask=context_mask, query_offset=position
            )
            h = self.residual_cross(h, kernels.normalize(h_cross))  # eq. 10 with alpha_C
        h_mlp = kernels.normalize(self.mlp(h))  # h_M = Norm(MLP(h))
        h = self.residual_mlp(h, h_mlp)  # eq. 11
        return h


def _cross_inputs(block: nn.Module, context, cross_cache) -> bool:
    """Whether the block's cross-attention runs; a context for a block without one, or a block
    with one and no context (nor a filled cache), is an error."""
    if block.cross_attn is None:
        if context is not None:
            raise ValueError(f"{type(block).__name__} was built without cross_attention; it takes no context")
        return False
    if context is None and (cross_cache is None or cross_cache.length == 0):
        raise ValueError(f"{type(block).__name__} has cross-attention: give it context= (B, S, d_model)")
    return True


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
        cross_attention: bool = False,
        cross_positions: bool = False,
    ):
        super().__init__()
        d_mlp = 4 * d_model if d_mlp is None else d_mlp
        self.norm_attn = RMSNorm(d_model, norm_eps)
        self.attn = GPTAttention(d_model, n_heads, rope=rope, rope_base=rope_base, causal=causal)
        self.norm_cross = self.cross_attn = None
        if cross_attention:  # pre-norm as the others: h <- h + CROSS(RMSNorm(h), context)
            self.norm_cross = RMSNorm(d_model, norm_eps)
            self.cross_attn = GPTAttention(
                d_model, n_heads, rope=self.attn.rope, causal=False, cross_positions=cross_positions
            )
        self.norm_mlp = RMSNorm(d_model, norm_eps)
        self.mlp = GPTMLP(d_model, d_mlp)

    def forward(
        self,
        h: torch.Tensor,
        cache: KVCache | None = None,
        attn_mask: torch.Tensor | None = None,
        context: torch.Tensor | None = None,
        context_mask: torch.Tensor | None = None,
        cross_cache: KVCache | None = None,
    ) -> torch.Tensor:
        position = 0 if cache is None else cache.length
        h = h + self.attn(self.norm_attn(h), cache=cache, attn_mask=attn_mask)
        if _cross_inputs(self, context, cross_cache):
            h = h + self.cross_attn(
                self.norm_cross(h), context=context, cache=cross_cache, attn_mask=context_mask, query_offset=position
            )
        h = h + self.mlp(self.norm_mlp(h))
        return h
