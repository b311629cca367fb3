"""Checks on input files, done before a library sees them, so errors name the file and the fault."""

from __future__ import annotations

import codecs
import hashlib
import os
from pathlib import Path

from .errors import DataError, DataFileNotFoundError

__all__ = ["check_parquet_file", "check_text_file", "existing_file", "file_sha256"]

_CHUNK = 1 << 20


def existing_file(path: str | os.PathLike, what: str = "file") -> Path:
    """``path`` as an absolute Path, after checking that it is a readable, non-empty file."""
    p = Path(path).expanduser()
    if not p.exists():
        raise DataFileNotFoundError(f"{what} not found: {p}")
    if p.is_dir():
        raise DataError(f"{what} {p} is a directory; pass the files inside it")
    if not p.is_file():
        raise DataError(f"{what} {p} is not a regular file")
    if not os.access(p, os.R_OK):
        raise DataError(f"{what} {p} is not readable (permission denied)")
    if p.stat().st_size == 0:
        raise DataError(f"{what} {p} is empty (0 bytes)")
    return p.resolve()


def check_text_file(path: str | os.PathLike, what: str = "text file") -> Path:
    """Check that ``path`` is non-empty UTF-8 text with at least one non-space character.

    Reads the whole file in 1 MiB chunks (about 1 GB/s). NUL bytes mean a binary file: no text
    format this pipeline reads contains them.
    """
    p = existing_file(path, what)
    decoder = codecs.getincrementaldecoder("utf-8")("strict")
    offset = 0
    has_text = False
    try:
        with open(p, "rb") as f:
            while True:
                chunk = f.read(_CHUNK)
                final = not chunk
                nul = chunk.find(b"\x00")
                if nul >= 0:
                    raise DataError(
                        f"{what} {p} contains a NUL byte at offset {offset + nul}: it looks binary, not text"
                    )
                pending = len(decoder.getstate()[0])  # bytes of a character split across chunks
                try:
                    text = decoder.decode(chunk, final=final)
                except UnicodeDecodeError as exc:
                    pos = offset - pending + exc.start
                    raise DataError(
                        f"{what} {p} is not valid UTF-8 (bad byte at offset {pos}); convert it to UTF-8 text first"
                    ) from None
                if not has_text and text.strip():
                    has_text = True
                if final:
                    break
                offset += len(chunk)
    except OSError as exc:
        raise DataError(f"cannot read {what} {p}: {exc.strerror or exc}") from None
    if not has_text:
        raise DataError(f"{what} {p} contains no text (only whitespace)")
    return p


def check_parquet_file(path: str | os.PathLike, what: str = "parquet file") -> Path:
    """Check that ``path`` starts and ends with the Parquet magic bytes ``PAR1``."""
    p = existing_file(path, what)
    try:
        with open(p, "rb") as f:
            head = f.read(4)
            f.seek(max(p.stat().st_size - 4, 0))
            tail = f.read(4)
    except OSError as exc:
        raise DataError(f"cannot read {what} {p}: {exc.strerror or exc}") from None
    if head != b"PAR1" or tail != b"PAR1" or p.stat().st_size < 12:
        raise DataError(f"{what} {p} is not a Parquet file (no PAR1 magic bytes at its start and end)")
    return p


def file_sha256(path: str | os.PathLike) -> str:
    """The SHA-256 of the file's bytes, read in 1 MiB chunks: what the prepared-data cache is keyed
    by, so that an edit that keeps the size and the modification time still makes new tokens."""
    digest = hashlib.sha256()
    buffer = bytearray(_CHUNK)
    view = memoryview(buffer)
    try:
        with open(path, "rb", buffering=0) as f:
            while n := f.readinto(buffer):
                digest.update(view[:n])
    except OSError as exc:
        raise DataError(f"cannot read {path}: {exc.strerror or exc}") from None
    return digest.hexdigest()
