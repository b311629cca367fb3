"""Rotary position embeddings (RoPE, Su et al. 2024), shared by nGPT and the baseline GPT.

RoPE rotates pairs of coordinates of every query and key by an angle proportional to the
token's position: pair ``i`` of a head of size ``d_k`` turns by ``p * base^(-2i/d_k)`` at
position ``p``. A rotation keeps norms, and since ``R(p)^T R(p') = R(p' - p)``, the dot product
of a rotated query and key depends on their positions only through the offset ``p' - p``.

Pairing convention ("half split"): pair ``i`` is the coordinates ``(i, i + d_k/2)``, for
``i < d_k/2``. Any fixed pairing is equally a rotation; this one avoids strided access. Models
trained with one pairing are not interchangeable with the other (checkpoints are not portable
between conventions).

The cos/sin table is computed in float64 (float32 on devices without float64), cached per
device and dtype, and recomputed for a longer length when a sequence (plus its position
offset, for a KV cache) runs past the cached table. Under ``torch.compile`` the table is
computed inside the graph instead, so no Python-side cache is mutated while tracing.
"""

from __future__ import annotations

import torch
from torch import nn

from .fold import cached

__all__ = ["RotaryEmbedding", "apply_rotary"]


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the pairs ``(x[..., i], x[..., i + d/2])`` of ``x`` (shape ``(..., T, d)``) by the
    angles whose cosines and sines are ``cos``, ``sin`` (shape ``(T, d/2)``)::

        x_i'       = x_i cos - x_{i+d/2} sin
        x_{i+d/2}' = x_i sin + x_{i+d/2} cos

    Computed in float32 at least and cast back to ``x.dtype``.
    """
    work = torch.float64 if x.dtype == torch.float64 else torch.float32
    xw = x.to(work)
    cos, sin = cos.to(work), sin.to(work)
    x1, x2 = xw.chunk(2, dim=-1)
    rotated = torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
    return rotated.to(x.dtype)


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

    def _angles(self, start: int, stop: int, device: torch.device) -> torch.Tensor:
        """``positions x inverse frequencies``, shape ``(stop - start, head_dim/2)``."""
        work = torch.float32 if device.type == "mps" else torch.float64
        half = self.head_dim // 2
        inv_freq = self.base ** (-torch.arange(half, dtype=work, device=device) * 2 / self.head_dim)
        positions = torch.arange(start, stop, dtype=work, device=device)
        return torch.outer(positions, inv_freq)

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
            angles = self._angles(offset, stop, device)
            return angles.cos().to(dtype), angles.sin().to(dtype)
        key = (device, dtype)
        table = self._tables.get(key)
        if table is None or table[0].shape[0] < stop:
            # Extend: recompute for at least twice the old length, so that a sequence growing
            # one token at a time (generation) rebuilds the table only O(log T) times.
            old = 0 if table is None else table[0].shape[0]
            new_length = max(stop, 2 * old, self.initial_length)
            angles = self._angles(0, new_length, device)
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
            if torch.compiler.is_compiling():
                cos, sin = self._position_cos_sin(positions, work)
            else:  # every layer, for q and k, gets the same positions: computed once for all
                cos, sin = cached(
                    self, f"positions {work}", (positions,), lambda: self._position_cos_sin(positions, work)
                )
        return apply_rotary(x, cos, sin)

    def _position_cos_sin(self, positions: torch.Tensor, work: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin of the angles at ``positions`` ``(B, T)``, each ``(B, 1, T, head_dim/2)``."""
        angles = self._position_angles(positions)[:, None]  # one set per row
        return angles.cos().to(work), angles.sin().to(work)

    def _position_angles(self, positions: torch.Tensor) -> torch.Tensor:
        """``positions x inverse frequencies`` for any integer tensor of positions: shape
        ``(*positions.shape, head_dim/2)``, the same values as the table's rows."""
        work = torch.float32 if positions.device.type == "mps" else torch.float64
        half = self.head_dim // 2
        inv_freq = self.base ** (-torch.arange(half, dtype=work, device=positions.device) * 2 / self.head_dim)
        return positions.to(work)[..., None] * inv_freq

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, base={self.base:g}"
