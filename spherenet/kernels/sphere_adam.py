"""One step of Adam on the unit sphere over lists of tensors: :func:`sphere_adam_`.

Equation numbers are those of Loshchilov et al., "nGPT" (2024); the operation names are
geoopt's (``proju``, ``retr``, ``transp``). For a parameter ``x`` with gradient ``g``, step
count ``t``, one step is, in this order (the plain-torch reference below is written so):

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

The unit sphere (rows along the last dimension) is the default manifold. Another manifold (the
whole-matrix sphere of Hyperball) steps through the same reference by handing in its operations:
an object with ``proju_(xs, us)`` (step 2, in place), ``step_(xs, directions, lr)`` (step 5) and
``blocks(lists)`` (how the lists may be cut while stepping).

Implementations, registered below under one signature and computing the same step to float
rounding: ``"reference"`` (this module's ``_foreach`` passes, any device; also ``"torch"``), ``"native"`` (one fused C++ pass
per row, CPU; :mod:`spherenet.kernels.native`) and ``"triton"`` (one launch per dtype and row
length; :mod:`spherenet.kernels.sphere_rows_triton`). ``implementation=None`` lets the
resolver (:mod:`spherenet.kernels.resolve`) choose.
"""

from __future__ import annotations

import math

import torch

from . import _choice
from .resolve import Op
from .sphere_rows import ROW_SPHERE, TINY, RowOps

__all__ = ["sphere_adam_", "SPHERE_ADAM", "SECOND_MOMENTS", "GRADIENTS"]

SECOND_MOMENTS = ("element", "row")
GRADIENTS = ("riemannian", "euclidean")

_ROWS = RowOps()  # the scratch of the projected gradients' copies


def _values(steps: list[torch.Tensor]) -> list[float]:
    """The step counts as floats, with one device sync rather than one per tensor."""
    if len({s.device for s in steps}) == 1:
        return torch.stack(steps).tolist()
    return [float(s) for s in steps]


def _sphere_adam_foreach(
    params, grads, exp_avgs, exp_avg_sqs, steps, *, lr, beta1, beta2, eps, second_moment, gradient, manifold
) -> None:
    """The reference: steps 1-6 of the module docstring in ``torch._foreach_*`` passes, one
    cache-sized block of rows at a time on the unit sphere (:func:`spherenet.kernels.sphere_rows.waves`)."""
    manifold = ROW_SPHERE if manifold is None else manifold
    row_v, project = second_moment == "row", gradient == "riemannian"
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


def _bias_corrected_scalars(steps, lr, beta1, beta2) -> tuple[list[float], list[float]]:
    """Step 1 for the fused kernels: the counts moved, then per tensor ``lr / (1 - b1^t)`` and
    ``sqrt(1 - b2^t)`` (the arguments the kernels take, as torch's fused Adam)."""
    torch._foreach_add_(steps, 1)
    t = _values(steps)
    return [lr / (1 - beta1**k) for k in t], [math.sqrt(1 - beta2**k) for k in t]


def _refuse_manifold(manifold, name: str) -> None:
    if manifold is not None and manifold is not ROW_SPHERE:
        raise ValueError(f"sphere_adam_: the {name} implementation steps the unit sphere's rows only, not {manifold!r}")


def _sphere_adam_native(
    params, grads, exp_avgs, exp_avg_sqs, steps, *, lr, beta1, beta2, eps, second_moment, gradient, manifold
) -> None:
    _refuse_manifold(manifold, "native")
    from . import native

    step_sizes, bias2_sqrts = _bias_corrected_scalars(steps, lr, beta1, beta2)
    native.sphere_adam_op()(
        params, grads, exp_avgs, exp_avg_sqs, step_sizes, bias2_sqrts, beta1, beta2, eps,
        TINY[torch.float32], second_moment == "row", gradient == "riemannian",
    )  # fmt: skip  # the operator's arguments in its schema's order


def _sphere_adam_triton(
    params, grads, exp_avgs, exp_avg_sqs, steps, *, lr, beta1, beta2, eps, second_moment, gradient, manifold
) -> None:
    _refuse_manifold(manifold, "triton")
    from .sphere_rows_triton import sphere_adam_rows_  # imports Triton: only when it is used

    step_sizes, bias2_sqrts = _bias_corrected_scalars(steps, lr, beta1, beta2)
    sphere_adam_rows_(
        params, grads, exp_avgs, exp_avg_sqs, step_sizes, bias2_sqrts, beta1, beta2, eps,
        TINY[torch.float32], second_moment == "row", gradient == "riemannian",
    )  # fmt: skip  # the native operator's order


#: The op: its implementations, all with :func:`sphere_adam_`'s arguments ("torch" is the reference:
#: torch's foreach kernels), and what ``"auto"`` takes per device type.
SPHERE_ADAM = Op(
    "sphere_adam_",
    implementations={
        "reference": _sphere_adam_foreach,
        "torch": _sphere_adam_foreach,
        "native": _sphere_adam_native,
        "triton": _sphere_adam_triton,
    },
    auto={"cpu": "native", "cuda": "triton", "*": "torch"},
)


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
    second_moment: str = "element",
    gradient: str = "euclidean",
    manifold=None,
    implementation: str | None = None,
) -> None:
    """One sphere-Adam step (the module docstring's steps 1-6), in place, on local tensors.

    ``params`` are updated, ``grads`` read only, ``exp_avgs`` / ``exp_avg_sqs`` updated
    (``exp_avg_sqs[i]`` of the parameter's shape, or ``shape[:-1] + (1,)`` with
    ``second_moment="row"``), ``steps`` 0-d float32 counters, each moved by one. ``manifold``:
    ``None`` for the unit sphere along the last dimension, else another manifold's operations
    (the module docstring; the reference only). ``implementation``:
    a name of :data:`spherenet.kernels.VALUES` (``"reference"`` and ``"torch"`` are the foreach
    reference), or ``None``: the resolver's choice (:mod:`spherenet.kernels.resolve`; native on
    CPU, Triton on CUDA), the reference for the tensors those cannot take."""
    if second_moment not in SECOND_MOMENTS:
        raise ValueError(f"second_moment must be one of {SECOND_MOMENTS}, got {second_moment!r}")
    if gradient not in GRADIENTS:
        raise ValueError(f"gradient must be one of {GRADIENTS}, got {gradient!r}")
    lists = (params, grads, exp_avgs, exp_avg_sqs, steps)
    if len({len(lst) for lst in lists}) != 1:
        raise ValueError(f"sphere_adam_: lists of unequal lengths {[len(lst) for lst in lists]}")
    if not params:
        return
    options = dict(
        lr=float(lr), beta1=float(beta1), beta2=float(beta2), eps=float(eps),
        second_moment=second_moment, gradient=gradient, manifold=manifold,
    )  # fmt: skip  # the signature's order
    if manifold is not None and implementation in (None, "auto"):
        implementation = "reference"  # the fused kernels step the unit sphere's rows only
    _choice.run(SPHERE_ADAM, implementation, lists, options, checked=4)
