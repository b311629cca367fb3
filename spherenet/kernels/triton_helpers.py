"""What every Triton kernel of spherenet shares: the tile of a program, its warps, the device and
alignment checks of a launch, and the one smallest norm divided by.

The kernels are row-wise (the sphere dimension last): a program takes a tile of ``ROWS`` whole
rows padded to ``BLOCK_D`` (a power of two) columns, about :data:`ELEMENTS_PER_PROGRAM` elements,
computes in float32 and stores in each tensor's own dtype. Importing this module imports Triton:
only the ops' Triton modules do, on first use. On CPU tensors the kernels run only under
Triton's interpreter (``TRITON_INTERPRET=1``, set before Triton is imported).
"""

from __future__ import annotations

import contextlib
import os

import torch
import triton
import triton.language as tl

from ..manifolds.geodesic import TINY as _TINY_BY_DTYPE

__all__ = [
    "ELEMENTS_PER_PROGRAM",
    "WARP_ELEMENTS",
    "MAX_PROGRAMS",
    "TINY",
    "blocks",
    "warps",
    "programs",
    "aligned",
    "check_device",
    "on_device_of",
    "contiguous_like",
    "tile",
    "norm_grad",
]

ELEMENTS_PER_PROGRAM = 4096  # the elements of one program's tile
WARP_ELEMENTS = 512  # elements of a tile per warp: 16 per thread
MAX_PROGRAMS = 1024  # backward kernels with per-column partial sums (a few per SM of a large GPU)
#: ``‖x‖`` is clamped at this before dividing, in float32 (the kernels' arithmetic), as the
#: references of :mod:`spherenet.manifolds` do in float32. A kernel takes it as an argument: a
#: global a kernel reads must be a ``tl.constexpr``.
TINY = _TINY_BY_DTYPE[torch.float32]


def blocks(d: int, elements: int = ELEMENTS_PER_PROGRAM) -> tuple[int, int]:
    """``(BLOCK_D, ROWS)`` for rows of length ``d``: the row padded to a power of two, and the rows
    of a program's tile (about ``elements`` elements; one row if it is longer, at most 64)."""
    block_d = triton.next_power_of_2(d)
    return block_d, max(1, min(64, elements // block_d))


def warps(tile: int, per_warp: int = WARP_ELEMENTS, fewest: int = 4, most: int = 16) -> int:
    """Warps for a program's tile of ``tile`` elements (a power of two): one per ``per_warp``
    elements, so each thread holds a few values per tensor in registers (no spilling at the tiles
    used; tests/kernels/test_triton_compile.py), within ``[fewest, most]``. The optimizer's kernels hold
    four tensors per element and take ``fewest=8, most=32``; SLERP's backward, about 20 values per
    element, ``per_warp=256``."""
    return max(fewest, min(most, tile // per_warp))


def programs(n_blocks: int) -> int:
    """Programs of a backward kernel that sums a per-column gradient: at most
    :data:`MAX_PROGRAMS`, each taking every ``n``-th block of rows, so the partial sums are
    ``programs x d`` floats however many rows there are."""
    return max(1, min(n_blocks, MAX_PROGRAMS))


def aligned(d: int, itemsize: int, addresses) -> bool:
    """Whether every address of ``addresses`` and every row (``d`` elements of ``itemsize``
    bytes) starts on 16 bytes: then a kernel reading its pointers from a table may say so
    (``tl.multiple_of``) and load 16 bytes at a time."""
    return (d * itemsize) % 16 == 0 and all(a % 16 == 0 for a in addresses)


def check_device(op: str, *tensors: torch.Tensor, hint: str = "") -> None:
    """Refuse CPU tensors outside Triton's interpreter (``hint``: what to use instead). The
    environment is read at every launch: a test may set it after import."""
    if any(t.device.type == "cpu" for t in tensors) and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError(f"{op} (Triton): CPU tensors need TRITON_INTERPRET=1 (set before Triton is imported){hint}")


def on_device_of(t: torch.Tensor):
    """Triton launches on the current CUDA device: a context that makes it ``t``'s."""
    return torch.cuda.device(t.device) if t.device.type == "cuda" else contextlib.nullcontext()


def contiguous_like(t: torch.Tensor) -> torch.Tensor:
    """What a kernel returns for an input like ``t``: a new contiguous tensor (a custom op's fake
    must report the real strides, which ``empty_like`` of a view does not)."""
    return torch.empty(t.shape, dtype=t.dtype, device=t.device)


@triton.jit
def tile(block, n_rows, d, BLOCK_D: tl.constexpr, ROWS: tl.constexpr):
    """The rows of block ``block`` of a ``(n_rows, d)`` row-major tensor, its columns, their
    offsets and the mask of the live elements."""
    rows = (block * ROWS + tl.arange(0, ROWS)).to(tl.int64)
    cols = tl.arange(0, BLOCK_D)
    mask = (rows[:, None] < n_rows) & (cols[None, :] < d)
    return rows, cols, rows[:, None] * d + cols[None, :], mask


@triton.jit
def norm_grad(g, y, norm, tiny):
    """Gradient of ``x / max(‖x‖, tiny)`` from the output ``y``: ``(g - y (y . g)) / ‖x‖``
    (``g / tiny`` below ``tiny``)."""
    dot = tl.where(norm >= tiny, tl.sum(y * g, axis=1), 0.0)
    return (g - y * dot[:, None]) / tl.maximum(norm, tiny)[:, None]
