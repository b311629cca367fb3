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
signature as :func:`sphere_adam_`; ``project``: the riemannian gradient). One launch per tensor. On CPU tensors it runs only under
Triton's interpreter (``TRITON_INTERPRET=1`` before Triton is imported), which is how the tests
run it; its float64 parameters are stepped in float32.

:func:`normalize_rows_` is the paper's renormalization after a Euclidean step (``adam_normalize``,
:func:`spherenet.optim.normalize_`) as one pass of the same shape: 8 bytes per float32 parameter.
"""

from __future__ import annotations

import os

import triton
import triton.language as tl

__all__ = ["sphere_adam_", "normalize_rows_"]

ELEMENTS_PER_PROGRAM = 4096


@triton.jit
def _sphere_adam_rows(
    X, G, M, V, n_rows, d, step_size, inv_bias2_sqrt, beta1, beta2, eps, tiny,
    ROW_V: tl.constexpr, PROJECT: tl.constexpr, BLOCK_D: tl.constexpr, ROWS: tl.constexpr,
):  # fmt: skip  # the arguments in the order of the header's formulas
    rows = (tl.program_id(0) * ROWS + tl.arange(0, ROWS)).to(tl.int64)
    cols = tl.arange(0, BLOCK_D)
    live = rows < n_rows
    mask = live[:, None] & (cols[None, :] < d)
    offs = rows[:, None] * d + cols[None, :]
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
        tl.store(V + rows, v.to(V.dtype.element_ty), mask=live)
    else:
        v = tl.load(V + offs, mask=mask, other=0.0).to(tl.float32)
        v = beta2 * v + (1.0 - beta2) * u * u
        y = x - step_size * m / (tl.sqrt(v) * inv_bias2_sqrt + eps)
        tl.store(V + offs, v.to(V.dtype.element_ty), mask=mask)
    y = tl.where(mask, y, 0.0)
    x = y / tl.maximum(tl.sqrt(tl.sum(y * y, axis=1)), tiny)[:, None]
    if ROW_V and PROJECT:
        m = m - tl.sum(x * m, axis=1)[:, None] * x
    tl.store(X + offs, x.to(X.dtype.element_ty), mask=mask)
    tl.store(M + offs, m.to(M.dtype.element_ty), mask=mask)


def sphere_adam_(
    xs, gs, ms, vs, step_sizes, bias2_sqrts, beta1: float, beta2: float, eps: float, tiny: float,
    row_v: bool, project: bool,
) -> None:  # fmt: skip  # the native kernel's signature, argument for argument
    """Step every sphere tensor of ``xs`` in place (``gs`` read; ``ms``, ``vs`` updated): the
    arguments of the native CPU kernel ``torch.ops.spherenet.sphere_adam_``. ``vs[i]`` holds one
    value per element, or per row with ``row_v``. Every tensor must be contiguous."""
    for x, g, m, v, step_size, bias2_sqrt in zip(xs, gs, ms, vs, step_sizes, bias2_sqrts, strict=True):
        d = x.shape[-1]
        n_rows = x.numel() // d if d else 0
        if n_rows == 0:
            continue
        if x.device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
            raise RuntimeError(
                "sphere_adam_ (Triton): CPU tensors need TRITON_INTERPRET=1 (set before Triton is imported); "
                "use sphere_kernel='native' or 'foreach' on CPU"
            )
        for name, t in (("gradient", g), ("exp_avg", m), ("exp_avg_sq", v), ("parameter", x)):
            if not t.is_contiguous():
                raise ValueError(f"sphere_adam_ (Triton): the {name} of shape {tuple(t.shape)} is not contiguous")
        block_d = triton.next_power_of_2(d)
        rows = max(1, min(64, ELEMENTS_PER_PROGRAM // block_d))
        _sphere_adam_rows[(triton.cdiv(n_rows, rows),)](
            x, g, m, v, n_rows, d, step_size, 1.0 / bias2_sqrt, beta1, beta2, eps, tiny,
            ROW_V=row_v, PROJECT=project, BLOCK_D=block_d, ROWS=rows,
        )  # fmt: skip  # one launch


@triton.jit
def _normalize_rows(X, n_rows, d, tiny, BLOCK_D: tl.constexpr, ROWS: tl.constexpr):
    rows = (tl.program_id(0) * ROWS + tl.arange(0, ROWS)).to(tl.int64)
    cols = tl.arange(0, BLOCK_D)
    offs = rows[:, None] * d + cols[None, :]
    mask = (rows[:, None] < n_rows) & (cols[None, :] < d)
    x = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
    norm = tl.sqrt(tl.sum(x * x, axis=1))
    tl.store(X + offs, (x / tl.maximum(norm, tiny)[:, None]).to(X.dtype.element_ty), mask=mask)


def normalize_rows_(xs, tiny: float = 1e-30) -> None:
    """``x <- x / ||x||`` row by row, in place, for every tensor of ``xs`` (the sphere's ``retr``,
    Section 2.6 step 2): one read and one write per element (8 bytes per float32 parameter),
    norms in float32, a zero row left zero. Every tensor must be contiguous."""
    for x in xs:
        d = x.shape[-1] if x.dim() else 0
        n_rows = x.numel() // d if d else 0
        if n_rows == 0:
            continue
        if x.device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
            raise RuntimeError(
                "normalize_rows_ (Triton): CPU tensors need TRITON_INTERPRET=1 (set before Triton is imported)"
            )
        if not x.is_contiguous():
            raise ValueError(f"normalize_rows_ (Triton): the parameter of shape {tuple(x.shape)} is not contiguous")
        block_d = triton.next_power_of_2(d)
        rows = max(1, min(64, ELEMENTS_PER_PROGRAM // block_d))
        _normalize_rows[(triton.cdiv(n_rows, rows),)](x, n_rows, d, tiny, BLOCK_D=block_d, ROWS=rows)
