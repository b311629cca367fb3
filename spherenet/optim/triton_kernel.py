"""The sphere Adam step as one Triton kernel: moments, update and retraction of a block of rows in
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

the algorithm of :mod:`spherenet.optim.riemannian_adam` (whose native CPU kernel has the same
signature as :func:`sphere_adam_`; ``project``: the riemannian gradient).

Few launches: the tensors of one call are grouped by device, dtype and row length, and each group
is one launch over a table of (tensor, block of rows) work items, the tensors reached through a
table of their addresses (multi-tensor, as torch's fused Adam): a model's whole set of sphere
matrices of one width is one launch, however many layers it has. On CPU tensors the kernels run
only under Triton's interpreter (``TRITON_INTERPRET=1`` before Triton is imported), which is how
the tests run them; float64 parameters are stepped in float32.

:func:`normalize_rows_` is the paper's renormalization after a Euclidean step (``adam_normalize``,
:func:`spherenet.optim.normalize_`) as one pass of the same shape: 8 bytes per float32 parameter;
:func:`sphere_muon_tail_` is :class:`spherenet.optim.SphericalMuon`'s step after Newton-Schulz.
"""

from __future__ import annotations

import os
from collections import defaultdict

import torch
import triton
import triton.language as tl

__all__ = ["sphere_adam_", "sphere_muon_tail_", "normalize_rows_", "launch_groups"]

ELEMENTS_PER_PROGRAM = 4096

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
def _sphere_adam_rows(
    TABLE, WORK, SCALARS, d, beta1, beta2, eps, tiny, DTYPE: tl.constexpr,
    ROW_V: tl.constexpr, PROJECT: tl.constexpr, BLOCK_D: tl.constexpr, ROWS: tl.constexpr,
):  # fmt: skip  # the arguments in the order of the header's formulas
    tensor, rows, live, mask, offs = _work_item(WORK, TABLE, 5, ROWS, BLOCK_D, d)
    X = tl.load(TABLE + tensor * 5).to(tl.pointer_type(DTYPE))
    G = tl.load(TABLE + tensor * 5 + 1).to(tl.pointer_type(DTYPE))
    M = tl.load(TABLE + tensor * 5 + 2).to(tl.pointer_type(DTYPE))
    V = tl.load(TABLE + tensor * 5 + 3).to(tl.pointer_type(DTYPE))
    step_size = tl.load(SCALARS + 2 * tensor)
    inv_bias2_sqrt = tl.load(SCALARS + 2 * tensor + 1)
    x = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(G + offs, mask=mask, other=0.0).to(tl.float32)
    m = tl.load(M + offs, mask=mask, other=0.0).to(tl.float32)
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
        v = tl.load(V + offs, mask=mask, other=0.0).to(tl.float32)
        v = beta2 * v + (1.0 - beta2) * u * u
        y = x - step_size * m / (tl.sqrt(v) * inv_bias2_sqrt + eps)
        tl.store(V + offs, v.to(DTYPE), mask=mask)
    y = tl.where(mask, y, 0.0)
    x = y / tl.maximum(tl.sqrt(tl.sum(y * y, axis=1)), tiny)[:, None]
    if ROW_V and PROJECT:
        m = m - tl.sum(x * m, axis=1)[:, None] * x
    tl.store(X + offs, x.to(DTYPE), mask=mask)
    tl.store(M + offs, m.to(DTYPE), mask=mask)


@triton.jit
def _muon_tail_rows(
    TABLE, WORK, SCALARS, d, tiny, DTYPE: tl.constexpr, PROJECT: tl.constexpr, BLOCK_D: tl.constexpr,
    ROWS: tl.constexpr,
):  # fmt: skip  # the table's arguments first, as in _sphere_adam_rows
    tensor, rows, live, mask, offs = _work_item(WORK, TABLE, 4, ROWS, BLOCK_D, d)
    X = tl.load(TABLE + tensor * 4).to(tl.pointer_type(DTYPE))
    UPDATE = tl.load(TABLE + tensor * 4 + 1).to(tl.pointer_type(DTYPE))
    M = tl.load(TABLE + tensor * 4 + 2).to(tl.pointer_type(DTYPE))
    step_size = tl.load(SCALARS + tensor)
    x = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
    o = tl.load(UPDATE + offs, mask=mask, other=0.0).to(tl.float32)
    m = tl.load(M + offs, mask=mask, other=0.0).to(tl.float32)
    if PROJECT:
        o = o - tl.sum(x * o, axis=1)[:, None] * x
    y = x - step_size * o
    x = y / tl.maximum(tl.sqrt(tl.sum(y * y, axis=1)), tiny)[:, None]
    m = m - tl.sum(x * m, axis=1)[:, None] * x
    tl.store(X + offs, x.to(DTYPE), mask=mask)
    tl.store(M + offs, m.to(DTYPE), mask=mask)


@triton.jit
def _normalize_rows(TABLE, WORK, d, tiny, DTYPE: tl.constexpr, BLOCK_D: tl.constexpr, ROWS: tl.constexpr):
    tensor, rows, live, mask, offs = _work_item(WORK, TABLE, 2, ROWS, BLOCK_D, d)
    X = tl.load(TABLE + tensor * 2).to(tl.pointer_type(DTYPE))
    x = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
    norm = tl.sqrt(tl.sum(x * x, axis=1))
    tl.store(X + offs, (x / tl.maximum(norm, tiny)[:, None]).to(DTYPE), mask=mask)


def _blocks(d: int) -> tuple[int, int]:
    """The padded row length and the rows per program for rows of length ``d``."""
    block_d = triton.next_power_of_2(d)
    return block_d, max(1, min(64, ELEMENTS_PER_PROGRAM // block_d))


def launch_groups(xs) -> dict[tuple, list[int]]:
    """The indices of ``xs`` that share a launch: one group per (device, dtype, row length);
    empty tensors belong to none."""
    groups: dict[tuple, list[int]] = defaultdict(list)
    for i, x in enumerate(xs):
        d = x.shape[-1] if x.dim() else 0
        if d and x.numel():
            groups[(x.device, x.dtype, d)].append(i)
    return dict(groups)


def _check(name: str, what: str, tensors) -> None:
    for label, t in tensors:
        if t.device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
            raise RuntimeError(
                f"{name} (Triton): CPU tensors need TRITON_INTERPRET=1 (set before Triton is imported){what}"
            )
        if not t.is_contiguous():
            raise ValueError(f"{name} (Triton): the {label} of shape {tuple(t.shape)} is not contiguous")


def _launch(kernel, device, d: int, addresses: list[list[int]], rows: list[int], *args, **meta) -> None:
    """One launch of ``kernel`` over every block of rows of the tensors whose addresses are
    ``addresses`` (one list per tensor) and row counts ``rows``."""
    block_d, rows_per_program = _blocks(d)
    table = torch.tensor([a + [n] for a, n in zip(addresses, rows)], dtype=torch.int64)
    blocks = [triton.cdiv(n, rows_per_program) for n in rows]
    work = torch.stack(
        [
            torch.repeat_interleave(torch.arange(len(rows)), torch.tensor(blocks)),
            torch.cat([torch.arange(b) for b in blocks]),
        ],
        dim=1,
    ).to(torch.int32)
    table, work = table.to(device, non_blocking=True), work.to(device, non_blocking=True)
    kernel[(work.shape[0],)](table, work, *args, **meta, BLOCK_D=block_d, ROWS=rows_per_program)


def sphere_adam_(
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
        for i in idx:
            named = (("gradient", gs[i]), ("exp_avg", ms[i]), ("exp_avg_sq", vs[i]), ("parameter", xs[i]))
            _check("sphere_adam_", "; use sphere_kernel='native' or 'foreach' on CPU", named)
            for label, t in named[:3]:
                if t.dtype != dtype or t.device != device:
                    raise ValueError(
                        f"sphere_adam_ (Triton): the {label} of shape {tuple(t.shape)} is {t.dtype} on {t.device}, "
                        f"its parameter {dtype} on {device}"
                    )
        scalars = torch.tensor([[step_sizes[i], 1.0 / bias2_sqrts[i]] for i in idx], dtype=torch.float32).to(
            device, non_blocking=True
        )
        addresses = [[t.data_ptr() for t in (xs[i], gs[i], ms[i], vs[i])] for i in idx]
        rows = [xs[i].numel() // d for i in idx]
        _launch(
            _sphere_adam_rows, device, d, addresses, rows, scalars, d, beta1, beta2, eps, tiny,
            DTYPE=_TRITON_TYPES[dtype], ROW_V=row_v, PROJECT=project,
        )  # fmt: skip  # one launch per group


def sphere_muon_tail_(xs, updates, ms, step_sizes, project_update: bool, tiny: float = 1e-30) -> None:
    """The element-wise tail of :class:`spherenet.optim.SphericalMuon`'s step, after
    Newton-Schulz, in one pass (read x, O, M; write x, M: 20 bytes per float32 parameter, where
    the ``_foreach`` passes move about 64)::

        O = O - <x, O> x      (project_update)
        x = Norm(x - step_size O)
        M = M - <x, M> x      the momentum at the new point

    ``updates`` (the orthogonalized ``O``) are read only. Every tensor must be contiguous and of
    its parameter's dtype. One launch per (device, dtype, row length)."""
    for (device, dtype, d), idx in launch_groups(xs).items():
        for i in idx:
            named = (("update", updates[i]), ("momentum", ms[i]), ("parameter", xs[i]))
            _check("sphere_muon_tail_", "", named)
            for label, t in named[:2]:
                if t.dtype != dtype or t.device != device or t.shape != xs[i].shape:
                    raise ValueError(
                        f"sphere_muon_tail_ (Triton): the {label} is {t.dtype} {tuple(t.shape)} on {t.device}, "
                        f"its parameter {dtype} {tuple(xs[i].shape)} on {device}"
                    )
        scalars = torch.tensor([step_sizes[i] for i in idx], dtype=torch.float32).to(device, non_blocking=True)
        addresses = [[t.data_ptr() for t in (xs[i], updates[i], ms[i])] for i in idx]
        rows = [xs[i].numel() // d for i in idx]
        _launch(
            _muon_tail_rows, device, d, addresses, rows, scalars, d, tiny, DTYPE=_TRITON_TYPES[dtype],
            PROJECT=project_update,
        )  # fmt: skip  # one launch per group


def normalize_rows_(xs, tiny: float = 1e-30) -> None:
    """``x <- x / ||x||`` row by row, in place, for every tensor of ``xs`` (the sphere's ``retr``,
    Section 2.6 step 2): one read and one write per element (8 bytes per float32 parameter),
    norms in float32, a zero row left zero. Every tensor must be contiguous. One launch per
    (device, dtype, row length)."""
    for (device, dtype, d), idx in launch_groups(xs).items():
        _check("normalize_rows_", "", [("parameter", xs[i]) for i in idx])
        addresses = [[xs[i].data_ptr()] for i in idx]
        rows = [xs[i].numel() // d for i in idx]
        _launch(_normalize_rows, device, d, addresses, rows, d, tiny, DTYPE=_TRITON_TYPES[dtype])
