"""The attention plumbing nGPT's and the baseline's attentions share (their classes are in
:mod:`spherenet.models.ngpt` and :mod:`spherenet.models.gpt`): rotary position embeddings, the
KV cache, masks, heads and the SDPA call (:class:`Attention`).

Conventions of every attention built on :class:`Attention`:

- ``forward(x, cache=None, causal=None, attn_mask=None, positions=None)``, ``x`` of shape
  ``(B, T, d_model)``, ``causal`` (default: the module's) masking the future: RoPE turns q and k
  by positions ``offset .. offset + T - 1`` (``offset``: the tokens held in ``cache``), or by
  ``positions`` (``(B, T)``: a padded batch) when given.
- ``attn_mask``: SDPA's convention, a bool tensor (True: may attend) or an additive float
  tensor, broadcastable to ``(B, H, T, keys)`` (``keys``: the cached ones included), e.g.
  ``(B, 1, 1, keys)`` for padding. It is combined with the causal mask.
- ``cache`` (a :class:`KVCache`, or anything with ``length`` and ``append``) makes incremental
  decoding possible: it holds the keys (after RoPE, and for nGPT after ``Norm``/``s_qk``) and
  values of all tokens seen so far; new ones are appended.
- Heads: ``n_heads`` query heads of size ``head_dim`` (default ``d_model / n_heads``; any even
  size otherwise), and ``n_kv_heads`` key/value heads (default ``n_heads``), a divisor of
  ``n_heads``: grouped-query attention (multi-query for one). Query head ``j`` attends with
  key/value head ``j // (n_heads / n_kv_heads)``, SDPA's ``enable_gqa`` convention; keys and
  values are computed and cached for the ``n_kv_heads`` heads only.

The causal mask with a cache: queries are the last ``T`` of ``offset + T`` positions, so query
``i`` may see keys ``j <= offset + i``. SDPA's ``is_causal=True`` would align the mask top-left
(query ``i`` sees keys ``j <= i``) when there are more keys than queries, which is wrong here;
the bottom-right mask is built explicitly whenever ``offset > 0``.

RoPE (Su et al. 2024) rotates pairs of coordinates of every query and key by an angle
proportional to the token's position: pair ``i`` of a head of size ``d_k`` turns by
``p * base^(-2i/d_k)`` at position ``p``. A rotation keeps norms, and since ``R(p)^T R(p') =
R(p' - p)``, the dot product of a rotated query and key depends on their positions only through
the offset ``p' - p``. Pairing convention ("half split"): pair ``i`` is the coordinates ``(i, i +
d_k/2)``, for ``i < d_k/2`` (checkpoints are not portable between pairing conventions). The
cos/sin table is computed in float64 (float32 on devices without float64), cached per device and
dtype, and recomputed for a longer length when a sequence runs past it; under ``torch.compile``
it is computed inside the graph instead, so no Python-side cache is mutated while tracing.
"""

from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F
from torch import nn

from .kv_cache import KVCache

__all__ = ["Attention", "RotaryEmbedding", "apply_rotary"]


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the pairs ``(x[..., i], x[..., i + d/2])`` of ``x`` (shape ``(..., T, d)``) by the
    angles whose cosines and sines are ``cos``, ``sin`` (shape ``(T, d/2)``)::

        x_i'       = x_i cos - x_{i+d/2} sin
        x_{i+d/2}' = x_i sin + x_{i+d/2} cos

    Computed in float32 at least and cast back to ``x.dtype``.
    """
    work = torch.float64 if x.dtype == torch.float64 else torch.float32
    xw, cos, sin = (t if t.dtype == work else t.to(work) for t in (x, cos, sin))  # no call where it is one
    x1, x2 = xw.chunk(2, dim=-1)
    rotated = torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
    return rotated if rotated.dtype == x.dtype else rotated.to(x.dtype)


class RotaryEmbedding(nn.Module):
    """RoPE for heads of size ``head_dim`` (even), base ``base`` (10000 in the paper, A.5).

    ``forward(x, offset=0)`` rotates ``x`` of shape ``(..., T, head_dim)``: the token at index
    ``t`` along dimension -2 is at position ``offset + t``. Use ``offset`` = number of tokens
    already in a KV cache. The module holds no parameters and no buffers (nothing to shard,
    save or initialize; it works unchanged when the model is built on the meta device).
    """

    def __init__(self, head_dim: int, base: float = 10000.0, initial_length: int = 0):
        super().__init__()
        if not isinstance(head_dim, int) or isinstance(head_dim, bool) or head_dim < 2 or head_dim % 2:
            raise ValueError(
                f"RotaryEmbedding head_dim must be a positive even int (RoPE rotates pairs), got {head_dim!r}"
            )
        if not base > 0:
            raise ValueError(f"RotaryEmbedding base must be > 0, got {base!r}")
        self.head_dim, self.base = head_dim, float(base)
        self.initial_length = int(initial_length)  # first table size, a hint only
        # {(device, dtype): (cos, sin)}, each (length, head_dim/2). Plain attributes, not buffers.
        self._tables: dict[tuple[torch.device, torch.dtype], tuple[torch.Tensor, torch.Tensor]] = {}

    def _angles(self, positions: torch.Tensor) -> torch.Tensor:
        """``positions x inverse frequencies`` for an integer tensor of positions: shape
        ``(*positions.shape, head_dim/2)``."""
        work = torch.float32 if positions.device.type == "mps" else torch.float64
        pair = torch.arange(self.head_dim // 2, dtype=work, device=positions.device)
        return positions.to(work)[..., None] * self.base ** (-pair * 2 / self.head_dim)

    def cos_sin(
        self, length: int, offset: int = 0, device=None, dtype=torch.float32
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin of the rotation angles for positions ``offset .. offset + length - 1``,
        each of shape ``(length, head_dim/2)`` and dtype ``dtype``."""
        if offset < 0 or length < 0:
            raise ValueError(f"RotaryEmbedding: positions must be >= 0, got offset={offset}, length={length}")
        device = torch.device("cpu") if device is None else torch.device(device)
        stop = offset + length
        if torch.compiler.is_compiling():
            angles = self._angles(torch.arange(offset, stop, device=device))
            return angles.cos().to(dtype), angles.sin().to(dtype)
        key = (device, dtype)
        table = self._tables.get(key)
        if table is None or table[0].shape[0] < stop:
            # Extend: recompute for at least twice the old length, so that a sequence growing
            # one token at a time (generation) rebuilds the table only O(log T) times.
            old = 0 if table is None else table[0].shape[0]
            new_length = max(stop, 2 * old, self.initial_length)
            angles = self._angles(torch.arange(new_length, device=device))
            table = (angles.cos().to(dtype), angles.sin().to(dtype))
            self._tables[key] = table
        cos, sin = table
        return cos[offset:stop], sin[offset:stop]

    def forward(self, x: torch.Tensor, offset: int = 0, positions: torch.Tensor | None = None) -> torch.Tensor:
        """Rotate ``x`` (``(B, H, T, head_dim)`` or ``(..., T, head_dim)``) at positions ``offset ..
        offset + T - 1``, or at ``positions`` when given: integers of shape ``(B, T)``, one
        position per row and token (a left-padded batch counts each row from its first token)."""
        if x.shape[-1] != self.head_dim:
            raise ValueError(f"RotaryEmbedding expected last dimension {self.head_dim}, got shape {tuple(x.shape)}")
        work = torch.float64 if x.dtype == torch.float64 else torch.float32
        if positions is None:
            cos, sin = self.cos_sin(x.shape[-2], offset, device=x.device, dtype=work)
        else:
            if positions.ndim != 2 or positions.shape[-1] != x.shape[-2] or positions.shape[0] not in (1, x.shape[0]):
                raise ValueError(
                    f"RotaryEmbedding: positions of shape {tuple(positions.shape)} do not match x of shape "
                    f"{tuple(x.shape)}; expected (batch, {x.shape[-2]})"
                )
            cos, sin = self._position_cos_sin(positions, work)
        return apply_rotary(x, cos, sin)

    def _position_cos_sin(self, positions: torch.Tensor, work: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin of the angles at ``positions`` ``(B, T)``, each ``(B, 1, T, head_dim/2)``.
        Every layer rotates q and k at the same positions: outside ``torch.compile`` the result
        for the same tensor as the last call, unchanged (object, storage, version), is reused."""
        traced = torch.compiler.is_compiling()  # no tensor identity to key on
        key = None if traced else (positions._version, positions.data_ptr(), positions.shape, work)
        memo = self.__dict__.get("_positions_memo")
        if key is not None and memo is not None and memo[0]() is positions and memo[1] == key:
            return memo[2]
        angles = self._angles(positions)[:, None]  # one set per row
        cos_sin = angles.cos().to(work), angles.sin().to(work)
        if key is not None:
            self.__dict__["_positions_memo"] = (weakref.ref(positions), key, cos_sin)
        return cos_sin

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, base={self.base:g}"


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


class Attention(nn.Module):
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

    def _project(self, x: torch.Tensor, offset: int, positions: torch.Tensor | None):
        """Queries ``(B, n_heads, T, d_k)``, keys and values ``(B, n_kv_heads, T, d_k)`` of ``x``:
        q and k after RoPE and ``_scale_q`` / ``_scale_k``."""
        q = self._scale_q(self.rope(self._split_heads(self.w_q(x)), offset, positions))
        k = self._scale_k(self.rope(self._split_heads(self.w_k(x)), offset, positions))
        return q, k, self._split_heads(self.w_v(x))

    def _split_heads(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, T, heads * head_dim)`` -> ``(B, heads, T, head_dim)``: queries (n_heads) or keys
        and values (n_kv_heads)."""
        return x.unflatten(-1, (-1, self.head_dim)).transpose(1, 2)

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
        return self.w_o(out.transpose(1, 2).flatten(2))  # (B, H, T, d) -> (B, T, H d)

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
        q, k, v = self._project(x, offset, positions)
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
