"""Batches of token windows read from a memory-mapped token file.

:class:`TokenWindows` cuts windows of ``block_size + 1`` tokens out of a 1-D token array and returns
``x = window[:-1]``, ``y = window[1:]`` as int64 tensors of shape ``(batch_size, block_size)``.

Training batches (:meth:`TokenWindows.next_batch`, or iterate the object) start at random offsets.
Batch number ``step`` is one global batch of ``batch_size * world_size`` windows drawn from a
``torch.Generator`` seeded with a hash of ``(seed, step)``; rank ``r`` reads only its slice
``[r * batch_size, (r + 1) * batch_size)``. So the global batch does not depend on the number of
ranks, and the whole position in the data is the integer ``step``. ``state_dict()`` holds it (the same dict is valid on every rank, so a trainer can
save rank 0's), and ``load_state_dict()`` makes the next batch identical to the one an
uninterrupted run would have drawn.

Evaluation batches (:meth:`TokenWindows.eval_batches`) are fixed: window ``i`` starts at
``i * block_size`` (consecutive windows share one token, so every token after the first is a
target exactly once). The windows are dealt out in equal contiguous shares, rank ``r`` of ``w``
getting windows ``[r * k, (r + 1) * k)`` with ``k = total // w``; the few left over are
skipped, so every rank runs the same number of batches (collectives stay in step).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .errors import DataError, DataFileNotFoundError

__all__ = ["TokenWindows"]


def _positive_int(value: Any, what: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise DataError(f"{what} must be an integer, got {value!r}")
    if int(value) < minimum:
        raise DataError(f"{what} must be >= {minimum}, got {value}")
    return int(value)


def _stream_seed(seed: int, step: int) -> int:
    digest = hashlib.blake2b(f"spherenet.windows:{seed}:{step}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def _open_token_file(path: Path, dtype: Any) -> np.ndarray:
    if not path.is_file():
        raise DataFileNotFoundError(f"token file not found: {path}")
    if dtype is None:
        try:
            meta = json.loads((path.parent / "meta.json").read_text(encoding="utf-8"))
            dtype = meta["dtype"]
        except (OSError, ValueError, KeyError):
            raise DataError(f"dtype of token file {path} is unknown: pass dtype='uint16' or 'uint32'") from None
    dt = np.dtype(dtype)
    size = path.stat().st_size
    if size == 0:
        raise DataError(f"token file {path} is empty")
    if size % dt.itemsize:
        raise DataError(f"token file {path} has {size} bytes, not a whole number of {dt} tokens")
    return np.memmap(path, dtype=dt, mode="r")


class TokenWindows:
    """Random training windows and fixed evaluation windows over a 1-D token array.

    ``tokens`` is a 1-D integer array (e.g. :meth:`PreparedData.tokens`) or the path of a raw
    token file (``dtype`` from the ``meta.json`` beside it, or given). ``rank``/``world_size``
    select this process's stream and eval share. ``vocab_size``, when given, is checked against
    every batch. ``name`` is used in error messages.
    """

    def __init__(
        self,
        tokens: np.ndarray | str | os.PathLike,
        block_size: int,
        batch_size: int,
        *,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        vocab_size: int | None = None,
        dtype: Any = None,
        name: str | None = None,
    ) -> None:
        if isinstance(tokens, (str, os.PathLike)):
            name = name or str(tokens)
            tokens = _open_token_file(Path(tokens), dtype)
        self.name = name or "token array"
        arr = tokens
        if not isinstance(arr, np.ndarray) or arr.ndim != 1:
            raise DataError(
                f"{self.name}: tokens must be a 1-D numpy array, got {type(arr).__name__} of shape "
                f"{getattr(arr, 'shape', '?')}"
            )
        if not np.issubdtype(arr.dtype, np.integer):
            raise DataError(f"{self.name}: tokens must be integers, got dtype {arr.dtype}")
        self.tokens = arr
        self.block_size = _positive_int(block_size, "block_size")
        self.batch_size = _positive_int(batch_size, "batch_size")
        self.world_size = _positive_int(world_size, "world_size")
        self.rank = _positive_int(rank, "rank", minimum=0)
        if self.rank >= self.world_size:
            raise DataError(f"rank {rank} is out of range for world_size {world_size}")
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
            raise DataError(f"seed must be an integer, got {seed!r}")
        self.seed = int(seed)
        self.vocab_size = None if vocab_size is None else _positive_int(vocab_size, "vocab_size")
        n = len(arr)
        if n < self.block_size + 1:
            raise DataError(
                f"block_size {self.block_size} is too large for {self.name}: a window needs "
                f"{self.block_size + 1} tokens and it has {n}"
            )
        self.step = 0

    # ------------------------------------------------------------------ training (random)
    @property
    def num_tokens(self) -> int:
        return len(self.tokens)

    def batch_at(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Training batch number ``step`` of this rank (pure: does not move the position).

        Every rank draws the same global batch of ``batch_size * world_size`` windows from a
        stream seeded by ``(seed, step)`` and reads only its own contiguous slice. The global
        batch therefore does not depend on how many ranks share it: 2 ranks of 4 see exactly
        the windows of 1 rank of 8, which is what makes DDP/FSDP runs match a single process.
        """
        g = torch.Generator()
        g.manual_seed(_stream_seed(self.seed, int(step)))
        high = self.num_tokens - self.block_size  # last valid start is n - block_size - 1
        starts = torch.randint(0, high, (self.batch_size * self.world_size,), generator=g).numpy()
        mine = starts[self.rank * self.batch_size : (self.rank + 1) * self.batch_size]
        return self._gather(mine)

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The next training batch ``(x, y)``; advances :attr:`step`."""
        batch = self.batch_at(self.step)
        self.step += 1
        return batch

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.next_batch()

    # ------------------------------------------------------------------ evaluation (fixed)
    @property
    def total_eval_windows(self) -> int:
        return (self.num_tokens - 1) // self.block_size

    @property
    def num_eval_windows(self) -> int:
        """Evaluation windows of this rank."""
        return self.total_eval_windows // self.world_size

    def eval_starts(self) -> np.ndarray:
        """Start offsets of this rank's evaluation windows."""
        k = self.num_eval_windows
        if k == 0:
            raise DataError(
                f"{self.name} has {self.num_tokens} tokens: not enough for one evaluation window of "
                f"{self.block_size + 1} tokens per rank with world_size {self.world_size}"
            )
        first = self.rank * k
        return np.arange(first, first + k, dtype=np.int64) * self.block_size

    def eval_batches(self, max_batches: int | None = None) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """This rank's evaluation batches in order (the last may be smaller), at most ``max_batches``."""
        starts = self.eval_starts()
        if max_batches is not None:
            starts = starts[: _positive_int(max_batches, "max_batches", minimum=0) * self.batch_size]
        for i in range(0, len(starts), self.batch_size):
            yield self._gather(starts[i : i + self.batch_size])

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """The data position; the same on every rank (the rank is not part of it)."""
        return {
            "step": self.step,
            "seed": self.seed,
            "block_size": self.block_size,
            "batch_size": self.batch_size,
            "num_tokens": self.num_tokens,
        }

    def load_state_dict(self, state: dict[str, Any], strict: bool = True) -> None:
        """Restore the position. With ``strict`` (default) the seed, block and batch sizes and the
        number of tokens must match, since otherwise the batches would differ from the saved run."""
        if "step" not in state:
            raise DataError(f"not a TokenWindows state (no 'step'): keys {sorted(state)}")
        if strict:
            for k in ("seed", "block_size", "batch_size", "num_tokens"):
                if k in state and int(state[k]) != getattr(self, k):
                    raise DataError(
                        f"cannot resume {self.name}: saved {k}={state[k]} but this loader has "
                        f"{k}={getattr(self, k)} "
                        "(pass strict=False to keep only the step)"
                    )
        self.step = _positive_int(int(state["step"]), "step", minimum=0)

    # ------------------------------------------------------------------ gathering
    def _gather(self, starts: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        idx = starts[:, None] + np.arange(self.block_size + 1, dtype=np.int64)
        buf = np.asarray(self.tokens[idx]).astype(np.int64)
        # Ids are checked here, on the host, where they enter: the models' forward only asserts
        # them on the device (reading them there would synchronize every step).
        if self.vocab_size is not None and buf.size:
            if int(buf.max()) >= self.vocab_size:
                r, c = np.argwhere(buf >= self.vocab_size)[0]
                raise DataError(
                    f"{self.name} holds token id {int(buf[r, c])} at position {int(idx[r, c])} but the "
                    "vocab has "
                    f"{self.vocab_size} ids: the data was made with another tokenizer"
                )
        if buf.size and int(buf.min()) < 0:
            r, c = np.argwhere(buf < 0)[0]
            raise DataError(f"{self.name} holds negative token id {int(buf[r, c])} at position {int(idx[r, c])}")
        t = torch.from_numpy(buf)
        return t[:, :-1].contiguous(), t[:, 1:].contiguous()

    def __repr__(self) -> str:
        return (
            f"TokenWindows({self.name}, tokens={self.num_tokens}, block_size={self.block_size}, "
            f"batch_size={self.batch_size}, rank={self.rank}/{self.world_size}, step={self.step})"
        )
