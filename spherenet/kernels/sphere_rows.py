"""Row operations of the unit sphere over lists of tensors, in plain torch: the foreach passes of
the sphere optimizers' ``"torch"`` implementations, and the row ops ``normalize_rows_`` and
``sphere_muon_tail_``.

Layout: a sphere parameter is a stack of unit vectors along its **last** dimension ("rows").
FSDP2 shards dim 0, so on every rank each row is whole and every row reduction (dot product,
norm) is local: these functions take the local tensors (``DTensor.to_local()``) and never
communicate.

Elementwise stages run as ``torch._foreach_*`` ops over a list of tensors. Row reductions
have no ``_foreach`` form; they run once per tensor through one bounded scratch buffer, so that
no parameter-sized temporary is allocated at every step.

A sphere step chains about a dozen such passes (projection, Adam, retraction, transport). Run
over whole parameters, each pass streams every tensor from main memory again. :func:`waves`
cuts the parameter lists into row blocks of a few MiB ("waves") and the optimizers run all
passes on one wave before the next, so that the data stays in the CPU caches between passes;
every row is still processed whole and every pass is still one ``_foreach`` call per wave.
"""

from __future__ import annotations

import torch

from ..manifolds.geodesic import TINY
from .arguments import check_lists
from .resolve import Op

__all__ = ["RowOps", "RowSphere", "ROW_SPHERE", "waves", "TINY", "WAVE_BYTES", "normalize_rows_", "sphere_muon_tail_"]

# Norms are clamped here before dividing, so that an (impossible in practice) zero row maps to
# zero rather than to NaN; the first-step check refuses zero rows explicitly.

# Largest scratch buffer for row reductions, in elements (4 MiB in float32).
_SCRATCH_NUMEL = 1 << 20

#: Bytes of one parameter list per wave (4 MiB: with x, g, m, v a wave is 16 MiB, within a
#: server CPU's last-level cache).
WAVE_BYTES = 1 << 22


def _as_rows(t: torch.Tensor) -> torch.Tensor | None:
    """``t`` viewed as ``(rows, last)`` without copying, or ``None`` if it cannot be."""
    if t.dim() == 2:
        return t
    try:
        return t.view(-1, t.shape[-1]) if t.shape[-1] else None
    except RuntimeError:
        return None


def waves(lists: list[list[torch.Tensor]], wave_bytes: int | None = None):
    """Cut parallel tensor lists into row blocks ("waves") of about ``wave_bytes`` per list.

    ``lists[k][i]`` must all have the leading (row) dimensions of ``lists[0][i]`` (a row-wise
    second moment of shape ``(..., 1)`` is fine). Yields ``(index, views)``: ``index[j]`` is
    the position in the input lists that chunk ``j`` comes from, ``views[k]`` the chunk views
    of ``lists[k]`` (row slices: in-place ops on them update the originals). Tensors that
    cannot be viewed as 2-D are kept whole.
    """
    if not lists or not lists[0]:
        return
    wave_bytes = WAVE_BYTES if wave_bytes is None else int(wave_bytes)
    idx: list[int] = []
    out: list[list[torch.Tensor]] = [[] for _ in lists]
    size = 0
    for i, x in enumerate(lists[0]):
        budget = max(1, wave_bytes // max(1, x.element_size()))
        rows2d = [_as_rows(lst[i]) for lst in lists]
        if x.numel() <= budget or any(r is None for r in rows2d):
            pieces = [[lst[i] for lst in lists]]
            sizes = [x.numel()]
        else:
            d = x.shape[-1]
            step = max(1, budget // d)
            n = rows2d[0].shape[0]
            pieces = [[r[s : s + step] for r in rows2d] for s in range(0, n, step)]
            sizes = [min(step, n - s) * d for s in range(0, n, step)]
        for piece, numel in zip(pieces, sizes):
            idx.append(i)
            for k, view in enumerate(piece):
                out[k].append(view)
            size += numel * x.element_size()
            if size >= wave_bytes:
                yield idx, out
                idx, out, size = [], [[] for _ in lists], 0
    if idx:
        yield idx, out


class RowOps:
    """Row reductions over lists of local tensors, with one reusable scratch per device/dtype."""

    def __init__(self, scratch_numel: int = _SCRATCH_NUMEL):
        self.scratch_numel = int(scratch_numel)
        self._scratch: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}
        self._copies: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}

    def _buffer(self, like: torch.Tensor, numel: int) -> torch.Tensor:
        key = (like.device, like.dtype)
        buf = self._scratch.get(key)
        if buf is None or buf.numel() < numel:
            buf = torch.empty(numel, dtype=like.dtype, device=like.device)
            self._scratch[key] = buf
        return buf[:numel]

    def copies(self, ts: list[torch.Tensor]) -> list[torch.Tensor]:
        """Copies of ``ts`` in one reusable buffer per device/dtype (valid until the next call;
        separate from the buffer :meth:`dot` uses). Sized for one wave of rows."""
        need: dict[tuple[torch.device, torch.dtype], int] = {}
        for t in ts:
            key = (t.device, t.dtype)
            need[key] = need.get(key, 0) + t.numel()
        offset = dict.fromkeys(need, 0)
        for key, numel in need.items():
            buf = self._copies.get(key)
            if buf is None or buf.numel() < numel:
                self._copies[key] = torch.empty(numel, dtype=key[1], device=key[0])
        out = []
        for t in ts:
            key = (t.device, t.dtype)
            start = offset[key]
            out.append(self._copies[key][start : start + t.numel()].view(t.shape))
            offset[key] = start + t.numel()
        if out:
            torch._foreach_copy_(out, ts)
        return out

    def dot(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """``<a_i, b_i>`` for every row i: shape ``a.shape[:-1] + (1,)``, dtype of ``a``.

        Computed as ``(a * b).sum(-1)`` (the product written to the scratch buffer, row chunk
        by row chunk), the same arithmetic as geoopt's ``Sphere.inner``.
        """
        d = a.shape[-1]
        out_shape = a.shape[:-1] + (1,)
        rows = a.numel() // d if d else 0
        if rows == 0:
            return a.new_zeros(out_shape)
        a2, b2 = a.reshape(rows, d), b.reshape(rows, d)  # views for the usual contiguous layout
        out = torch.empty(rows, 1, dtype=a.dtype, device=a.device)
        chunk = max(1, self.scratch_numel // d)
        for start in range(0, rows, chunk):
            stop = min(rows, start + chunk)
            buf = self._buffer(a, (stop - start) * d).view(stop - start, d)
            torch.mul(a2[start:stop], b2[start:stop], out=buf)
            torch.sum(buf, dim=-1, keepdim=True, out=out[start:stop])
        return out.view(out_shape)

    def dots(self, xs: list[torch.Tensor], ys: list[torch.Tensor]) -> list[torch.Tensor]:
        return [self.dot(x, y) for x, y in zip(xs, ys)]

    @staticmethod
    def norms(xs: list[torch.Tensor]) -> list[torch.Tensor]:
        """Row norms ``||x_i||`` (shape ``x.shape[:-1] + (1,)``), accumulated in at least float32."""
        out = []
        for x in xs:
            if x.dtype in (torch.float16, torch.bfloat16):
                out.append(torch.linalg.vector_norm(x, dim=-1, keepdim=True, dtype=torch.float32).to(x.dtype))
            else:
                out.append(torch.linalg.vector_norm(x, dim=-1, keepdim=True))
        return out

    # ---- the unit sphere's operations (geoopt's names), each over a whole list ------------------

    def proju_(self, xs: list[torch.Tensor], us: list[torch.Tensor]) -> None:
        """The sphere's ``proju``: ``u <- u - <x, u> x`` in place, each ``u`` projected onto the
        tangent space at ``x`` (the Riemannian gradient, eq. 24 in the paper's Appendix A.3;
        applied to a moment at the new point it is the transport ``transp``)."""
        if not xs:
            return
        torch._foreach_addcmul_(us, xs, self.dots(xs, us), value=-1)

    def retr_(self, xs: list[torch.Tensor]) -> None:
        """The sphere's ``retr``: ``x <- x / ||x||`` in place, row by row (``Norm``, Section 2.2.2),
        applied to ``x - lr d`` after the step."""
        if not xs:
            return
        half = [x for x in xs if x.dtype in (torch.float16, torch.bfloat16)]
        full = [x for x in xs if x.dtype not in (torch.float16, torch.bfloat16)]
        if full:
            n = self.norms(full)
            torch._foreach_clamp_min_(n, TINY.get(full[0].dtype, 1e-30))
            torch._foreach_div_(full, n)
        for x in half:
            # Divide in float32 and round once: a norm rounded to bf16 is 1 for every row within
            # [1 - 2^-9, 1 + 2^-8], so such rows would never be corrected.
            xf = x.float()
            x.copy_(xf / torch.linalg.vector_norm(xf, dim=-1, keepdim=True).clamp_min(1e-30))

    @staticmethod
    def norm_errors(xs: list[torch.Tensor]) -> list[torch.Tensor]:
        """``max |‖x_i‖ - 1|`` per tensor (0-d, float32 or float64)."""
        out = []
        for x in xs:
            work = torch.float64 if x.dtype == torch.float64 else torch.float32
            if x.numel() == 0:
                out.append(torch.zeros((), dtype=work, device=x.device))
                continue
            n = torch.linalg.vector_norm(x, dim=-1, dtype=work)
            out.append((n - 1).abs().max())
        return out


class RowSphere:
    """The unit sphere along the last dimension, row by row, as :func:`spherenet.kernels.sphere_adam_`
    asks a manifold for its operations (over whole lists of local tensors)."""

    def __init__(self):
        self.rows = RowOps()

    def __repr__(self) -> str:
        return "RowSphere()"

    def proju_(self, xs: list[torch.Tensor], us: list[torch.Tensor]) -> None:
        """``u <- u - <x, u> x``, row by row."""
        self.rows.proju_(xs, us)

    def step_(self, xs: list[torch.Tensor], directions: list[torch.Tensor], lr: float) -> None:
        """``x <- Norm(x - lr d)``, row by row."""
        torch._foreach_add_(xs, directions, alpha=-lr)
        self.rows.retr_(xs)

    @staticmethod
    def blocks(lists: list[list[torch.Tensor]]):
        """Cache-sized blocks of whole rows: every row operation is local to its row."""
        return waves(lists)


#: The unit sphere's row operations: the default manifold of the sphere kernels.
ROW_SPHERE = RowSphere()


def _normalize_rows_foreach(xs: list[torch.Tensor]) -> None:
    ROW_SPHERE.rows.retr_(xs)


def _normalize_rows_triton(xs: list[torch.Tensor]) -> None:
    from .sphere_rows_triton import normalize_rows_triton_  # imports Triton: only when it is used

    normalize_rows_triton_(xs)


def normalize_rows_(xs: list[torch.Tensor], *, implementation: str | None = None) -> None:
    """``x <- x / ||x||`` row by row, in place, for every tensor of ``xs`` (the sphere's ``retr``,
    ``Norm`` of Section 2.2.2; the paper's renormalization after a Euclidean step, Section 2.6
    step 2). A zero row stays zero. ``implementation``: ``"reference"`` / ``"torch"``
    (``_foreach`` passes), ``"triton"`` (one read and one write per element) or ``None`` (the
    resolver's choice, :mod:`spherenet.kernels.resolve`)."""
    from . import _choice

    for run, sublists in _choice.assign(NORMALIZE_ROWS, implementation, (xs,), 1):
        run(*sublists)


def _sphere_muon_tail_foreach(xs, updates, ms, step_sizes, *, project_update: bool) -> None:
    rows = ROW_SPHERE.rows
    if project_update:
        updates = rows.copies(updates)  # the updates are read only
        rows.proju_(xs, updates)  # 4. O <- P_X(O)
    for x, o, step_size in zip(xs, updates, step_sizes):
        x.add_(o, alpha=-step_size)
    rows.retr_(xs)  # 5. X <- Norm(X - lr s O)
    rows.proju_(xs, ms)  # 6. M <- P_X(M) at the new point


def _sphere_muon_tail_triton(xs, updates, ms, step_sizes, *, project_update: bool) -> None:
    from .sphere_rows_triton import sphere_muon_tail_triton_  # imports Triton: only when it is used

    sphere_muon_tail_triton_(xs, updates, ms, step_sizes, project_update)


def sphere_muon_tail_(xs, updates, ms, step_sizes, *, project_update: bool, implementation: str | None = None) -> None:
    """The row-wise tail of :class:`spherenet.optim.SphericalMuon`'s step, after Newton-Schulz
    (steps 4-6 there; ``updates``, the orthogonalized ``O``, are read only)::

        O = O - <x, O> x      (project_update)
        x = Norm(x - step_size O)
        M = M - <x, M> x      the momentum at the new point

    ``implementation`` as for :func:`normalize_rows_`."""
    from . import _choice

    check_lists("sphere_muon_tail_", "xs, updates, ms, step_sizes", xs, updates, ms, step_sizes, same_shape=3)
    for run, sublists in _choice.assign(SPHERE_MUON_TAIL, implementation, (xs, updates, ms, step_sizes), 3):
        run(*sublists, project_update=project_update)


#: The ops, each with its implementations under its signature ("torch" is the reference) and what
#: ``"auto"`` takes per device type.
NORMALIZE_ROWS = Op(
    "normalize_rows_",
    implementations={
        "reference": _normalize_rows_foreach,
        "torch": _normalize_rows_foreach,
        "triton": _normalize_rows_triton,
    },
    auto={"cuda": "triton", "*": "torch"},
)
SPHERE_MUON_TAIL = Op(
    "sphere_muon_tail_",
    implementations={
        "reference": _sphere_muon_tail_foreach,
        "torch": _sphere_muon_tail_foreach,
        "triton": _sphere_muon_tail_triton,
    },
    auto={"cuda": "triton", "*": "torch"},
)
