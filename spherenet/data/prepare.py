"""Tokenize a document source once into memory-mappable token files, with caching.

:func:`prepare_dataset` writes, under ``out_dir/<source>-<tokenizer>-<key>/``:

``train.bin``, ``val.bin``
    the token ids of the documents in each split, each document followed by the tokenizer's
    ``eos_id``; raw little-endian ``uint16`` when the vocabulary has at most 65536 ids, else
    ``uint32``. Open them with :meth:`PreparedData.tokens` (``numpy.memmap``).
``meta.json``
    source, tokenizer spec, dtype, token and document counts, split settings, the records skipped
    for want of text (``bad_records``), and SHA-256 digests of both files (``content_sha256``
    combines them with the tokenizer fingerprint).
``tokenizer_spec.json`` (+ ``tokenizer.json``)
    a copy of the tokenizer, so ``load_tokenizer(<that directory>)`` works anywhere.

The split is by document: ``val_fraction`` of the non-empty documents (at least one) are drawn
with ``numpy.random.default_rng(seed)``; documents keep their source order within each split.

Everything is built in a hidden temporary directory next to the result and renamed into place at
the end, so a reader never sees a half-written directory and concurrent preparations (one per
rank) cannot corrupt each other. The directory name ends in a key computed from the source
identity, the tokenizer, and the split settings: a second call with the same inputs finds the
directory and returns at once (``PreparedData.cached``). In a multi-process job, prepare on rank 0
first and let the others call again after a barrier. The files are written by
:mod:`spherenet.data.token_files`, the hidden directory kept and renamed by
:mod:`spherenet.data._staging`.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from ._staging import publish, start_tmp
from .errors import DataError
from .prepared import FORMAT_VERSION, META_FILE, PreparedData, _complete, _read_meta, load_prepared, token_dtype
from .source_spec import Source, resolve_source
from .sources import WRITE_ERRNOS
from .token_files import write_token_files
from .tokenizer import ByteTokenizer, Tokenizer, build_tokenizer

__all__ = [
    "FORMAT_VERSION",
    "META_FILE",
    "PreparedData",
    "default_corpus",
    "load_prepared",
    "prepare_dataset",
    "token_dtype",
]


def default_corpus(out_dir: str | os.PathLike = "data", tokenizer: Any = "byte", **kwargs: Any) -> PreparedData:
    """Prepare the built-in corpus: this Python's standard library source (no download).

    About 8 MB of ``.py`` files (one document per file), about 8M byte-level tokens; takes a few
    seconds. Keyword arguments go to :func:`prepare_dataset` (e.g. ``max_bytes``).
    """
    return prepare_dataset("stdlib", tokenizer, out_dir, **kwargs)


def prepare_dataset(
    source: str | os.PathLike | Sequence[str | os.PathLike] | Source = "stdlib",
    tokenizer: str | Mapping[str, Any] | Tokenizer = "byte",
    out_dir: str | os.PathLike = "data",
    *,
    kind: str | None = None,
    text_field: str = "text",
    text_unit: str = "paragraph",
    hub_config: str | None = None,
    hub_split: str = "train",
    revision: str | None = None,
    max_bytes: int | None = None,
    max_documents: int | None = None,
    val_fraction: float = 0.01,
    seed: int = 0,
    dtype: str | None = None,
    num_proc: int | None = None,
    batch_size: int = 1000,
    hub_cache_dir: str | os.PathLike | None = None,
    timeout: float = 5.0,
    force: bool = False,
    progress: bool = False,
    skip_bad_records: bool = False,
) -> PreparedData:
    """Tokenize ``source`` with ``tokenizer`` into ``train.bin``/``val.bin`` under ``out_dir`` (cached).

    ``source``/``kind``/``text_field``/``text_unit``/``hub_config``/``hub_split``/``revision``/
    ``max_bytes`` are described in :func:`~spherenet.data.sources.resolve_source`. ``tokenizer``
    is anything :func:`~spherenet.data.tokenizer.build_tokenizer` takes; ``"bpe:<vocab size>"``
    trains a BPE on the train-split documents. ``max_documents`` keeps the first N non-empty
    documents. ``num_proc`` worker processes tokenize (``Dataset.map``); ``batch_size`` documents
    per call. ``force`` rebuilds even when a matching directory exists. ``progress`` shows the
    tokenizing bars (``datasets``'), only when stderr is a terminal. A JSON/Parquet record or Hub
    row without usable text (field missing, null or not a string) is a ``DataError`` naming the
    file, the count and the first one; ``skip_bad_records`` skips them instead, and ``meta.json``
    records how many (``"bad_records"``). It is part of the cache key of those kinds.
    """
    import datasets

    src = resolve_source(
        source,
        kind=kind,
        text_field=text_field,
        text_unit=text_unit,
        hub_config=hub_config,
        hub_split=hub_split,
        revision=revision,
        max_bytes=max_bytes,
    )
    val_fraction = float(val_fraction)
    if not 0.0 <= val_fraction < 1.0:
        raise DataError(f"val_fraction must be in [0, 1), got {val_fraction}")
    if max_documents is not None and int(max_documents) < 1:
        raise DataError(f"max_documents must be positive, got {max_documents}")
    if num_proc is not None and int(num_proc) < 1:
        raise DataError(f"num_proc must be positive, got {num_proc}")

    tok, train_vocab = _tokenizer_plan(tokenizer, timeout)
    vocab_bound = tok.vocab_size if tok is not None else train_vocab
    assert vocab_bound is not None
    dt = token_dtype(vocab_bound, dtype)
    tok_ident: dict[str, Any] = (
        {"kind": tok.spec()["kind"], "fingerprint": tok.fingerprint, "eos_id": tok.eos_id}
        if tok is not None
        else {"kind": "bpe", "train_vocab_size": train_vocab}
    )
    tok_slug = tok.name if tok is not None else f"bpe{train_vocab}"
    key_material = {
        "format": FORMAT_VERSION,
        "source": src.identity(),
        "tokenizer": tok_ident,
        "val_fraction": val_fraction,
        "seed": int(seed),
        "max_documents": None if max_documents is None else int(max_documents),
        "dtype": dt.name,
    }
    if src.kind in ("json", "parquet", "hub"):  # record sources: bad records refused or skipped
        key_material["skip_bad_records"] = bool(skip_bad_records)
    key = hashlib.sha256(json.dumps(key_material, sort_keys=True).encode()).hexdigest()[:16]
    root = Path(out_dir).expanduser()
    final = root / f"{src.slug()}-{tok_slug}-{key}"
    if not force:
        meta = _complete(final, key)
        if meta is not None:
            return PreparedData(final, meta, cached=True)

    with _cache_writes(root):
        tmp = start_tmp(root, final.name)
    progress = progress and sys.stderr.isatty()  # bars only on a terminal, not in a log file or CI
    bars = datasets.is_progress_bar_enabled()
    if not progress:
        datasets.disable_progress_bars()
    try:
        with _cache_writes(root):
            meta = write_token_files(
                src,
                tok,
                train_vocab,
                dt,
                tmp,
                key=key,
                val_fraction=val_fraction,
                seed=int(seed),
                max_documents=max_documents,
                num_proc=num_proc,
                batch_size=int(batch_size),
                hub_cache_dir=hub_cache_dir,
                timeout=timeout,
                skip_bad_records=bool(skip_bad_records),
            )
            path = publish(tmp, final, key, force)
        return PreparedData(path, _read_meta(path) or meta, cached=False)
    finally:
        if not progress and bars:
            datasets.enable_progress_bars()
        shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def _cache_writes(root: Path) -> Iterator[None]:
    """A failed write (disk full, read-only, not permitted) as one ``DataError`` naming the data
    cache: such an error from ``write`` on an open file names no path, and the staging directory
    it happened in is removed by then."""
    try:
        yield
    except OSError as exc:
        if exc.errno not in WRITE_ERRNOS:
            raise
        reason = (exc.strerror or str(exc)).lower()
        raise DataError(
            f"cannot write the data cache {root}: {reason} ({errno.errorcode.get(exc.errno, '')}); "
            "nothing was kept of this preparation"
        ) from None


def _tokenizer_plan(tokenizer: Any, timeout: float) -> tuple[Tokenizer | None, int | None]:
    """(ready tokenizer, None) or (None, vocab size of a BPE to train on the train split)."""
    if (
        isinstance(tokenizer, str)
        and tokenizer.strip().lower().startswith("bpe:")
        and tokenizer.split(":", 1)[1].strip().isdigit()
    ):
        n = int(tokenizer.split(":", 1)[1])
        if n <= 257:
            raise DataError(f"BPE vocab size {n} is too small: byte-level BPE needs more than 257 (256 bytes + EOS)")
        return None, n
    if (
        isinstance(tokenizer, Mapping)
        and tokenizer.get("kind") == "bpe"
        and "path" not in tokenizer
        and "name" not in tokenizer
    ):
        return None, int(tokenizer["vocab_size"])
    if tokenizer is None:
        return ByteTokenizer(), None
    return build_tokenizer(tokenizer, timeout=timeout), None
