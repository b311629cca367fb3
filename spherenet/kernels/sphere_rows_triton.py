"""The Triton implementations of the sphere row ops (:mod:`spherenet.kernels.sphere_adam`,
:mod:`spherenet.kernels.sphere_rows`). The sphere-Adam step as one kernel: moments, update and retraction of a block of rows in
one read and one write of parameter, gradient and states (28 bytes per float32 parameter with
a per-element second moment, as fused Adam).

Each program takes a block of whole rows (the sphere dimension last), computes in float32 and
stores in each tensor's own dtype (float32 or bf16/fp16 parameters and states). Per row, with
``step_size = lr / (1 - b1^t)`` and ``bias2_sqrt = sqrt(1 - b2^t)``::

    u = g - <x, g> x  (the manifold's ``proju``; gradient "riemannian")  |  u = g  ("euclidean")
    m = b1 m + (1 - b1) u
    v = b2 v + (1 - b2) u*u   ("element")  |  b2 v + (1 - b2) ||u||^2   ("row")
    y = x - step_size m / (sqrt(v) / bias2_sqrt + eps)
    x = y / ||y||                          the manifold's ``retr`` (Norm)
    m = m - <x, m> x                       ``transp`` by projection: row v and riemannian gradient only

the algorithm of :func:`spherenet.kernels.sphere_adam_` (the native CPU operator has the same
arguments as :func:`sphere_adam_rows_`; ``project``: the riemannian gradient).

Few launches: the tensors of one call are grouped by device, dtype and row length, and each group
is one launch over a table of (tensor, block of rows) work items, the tensors reached through a
table of their addresses (multi-tensor, as torch's fused Adam): a model's whole set of sphere
matrices of one width is one launch, however many layers it has. On CPU tensors the kernels run
only under Triton's interpreter (``TRITON_INTERPRET=1`` before Triton is imported), which is how
the tests run them; float64 parameters are stepped in float32.

:func:`normalize_rows_triton_` is the paper's renormalization after a Euclidean step (``adam_normalize``,
:func:`spherenet.optim.normalize_`) as one pass of the same shape: 8 bytes per float32 parameter;
:func:`sphere_muon_tail_triton_` is :class:`spherenet.optim.SphericalMuon`'s step after Newton-Schulz.
"""

from __future__ import annotations

import functools
from collections import defaultdict

import torch
import triton
import triton.language as tl

from . import triton_helpers as _triton

__all__ = ["sphere_adam_rows_", "sphere_muon_tail_triton_", "normalize_rows_triton_", "launch_groups"]

_TRITON_TYPES = {
    torch.float32: tl.float32,
    torch.float64: tl.float64,
    torch.bfloat16: tl.bfloat16,
    torch.float16: tl.float16,
}


@triton.jit
def _work_item(WORK, TABLE, FIELDS: tl.constexpr, ROWS: tl.constexpr, BLOCK_D: tl.constexpr, d):
    """This program's tensor (its row of ``TABLE``: addresses, then its row count last) and its
    block of rows, with the mask of live elements."""
    item = tl.program_id(0)
    tensor = tl.load(WORK + 2 * item).to(tl.int64)
    block = tl.load(WORK + 2 * item + 1).to(tl.int64)
    n_rows = tl.load(TABLE + tensor * FIELDS + FIELDS - 1)
    rows = block * ROWS + tl.arange(0, ROWS).to(tl.int64)
    cols = tl.arange(0, BLOCK_D)
    live = rows < n_rows
    mask = live[:, None] & (cols[None, :] < d)
    return tensor, rows, live, mask, rows[:, None] * d + cols[None, :]


@triton.jit
def _elements(TABLE, tensor, FIELDS: tl.constexpr, FIELD: tl.constexpr, DTYPE: tl.constexpr, offs, ALIGNED: tl.constexpr):  # fmt: skip  # one signature line
    """Pointers to the elements ``offs`` of the tensor at column ``FIELD`` of ``TABLE``'s row
    ``tensor``. A pointer read from a table has no known alignment, so the loads would be one
    element wide; ``ALIGNED`` (every address and row 16-byte aligned, checked by the launcher)
    says so, and the loads and stores become 16 bytes wide."""
    pointers = tl.load(TABLE + tensor * FIELDS + FIELD).to(tl.pointer_type(DTYPE)) + offs
    if ALIGNED:
        pointers = tl.multiple_of(pointers, [1, 16])
    return pointers


@triton.jit
def _sphere_adam_rows(
    TABLE, WORK, SCALARS, d, beta1, beta2, eps, tiny, DTYPE: tl.constexpr,
    ROW_V: tl.constexpr, PROJECT: tl.constexpr, BLOCK_D: tl.constexpr, ROWS: tl.constexpr, ALIGNED: tl.constexpr,
):  # fmt: skip  # the arguments in the order of the header's formulas
    tensor, rows, live, mask, offs = _work_item(WORK, TABLE, 5, ROWS, BLOCK_D, d)
    X = _elements(TABLE, tensor, 5, 0, DTYPE, offs, ALIGNED)
    G = _elements(TABLE, tensor, 5, 1, DTYPE, offs, ALIGNED)
    M = _elements(TABLE, tensor, 5, 2, DTYPE, offs, ALIGNED)
    V = tl.load(TABLE + tensor * 5 + 3).to(tl.pointer_type(DTYPE))  # per element (below) or per row
    step_size = tl.load(SCALARS + 2 * tensor)
    inv_bias2_sqrt = tl.load(SCALARS + 2 * tensor + 1)
    x = tl.load(X, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(G, mask=mask, other=0.0).to(tl.float32)
    m = tl.load(M, mask=mask, other=0.0).to(tl.float32)
    if PROJECT:
        u = g - tl.sum(x * g, axis=1)[:, None] * x
    else:
        u = g
    m = beta1 * m + (1.0 - beta1) * u
    if ROW_V:
        v = tl.load(V + rows, mask=live, other=0.0).to(tl.float32)
        v = beta2 * v + (1.0 - beta2) * tl.sum(u * u, axis=1)
        y = x - (step_size / (tl.sqrt(v) * inv_bias2_sqrt + eps))[:, None] * m
        tl.store(V + rows, v.to(DTYPE), mask=live)
    else:
        V = _elements(TABLE, tensor, 5, 3, DTYPE, offs, ALIGNED)
        v = tl.load(V, mask=mask, other=0.0).to(tl.float32)
        v = beta2 * v + (1.0 - beta2) * u * u
        y = x - step_size * m / (tl.sqrt(v) * inv_bias2_sqrt + eps)
        tl.store(V, v.to(DTYPE), mask=mask)
    y = tl.where(mask, y, 0.0)
    x = y / tl.maximum(tl.sqrt(tl.sum(y * y, axis=1)), tiny)[:, None]
    if ROW_V and PROJECT:
        m = m - tl.sum(x * m, axis=1)[:, None] * x
    tl.store(X, x.to(DTYPE), mask=mask)
    tl.store(M, m.to(DTYPE), mask=mask)


@triton.jit
def _muon_tail_rows(
    TABLE, WORK, SCALARS, d, tiny, DTYPE: tl.constexpr, PROJECT: tl.constexpr, BLOCK_D: tl.constexpr,
    ROWS: tl.constexpr, ALIGNED: tl.constexpr,
):  # fmt: skip  # the table's arguments first, as in _sphere_adam_rows
    tensor, rows, live, mask, offs = _work_item(WORK, TABLE, 4, ROWS, BLOCK_D, d)
    X = _elements(TABLE, tensor, 4, 0, DTYPE, offs, ALIGNED)
    UPDATE = _elements(TABLE, tensor, 4, 1, DTYPE, offs, ALIGNED)
    M = _elements(TABLE, tensor, 4, 2, DTYPE, offs, ALIGNED)
    step_size = tl.load(SCALARS + tensor)
    x = tl.load(X, mask=mask, other=0.0).to(tl.float32)
    o = tl.load(UPDATE, mask=mask, other=0.0).to(tl.float32)
    m = tl.load(M, mask=mask, other=0.0).to(tl.float32)
    if PROJECT:
        o = o - tl.sum(x * o, axis=1)[:, None] * x
    y = x - step_size * o
    x = y / tl.maximum(tl.sqrt(tl.sum(y * y, axis=1)), tiny)[:, None]
    m = m - tl.sum(x * m, axis=1)[:, None] * x
    tl.store(X, x.to(DTYPE), mask=mask)
    tl.store(M, m.to(DTYPE), mask=mask)


@triton.jit
def _normalize_rows(
    TABLE, WORK, d, tiny, DTYPE: tl.constexpr, BLOCK_D: tl.constexpr, ROWS: tl.constexpr, ALIGNED: tl.constexpr
):
    tensor, rows, live, mask, offs = _work_item(WORK, TABLE, 2, ROWS, BLOCK_D, d)
    X = _elements(TABLE, tensor, 2, 0, DTYPE, offs, ALIGNED)
    x = tl.load(X, mask=mask, other=0.0).to(tl.float32)
    norm = tl.sqrt(tl.sum(x * x, axis=1))
    tl.store(X, (x / tl.maximum(norm, tiny)[:, None]).to(DTYPE), mask=mask)


def _blocks(d: int) -> tuple[int, int, int]:
    """The padded row length, the rows per program and the warps per program for rows of length
    ``d`` (:func:`spherenet.kernels.triton_helpers.blocks` and ``warps``: these kernels hold four tensors
    per element, so 8 to 32 warps)."""
    block_d, rows = _triton.blocks(d)
    return block_d, rows, _triton.warps(block_d * rows, fewest=8, most=32)


def launch_groups(xs) -> dict[tuple, list[int]]:
    """The indices of ``xs`` that share a launch: one group per (device, dtype, row length);
    empty tensors belong to none."""
    groups: dict[tuple, list[int]] = defaultdict(list)
    for i, x in enumerate(xs):
        d = x.shape[-1] if x.dim() else 0
        if d and x.numel():
            groups[(x.device, x.dtype, d)].append(i)
    return dict(groups)


def _check(name: str, what: str, device: torch.device, tensors) -> None:
    """Refuse CPU tensors outside the interpreter (``what`` says what to use instead) and any
    tensor of ``tensors`` (``(label, tensor)`` pairs) that is not contiguous. The environment is
    read once per launch: this runs at every optimizer step."""
    _triton.check_device(name, torch.empty(0, device=device), hint=what)
    for label, t in tensors:
        if not t.is_contiguous():
            raise ValueError(f"{name} (Triton): the {label} of shape {tuple(t.shape)} is not contiguous")


@functools.lru_cache(maxsize=64)
def _work_items(device: torch.device, rows_per_program: int, rows: tuple[int, ...]) -> torch.Tensor:
    """The (tensor, block of rows) pairs of a launch, on ``device``. They depend on the row counts
    alone, which a model's parameters keep from step to step: built once, not at every step."""
    blocks = torch.tensor([triton.cdiv(n, rows_per_program) for n in rows])
    tensor = torch.repeat_interleave(torch.arange(len(rows)), blocks)
    first = torch.repeat_interleave(torch.cumsum(blocks, 0) - blocks, blocks)
    work = torch.stack([tensor, torch.arange(int(blocks.sum())) - first], dim=1)
    return work.to(torch.int32).to(device)


def _launch(kernel, device, d: int, tensors: list[list[torch.Tensor]], *args, **meta) -> None:
    """One launch of ``kernel`` over every block of rows of ``tensors`` (one list per work item:
    the tensors the kernel's table holds for it, of row length ``d``, the first of them setting
    the row count)."""
    block_d, rows_per_program, warps = _blocks(d)
    rows = tuple(ts[0].numel() // d for ts in tensors)
    addresses = [[t.data_ptr() for t in ts] for ts in tensors]
    aligned = _triton.aligned(d, tensors[0][0].element_size(), [a for row in addresses for a in row])
    table = torch.tensor([a + [n] for a, n in zip(addresses, rows)], dtype=torch.int64).to(device, non_blocking=True)
    work = _work_items(device, rows_per_program, rows)
    with _triton.on_device_of(tensors[0][0]):
        kernel[(work.shape[0],)](
            table, work, *args, **meta, BLOCK_D=block_d, ROWS=rows_per_program, ALIGNED=aligned, num_warps=warps
        )


def sphere_adam_rows_(
    xs, gs, ms, vs, step_sizes, bias2_sqrts, beta1: float, beta2: float, eps: float, tiny: float,
    row_v: bool, project: bool,
) -> None:  # fmt: skip  # the native kernel's signature, argument for argument
    """Step every sphere tensor of ``xs`` in place (``gs`` read; ``ms``, ``vs`` updated): the
    arguments of the native CPU kernel ``torch.ops.spherenet.sphere_adam_``. ``vs[i]`` holds one
    value per element, or per row with ``row_v``. Every tensor must be contiguous and of its
    parameter's dtype. One launch per (device, dtype, row length)."""
    lists = (xs, gs, ms, vs, step_sizes, bias2_sqrts)
    if len({len(lst) for lst in lists}) != 1:
        raise ValueError(f"sphere_adam_ (Triton): lists of unequal lengths {[len(lst) for lst in lists]}")
    for (device, dtype, d), idx in launch_groups(xs).items():
        named = [[("gradient", gs[i]), ("exp_avg", ms[i]), ("exp_avg_sq", vs[i]), ("parameter", xs[i])] for i in idx]
        _check(
            "sphere_adam_",
            "; use the native or torch implementation on CPU",
            device,
            [pair for tensors in named for pair in tensors],
        )
        for tensors in named:
            for label, t in tensors[:3]:
                if t.dtype != dtype or t.device != device:
                    raise ValueError(
                        f"sphere_adam_ (Triton): the {label} of shape {tuple(t.shape)} is {t.dtype} on {t.device}, "
                        f"its parameter {dtype} on {device}"
                    )
        scalars = torch.tensor([[step_sizes[i], 1.0 / bias2_sqrts[i]] for i in idx], dtype=torch.float32).to(
            device, non_blocking=True
        )
        _launch(
            _sphere_adam_rows, device, d, [[xs[i], gs[i], ms[i], vs[i]] for i in idx], scalars, d, beta1, beta2,
            eps, tiny, DTYPE=_TRITON_TYPES[dtype], ROW_V=row_v, PROJECT=project,
        )  # fmt: skip  # one launch per group


def sphere_muon_tail_triton_(xs, updates, ms, step_sizes, project_update: bool, tiny: float = _triton.TINY) -> None:
    """The element-wise tail of :class:`spherenet.optim.SphericalMuon`'s step, after
    Newton-Schulz, in one pass (read x, O, M; write x, M: 20 bytes per float32 parameter, where
    the ``_foreach`` passes move about 64)::

        O = O - <x, O> x      (project_update)
        x = Norm(x - step_size O)
        M = M - <x, M> x      the momentum at the new point

    ``updates`` (the orthogonalized ``O``) are read only. Every tensor must be contiguous and of
    its parameter's dtype. One launch per (device, dtype, row length)."""
    for (device, dtype, d), idx in launch_groups(xs).items():
        _check("sphere_muon_tail_", "", device, [(label, t[i]) for label, t in (("update", updates), ("momentum", ms), ("parameter", xs)) for i in idx])  # fmt: skip  # one check per launch
        for i in idx:
            for label, t in (("update", updates[i]), ("momentum", ms[i])):
                if t.dtype != dtype or t.device != device or t.shape != xs[i].shape:
                    raise ValueError(
                        f"sphere_muon_tail_ (Triton): the {label} is {t.dtype} {tuple(t.shape)} on {t.device}, "
                        f"its parameter {dtype} {tuple(xs[i].shape)} on {device}"
                    )
        scalars = torch.tensor([step_sizes[i] for i in idx], dtype=torch.float32).to(device, non_blocking=True)
        _launch(
            _muon_tail_rows, device, d, [[xs[i], updates[i], ms[i]] for i in idx], scalars, d, tiny,
            DTYPE=_TRITON_TYPES[dtype], PROJECT=project_update,
        )  # fmt: skip  # one launch per group


def normalize_rows_triton_(xs, tiny: float = _triton.TINY) -> None:
    """``x <- x / ||x||`` row by row, in place, for every tensor of ``xs`` (the sphere's ``retr``,
    Section 2.6 step 2): one read and one write per element (8 bytes per float32 parameter),
    norms in float32, a zero row left zero. Every tensor must be contiguous. One launch per
    (device, dtype, row length)."""
    for (device, dtype, d), idx in launch_groups(xs).items():
        _check("normalize_rows_", "", device, [("parameter", xs[i]) for i in idx])
        _launch(_normalize_rows, device, d, [[xs[i]] for i in idx], d, tiny, DTYPE=_TRITON_TYPES[dtype])
