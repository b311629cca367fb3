"""Multi-head self-attention: nGPT's (Section 2.3.2, eq. 15, 16) and the baseline's (eq. 12-14).
Cross-attention, for encoder-decoder models, is in :mod:`spherenet.layers.cross_attention`.

Shared conventions of both classes:

- ``forward(x, cache=None, causal=None, attn_mask=None, positions=None)``, ``x`` of shape
  ``(B, T, d_model)``: queries, keys and values come from ``x``; RoPE is applied to q and k at
  positions ``offset .. offset + T - 1``, where ``offset`` is the number of tokens already held
  in ``cache``, or at ``positions`` (``(B, T)``, per row: a padded batch) when given.
  ``causal`` (default: the module's) masks the future.
- ``attn_mask``: SDPA's convention, a bool tensor (True: may attend) or an additive float
  tensor, broadcastable to ``(B, H, T, keys)`` (``keys``: the cached ones included), e.g.
  ``(B, 1, 1, keys)`` for padding. It is combined with the causal mask.
- ``cache`` (a :class:`KVCache`) makes incremental decoding possible: it holds the keys (after
  RoPE, and for nGPT after ``Norm``/``s_qk``) and values of all tokens seen so far; new ones are
  appended.
- Heads: ``n_heads`` query heads of size ``head_dim`` (default ``d_model / n_heads``; any even
  size otherwise), and ``n_kv_heads`` key/value heads (default ``n_heads``), a divisor of
  ``n_heads``: grouped-query attention (multi-query for one). Query head ``j`` attends with
  key/value head ``j // (n_heads / n_kv_heads)``, SDPA's ``enable_gqa`` convention; keys and
  values are computed and cached for the ``n_kv_heads`` heads only.

The causal mask with a cache: queries are the last ``T`` of ``offset + T`` positions, so query
``i`` may see keys ``j <= offset + i``. SDPA's ``is_causal=True`` would align the mask top-left
(query ``i`` sees keys ``j <= i``) when there are more keys than queries, which is wrong here;
the bottom-right mask is built explicitly whenever ``offset > 0``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

from .. import kernels
from .config import S_QK, gpt_softmax_scale, ngpt_softmax_scale
from .fold import Folding, cached, folding
from .linear import SphereLinear
from .rotary import RotaryEmbedding
from .scale import Scale, ScaleSpec

__all__ = ["NGPTAttention", "GPTAttention", "KVCache"]


class KVCache:
    """Keys and values already computed by one attention layer, shape ``(B, n_kv_heads, T_cached, d_k)``.

    A plain container (not a module, nothing to save). ``append`` concatenates, so each step
    copies the cache: simple and exact; fine for the sequence lengths of this project.
    """

    def __init__(self):
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None

    def __len__(self) -> int:
        return 0 if self.keys is None else self.keys.shape[-2]

    @property
    def length(self) -> int:
        """Number of positions held (the position offset of the next token)."""
        return len(self)

    def append(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Add new keys/values along the sequence dimension; return all keys/values held."""
        if self.keys is None:
            self.keys, self.values = keys, values
        else:
            self.keys = torch.cat((self.keys, keys), dim=-2)
            self.values = torch.cat((self.values, values), dim=-2)
        return self.keys, self.values

    def __repr__(self) -> str:
        return f"KVCache(length={len(self)})"


def _causal_mask(n_queries: int, n_keys: int, device) -> torch.Tensor:
    """Boolean ``(n_queries, n_keys)`` mask, True = may attend. The queries are the *last*
    ``n_queries`` positions of ``n_keys``: query ``i`` sees keys ``j <= i + n_keys - n_queries``."""
    return torch.ones(n_queries, n_keys, dtype=torch.bool, device=device).tril(diagonal=n_keys - n_queries)


def _check_mask(owner: str, mask: torch.Tensor, batch: int, heads: int, n_queries: int, n_keys: int) -> None:
    if not isinstance(mask, torch.Tensor) or not (mask.dtype == torch.bool or mask.is_floating_point()):
        raise ValueError(f"{owner}: attn_mask must be a bool or float tensor, got {getattr(mask, 'dtype', type(mask))}")
    target = (batch, heads, n_queries, n_keys)
    shape = (1,) * (4 - mask.ndim) + tuple(mask.shape)
    if mask.ndim > 4 or any(m not in (1, t) for m, t in zip(shape, target)):
        raise ValueError(
            f"{owner}: attn_mask of shape {tuple(mask.shape)} does not broadcast to (batch, heads, queries, keys) "
            f"= {target}"
        )


def _with_causal(mask: torch.Tensor, causal: torch.Tensor) -> torch.Tensor:
    """A user mask and a boolean causal mask as one SDPA mask of the user mask's kind."""
    if mask.dtype == torch.bool:
        return mask & causal
    return mask.masked_fill(~causal, float("-inf"))


def _check_size(owner: str, name: str, value) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{owner} {name} must be a positive int, got {value!r}")


class _Attention(nn.Module):
    """What both attentions share: heads, RoPE, cache handling, masking, SDPA.

    Subclasses define ``w_q`` (d_model -> n_heads * head_dim), ``w_k``, ``w_v`` (d_model ->
    n_kv_heads * head_dim), ``w_o`` (n_heads * head_dim -> d_model), ``softmax_scale``, and may
    override ``_scale_q(x)`` and ``_scale_k(x)``, applied to q and to k after RoPE (identity for
    the baseline; Norm and s_qk for nGPT). Heads are laid out as ``(B, heads, T, d_k)``.
    """

    softmax_scale: float

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        rope: RotaryEmbedding | None,
        rope_base: float,
        causal: bool,
        n_kv_heads: int | None = None,
        head_dim: int | None = None,
    ):
        super().__init__()
        owner = type(self).__name__
        for name, value in (("d_model", d_model), ("n_heads", n_heads)):
            _check_size(owner, name, value)
        if head_dim is None:
            if d_model % n_heads:
                raise ValueError(f"{owner}: d_model={d_model} is not divisible by n_heads={n_heads} (or give head_dim)")
            head_dim = d_model // n_heads
        _check_size(owner, "head_dim", head_dim)
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        _check_size(owner, "n_kv_heads", n_kv_heads)
        if n_heads % n_kv_heads:
            raise ValueError(f"{owner}: n_kv_heads={n_kv_heads} does not divide n_heads={n_heads}")
        self.d_model, self.n_heads, self.n_kv_heads, self.head_dim = d_model, n_heads, n_kv_heads, head_dim
        self.causal = bool(causal)
        if rope is None:
            rope = RotaryEmbedding(self.head_dim, rope_base)
        elif rope.head_dim != self.head_dim:
            raise ValueError(f"{owner}: rope.head_dim={rope.head_dim} but the attention's head_dim={self.head_dim}")
        self.rope = rope

    @property
    def grouped(self) -> bool:
        """Whether key/value heads are shared by several query heads (``n_kv_heads < n_heads``)."""
        return self.n_kv_heads < self.n_heads

    def _scale_q(self, x: torch.Tensor) -> torch.Tensor:
        """What happens to q after RoPE: nothing here (the baseline)."""
        return x

    def _scale_k(self, x: torch.Tensor) -> torch.Tensor:
        """What happens to k after RoPE: nothing here (the baseline)."""
        return x

    def _split_heads(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, T, heads * head_dim)`` -> ``(B, heads, T, head_dim)``: queries (n_heads) or keys
        and values (n_kv_heads)."""
        return rearrange(x, "b t (h d) -> b h t d", d=self.head_dim)

    def _check_input(self, x: torch.Tensor) -> None:
        if x.ndim != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"{type(self).__name__} expected x of shape (B, T, {self.d_model}), got {tuple(x.shape)}")

    def _attend(self, q, k, v, mask, is_causal: bool, attn_mask: torch.Tensor | None) -> torch.Tensor:
        """SDPA over heads with ``mask`` and the user's ``attn_mask`` combined, then ``W_o``."""
        if attn_mask is not None:
            _check_mask(type(self).__name__, attn_mask, q.shape[0], self.n_heads, q.shape[-2], k.shape[-2])
            mask = attn_mask if mask is None else _with_causal(attn_mask, mask)
        # enable_gqa: query head j reads key/value head j // (n_heads / n_kv_heads), without copies
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=is_causal, scale=self.softmax_scale, enable_gqa=self.grouped
        )
        return self.w_o(rearrange(out, "b h t d -> b t (h d)"))

    def forward(
        self,
        x: torch.Tensor,
        cache: KVCache | None = None,
        causal: bool | None = None,
        attn_mask: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Self-attention of ``x`` (``(B, T, d_model)``), after the tokens held in ``cache``;
        ``positions`` (``(B, T)``, optional) are RoPE's positions of the tokens instead."""
        self._check_input(x)
        causal = self.causal if causal is None else causal
        offset = 0 if cache is None else cache.length
        q = self._scale_q(self.rope(self._split_heads(self.w_q(x)), offset, positions))
        k = self._scale_k(self.rope(self._split_heads(self.w_k(x)), offset, positions))
        v = self._split_heads(self.w_v(x))
        if cache is not None:
            k, v = cache.append(k, v)
        n_queries, n_keys = q.shape[-2], k.shape[-2]
        if not causal or n_queries == 1:
            mask, is_causal = None, False  # a single newest query may see every key
        elif n_queries == n_keys and attn_mask is None:
            mask, is_causal = None, True  # square: SDPA's own causal mask is right
        else:
            mask, is_causal = _causal_mask(n_queries, n_keys, x.device), False
        return self._attend(q, k, v, mask, is_causal, attn_mask)


class NGPTAttention(Folding, _Attention):
    """nGPT attention (Section 2.3.2).

    ``W_q``, ``W_k``, ``W_v`` are unit vectors along their d_model-sized input side (so q, k, v
    are cosine similarities with ``h``); ``W_o`` is unit along its d_model-sized output side
    (stored transposed, ``(n_heads * head_dim, d_model)``). After RoPE, each head's q and k are
    normalized over ``d_k`` and scaled (eq. 15, 16)::

        q <- Norm(q) * s_qk,    k <- Norm(k) * s_qk

    with ``s_qk`` of :data:`S_QK` (the paper's): ``d_k`` factors per head, ``n_heads * d_k`` in
    all. The softmax scale is ``sqrt(d_k)`` instead of ``1/sqrt(d_k)``: the dot product of two
    random unit vectors of size d_k has variance 1/d_k.

    With grouped-query attention (``n_kv_heads < n_heads``) a key head serves several query
    heads, each with its own ``s_qk``, so ``s_qk`` applies squared on the query side only::

        q <- Norm(q) * s_qk**2,    k <- Norm(k)

    The scores ``q . k`` are those of eq. 15, 16 with each query head's own ``s_qk`` (equal in
    exact arithmetic): only the keys, shared by a group, no longer carry it. With ``n_kv_heads ==
    n_heads`` the form of eq. 15, 16 is kept.

    ``qk_norm=False`` drops the ``Norm`` of eq. 15, 16 (keeping ``s_qk``; Table 6). The output is
    not normalized here: the block applies ``Norm`` (``h_A = Norm(ATTN(h))``).
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
        qk_norm: bool = True,
        s_qk: ScaleSpec = S_QK,
    ):
        super().__init__(d_model, n_heads, rope, rope_base, causal, n_kv_heads, head_dim)
        self.qk_norm = bool(qk_norm)
        self.softmax_scale = ngpt_softmax_scale(self.head_dim)
        inner, kv_inner = self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim
        self.w_q = SphereLinear(d_model, inner, sphere="in")
        self.w_k = SphereLinear(d_model, kv_inner, sphere="in")
        self.w_v = SphereLinear(d_model, kv_inner, sphere="in")
        self.w_o = SphereLinear(inner, d_model, sphere="out")
        self.s_qk = Scale.from_spec(inner, s_qk, d_model)

    def _s_qk(self) -> torch.Tensor:
        """``s_qk`` per head: shape ``(H, 1, d_k)``, or ``(1,)`` for a scalar one."""
        s_qk = self.s_qk()
        if s_qk.numel() > 1:
            s_qk = rearrange(s_qk, "(h d) -> h 1 d", h=self.n_heads)
        return s_qk

    def _qk_scales(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The queries' and the keys' factors: ``s_qk`` and ``s_qk`` per head, or ``s_qk**2`` and
        None with grouped key/value heads; computed once in eval mode (:mod:`spherenet.layers.fold`)."""
        if folding(self):
            return cached(self, "s_qk", (self.s_qk.source,), self._compute_qk_scales)
        return self._compute_qk_scales()

    def _compute_qk_scales(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        s_qk = self._s_qk()
        return (s_qk * s_qk, None) if self.grouped else (s_qk, s_qk)

    def _scale_q(self, x: torch.Tensor) -> torch.Tensor:
        """eq. 15 for q of shape (B, H, T, d_k): ``Norm(q) * s_qk``; ``Norm(q) * s_qk**2`` with
        grouped key/value heads."""
        return kernels.qk_normalize(x, self._qk_scales()[0], self.qk_norm)

    def _scale_k(self, x: torch.Tensor) -> torch.Tensor:
        """eq. 16 for k of shape (B, H, T, d_k): ``Norm(k) * s_qk``; ``Norm(k)`` alone with
        grouped key/value heads (their s_qk is on the queries)."""
        if not self.grouped:
            return kernels.qk_normalize(x, self._qk_scales()[1], self.qk_norm)
        return kernels.normalize(x) if self.qk_norm else x

    def extra_repr(self) -> str:
        return (
            f"d_model={self.d_model}, n_heads={self.n_heads}, n_kv_heads={self.n_kv_heads}, head_dim={self.head_dim}, "
            f"causal={self.causal}, qk_norm={self.qk_norm}"
        )


class GPTAttention(_Attention):
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
