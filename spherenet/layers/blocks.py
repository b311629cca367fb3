"""Transformer blocks: nGPT's (eq. 10, 11) and the baseline's pre-norm block (eq. 4, 5).

Both are self-attention blocks; ``forward(h, cache=None)`` takes the hidden state of shape
``(B, T, d_model)`` and an optional :class:`KVCache` for the block's attention.
"""

from __future__ import annotations

import torch
from torch import nn

from ..manifolds import normalize
from . import fused
from .attention import GPTAttention, KVCache, NGPTAttention
from .mlp import GPTMLP, NGPTMLP
from .norm import RMSNorm
from .residual import ALPHA, SphericalResidual
from .rotary import RotaryEmbedding
from .scale import ScaleSpec, specs_from_flat_keywords

__all__ = ["NGPTBlock", "GPTBlock"]


class NGPTBlock(nn.Module):
    """One nGPT layer: the hidden state ``h`` stays on the unit sphere throughout::

        h_A = Norm(ATTN(h));   h <- Norm(h + alpha_A (h_A - h))      (eq. 10)
        h_M = Norm(MLP(h));    h <- Norm(h + alpha_M (h_M - h))      (eq. 11)

    (with ``update="lerp"``; ``"slerp"`` and ``"riemannian"`` swap in eq. 6 or eq. 25, 26). No
    RMSNorm/LayerNorm anywhere. ``rope`` may be shared between blocks (it holds no state that
    needs saving). ``alpha_attn``, ``alpha_mlp``: the :class:`ScaleSpec` of alpha_A, alpha_M.
    ``attention``, ``mlp``: keyword arguments of :class:`NGPTAttention` (``qk_norm``, ``s_qk``)
    and :class:`NGPTMLP` (``s_u``, ``s_v``), passed through. :meth:`from_config` builds the block
    of an :class:`NGPTConfig`; each part reads its own options there (``options_from``), so a new
    option of a part touches only that part and the config.
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
        attention: dict | None = None,
        mlp: dict | None = None,
        **deprecated,
    ):
        super().__init__()
        d_mlp = 4 * d_model if d_mlp is None else d_mlp
        if deprecated:  # the flat keywords of earlier versions: alpha_* here, s_qk_* and s_uv_* to the parts
            alpha = {k: deprecated.pop(k) for k in list(deprecated) if k.startswith("alpha_")}
            specs = {"alpha_attn": alpha_attn, "alpha_mlp": alpha_mlp}
            specs = specs_from_flat_keywords("NGPTBlock", alpha, specs, {"alpha": ("alpha_attn", "alpha_mlp")})
            alpha_attn, alpha_mlp = specs["alpha_attn"], specs["alpha_mlp"]
            attention = {**(attention or {}), **{k: v for k, v in deprecated.items() if k.startswith("s_qk_")}}
            mlp = {**(mlp or {}), **{k: v for k, v in deprecated.items() if not k.startswith("s_qk_")}}
        self.attn = NGPTAttention(d_model, n_heads, rope=rope, rope_base=rope_base, causal=causal, **(attention or {}))
        self.residual_attn = SphericalResidual(d_model, update, alpha_attn)
        self.mlp = NGPTMLP(d_model, d_mlp, **(mlp or {}))
        self.residual_mlp = SphericalResidual(d_model, update, alpha_mlp)

    @classmethod
    def from_config(cls, config, rope: RotaryEmbedding | None = None) -> NGPTBlock:
        """One block of the nGPT that ``config`` (an :class:`NGPTConfig`) describes."""
        c = config
        return cls(
            c.d_model,
            c.n_heads,
            c.d_mlp,
            rope=rope,
            rope_base=c.rope_base,
            causal=c.causal,
            update=c.update,
            alpha_attn=c.alpha_attn,
            alpha_mlp=c.alpha_mlp,
            attention=NGPTAttention.options_from(c),
            mlp=NGPTMLP.options_from(c),
        )

    def forward(self, h: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        norm = fused.normalize if fused.is_enabled() else normalize
        h_attn = norm(self.attn(h, cache=cache))
        h = self.residual_attn(h, h_attn)
        h_mlp = norm(self.mlp(h))
        h = self.residual_mlp(h, h_mlp)
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
