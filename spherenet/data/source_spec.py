"""What a document source is: :class:`Source`, and :func:`resolve_source`, which turns the
spellings a user writes (a path, a list of paths, ``"stdlib"``, ``"hf:owner/name"``) into one.

The kinds and what a document of each is are described in :mod:`spherenet.data.sources`, which
reads them (:func:`~spherenet.data.sources.load_documents`).
"""

from __future__ import annotations

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

from ._files import existing_file, file_sha256
from .errors import DataError, DataFileNotFoundError

__all__ = [
    "DEFAULT_STDLIB_BYTES",
    "HUB_ALIASES",
    "SOURCE_KINDS",
    "TEXT_UNITS",
    "Source",
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
                f"cannot tell the format of {p} from its extension {p.suffix or '(none)'!r}: name it with "
                "kind='text', 'json' or 'parquet' (in a run config: data.format=text, json or parquet)"
            )
        kinds.add(k)
        resolved.append(str(p.resolve()))
    if len(kinds) > 1:
        raise DataError(f"source files mix formats ({', '.join(sorted(kinds))}); prepare them separately or pass kind=")
    k = kinds.pop()
    return Source(kind=k, files=tuple(resolved), text_field="text" if k == "text" else text_field, text_unit=text_unit)
