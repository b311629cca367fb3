"""Reading prepared token directories (the format :func:`~spherenet.data.prepare_dataset` writes,
described in :mod:`spherenet.data.prepare`): :class:`PreparedData`, :func:`load_prepared`, and the
storage dtype of token ids."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .errors import DataError, DataFileNotFoundError
from .tokenizer import Tokenizer, load_tokenizer

if TYPE_CHECKING:
    from .windows import TokenWindows

__all__ = ["FORMAT_VERSION", "META_FILE", "SPLITS", "PreparedData", "load_prepared", "token_dtype"]

FORMAT_VERSION = 1
META_FILE = "meta.json"
SPLITS = ("train", "val")
_HASH_CHUNK = 1 << 24


def token_dtype(vocab_size: int, dtype: str | np.dtype | None = None) -> np.dtype:
    """The storage dtype for ids ``0 .. vocab_size-1``: ``uint16`` up to 65536 ids, else ``uint32``.

    An explicit ``dtype`` is checked: :class:`DataError` when the vocabulary does not fit.
    """
    vocab_size = int(vocab_size)
    if vocab_size < 1:
        raise DataError(f"vocab_size must be positive, got {vocab_size}")
    if dtype is None:
        dt = np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.uint32)
    else:
        try:
            dt = np.dtype(dtype)
        except TypeError:
            raise DataError(f"unknown token dtype {dtype!r}: use 'uint16' or 'uint32'") from None
        if dt not in (np.dtype(np.uint16), np.dtype(np.uint32)):
            raise DataError(f"token dtype must be uint16 or uint32, got {dt}")
    capacity = int(np.iinfo(dt).max) + 1
    if vocab_size > capacity:
        raise DataError(
            f"tokenizer vocab of {vocab_size} ids is too large for {dt} token files (at most {capacity} "
            "ids); use uint32"
        )
    return dt


@dataclass
class PreparedData:
    """A prepared token directory: ``path``, its parsed ``meta.json``, and whether it was reused."""

    path: Path
    meta: dict[str, Any]
    cached: bool = False
    _memmaps: dict[str, np.memmap] = field(default_factory=dict, repr=False, compare=False)

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self.meta["dtype"])

    @property
    def vocab_size(self) -> int:
        return int(self.meta["vocab_size"])

    @property
    def eos_id(self) -> int:
        return int(self.meta["eos_id"])

    def num_tokens(self, split: str = "train") -> int:
        return int(self.meta["tokens"][_check_split(split)])

    def file(self, split: str = "train") -> Path:
        return self.path / self.meta["files"][_check_split(split)]

    def tokens(self, split: str = "train") -> np.ndarray:
        """The split's token ids as a read-only ``numpy.memmap`` (an empty array for an empty split)."""
        split = _check_split(split)
        if split not in self._memmaps:
            f = self.file(split)
            n = self.num_tokens(split)
            if not f.is_file():
                raise DataFileNotFoundError(f"token file missing: {f}")
            want = n * self.dtype.itemsize
            if f.stat().st_size != want:
                raise DataError(
                    f"token file {f} has {f.stat().st_size} bytes but {META_FILE} says {n} tokens ({want} "
                    "bytes): it is truncated or replaced; prepare again with force=True"
                )
            if n == 0:
                return np.zeros(0, dtype=self.dtype)
            self._memmaps[split] = np.memmap(f, dtype=self.dtype, mode="r", shape=(n,))
        return self._memmaps[split]

    def tokenizer(self) -> Tokenizer:
        """The tokenizer these tokens were made with (from the copy in this directory)."""
        return load_tokenizer(self.path)

    def windows(
        self,
        split: str = "train",
        *,
        block_size: int,
        batch_size: int,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        vocab_size: int | None = None,
    ) -> TokenWindows:
        """A :class:`~spherenet.data.windows.TokenWindows` over ``split``.

        ``vocab_size`` is the model's vocabulary; it must hold the data's (checked here), and
        every batch is checked against it.
        """
        from .windows import TokenWindows

        if vocab_size is not None and int(vocab_size) < self.vocab_size:
            raise DataError(
                f"{self.path} was tokenized with a vocab of {self.vocab_size} ids but the model's "
                f"vocab_size is {vocab_size}"
            )
        return TokenWindows(
            self.tokens(split),
            block_size,
            batch_size,
            seed=seed,
            rank=rank,
            world_size=world_size,
            vocab_size=vocab_size if vocab_size is not None else self.vocab_size,
            name=f"{self.file(split)} ({split} split)",
        )

    def verify(self) -> None:
        """Re-read both files: their SHA-256 must match ``meta.json`` and every id must be < vocab_size."""
        for split in SPLITS:
            arr = self.tokens(split)
            digest = hashlib.sha256()
            step = _HASH_CHUNK // self.dtype.itemsize
            for start in range(0, len(arr), step):
                chunk = np.asarray(arr[start : start + step])
                digest.update(chunk.tobytes())
                if chunk.size and int(chunk.max()) >= self.vocab_size:
                    pos = start + int(np.argmax(chunk >= self.vocab_size))
                    raise DataError(
                        f"token file {self.file(split)} holds id {int(arr[pos])} at position {pos}, >= "
                        f"vocab_size {self.vocab_size}"
                    )
            if digest.hexdigest() != self.meta["sha256"][split]:
                raise DataError(
                    f"token file {self.file(split)} does not match the SHA-256 recorded in "
                    f"{self.path / META_FILE}: it was modified"
                )


def _check_split(split: str) -> str:
    if split not in SPLITS:
        raise DataError(f"unknown split {split!r}: expected 'train' or 'val'")
    return split


def load_prepared(path: str | os.PathLike) -> PreparedData:
    """Open a directory written by :func:`prepare_dataset` (checks ``meta.json`` and the file sizes)."""
    d = Path(path).expanduser()
    meta = _read_meta(d)
    if meta is None:
        if not d.exists():
            raise DataFileNotFoundError(f"prepared data directory not found: {d}")
        raise DataFileNotFoundError(f"{d} is not a prepared token directory (no readable {META_FILE})")
    data = PreparedData(d, meta, cached=True)
    for split in SPLITS:
        data.tokens(split)  # size checks
    return data


def _read_meta(d: Path) -> dict[str, Any] | None:
    try:
        meta = json.loads((d / META_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict) or meta.get("format") != "spherenet.tokens" or meta.get("version") != FORMAT_VERSION:
        return None
    return meta


def _complete(d: Path, key: str) -> dict[str, Any] | None:
    meta = _read_meta(d)
    if meta is None or meta.get("key") != key:
        return None
    itemsize = np.dtype(meta["dtype"]).itemsize
    for split in SPLITS:
        f = d / meta["files"][split]
        if not f.is_file() or f.stat().st_size != int(meta["tokens"][split]) * itemsize:
            return None
    return meta
