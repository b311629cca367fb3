"""Where documents come from: local files, Hub datasets, or the Python standard library.

A source is described by a :class:`Source` (see :func:`resolve_source` for the accepted
spellings; both in :mod:`spherenet.data.source_spec`, and importable from here) and read with
:func:`load_documents` into a ``datasets.Dataset`` with one string column ``"text"``, one row per
document, empty documents removed.

Kinds:

``text``
    ``.txt``/``.text``/``.md`` files. ``text_unit`` says what a document is: ``"paragraph"``
    (text between blank lines, the default; the blank lines become the EOS between documents),
    ``"line"`` or ``"document"`` (a whole file).
``json``
    JSON Lines (``.jsonl``/``.ndjson``) or a JSON array of objects (``.json``); the document is
    the ``text_field`` of each record.
``parquet``
    ``.parquet`` files; the document is the ``text_field`` column.

A JSON or Parquet record (or Hub row) without usable text (its field missing, null or not a
string) is an error naming the file, the count and the first one, unless ``skip_bad_records``
(:mod:`spherenet.data.records`).
``hub``
    a dataset repository on the Hugging Face Hub, ``"hf:owner/name"``. ``datasets`` >= 4 no
    longer runs loading scripts, so use repositories stored as Parquet/JSON (e.g.
    ``"hf:Skylion007/openwebtext"`` or ``"hf:HuggingFaceFW/fineweb-edu"`` with
    ``hub_config="sample-10BT"``) or pass ``revision="refs/convert/parquet"`` for the Hub's
    Parquet export of a script-based one.
``stdlib``
    the ``.py`` files of this Python's standard library (tests excluded), in sorted order, up to
    ``max_bytes`` (8 MB by default): real text that needs no download. See :func:`stdlib_files`.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

from ._files import check_parquet_file, check_text_file
from ._hub import hub_endpoint, hub_offline, hub_unreachable
from .errors import DataError, root_cause
from .records import (
    BadRecords,
    arrow_dataset,
    drop_empty,
    null_records,
    read_json_records,
    read_parquet_records,
)
from .source_spec import (  # noqa: F401 - HUB_ALIASES, TEXT_UNITS: re-exported, spherenet.data.sources' names too
    DEFAULT_STDLIB_BYTES,
    HUB_ALIASES,
    SOURCE_KINDS,
    TEXT_UNITS,
    Source,
    resolve_source,
    stdlib_files,
)

__all__ = [  # Source, resolve_source and stdlib_files live in spherenet.data.source_spec
    "DEFAULT_STDLIB_BYTES",
    "SOURCE_KINDS",
    "Source",
    "load_documents",
    "read_documents",
    "resolve_source",
    "stdlib_files",
]


def load_documents(
    src: Source,
    *,
    cache_dir: str | os.PathLike,
    hub_cache_dir: str | os.PathLike | None = None,
    timeout: float = 5.0,
    skip_bad_records: bool = False,
) -> Any:
    """Read ``src`` into a ``datasets.Dataset`` with a single ``"text"`` column, empty documents removed.

    ``cache_dir`` receives the Arrow files made from local files (the caller deletes it); Hub
    downloads go to ``hub_cache_dir`` (default: the usual Hugging Face cache). A record whose text
    field is missing, null or not a string is a ``DataError`` naming the file, the count and the
    first one, unless ``skip_bad_records`` (see :mod:`spherenet.data.records`;
    :func:`read_documents` also returns what was skipped).
    """
    return read_documents(
        src, cache_dir=cache_dir, hub_cache_dir=hub_cache_dir, timeout=timeout, skip_bad_records=skip_bad_records
    )[0]


def read_documents(
    src: Source,
    *,
    cache_dir: str | os.PathLike,
    hub_cache_dir: str | os.PathLike | None = None,
    timeout: float = 5.0,
    skip_bad_records: bool = False,
) -> tuple[Any, BadRecords]:
    """:func:`load_documents`, and the bad records it skipped (none for text and the stdlib)."""
    import datasets

    bad = BadRecords(src.text_field)
    if src.kind == "stdlib":
        texts = []
        for f in src.files:
            try:
                texts.append(Path(f).read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError):
                continue  # stdlib_files() promised UTF-8 text; skip a file that changed meanwhile
        ds = datasets.Dataset.from_dict({"text": texts})
        where = src.describe()
    elif src.kind == "text":
        for f in src.files:
            check_text_file(f, "text file")
        ds = _load(
            lambda: datasets.load_dataset(
                "text", data_files=list(src.files), split="train", cache_dir=str(cache_dir), sample_by=src.text_unit
            ),
            src,
            cache_dir,
        )
        where = ", ".join(src.files)
    elif src.kind in ("json", "parquet"):
        for f in src.files:
            if src.kind == "json":
                check_text_file(f, "json file")
            else:
                check_parquet_file(f)
        arrow = Path(cache_dir) / "records.arrow"
        read = read_json_records if src.kind == "json" else read_parquet_records
        bad = _load(lambda: read(src.files, src.text_field, arrow), src, cache_dir)
        bad.check(skip_bad_records)
        ds = arrow_dataset(arrow)
        where = ", ".join(src.files)
    elif src.kind == "hub":
        ds = _load_hub(src, hub_cache_dir, timeout)
        where = src.describe()
    else:
        raise DataError(f"unknown source kind {src.kind!r}: expected one of {', '.join(SOURCE_KINDS)}")

    if isinstance(ds, datasets.DatasetDict):  # pragma: no cover - we always pass split=
        ds = ds[next(iter(ds))]
    field_ = "text" if src.kind in ("json", "parquet") else src.text_field  # the readers name it text
    if field_ not in ds.column_names:
        raise DataError(
            f"{where} has no column {field_!r} (columns: {', '.join(ds.column_names) or 'none'}); pass text_field="
        )
    feat = ds.features[field_]
    if getattr(feat, "dtype", None) not in ("string", "large_string"):
        raise DataError(f"column {field_!r} of {where} holds {feat}, not text; pass the text column as text_field=")
    ds = ds.select_columns([field_])
    if field_ != "text":
        ds = ds.rename_column(field_, "text")
    if src.kind == "hub":
        bad = null_records(ds, where, field_)
        bad.check(skip_bad_records)  # the null rows are dropped with the empty ones below
    if src.kind == "text" and src.text_unit == "paragraph":
        # The paragraph reader keeps the newlines around a paragraph (e.g. the file's final "\n").
        ds = ds.map(_strip_newlines, batched=True, new_fingerprint=f"{ds._fingerprint}-strip", desc="paragraphs")
    ds = drop_empty(ds)
    if len(ds) == 0:
        raise DataError(f"{where} contains no text: every document in column {src.text_field!r} is empty")
    return ds, bad


def _load(fn: Any, src: Source, cache_dir: Any) -> Any:
    try:
        return fn()
    except DataError:
        raise
    except Exception as exc:
        failed_write = write_error(exc)
        if failed_write is not None:  # datasets writing its Arrow files: the cache, not the source
            reason = (failed_write.strerror or str(failed_write)).lower()
            code = errno.errorcode.get(failed_write.errno, "")
            raise DataError(f"cannot write the data cache {cache_dir}: {reason} ({code})") from None
        raise DataError(f"could not read {src.kind} source {', '.join(src.files)}: {root_cause(exc)}") from None


WRITE_ERRNOS = {errno.ENOSPC, errno.EROFS, errno.EACCES, errno.EPERM, errno.EDQUOT}


def write_error(exc: BaseException) -> OSError | None:
    """The OSError of a failed write (disk full, read-only, not permitted) in ``exc``'s chain."""
    e: BaseException | None = exc
    for _ in range(10):
        if e is None:
            return None
        if isinstance(e, OSError) and e.errno in WRITE_ERRNOS:
            return e
        e = e.__cause__ or e.__context__
    return None


def _load_hub(src: Source, cache_dir: Any, timeout: float) -> Any:
    import datasets

    label = src.name + (f" (config {src.config})" if src.config else "")
    if src.extra.get("bare"):
        label += f" (read as a Hub dataset id because no local file {src.name} exists)"
    local_hint = (
        "Without network, download its data files elsewhere (e.g. `hf download "
        f"{src.name} --repo-type dataset --local-dir DIR`) and pass the local parquet/jsonl files as the "
        "source."
    )
    if not hub_offline():
        reason = hub_unreachable(timeout)
        if reason is not None:
            raise DataError(
                f"cannot load Hub dataset {label} from {hub_endpoint()}: no network ({reason}). "
                f"If it is already in your Hugging Face cache, set HF_HUB_OFFLINE=1. {local_hint}"
            )
    try:
        return datasets.load_dataset(
            src.name,
            src.config,
            split=src.split,
            revision=src.revision,
            cache_dir=None if cache_dir is None else str(cache_dir),
        )
    except Exception as exc:
        msg = root_cause(exc)
        if "scripts are no longer supported" in msg:
            msg += (
                ". datasets>=4 does not run loading scripts: pass revision='refs/convert/parquet' for the "
                "Hub's "
                "Parquet export, or use a Parquet copy of the dataset"
            )
        raise DataError(f"could not load Hub dataset {label}, split {src.split!r}: {msg}. {local_hint}") from None


def _strip_newlines(batch: dict[str, list[str]]) -> dict[str, list[str]]:
    return {"text": [t.strip("\n") if t else t for t in batch["text"]]}
