"""Records of JSON and Parquet sources read into documents, every record accounted for.

``datasets`` reads JSON in blocks and infers each block's types, so what becomes of a record
depends on where it lies: ``{"text": 7}`` deep in a file becomes the document ``"7"``, near its
start it turns the column into ``Json``; a record without the field is a null row that the
empty-document filter then drops without a word, or, in a later block, a cast error naming no
line. A second Parquet file whose column holds numbers is cast to strings. So local JSON and
Parquet files are read here, record by record, into an Arrow file of one ``text`` column: a
record whose text field is missing, null or not a string is a *bad record*, counted per file
with where the first one is (line of a JSON Lines file, record index of a JSON array or Parquet
file, 0-based), and refused unless the caller asked to skip such records
(``skip_bad_records``). Rows of a Hub dataset are checked the same way (null text).

Empty and whitespace-only texts are not bad records: they are documents without text, removed
afterwards like the empty paragraphs of a text file.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import DataError

__all__ = ["BadRecords", "drop_empty", "null_records", "read_json_records", "read_parquet_records"]

_BATCH = 10_000  # texts per Arrow record batch
_KINDS = {bool: "true/false", int: "a number", float: "a number", list: "a list", dict: "an object"}


@dataclass
class BadRecords:
    """Records without usable text, per file (or per Hub split): how many, among how many records,
    and where the first is and what it holds."""

    text_field: str
    counts: dict[str, int] = field(default_factory=dict)
    totals: dict[str, int] = field(default_factory=dict)
    first: dict[str, str] = field(default_factory=dict)  # "line 2 (field missing)"

    @property
    def count(self) -> int:
        return sum(self.counts.values())

    def add(self, where: str, position: str, reason: str) -> None:
        if where not in self.counts:
            self.counts[where] = 0
            self.first[where] = f"{position} ({reason})"
        self.counts[where] += 1

    def message(self) -> str:
        """One line: the first file with bad records, its count and first one, and the others."""
        where = next(iter(self.counts))
        text = (
            f"{where}: {self.counts[where]} of {self.totals.get(where, '?')} records have no usable text in field "
            f"{self.text_field!r} (missing, null or not a string), the first at {self.first[where]}"
        )
        others = [w for w in self.counts if w != where]
        if others:
            more = sum(self.counts[w] for w in others)
            text += f"; {more} more in {len(others)} other file{'s' if len(others) > 1 else ''} ({', '.join(others)})"
        return (
            text + "; fix or remove them, or skip them with skip_bad_records=True (in a recipe "
            "data.skip_bad_records=true)"
        )

    def check(self, skip: bool) -> None:
        """``DataError`` with :meth:`message` when there are bad records and ``skip`` is false."""
        if self.count and not skip:
            raise DataError(self.message())

    def to_dict(self) -> dict[str, Any]:
        """For ``meta.json``: the count skipped and, per file, how many and the first."""
        return {
            "skipped": self.count,
            "files": {w: {"count": n, "first": self.first[w]} for w, n in self.counts.items()},
        }


class _ArrowTexts:
    """Writes texts in batches to an Arrow stream file that ``datasets.Dataset.from_file`` maps."""

    def __init__(self, path: Path) -> None:
        import pyarrow as pa

        self.pa = pa
        self.schema = pa.schema([("text", pa.large_string())])
        self.writer = pa.ipc.new_stream(str(path), self.schema)
        self.pending: list[str] = []

    def add(self, text: str) -> None:
        self.pending.append(text)
        if len(self.pending) >= _BATCH:
            self.flush()

    def write_array(self, array: Any) -> None:
        self.flush()
        self.writer.write_batch(self.pa.record_batch([array], schema=self.schema))

    def flush(self) -> None:
        if self.pending:
            pending, self.pending = self.pending, []
            self.write_array(self.pa.array(pending, type=self.pa.large_string()))

    def close(self) -> None:
        self.flush()
        self.writer.close()


def read_json_records(files: list[str] | tuple[str, ...], text_field: str, out: Path) -> BadRecords:
    """Read JSON Lines files (one record per non-blank line) or JSON arrays of records (a file
    whose first character is ``[``) into the Arrow file ``out``: the string ``text_field`` of
    each record, in order. Returns the bad records (not written). A line that is not JSON, a
    field that no record has, or one that never holds a string is a ``DataError``."""
    bad = BadRecords(text_field)
    writer = _ArrowTexts(out)
    seen_keys: dict[str, None] = {}  # the records' keys, for the "no such field" message
    has_field, has_text, other_kinds = False, False, set()
    try:
        for path in files:
            total = 0
            for position, record in _json_records(path):
                total += 1
                value = record.get(text_field) if isinstance(record, dict) else None
                if isinstance(value, str):
                    has_field = has_text = True
                    writer.add(value)
                    continue
                if not isinstance(record, dict):
                    reason = "not a JSON object"
                elif text_field not in record:
                    reason = "field missing"
                    if not has_field:
                        seen_keys.update(dict.fromkeys(record))
                else:
                    has_field = True
                    reason = "null" if value is None else _KINDS.get(type(value), type(value).__name__)
                    if value is not None:
                        other_kinds.add(reason)
                bad.add(path, position, reason)
            bad.totals[path] = total
    finally:
        writer.close()
    where = ", ".join(files)
    if not has_field:
        raise DataError(
            f"{where} has no column {text_field!r} (columns: {', '.join(seen_keys) or 'none'}); pass text_field="
        )
    if not has_text and other_kinds:
        raise DataError(
            f"column {text_field!r} of {where} holds {', '.join(sorted(other_kinds))}, not text; pass the text "
            "column as text_field="
        )
    return bad


def _json_records(path: str):
    """``(position, record)`` of a JSON Lines file (position ``line N``) or a JSON array (``record
    index N``)."""
    with open(path, "rb") as f:
        head = f.read(64).lstrip(b"\xef\xbb\xbf \t\r\n")
        f.seek(0)
        if head.startswith(b"["):
            try:
                records = json.load(f)
            except ValueError as exc:
                raise DataError(f"could not read json source {path}: not valid JSON: {exc}") from None
            if not isinstance(records, list):  # pragma: no cover - a "[" starts a list
                raise DataError(f"could not read json source {path}: expected an array of records")
            for index, record in enumerate(records):
                yield f"record index {index}", record
            return
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError as exc:
                raise DataError(
                    f"could not read json source {path}: line {number} is not valid JSON ({exc}); JSON Lines has "
                    "one record per line, a .json file may also be one array of records"
                ) from None
            yield f"line {number}", record


def read_parquet_records(files: list[str] | tuple[str, ...], text_field: str, out: Path) -> BadRecords:
    """Read the string column ``text_field`` of Parquet files into the Arrow file ``out``; a
    null is a bad record (not written). A file without the column, or whose column is not
    text, is a ``DataError`` naming it."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    bad = BadRecords(text_field)
    writer = _ArrowTexts(out)
    try:
        for path in files:
            try:
                reader = pq.ParquetFile(path)
            except (OSError, pa.ArrowException) as exc:
                raise DataError(f"could not read parquet source {path}: {exc}") from None
            schema = reader.schema_arrow
            if text_field not in schema.names:
                raise DataError(
                    f"{path} has no column {text_field!r} (columns: {', '.join(schema.names) or 'none'}); "
                    "pass text_field="
                )
            kind = schema.field(text_field).type
            value_kind = kind.value_type if pa.types.is_dictionary(kind) else kind
            if not (pa.types.is_string(value_kind) or pa.types.is_large_string(value_kind) or pa.types.is_null(kind)):
                raise DataError(
                    f"column {text_field!r} of {path} holds {kind}, not text; pass the text column as text_field="
                )
            offset = 0
            for batch in reader.iter_batches(batch_size=_BATCH, columns=[text_field]):
                column = batch.column(0).cast(pa.large_string())
                if column.null_count:
                    nulls = pc.is_null(column).to_numpy(zero_copy_only=False)
                    for index in nulls.nonzero()[0]:
                        bad.add(path, f"record index {offset + int(index)}", "null")
                    column = column.filter(pc.invert(pc.is_null(column)))
                writer.write_array(column)
                offset += len(batch)
            bad.totals[path] = offset
    except pa.ArrowException as exc:
        raise DataError(f"could not read parquet source {', '.join(files)}: {exc}") from None
    finally:
        writer.close()
    return bad


def null_records(ds: Any, where: str, text_field: str) -> BadRecords:
    """The rows of ``ds`` (a Hub split, its text column named ``text``) whose text is null."""
    import pyarrow.compute as pc

    bad = BadRecords(text_field)
    offset = 0
    for table in ds.with_format("arrow").iter(batch_size=_BATCH):
        column = table["text"]
        if column.null_count:
            nulls = pc.is_null(column).to_numpy(zero_copy_only=False)
            for index in nulls.nonzero()[0]:
                bad.add(where, f"record index {offset + int(index)}", "null")
        offset += len(table)
    bad.totals[where] = offset
    return bad


def arrow_dataset(path: str | os.PathLike) -> Any:
    """The ``datasets.Dataset`` of the Arrow file written by the readers above (memory-mapped)."""
    import datasets

    return datasets.Dataset.from_file(str(path))


def drop_empty(ds: Any) -> Any:
    """Rows whose text is null, empty or only whitespace are removed (they carry no text)."""
    import numpy as np
    import pyarrow.compute as pc

    keep = []
    for table in ds.with_format("arrow").iter(batch_size=10_000):
        col = pc.fill_null(table["text"], "")
        nonempty = pc.greater(pc.utf8_length(pc.utf8_trim_whitespace(col)), 0)
        keep.append(np.asarray(nonempty.to_numpy(zero_copy_only=False), dtype=bool))
    mask = np.concatenate(keep) if keep else np.zeros(0, dtype=bool)
    if mask.all():
        return ds
    return ds.select(np.flatnonzero(mask))
