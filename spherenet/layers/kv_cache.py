"""The keys and values an attention layer has computed, kept for incremental decoding: each new
token then attends to them without recomputing them (:class:`spherenet.layers.attention.Attention`
with ``cache=``)."""

from __future__ import annotations

import torch

__all__ = ["KVCache"]


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
