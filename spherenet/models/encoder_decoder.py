"""Cross-attention, and the decoder blocks of encoder-decoder models that use it, built from the
models' own parts (:mod:`spherenet.models.ngpt`, :mod:`spherenet.models.gpt`): an encoder is a
stack of :class:`~spherenet.models.NGPTBlock` or :class:`~spherenet.models.GPTBlock` built with
``causal=False`` (examples/seq2seq.py).

A cross-attention's queries come from the decoder's hidden state ``x`` (``(B, T, d_model)``),
its keys and values from ``context`` (``(B, S, d_model)``, the encoder's output), and every
query may see the whole context (unless ``attn_mask`` says otherwise): no causal mask.

Positions: by default none (``cross_positions=False``): the two sequences share no position
axis, and the context carries its own positions from its encoder. With ``cross_positions=True``
queries are rotated at their positions and context keys at theirs (both from 0), so a score
depends on how far apart a query and a context token are: for sequences that run roughly in
step (transcription, monotonic alignment).

A :class:`KVCache` given to a cross-attention stores the context's keys and values at the first
call and reuses them afterwards (``context`` is then ignored).
"""

from __future__ import annotations

import torch
from torch import nn

from .. import kernels
from ..kernels.layer_ops import update_op
from ..layers import KVCache, RMSNorm, RotaryEmbedding, ScaleSpec
from ..layers.config import ALPHA
from .gpt import GPTAttention, GPTConfig, gpt_attention, gpt_mlp
from .ngpt import NGPTAttention, NGPTConfig, ngpt_attention, ngpt_mlp, residual_alpha

__all__ = ["NGPTCrossAttention", "GPTCrossAttention", "NGPTCrossBlock", "GPTCrossBlock"]


class _CrossAttention:
    """The cross-attention forward pass, over the projections and q/k scaling of the self-attention
    class it is mixed into."""

    def __init__(self, *args, cross_positions: bool = False, **kwargs):
        super().__init__(*args, causal=False, **kwargs)
        self.cross_positions = bool(cross_positions)

    def forward(
        self,
        x: torch.Tensor,
        context: torch.Tensor | None = None,
        cache: KVCache | None = None,
        attn_mask: torch.Tensor | None = None,
        query_offset: int = 0,
    ) -> torch.Tensor:
        """``query_offset``: with ``cross_positions``, the position of the first query (the
        tokens decoded before it)."""
        self._check_input(x)
        q = self._split_heads(self.w_q(x))
        if self.cross_positions:  # queries at their own positions (after any cached ones)
            q = self.rope(q, query_offset)
        q = self._scale_q(q)
        if cache is not None and cache.length > 0:
            k, v = cache.keys, cache.values
        else:
            if context is None:
                raise ValueError(f"{type(self).__name__}: give context= (B, S, {self.d_model}) or a filled cache")
            if context.ndim != 3 or context.shape[-1] != self.d_model or context.shape[0] != x.shape[0]:
                raise ValueError(
                    f"{type(self).__name__} expected context of shape ({x.shape[0]}, S, {self.d_model}), got {tuple(context.shape)}"
                )
            k = self._split_heads(self.w_k(context))
            k = self._scale_k(self.rope(k) if self.cross_positions else k)
            v = self._split_heads(self.w_v(context))
            if cache is not None:
                cache.append(k, v)
        return self._attend(q, k, v, None, False, attn_mask)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, cross_positions={self.cross_positions}"


class NGPTCrossAttention(_CrossAttention, NGPTAttention):
    """nGPT's attention (eq. 15, 16, softmax scale ``sqrt(d_k)``) from ``x`` to ``context``.
    ``NGPTCrossAttention(d_model, n_heads, *, rope=None, rope_base=10000.0, cross_positions=False,
    qk_norm=True, s_qk=S_QK)``."""


class GPTCrossAttention(_CrossAttention, GPTAttention):
    """The baseline's attention (eq. 12-14) from ``x`` to ``context``.
    ``GPTCrossAttention(d_model, n_heads, *, rope=None, rope_base=10000.0, cross_positions=False)``."""


def _check_context(block: nn.Module, context, cross_cache) -> None:
    if context is None and (cross_cache is None or cross_cache.length == 0):
        raise ValueError(f"{type(block).__name__} has cross-attention: give it context= (B, S, d_model)")


class NGPTCrossBlock(nn.Module):
    """An nGPT decoder layer (:class:`~spherenet.models.NGPTBlock`) that also attends to
    ``context``: between its self-attention and its MLP, a cross-attention step with its own
    update, in the form of eq. 10::

        h_C = Norm(CROSS(h, context));   h <- Norm(h + alpha_C (h_C - h))

    (``alpha_cross``: the :class:`ScaleSpec` of alpha_C, default as alpha_A). ``context``
    should lie on the sphere too (an nGPT encoder's output does).
    """

    def __init__(
        self,
        config: NGPTConfig,
        rope: RotaryEmbedding | None = None,
        *,
        cross_positions: bool = False,
        alpha_cross: ScaleSpec = ALPHA,
    ):
        super().__init__()
        if not isinstance(config, NGPTConfig):
            raise TypeError(f"NGPTCrossBlock takes an NGPTConfig, got {config!r}")
        c = self.config = config
        self.update = update_op(c.update, type(self).__name__)  # chosen here, once
        # the order of NGPTBlock's modules with the cross-attention between: parameter order is
        # what optimizer states of saved runs are matched by
        self.attn = ngpt_attention(c, rope, causal=c.causal)
        self.residual_attn = residual_alpha(c, c.alpha_attn)
        self.cross_attn = ngpt_attention(c, self.attn.rope, NGPTCrossAttention, cross_positions=cross_positions)
        self.residual_cross = residual_alpha(c, alpha_cross)
        self.mlp = ngpt_mlp(c)
        self.residual_mlp = residual_alpha(c, c.alpha_mlp)

    def forward(
        self,
        h: torch.Tensor,
        cache: KVCache | None = None,
        attn_mask: torch.Tensor | None = None,
        context: torch.Tensor | None = None,
        context_mask: torch.Tensor | None = None,
        cross_cache: KVCache | None = None,
    ) -> torch.Tensor:
        _check_context(self, context, cross_cache)
        update, position = self.update, 0 if cache is None else cache.length
        h_attn = kernels.normalize(self.attn(h, cache=cache, attn_mask=attn_mask))  # h_A = Norm(ATTN(h))
        h = kernels.residual_update(update, h, h_attn, self.residual_attn.alpha())  # eq. 10
        h_cross = self.cross_attn(h, context, cache=cross_cache, attn_mask=context_mask, query_offset=position)
        h = kernels.residual_update(
            update, h, kernels.normalize(h_cross), self.residual_cross.alpha()
        )  # eq. 10, alpha_C
        h_mlp = kernels.normalize(self.mlp(h))  # h_M = Norm(MLP(h))
        return kernels.residual_update(update, h, h_mlp, self.residual_mlp.alpha())  # eq. 11


class GPTCrossBlock(nn.Module):
    """A baseline decoder layer (:class:`~spherenet.models.GPTBlock`) that also attends to
    ``context``, pre-norm as the others::

        h <- h + ATTN(RMSNorm(h))
        h <- h + CROSS(RMSNorm(h), context)
        h <- h + MLP(RMSNorm(h))
    """

    def __init__(self, config: GPTConfig, rope: RotaryEmbedding | None = None, *, cross_positions: bool = False):
        super().__init__()
        if not isinstance(config, GPTConfig):
            raise TypeError(f"GPTCrossBlock takes an GPTConfig, got {config!r}")
        c = self.config = config
        self.norm_attn = RMSNorm(c.d_model, c.norm_eps)
        self.attn = gpt_attention(c, rope, causal=c.causal)
        self.norm_cross = RMSNorm(c.d_model, c.norm_eps)
        self.cross_attn = gpt_attention(c, self.attn.rope, GPTCrossAttention, cross_positions=cross_positions)
        self.norm_mlp = RMSNorm(c.d_model, c.norm_eps)
        self.mlp = gpt_mlp(c)

    def forward(
        self,
        h: torch.Tensor,
        cache: KVCache | None = None,
        attn_mask: torch.Tensor | None = None,
        context: torch.Tensor | None = None,
        context_mask: torch.Tensor | None = None,
        cross_cache: KVCache | None = None,
    ) -> torch.Tensor:
        _check_context(self, context, cross_cache)
        position = 0 if cache is None else cache.length
        h = h + self.attn(self.norm_attn(h), cache=cache, attn_mask=attn_mask)
        h_cross = self.norm_cross(h)
        h = h + self.cross_attn(h_cross, context, cache=cross_cache, attn_mask=context_mask, query_offset=position)
        return h + self.mlp(self.norm_mlp(h))
