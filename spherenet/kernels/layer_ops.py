"""nGPT's layer ops, each an entry point over its implementations (equation numbers of
Loshchilov et al., "nGPT: Normalized Transformer with Representation Learning on the
Hypersphere", 2024):

| op | computes | reference (plain autograd) |
|---|---|---|
| :func:`normalize` | ``Norm(x) = x / ‖x‖`` (Table 1) | :func:`spherenet.manifolds.normalize` |
| :func:`qk_normalize` | ``Norm(x) * s_qk`` (eq. 15, 16) | :func:`scaled_normalize_reference` |
| :func:`residual_update` | LERP (eq. 10, 11), SLERP (eq. 6), Riemannian (eq. 24-26), then ``Norm`` | ``spherenet.manifolds.lerp``, ``slerp``, ``riemannian_update`` |
| :func:`normalized_update` | the above after ``Norm`` of a sub-block's output | the two refs in turn |
| :func:`swiglu` | ``u * SiLU(v)`` (eq. 19) | :func:`swiglu_reference` |
| :func:`relu2` | ``relu(x)**2`` (the ungated MLP) | :func:`relu2_reference` |
| :func:`scaled_linear` | ``(x W^T) * s`` (eq. 3, 20, 21) | :func:`scaled_linear_reference` |

Each op is an :class:`~spherenet.kernels.resolve.Op`: its implementations under one signature,
``"reference"`` (above), ``"torch"`` (what ``"auto"`` takes; :mod:`spherenet.kernels.fused`, SLERP's
in :mod:`spherenet.kernels.slerp_fused`) and ``"triton"`` (``*_triton`` modules, imported on first
use; the scaled linear has none: with the scale folded into the weight the work is the matmul's).
:func:`run` calls the implementation the resolver decided for the call's device type and dtype,
decided once and kept, so a call is a dictionary lookup. ``alpha`` (the eigen learning rates) is a
float or a tensor broadcasting against ``h``: shape ``(d,)`` or ``(1,)``.
"""  # noqa: E501  # the table's rows

from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import manifolds
from ..manifolds.geodesic import peek_transform
from . import triton_calls
from .arguments import check_broadcast, check_linear, check_update
from .fused import (
    _lerp_values,
    _normalize_values,
    _riemannian_values,
    lerp_normalize,
    normalize_fused,
    relu2_fused,
    riemannian_normalize,
    scaled_linear_fused,
    scaled_normalize_fused,
    swiglu_fused,
)
from .resolve import Op
from .slerp_fused import slerp_normalize

__all__ = [
    "NORMALIZE",
    "QK_NORMALIZE",
    "UPDATES",
    "SWIGLU",
    "RELU2",
    "SCALED_LINEAR",
    "run",
    "normalize",
    "qk_normalize",
    "update_op",
    "residual_update",
    "normalized_update",
    "swiglu",
    "relu2",
    "scaled_linear",
    "scaled_normalize_reference",
    "swiglu_reference",
    "relu2_reference",
    "scaled_linear_reference",
]


def run(op: Op, *args):
    """``op`` on ``args``: the implementation decided for the first argument's device type and
    dtype (and whether a ``torch.func`` transform is active), kept after the first call; a call
    its ``takes`` predicate refuses runs ``"torch"``."""
    if torch.compiler.is_compiling():  # traced: the resolver itself (keeping a decision is a side effect)
        return op.implementations[op.implementation_name(*args)](*args)
    x = args[0]
    key = (x.device.type, x.dtype, peek_transform() is not None)
    name, takes = op.decided.get(key) or op.decide(*key)
    if takes is not None and not takes(*args):
        name = "torch"
    return op.implementations[name](*args)  # by name: the table's entry now, patched or not


# ---------------------------------------------------------------- references


def scaled_normalize_reference(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``Norm(x) * s_qk`` (eq. 15, 16)."""
    return manifolds.normalize(x) * scale


def swiglu_reference(u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """``u * SiLU(v)`` (eq. 19)."""
    return u * F.silu(v)


def relu2_reference(x: torch.Tensor) -> torch.Tensor:
    """``relu(x)**2``."""
    return F.relu(x) ** 2


def scaled_linear_reference(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``(x W^T) * scale``, in that order."""
    return F.linear(x, weight) * scale


# ---------------------------------------------------------------- the ops

NORMALIZE = Op(
    "normalize",
    implementations={
        "reference": manifolds.normalize,
        "torch": normalize_fused,
        "triton": triton_calls.normalize_triton,
    },
    auto={"*": "torch"},
    takes={"triton": lambda x: x.dtype != torch.float64},  # the kernels compute in float32
)
QK_NORMALIZE = Op(
    "qk_normalize",
    implementations={
        "reference": scaled_normalize_reference,
        "torch": scaled_normalize_fused,
        "triton": triton_calls.scaled_normalize_triton,
    },
    auto={"*": "torch"},
    takes={"triton": lambda x, scale: x.dtype != torch.float64 and x.ndim == 4},  # per-head scales of (B, H, T, d_k)
)
#: update name -> its op
UPDATES: dict[str, Op] = {
    name: Op(
        name,
        implementations={
            "reference": reference,
            "torch": fused,
            "triton": triton,
        },
        auto={"*": "torch"},
        takes={"triton": triton_calls.update_takes},
    )
    for name, reference, fused, triton in (
        ("lerp", manifolds.lerp, lerp_normalize, triton_calls.lerp_triton),
        ("slerp", manifolds.slerp, slerp_normalize, triton_calls.slerp_triton),
        ("riemannian", manifolds.riemannian_update, riemannian_normalize, triton_calls.riemannian_triton),
    )
}
SWIGLU = Op(
    "swiglu",
    implementations={"reference": swiglu_reference, "torch": swiglu_fused, "triton": triton_calls.swiglu_triton},
    auto={"*": "torch"},
    # the kernels compute in float32 over same-shaped u and v (no broadcasting)
    takes={"triton": lambda u, v: torch.float64 not in (u.dtype, v.dtype) and u.shape == v.shape},
)
RELU2 = Op(
    "relu2",
    implementations={"reference": relu2_reference, "torch": relu2_fused, "triton": triton_calls.relu2_triton},
    auto={"*": "torch"},
    takes={"triton": lambda x: x.dtype != torch.float64},  # the kernels compute in float32
)
SCALED_LINEAR = Op(
    "scaled_linear",
    implementations={"reference": scaled_linear_reference, "torch": scaled_linear_fused},
    auto={"*": "torch"},
)


# ---------------------------------------------------------------- entry points


def normalize(x: torch.Tensor) -> torch.Tensor:
    """``Norm(x) = x / ‖x‖`` over the last dimension: ``h_A = Norm(ATTN(h))``,
    ``h_M = Norm(MLP(h))`` (Table 1, eq. 10, 11)."""
    return run(NORMALIZE, x)


def qk_normalize(x: torch.Tensor, s_qk: torch.Tensor, qk_norm: bool = True) -> torch.Tensor:
    """``Norm(x) * s_qk`` for the queries or keys of a head (eq. 15, 16); ``qk_norm=False``
    drops the ``Norm`` (Table 6). ``s_qk`` broadcasts against ``x``."""
    try:
        return run(QK_NORMALIZE, x, s_qk) if qk_norm else x * s_qk
    except Exception:
        check_broadcast("qk_normalize", "x, s_qk", x, s_qk)  # a ValueError naming the shapes, where they are the cause
        raise


def update_op(update: str, caller: str = "update_op") -> Op:
    """The op of the update named ``update`` (``"lerp"``, ``"slerp"``, ``"riemannian"``): what a
    block looks up once, when it is built. A ``ValueError`` naming ``caller`` for another name."""
    op = UPDATES.get(update)
    if op is None:
        raise ValueError(f"{caller}: unknown update {update!r}; expected one of {', '.join(UPDATES)}")
    return op


def _checked_update(caller: str, update: str | Op, h: torch.Tensor, block: torch.Tensor, alpha) -> Op:
    """The update's op (``update``: its name or the op), after the checks a failure would not
    reveal: the name, and an ``alpha`` of more than one dimension, which may broadcast past the
    points' shape (the definitions refuse that, where the fused functions would return the larger
    shape; the models' alpha is one dimension, which cannot)."""
    op = update if isinstance(update, Op) else update_op(update, caller)
    if isinstance(alpha, torch.Tensor) and alpha.dim() > 1:
        check_update(f"{caller}({op.name!r})", h, block, alpha)
    return op


def residual_update(update: str | Op, h: torch.Tensor, h_block: torch.Tensor, alpha) -> torch.Tensor:
    """The hidden state moved on the sphere towards the block's output ``h_block`` by the eigen
    learning rates ``alpha``: ``"lerp"`` ``Norm(h + alpha (h_block - h))`` (eq. 10, 11),
    ``"slerp"`` (eq. 6, then ``Norm``) or ``"riemannian"``
    ``Norm(h - alpha (h (h · h_block) - h_block))`` (eq. 24-26). ``update``: the name or its op."""
    op = _checked_update("residual_update", update, h, h_block, alpha)
    try:
        return run(op, h, h_block, alpha)
    except Exception:
        # a ValueError naming the shapes where they are the cause, else the implementation's error
        check_update(f"residual_update({op.name!r})", h, h_block, alpha)
        raise


#: the updates whose ``"torch"`` forward :func:`normalized_update` runs directly without gradients
_FORWARD_VALUES = {"lerp": _lerp_values, "riemannian": _riemannian_values}  # by name: torch.compile hashes no Op


def normalized_update(update: str | Op, h: torch.Tensor, block_out: torch.Tensor, alpha) -> torch.Tensor:
    """``residual_update(update, h, Norm(block_out), alpha)``: a sub-block's output normalized
    (``h_A = Norm(ATTN(h))``, ``h_M = Norm(MLP(h))``) and the hidden state moved towards it (eq.
    10, 11) in one call. ``update``: the update's name or its op (:func:`update_op`, as a block
    holds it). Without gradients, where both ops run ``"torch"``, their forward values are
    computed directly (no autograd function): the same values, fewer calls per token in decoding."""
    op = _checked_update("normalized_update", update, h, block_out, alpha)
    try:
        values = _FORWARD_VALUES.get(op.name)
        if (
            values is not None
            and not torch.is_grad_enabled()
            and NORMALIZE.implementation_name(block_out) == "torch"
            and op.implementation_name(h, block_out, alpha) == "torch"
        ):
            return values(h, _normalize_values(block_out, None)[0], alpha, None)[0]
        return run(op, h, run(NORMALIZE, block_out), alpha)
    except Exception:
        check_update(f"normalized_update({op.name!r})", h, block_out, alpha)  # as residual_update
        raise


def swiglu(u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """``u * SiLU(v)`` (eq. 19; ``v`` is the gate). ``u`` and ``v`` broadcast."""
    try:
        return run(SWIGLU, u, v)
    except Exception:
        check_broadcast("swiglu", "u, v", u, v)  # a ValueError naming the shapes, where they are the cause
        raise


def relu2(x: torch.Tensor) -> torch.Tensor:
    """``relu(x)**2``, the squared ReLU (ungated: ``x`` is the up projection)."""
    return run(RELU2, x)


def scaled_linear(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``(x W^T) * scale``, one factor per output feature. ``weight`` is ``(out_features,
    in_features)``; ``scale`` is ``(out_features,)``, ``(1,)`` or a scalar."""
    try:
        return run(SCALED_LINEAR, x, weight, scale)
    except Exception:
        check_linear("scaled_linear", x, weight, scale)  # a ValueError naming the shapes, where they are the cause
        raise
