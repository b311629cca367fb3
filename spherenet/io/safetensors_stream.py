"""Reading safetensors files tensor by tensor, straight into tensors that already exist.

A safetensors file is an 8-byte little-endian header length, a JSON header ``{name: {"dtype",
"shape", "data_offsets": [begin, end]}}`` (offsets counted from the end of the header), then
the raw bytes of every tensor. :func:`read_header` parses the header only;
:func:`read_into` fills one destination tensor with plain file reads: directly into its memory
when it is a contiguous CPU tensor of the stored dtype, otherwise through a bounded staging
buffer (another dtype, another device, a transposed view). Nothing is memory-mapped, so the
file's pages stay in the page cache and out of the process's resident memory, and no second
copy of the model is ever held.
"""

from __future__ import annotations

import json
import math
import struct
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

__all__ = ["StoredTensor", "TensorFileError", "read_header", "read_into", "STAGING_BYTES"]

#: safetensors' dtype names -> torch dtypes (floating point only: a model's weights)
FLOAT_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
_ITEMSIZE = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2}
_ITEMSIZE |= {"I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}
#: the most bytes a staging buffer (conversion, transposition, device copy) holds at once
STAGING_BYTES = 16 * 2**20
_MAX_HEADER = 100 * 2**20  # safetensors' own limit on the header's size


class TensorFileError(ValueError):
    """A safetensors file whose header or data cannot be read as it claims."""


@dataclass(frozen=True)
class StoredTensor:
    """One tensor of a safetensors file: where its bytes are and what they hold."""

    file: Path
    name: str
    dtype: str  # safetensors' name, e.g. "BF16"
    shape: tuple[int, ...]
    offset: int  # absolute byte offset of the first element in the file
    nbytes: int

    @property
    def torch_dtype(self) -> torch.dtype | None:
        """The torch dtype of a floating-point tensor; None for any other."""
        return FLOAT_DTYPES.get(self.dtype)


def read_header(path: str | Path) -> dict[str, StoredTensor]:
    """``{name: StoredTensor}`` of a safetensors file, checked against the file's size;
    :class:`TensorFileError` naming the file (and the tensor) for a header that is not valid."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            size = f.seek(0, 2)
            f.seek(0)
            prefix = f.read(8)
            if len(prefix) < 8:
                raise TensorFileError(f"{path}: not a safetensors file (shorter than its 8-byte header length)")
            (header_len,) = struct.unpack("<Q", prefix)
            if header_len > min(_MAX_HEADER, size - 8):
                raise TensorFileError(f"{path}: not a safetensors file (header length {header_len}, file size {size})")
            header = json.loads(f.read(header_len))
    except OSError as exc:
        raise TensorFileError(f"cannot read {path}: {exc}") from None
    except (UnicodeDecodeError, ValueError) as exc:
        if isinstance(exc, TensorFileError):
            raise
        raise TensorFileError(f"{path}: the safetensors header is not valid JSON: {exc}") from None
    if not isinstance(header, dict):
        raise TensorFileError(f"{path}: the safetensors header is not a JSON object")
    data_start = 8 + header_len
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (begin, end) = entry["dtype"], tuple(int(n) for n in entry["shape"]), entry["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise TensorFileError(f"{path}: tensor {name!r} has a malformed header entry {entry!r}") from None
        if dtype not in _ITEMSIZE:
            raise TensorFileError(f"{path}: tensor {name!r} has unknown dtype {dtype!r}")
        nbytes = math.prod(shape) * _ITEMSIZE[dtype]
        if not (isinstance(begin, int) and isinstance(end, int) and 0 <= begin <= end and end - begin == nbytes):
            raise TensorFileError(f"{path}: tensor {name!r} has data_offsets {[begin, end]} for {nbytes} bytes")
        if data_start + end > size:
            raise TensorFileError(f"{path}: tensor {name!r} runs past the end of the file (truncated?)")
        tensors[name] = StoredTensor(path, name, dtype, shape, data_start + begin, nbytes)
    return tensors


def _read_exact(f, buffer: memoryview, what: str) -> None:
    done = 0
    while done < len(buffer):
        n = f.readinto(buffer[done:])
        if not n:
            raise TensorFileError(f"{what}: the file ended before the tensor's last byte")
        done += n


def _byte_view(t: torch.Tensor) -> memoryview:
    """The bytes of a contiguous CPU tensor, writable."""
    return memoryview(t.reshape(-1).view(torch.uint8).numpy()).cast("B")


def read_into(
    stored: StoredTensor,
    target: torch.Tensor,
    check: Callable[[torch.Tensor], None] | None = None,
    staging_bytes: int = STAGING_BYTES,
) -> None:
    """Fill ``target`` (the stored shape; any dtype, device and strides, e.g. the transposed view
    of a parameter) with the stored values, converting the dtype as ``Tensor.copy_`` does.

    ``check(chunk)`` is called on every chunk of consecutive rows as stored (its dtype), before
    conversion. A contiguous CPU ``target`` of the stored dtype is read into directly; any other
    goes through a staging buffer of at most ``staging_bytes`` (at least one row).
    """
    if sys.byteorder != "little":
        raise TensorFileError("safetensors files are little-endian; this machine is not")
    source_dtype = stored.torch_dtype
    if source_dtype is None:
        raise TensorFileError(f"{stored.file}: tensor {stored.name!r} has dtype {stored.dtype}, not a float dtype")
    if tuple(target.shape) != stored.shape:
        raise ValueError(f"read_into: target of shape {tuple(target.shape)} for {stored.name!r} of {stored.shape}")
    if stored.nbytes == 0:
        return
    rows = stored.shape[0] if stored.shape else 1
    view = target.reshape(rows, -1) if target.ndim != 2 else target  # rows as stored (a view)
    row_bytes = stored.nbytes // rows
    direct = target.device.type == "cpu" and target.dtype == source_dtype and target.is_contiguous()
    per_chunk = max(1, staging_bytes // row_bytes)
    staging = None if direct else torch.empty((min(per_chunk, rows), view.shape[1]), dtype=source_dtype)
    what = f"{stored.file}: tensor {stored.name!r}"
    with torch.no_grad(), open(stored.file, "rb", buffering=0) as f:
        f.seek(stored.offset)
        for start in range(0, rows, per_chunk):
            stop = min(rows, start + per_chunk)
            chunk = view[start:stop] if direct else staging[: stop - start]
            _read_exact(f, _byte_view(chunk), what)
            if check is not None:
                check(chunk)
            if not direct:
                view[start:stop].copy_(chunk)
