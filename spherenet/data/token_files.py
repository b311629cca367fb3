"""The token files of one preparation, written into its (temporary) directory: the documents split
into train and val, tokenized, each followed by EOS, into ``train.bin`` / ``val.bin``, with the
tokenizer's files and ``meta.json`` beside them (the layout is :mod:`spherenet.data.prepare`'s).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from .errors import DataError
from .prepared import FORMAT_VERSION, META_FILE, SPLITS, token_dtype
from .source_spec import Source
from .sources import read_documents
from .tokenizer import SPEC_FILE, Tokenizer, train_bpe

__all__ = ["write_token_files"]


def write_token_files(
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
    """Split ``src``'s documents by document (``val_fraction`` of them, drawn with ``seed``), train
    a BPE of ``train_vocab`` ids on the train documents when ``tok`` is None, tokenize, and write
    the files into ``tmp``; the ``meta.json`` written, returned."""
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
