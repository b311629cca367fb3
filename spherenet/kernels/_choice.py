"""Which implementation of a row op (sphere-Adam, row normalization, the spherical-Muon tail)
takes which tensors: the resolver's per-tensor fallbacks.

:func:`spherenet.kernels.resolve.resolve` names the implementation for the tensors' device type
(the op's argument, the setting: ``SPHERENET_KERNELS`` or ``configure()``, the op's ``auto`` table).
:func:`assign` then sends a tensor to the op's ``"torch"`` implementation (its foreach passes)
where the named one cannot take it: ``"native"`` on a tensor that is not on the CPU, a dtype the
implementation does not compute in (Triton: float32, bf16, fp16, and float64 in float32 only when
named explicitly), tensors that are not contiguous and of the parameter's dtype, another manifold
than the unit sphere's rows (only ``"torch"`` takes one; named explicitly, the others are refused),
or an implementation chosen without being named that cannot run here (not built, Triton missing:
warned about once).
"""

from __future__ import annotations

import importlib.util
import warnings

import torch

from .. import install_hint
from .resolve import Op, resolve

__all__ = ["implementation_status", "assign"]

_DTYPES = {
    "native": (torch.float32, torch.float64, torch.bfloat16, torch.float16),
    "triton": (torch.float32, torch.bfloat16, torch.float16),
}
_warned: set[tuple[str, str]] = set()


def implementation_status(name: str) -> tuple[bool, str | None]:
    """Whether the implementation ``name`` can run here, and why not."""
    if name == "native":
        from . import native

        return native.native_status()
    if name == "triton" and importlib.util.find_spec("triton") is None:
        return False, f"triton is not installed ({install_hint('triton')})"
    return True, None


def _fits(name: str, tensors: list[torch.Tensor], named: bool) -> bool:
    x = tensors[0]
    if name == "native" and x.device.type != "cpu":
        return False
    dtypes = _DTYPES[name] + ((torch.float64,) if named and name == "triton" else ())
    return x.dtype in dtypes and all(t.is_contiguous() and t.dtype == x.dtype for t in tensors)


def assign(op: Op, requested: str | None, lists, checked: int, rows_only: bool = False) -> list[tuple]:
    """``(implementation, sublists)`` pairs that together cover every position of ``lists``: call
    each ``implementation(*sublists, ...)``. The first ``checked`` lists hold the tensors whose
    layout decides (the parameter first); a tensor the named implementation cannot take goes to
    ``"torch"``. ``rows_only``: the tensors lie on another manifold than the unit sphere's rows,
    which only ``"torch"`` steps."""
    named = requested not in (None, "auto")
    if rows_only:
        name = resolve(op, requested, lists[0][0].device.type if lists[0] else "cpu")
        if named and name != "torch":
            raise ValueError(f"{op.name}: the {name} implementation steps the unit sphere's rows only; use 'torch'")
        return [(op.implementations["torch"], lists)] if lists[0] else []
    by_name: dict[str, list[int]] = {}
    for i, x in enumerate(lists[0]):
        name = resolve(op, requested, x.device.type)
        if name in _DTYPES and not _fits(name, [lst[i] for lst in lists[:checked]], named):
            name = "torch"
        by_name.setdefault(name, []).append(i)
    for name in [n for n in by_name if n in _DTYPES]:
        available, reason = implementation_status(name)
        if available or named:  # a named implementation was checked by whoever named it
            continue
        if (op.name, name) not in _warned:
            _warned.add((op.name, name))
            warnings.warn(
                f"{op.name}: the {name} implementation is unavailable ({reason}); using the torch one (same step, "
                "slower)",
                RuntimeWarning,
                stacklevel=4,
            )
        by_name.setdefault("torch", []).extend(sorted(by_name.pop(name)))
    whole = len(by_name) == 1
    return [
        (op.implementations[name], lists if whole else [[lst[i] for i in idx] for lst in lists])
        for name, idx in by_name.items()
    ]
