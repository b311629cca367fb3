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
first and let the others call again after a barrier.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import socket
import sys
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .errors import DataError
from .prepared import (
    FORMAT_VERSION,
    META_FILE,
    SPLITS,
    PreparedData,
    _complete,
    _read_meta,
    load_prepared,
    token_dtype,
)
from .sources import WRITE_ERRNOS, Source, read_documents, resolve_source
from .tokenizer import SPEC_FILE, ByteTokenizer, Tokenizer, build_tokenizer, train_bpe

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

    root.mkdir(parents=True, exist_ok=True)
    _remove_stale_tmp(root)
    tmp = root / f".tmp-{final.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    (tmp / _OWNER_FILE).write_text(json.dumps({"host": socket.gethostname(), "pid": os.getpid()}), encoding="utf-8")
    progress = progress and sys.stderr.isatty()  # bars only on a terminal, not in a log file or CI
    bars = datasets.is_progress_bar_enabled()
    if not progress:
        datasets.disable_progress_bars()
    try:
        meta = _build(
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
        (tmp / _OWNER_FILE).unlink(missing_ok=True)
        path = _publish(tmp, final, key, force)
        return PreparedData(path, _read_meta(path) or meta, cached=False)
    except OSError as exc:
        if exc.errno not in WRITE_ERRNOS:
            raise
        reason = (exc.strerror or str(exc)).lower()
        raise DataError(
            f"cannot write the data cache {root}: {reason} ({errno.errorcode.get(exc.errno, '')}); "
            "nothing was kept of this preparation"
        ) from None
    finally:
        if not progress and bars:
            datasets.enable_progress_bars()
        shutil.rmtree(tmp, ignore_errors=True)


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


def _build(
    src: Source,
    tok: Tokenizer | None,
    train_vocab: int | None,
    dt: np.dtype,
    tmp: Path,
    *,
    key: str,
    val_fraction: float,
    seed: int,
    max_documents: int | None,
    num_proc: int | None,
    batch_size: int,
    hub_cache_dir: Any,
    timeout: float,
    skip_bad_records: bool,
) -> dict[str, Any]:
    import datasets
    import pyarrow.compute as pc

    hf_cache = tmp / "hf"
    hf_cache.mkdir()
    ds, bad = read_documents(
        src, cache_dir=hf_cache, hub_cache_dir=hub_cache_dir, timeout=timeout, skip_bad_records=skip_bad_records
    )
    if max_documents is not None and len(ds) > int(max_documents):
        ds = ds.select(range(int(max_documents)))
    n_docs = len(ds)
    if val_fraction > 0 and n_docs < 2:
        hint = (
            f" (text_unit={src.text_unit!r}; for a text file without blank lines use text_unit='line', "
            "in a recipe data.text_unit=line)"
            if src.kind == "text"
            else ""
        )
        raise DataError(
            f"{src.describe()} has only {n_docs} non-empty document: a train/val split by document needs at "
            f"least 2{hint}"
        )
    n_val = 0 if val_fraction == 0 else min(n_docs - 1, max(1, round(val_fraction * n_docs)))
    is_val = np.zeros(n_docs, dtype=bool)
    if n_val:
        is_val[np.random.default_rng(seed).choice(n_docs, size=n_val, replace=False)] = True

    if tok is None:  # train a BPE on the train documents only, so val stays unseen
        train_idx = np.flatnonzero(~is_val)

        tok = train_bpe(_texts(ds.select(train_idx)), int(train_vocab), length=len(train_idx))  # type: ignore[arg-type]
    vocab = tok.vocab_size
    token_dtype(vocab, dt)
    if not 0 <= tok.eos_id < vocab:
        raise DataError(f"tokenizer {tok.name} has eos_id {tok.eos_id} outside its vocab of {vocab}")

    try:
        encoded = ds.map(
            _Encoder(tok, dt),
            batched=True,
            batch_size=batch_size,
            num_proc=num_proc if num_proc and num_proc > 1 else None,
            remove_columns=ds.column_names,
            cache_file_name=str(hf_cache / "tokens.arrow"),
            load_from_cache_file=False,
            new_fingerprint=f"spherenet-{key}-tokens",
            desc=f"tokenizing with {tok.name}",
        )
    except DataError as exc:  # raised by _Encoder, possibly in a worker: drop the datasets frames
        raise DataError(str(exc)) from None

    files = {"train": "train.bin", "val": "val.bin"}
    hashes = {s: hashlib.sha256() for s in SPLITS}
    counts = {s: 0 for s in SPLITS}
    doc = 0
    with open(tmp / files["train"], "wb") as f_train, open(tmp / files["val"], "wb") as f_val:
        out = {"train": f_train, "val": f_val}
        for table in encoded.with_format("arrow").iter(batch_size=10_000):
            col = table["ids"].combine_chunks()
            lengths = pc.list_value_length(col).to_numpy(zero_copy_only=False).astype(np.int64)
            values = pc.list_flatten(col).to_numpy(zero_copy_only=False).astype(dt, copy=False)
            mask = np.repeat(is_val[doc : doc + len(lengths)], lengths)
            doc += len(lengths)
            for split, part in (("train", values[~mask]), ("val", values[mask])):
                if part.size:
                    b = np.ascontiguousarray(part).tobytes()
                    out[split].write(b)
                    hashes[split].update(b)
                    counts[split] += int(part.size)
    if doc != n_docs:  # pragma: no cover - would be a datasets bug
        raise DataError(f"tokenized {doc} documents but expected {n_docs}")
    del encoded, ds

    tok.save(tmp)
    tok_spec = json.loads((tmp / SPEC_FILE).read_text(encoding="utf-8"))
    sha = {s: hashes[s].hexdigest() for s in SPLITS}
    content = hashlib.sha256(json.dumps([dt.name, sha["train"], sha["val"], tok.fingerprint]).encode()).hexdigest()
    meta = {
        "format": "spherenet.tokens",
        "version": FORMAT_VERSION,
        "key": key,
        "source": src.to_dict(),
        "tokenizer": tok_spec,
        "vocab_size": vocab,
        "eos_id": tok.eos_id,
        "dtype": dt.name,
        "files": files,
        "tokens": counts,
        "documents": {"train": int(n_docs - n_val), "val": int(n_val)},
        "split": {
            "by": "document",
            "val_fraction": val_fraction,
            "seed": seed,
            "max_documents": max_documents,
        },
        "bad_records": {"skip": skip_bad_records, **bad.to_dict()},
        "document_separator": f"eos_id {tok.eos_id} after every document",
        "sha256": sha,
        "content_sha256": content,
        "versions": {
            "python": sys.version.split()[0],
            "numpy": np.__version__,
            "datasets": datasets.__version__,
            "spherenet": _spherenet_version(),
        },
    }
    shutil.rmtree(tmp / "hf", ignore_errors=True)
    (tmp / META_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return meta


def _texts(ds: Any) -> Iterator[str]:
    for table in ds.with_format("arrow").iter(batch_size=1000):
        yield from table["text"].to_pylist()


def _spherenet_version() -> str:
    try:
        from spherenet import __version__

        return __version__
    except Exception:  # pragma: no cover
        return "unknown"


class _Encoder:
    """``Dataset.map`` function: ids of each document + EOS, as arrays of the storage dtype.

    A top-level class (not a closure) so that ``num_proc`` workers can pickle it.
    """

    def __init__(self, tok: Tokenizer, dt: np.dtype) -> None:
        self.tok = tok
        self.dt = dt

    def __call__(self, batch: dict[str, list[str]]) -> dict[str, list[np.ndarray]]:
        tok = self.tok
        vocab, eos = tok.vocab_size, tok.eos_id
        out = []
        for ids in tok.encode_arrays(batch["text"]):
            if ids.size and (int(ids.max()) >= vocab or int(ids.min()) < 0):
                bad = int(ids.max()) if int(ids.max()) >= vocab else int(ids.min())
                raise DataError(
                    f"tokenizer {tok.name} produced token id {bad}, outside its vocab of {vocab} ids (0..{vocab - 1})"
                )
            arr = np.empty(ids.size + 1, dtype=self.dt)
            arr[:-1] = ids
            arr[-1] = eos
            out.append(arr)
        return {"ids": out}


_OWNER_FILE = "owner.json"  # which process is writing a .tmp-* directory
_STALE_UNOWNED_S = 3600.0  # a .tmp-* directory without an owner file, untouched this long, is stale


def _remove_stale_tmp(root: Path) -> None:
    """Delete the ``.tmp-*`` directories of preparations that were killed (their process, on
    this host, is gone; or they never wrote an owner and are an hour old). A directory of a live
    process, or of another host sharing the cache, is left alone."""
    host = socket.gethostname()
    for d in root.glob(".tmp-*"):
        if not d.is_dir():
            continue
        try:
            owner = json.loads((d / _OWNER_FILE).read_text(encoding="utf-8"))
            stale = owner.get("host") == host and not _process_alive(int(owner["pid"]))
        except (OSError, ValueError, KeyError, TypeError):
            try:
                stale = time.time() - d.stat().st_mtime > _STALE_UNOWNED_S
            except OSError:
                continue
        if stale:
            shutil.rmtree(d, ignore_errors=True)


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def _publish(tmp: Path, final: Path, key: str, force: bool) -> Path:
    """Rename the finished ``tmp`` directory to ``final`` (an atomic step on POSIX)."""
    if final.exists():
        if not force and _complete(final, key) is not None:
            return final  # another process finished the same preparation first
        old = final.with_name(f".old-{final.name}-{uuid.uuid4().hex[:8]}")
        try:
            os.replace(final, old)
        except OSError:
            pass
        shutil.rmtree(old, ignore_errors=True)
    try:
        os.replace(tmp, final)
    except OSError:
        if _complete(final, key) is None:
            raise DataError(f"could not move the prepared data into {final}") from None
    return final
