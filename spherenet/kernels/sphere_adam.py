"""One step of Adam on the unit sphere over lists of tensors: :func:`sphere_adam_`, and the one
object that says how it is taken, :class:`SphereAdamOptions`.

Equation numbers are those of Loshchilov et al., "nGPT" (2024); the operation names are
geoopt's (``proju``, ``retr``, ``transp``). For a parameter ``x`` with gradient ``g``, step
count ``t``, one step is, in this order (:func:`sphere_adam_reference` is written so):

1. ``t <- t + 1``; Adam's bias corrections ``1 - b1^t`` and ``1 - b2^t``;
2. the gradient the moments see: ``gradient="euclidean"``: ``u = g`` (the paper's optimizer,
   Section 2.6 step 2 and Table 3: Adam, then ``Norm``); ``gradient="riemannian"``:
   ``u = proju(x, g)``, the tangent projection ``g - <x, g> x`` (eq. 24 applied to the weights);
3. Adam's moments (eq. 22): ``m <- b1 m + (1 - b1) u`` and ``v <- b2 v + (1 - b2) u*u`` with
   ``second_moment="element"`` (as ``torch.optim.Adam``) or ``v <- b2 v + (1 - b2) ||u||^2``,
   one value per row, with ``second_moment="row"`` (geoopt's ``RiemannianAdam`` on its ``Sphere``);
4. the direction ``d = m_hat / (sqrt(v_hat) + eps)``, ``m_hat = m / (1 - b1^t)``,
   ``v_hat = v / (1 - b2^t)``;
5. the step and the retraction ``x <- retr(x - lr d)``: on the unit sphere ``Norm``, row by row
   (Section 2.2.2, eq. 25/26);
6. with ``"row"`` and ``"riemannian"`` only, ``transp`` of ``m`` to the new point by projection,
   ``m <- proju(x, m)`` (never with a per-element ``v``: :mod:`spherenet.optim.riemannian_adam`
   says why).

Implementations, registered in :data:`SPHERE_ADAM` under one signature and computing the same
step to float rounding:

- ``"reference"``: :func:`sphere_adam_reference`, the steps above written out, one parameter at a
  time (as torch's ``_single_tensor_adam``); what the others are tested against;
- ``"torch"``: the same passes as ``torch._foreach_*`` calls over cache-sized blocks of rows
  (:func:`spherenet.kernels.sphere_rows.waves`); the one that also steps another manifold (the
  whole-matrix sphere of Hyperball), handed in as an object with ``proju_(xs, us)`` (step 2, in
  place), ``step_(xs, directions, lr)`` (step 5) and ``blocks(lists)`` (how the lists may be cut);
- ``"native"``: one fused C++ pass per row, CPU (:mod:`spherenet.kernels.native`);
- ``"triton"``: one launch per dtype and row length (:mod:`spherenet.kernels.sphere_rows_triton`).

Which one runs for which tensors is the resolver's (:mod:`spherenet.kernels.resolve`, then the
per-tensor fallbacks of :mod:`spherenet.kernels._choice`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from . import _choice
from .arguments import check_lists
from .resolve import Op
from .sphere_rows import ROW_SPHERE, TINY, RowOps

__all__ = [
    "sphere_adam_",
    "sphere_adam_reference",
    "SphereAdamOptions",
    "SPHERE_ADAM",
    "SECOND_MOMENTS",
    "GRADIENTS",
    "IMPLEMENTATIONS",
]

SECOND_MOMENTS = ("element", "row")
GRADIENTS = ("riemannian", "euclidean")
#: The values of :attr:`SphereAdamOptions.implementation`: ``"auto"`` and :data:`SPHERE_ADAM`'s names.
IMPLEMENTATIONS = ("auto", "reference", "torch", "native", "triton")


@dataclass(frozen=True)
class SphereAdamOptions:
    """How a sphere-Adam step is taken, checked once here: what the moments see (``gradient``),
    the shape of the second moment (``second_moment``) and which implementation of
    :data:`SPHERE_ADAM` runs (``implementation``, one of :data:`IMPLEMENTATIONS`). The numbers
    (``lr``, betas, ``eps``) are not here: they are a parameter group's, changed by schedules.
    The one form of these settings from a run config (``optim.second_moment``,
    ``optim.gradient``, ``optim.sphere_kernel``) or the optimizer's keywords to the kernel.

    Raises ``ValueError`` naming a bad value and the allowed ones, ``RuntimeError`` when an
    implementation named explicitly (``"native"``, ``"triton"``) cannot run on this machine. Each
    message starts with the keyword that sets the field (``sphere_kernel`` for
    ``implementation``), which is also the run config's ``optim`` key."""

    second_moment: str = "element"
    gradient: str = "euclidean"
    implementation: str = "auto"

    def __post_init__(self):
        for keyword, value, allowed in (
            ("second_moment", self.second_moment, SECOND_MOMENTS),
            ("gradient", self.gradient, GRADIENTS),
            ("sphere_kernel", self.implementation, IMPLEMENTATIONS),
        ):
            if value not in allowed:
                what = " (the sphere-Adam implementation)" if keyword == "sphere_kernel" else ""
                raise ValueError(f"{keyword}{what} must be one of {allowed}, got {value!r}")
        available, reason = _choice.implementation_status(self.implementation)
        if not available:
            name = self.implementation
            raise RuntimeError(f"sphere_kernel={name!r} (sphere-Adam implementation): unavailable: {reason}")

    @property
    def row_second_moment(self) -> bool:
        return self.second_moment == "row"

    @property
    def projects_gradient(self) -> bool:
        return self.gradient == "riemannian"


_ROWS = RowOps()  # the scratch of the projected gradients' copies


def _values(steps: list[torch.Tensor]) -> list[float]:
    """The step counts as floats, with one device sync rather than one per tensor."""
    if len({s.device for s in steps}) == 1:
        return torch.stack(steps).tolist()
    return [float(s) for s in steps]


def sphere_adam_reference(params, grads, exp_avgs, exp_avg_sqs, steps, *, lr, beta1, beta2, eps, options, manifold=None):  # fmt: skip  # the signature of every implementation
    """Steps 1-6 of the module docstring, one parameter at a time, each line over all the rows of
    the parameter at once (a row's step reads that row only; sums are over the last dimension).
    Computes in at least float32. The unit sphere only (``manifold`` is ``None``)."""
    row_v, project = options.row_second_moment, options.projects_gradient
    for param, grad, exp_avg, exp_avg_sq, step in zip(params, grads, exp_avgs, exp_avg_sqs, steps):
        work = torch.promote_types(param.dtype, torch.float32)
        x, g, m, v = (t.to(work) for t in (param, grad, exp_avg, exp_avg_sq))
        step += 1  # 1.
        t = float(step)
        bias1, bias2 = 1 - beta1**t, 1 - beta2**t
        u = g - (x * g).sum(-1, keepdim=True) * x if project else g  # 2. u = proju(x, g), eq. 24
        m = beta1 * m + (1 - beta1) * u  # 3. eq. 22
        v = beta2 * v + (1 - beta2) * ((u * u).sum(-1, keepdim=True) if row_v else u * u)
        d = (m / bias1) / ((v / bias2).sqrt() + eps)  # 4.
        y = x - lr * d  # 5. x <- retr(x - lr d) = Norm(x - lr d), eq. 25/26
        x = y / torch.linalg.vector_norm(y, dim=-1, keepdim=True).clamp_min(TINY[work])
        if row_v and project:
            m = m - (x * m).sum(-1, keepdim=True) * x  # 6. transp: m <- proju(x, m)
        for out, value in ((param, x), (exp_avg, m), (exp_avg_sq, v)):
            out.copy_(value)


def _sphere_adam_foreach(params, grads, exp_avgs, exp_avg_sqs, steps, *, lr, beta1, beta2, eps, options, manifold=None):  # fmt: skip  # the signature of every implementation
    """Steps 1-6 in ``torch._foreach_*`` passes, one cache-sized block of rows at a time (for the
    unit sphere; another manifold's own blocks)."""
    manifold = ROW_SPHERE if manifold is None else manifold
    row_v, project = options.row_second_moment, options.projects_gradient
    torch._foreach_add_(steps, 1)  # 1. the step count, then the bias corrections
    t = _values(steps)
    bias1 = [1 - beta1**k for k in t]
    bias2_sqrt = [math.sqrt(1 - beta2**k) for k in t]
    for idx, (xs, gs, ms, vs) in manifold.blocks([params, grads, exp_avgs, exp_avg_sqs]):
        us = gs
        if project:
            us = _ROWS.copies(gs)  # the gradients are read only
            manifold.proju_(xs, us)  # 2. u = proju(x, g)
        torch._foreach_lerp_(ms, us, 1 - beta1)  # 3. m <- b1 m + (1 - b1) u
        torch._foreach_mul_(vs, beta2)
        if row_v:  # v <- b2 v + (1 - b2) ||u||^2
            squares = RowOps.norms(us)
            torch._foreach_mul_(squares, squares)
            torch._foreach_add_(vs, squares, alpha=1 - beta2)
        else:  # v <- b2 v + (1 - b2) u*u
            torch._foreach_addcmul_(vs, us, us, value=1 - beta2)
        denominators = torch._foreach_sqrt(vs)  # 4. d = m_hat / (sqrt(v_hat) + eps)
        torch._foreach_div_(denominators, [bias2_sqrt[i] for i in idx])
        torch._foreach_add_(denominators, eps)
        directions = torch._foreach_div(ms, denominators)
        torch._foreach_div_(directions, [bias1[i] for i in idx])
        manifold.step_(xs, directions, lr)  # 5. x <- retr(x - lr d)
        if row_v and project:
            manifold.proju_(xs, ms)  # 6. transp: m projected onto the tangent space at the new x


def _fused_arguments(steps, lr, beta1, beta2, eps, options) -> tuple:
    """Step 1 for the fused kernels, then their arguments after the tensor lists (the native
    operator's schema order): per tensor ``lr / (1 - b1^t)`` and ``sqrt(1 - b2^t)`` (as torch's
    fused Adam), the betas, eps, the smallest norm, row ``v``, projected gradient."""
    torch._foreach_add_(steps, 1)
    t = _values(steps)
    step_sizes, bias2_sqrts = [lr / (1 - beta1**k) for k in t], [math.sqrt(1 - beta2**k) for k in t]
    return (step_sizes, bias2_sqrts, beta1, beta2, eps, TINY[torch.float32], options.row_second_moment, options.projects_gradient)  # fmt: skip  # one tuple in the schema's order


def _sphere_adam_native(params, grads, exp_avgs, exp_avg_sqs, steps, *, lr, beta1, beta2, eps, options, manifold=None):  # fmt: skip  # the signature of every implementation
    from . import native

    native.sphere_adam_op()(params, grads, exp_avgs, exp_avg_sqs, *_fused_arguments(steps, lr, beta1, beta2, eps, options))  # fmt: skip  # one call


def _sphere_adam_triton(params, grads, exp_avgs, exp_avg_sqs, steps, *, lr, beta1, beta2, eps, options, manifold=None):  # fmt: skip  # the signature of every implementation
    from .sphere_rows_triton import sphere_adam_rows_  # imports Triton: only when it is used

    sphere_adam_rows_(params, grads, exp_avgs, exp_avg_sqs, *_fused_arguments(steps, lr, beta1, beta2, eps, options))


#: The op: its implementations, all with :func:`sphere_adam_`'s arguments, and what ``"auto"``
#: takes per device type.
SPHERE_ADAM = Op(
    "sphere_adam_",
    implementations={
        "reference": sphere_adam_reference,
        "torch": _sphere_adam_foreach,
        "native": _sphere_adam_native,
        "triton": _sphere_adam_triton,
    },
    auto={"cpu": "native", "cuda": "triton", "*": "torch"},
)
_DEFAULT = SphereAdamOptions()


def sphere_adam_(
    params: list[torch.Tensor],
    grads: list[torch.Tensor],
    exp_avgs: list[torch.Tensor],
    exp_avg_sqs: list[torch.Tensor],
    steps: list[torch.Tensor],
    *,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    options: SphereAdamOptions = _DEFAULT,
    manifold=None,
) -> None:
    """One sphere-Adam step (the module docstring's steps 1-6), in place, on local tensors.

    ``params`` are updated, ``grads`` read only, ``exp_avgs`` / ``exp_avg_sqs`` updated
    (``exp_avg_sqs[i]`` of the parameter's shape, or ``shape[:-1] + (1,)`` with
    ``second_moment="row"``), ``steps`` 0-d float32 counters, each moved by one. ``options``: a
    :class:`SphereAdamOptions`; with ``implementation="auto"`` the resolver chooses (native on
    CPU, Triton on CUDA), and the tensors an implementation cannot take run ``"torch"``.
    ``manifold``: ``None`` for the unit sphere along the last dimension, else another manifold's
    operations (the module docstring), stepped by ``"torch"``."""
    if not isinstance(options, SphereAdamOptions):
        raise TypeError(f"sphere_adam_: options must be a SphereAdamOptions, got {type(options).__name__}")
    lists = (params, grads, exp_avgs, exp_avg_sqs, steps)
    check_lists("sphere_adam_", "params, grads, exp_avgs, exp_avg_sqs, steps", *lists, same_shape=3)
    scalars = dict(lr=float(lr), beta1=float(beta1), beta2=float(beta2), eps=float(eps), options=options)
    rows_only = manifold is not None and manifold is not ROW_SPHERE  # only "torch" takes another manifold
    for implementation, sublists in _choice.assign(SPHERE_ADAM, options.implementation, lists, 4, rows_only):
        implementation(*sublists, **scalars, manifold=manifold)
