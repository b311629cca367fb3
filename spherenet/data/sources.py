"""Where documents come from: local files, Hub datasets, or the Python standard library.

A source is described by a :class:`Source` (see :func:`resolve_source` for the accepted
spellings) and read with :func:`load_documents` into a ``datasets.Dataset`` with one string
column ``"text"``, one row per document, empty documents removed.

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
import hashlib
import json
import os
import re
import sys
import sysconfig
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ._files import check_parquet_file, check_text_file, existing_file, file_sha256
from ._hub import hub_endpoint, hub_offline, hub_unreachable
from .errors import DataError, DataFileNotFoundError, root_cause
from .records import (
    BadRecords,
    arrow_dataset,
    drop_empty,
    null_records,
    read_json_records,
    read_parquet_records,
)

__all__ = [
    "DEFAULT_STDLIB_BYTES",
    "SOURCE_KINDS",
    "Source",
    "load_documents",
    "read_documents",
    "resolve_source",
    "stdlib_files",
]

SOURCE_KINDS = ("text", "json", "parquet", "hub", "stdlib")
TEXT_UNITS = ("paragraph", "line", "document")
DEFAULT_STDLIB_BYTES = 8_000_000
_EXTENSIONS = {
    ".txt": "text",
    ".text": "text",
    ".md": "text",
    ".json": "json",
    ".jsonl": "json",
    ".ndjson": "json",
    ".parquet": "parquet",
    ".pq": "parquet",
}
# Short names for the Hub datasets the paper and common recipes use.
HUB_ALIASES = {
    "openwebtext": ("Skylion007/openwebtext", None),
    "fineweb-edu": ("HuggingFaceFW/fineweb-edu", "sample-10BT"),
}
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
_STDLIB_SKIP = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}


@dataclass(frozen=True)
class Source:
    """A resolved document source. Build it with :func:`resolve_source`."""

    kind: str
    files: tuple[str, ...] = ()
    name: str | None = None  # Hub repo id
    config: str | None = None  # Hub config (subset)
    split: str = "train"  # Hub split, slicing allowed ("train[:10%]")
    revision: str | None = None
    text_field: str = "text"
    text_unit: str = "paragraph"
    max_bytes: int | None = None  # stdlib only
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def describe(self) -> str:
        if self.kind == "hub":
            cfg = f" ({self.config})" if self.config else ""
            rev = f" @ {self.revision}" if self.revision else ""
            return f"Hub dataset {self.name}{cfg}{rev}, split {self.split}"
        if self.kind == "stdlib":
            return f"Python {sys.version.split()[0]} standard library ({len(self.files)} .py files)"
        return (
            f"{self.kind} file{'s' if len(self.files) > 1 else ''} "
            + ", ".join(self.files[:3])
            + (" ..." if len(self.files) > 3 else "")
        )

    def slug(self) -> str:
        if self.kind == "hub":
            base = (self.name or "hub").replace("/", "-") + (f"-{self.config}" if self.config else "")
        elif self.kind == "stdlib":
            base = "stdlib"
        else:
            base = Path(self.files[0]).stem + (f"-and-{len(self.files) - 1}" if len(self.files) > 1 else "")
        return re.sub(r"[^A-Za-z0-9_.-]+", "-", base).strip("-.")[:60] or self.kind

    def identity(self) -> dict[str, Any]:
        """What the cache key depends on: for files their path and the SHA-256 of their bytes
        (each file read once; an edit that keeps size and modification time still changes the
        key); for the Hub the repo, config, split and revision (pin ``revision`` for a cache that
        cannot go stale); for the stdlib the Python version and the files' paths and bytes."""
        ident: dict[str, Any] = {"kind": self.kind, "text_field": self.text_field}
        if self.kind in ("text", "json", "parquet"):
            ident["files"] = [[f, file_sha256(f)] for f in self.files]
            if self.kind == "text":
                ident["text_unit"] = self.text_unit
        elif self.kind == "hub":
            ident.update(name=self.name, config=self.config, split=self.split, revision=self.revision)
        elif self.kind == "stdlib":
            ident.update(
                python=sys.version.split()[0],
                max_bytes=self.max_bytes,
                files=self.extra.get("listing_sha256"),
                content=[file_sha256(f) for f in self.files],
            )
        return ident

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able description for ``meta.json`` (only the fields that apply to the kind)."""
        d: dict[str, Any] = {"kind": self.kind}
        if self.kind == "hub":
            d.update(
                name=self.name,
                config=self.config,
                split=self.split,
                revision=self.revision,
                text_field=self.text_field,
            )
        elif self.kind == "stdlib":
            d.update(
                root=self.extra.get("root"),
                python=sys.version.split()[0],
                num_files=len(self.files),
                max_bytes=self.max_bytes,
                listing_sha256=self.extra.get("listing_sha256"),
            )
        else:
            d["files"] = list(self.files)
            if self.kind == "text":
                d["text_unit"] = self.text_unit
            else:
                d["text_field"] = self.text_field
        return d


def stdlib_files(max_bytes: int | None = DEFAULT_STDLIB_BYTES) -> list[Path]:
    """The ``.py`` files of the running Python's standard library, sorted by relative path.

    Test suites, ``site-packages`` and files that are not UTF-8 are skipped; the list stops before
    the first file that would take the total past ``max_bytes`` (None: no cap). The order is fixed
    for a given Python build, so the corpus is deterministic.
    """
    root = Path(sysconfig.get_paths()["stdlib"])
    if not root.is_dir():
        raise DataFileNotFoundError(f"the standard library directory {root} of this Python does not exist")
    candidates = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in _STDLIB_SKIP]
        for fn in filenames:
            if fn.endswith(".py"):
                p = Path(dirpath) / fn
                candidates.append((p.relative_to(root).as_posix(), p))
    candidates.sort()
    out: list[Path] = []
    total = 0
    for _, p in candidates:
        try:
            raw = p.read_bytes()
            blank = not raw.decode("utf-8").strip()
        except (OSError, UnicodeDecodeError):
            continue
        if blank:
            continue
        size = len(raw)
        if max_bytes is not None and total + size > max_bytes:
            break
        out.append(p)
        total += size
    if not out:
        raise DataError(f"found no .py files under the standard library directory {root} (max_bytes={max_bytes})")
    return out


def resolve_source(
    source: str | os.PathLike | Sequence[str | os.PathLike] | Source,
    *,
    kind: str | None = None,
    text_field: str = "text",
    text_unit: str = "paragraph",
    hub_config: str | None = None,
    hub_split: str = "train",
    revision: str | None = None,
    max_bytes: int | None = None,
) -> Source:
    """Turn a user's source description into a :class:`Source`.

    ``source`` is ``"stdlib"``; a path or a list of paths (the kind comes from the extension, or
    from ``kind``); ``"hf:owner/name"`` for a Hub dataset (also ``kind="hub"``, a bare
    ``"owner/name"`` that is not a local path and has no data-file extension, or one of the
    aliases ``"openwebtext"``, ``"fineweb-edu"``). Missing files and unknown kinds raise
    :class:`DataError`.
    """
    if isinstance(source, Source):
        return source
    if kind is not None and kind not in SOURCE_KINDS:
        raise DataError(f"unknown source kind {kind!r}: expected one of {', '.join(SOURCE_KINDS)}")
    if text_unit not in TEXT_UNITS:
        raise DataError(f"unknown text_unit {text_unit!r}: expected one of {', '.join(TEXT_UNITS)}")
    if not isinstance(text_field, str) or not text_field:
        raise DataError(f"text_field must be a non-empty column name, got {text_field!r}")

    if isinstance(source, (list, tuple)):
        if not source:
            raise DataError("the list of source files is empty")
        return _local_source([os.fspath(s) for s in source], kind, text_field, text_unit)
    if not isinstance(source, (str, os.PathLike)):
        raise DataError(
            f"source must be a path, a list of paths, 'stdlib' or 'hf:<dataset>', got {type(source).__name__}"
        )
    text = os.fspath(source)

    if kind == "stdlib" or (kind is None and text == "stdlib"):
        cap = DEFAULT_STDLIB_BYTES if max_bytes is None else int(max_bytes)
        files = stdlib_files(cap)
        root = Path(sysconfig.get_paths()["stdlib"])
        listing = [[p.relative_to(root).as_posix(), p.stat().st_size] for p in files]
        digest = hashlib.sha256(json.dumps(listing).encode()).hexdigest()
        return Source(
            kind="stdlib",
            files=tuple(str(p) for p in files),
            max_bytes=cap,
            extra={"root": str(root), "listing_sha256": digest},
        )

    hub_name = None
    bare = False
    if text.startswith(("hf:", "hub:")):
        hub_name = text.split(":", 1)[1]
        if kind not in (None, "hub"):
            raise DataError(f"source {text!r} names a Hub dataset but kind={kind!r}")
    elif kind == "hub":
        hub_name = text
    elif kind is None and text in HUB_ALIASES:
        hub_name = text
    elif (
        kind is None
        and _HUB_ID.fullmatch(text)
        and Path(text).suffix.lower() not in _EXTENSIONS
        and not Path(text).expanduser().exists()
    ):
        hub_name = text  # "owner/name" with no such local path: a Hub dataset
        bare = True
    if hub_name is not None:
        if hub_name in HUB_ALIASES:
            hub_name, default_config = HUB_ALIASES[hub_name]
            hub_config = hub_config if hub_config is not None else default_config
        if not re.fullmatch(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?", hub_name or ""):
            raise DataError(f"{hub_name!r} is not a Hub dataset id (expected 'owner/name')")
        return Source(
            kind="hub",
            name=hub_name,
            config=hub_config,
            split=hub_split,
            revision=revision,
            text_field=text_field,
            extra={"bare": bare},
        )

    return _local_source([text], kind, text_field, text_unit)


def _local_source(paths: list[str], kind: str | None, text_field: str, text_unit: str) -> Source:
    if kind in ("hub", "stdlib"):
        raise DataError(f"kind={kind!r} does not take file paths ({paths[0]})")
    kinds = set()
    resolved = []
    for s in paths:
        p = Path(s).expanduser()
        if not p.exists():
            hint = ""
            if kind is None and p.suffix.lower() not in _EXTENSIONS and "/" in s and not s.startswith((".", "/", "~")):
                hint = f" (for a Hub dataset write 'hf:{s}')"
            raise DataFileNotFoundError(f"source file not found: {p}{hint}")
        existing_file(p, "source file")
        k = kind or _EXTENSIONS.get(p.suffix.lower())
        if k is None:
            raise DataError(
                f"cannot tell the format of {p} from its extension {p.suffix or '(none)'!r}: pass "
                "kind='text', 'json' or 'parquet'"
            )
        kinds.add(k)
        resolved.append(str(p.resolve()))
    if len(kinds) > 1:
        raise DataError(f"source files mix formats ({', '.join(sorted(kinds))}); prepare them separately or pass kind=")
    k = kinds.pop()
    return Source(kind=k, files=tuple(resolved), text_field="text" if k == "text" else text_field, text_unit=text_unit)


# ----------------------------------------------------------------------------------------------
# loading


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
