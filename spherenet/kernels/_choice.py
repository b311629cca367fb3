"""Running a row op (sphere-Adam, row normalization, the spherical-Muon tail) with the
implementation the resolver names, tensor by tensor.

:func:`spherenet.kernels.resolve.resolve` names the implementation for the tensors' device type
(the op's argument, a ``use()`` block, ``SPHERENET_KERNELS``, the op's ``auto`` table). The row
ops then send a tensor to their plain-torch reference where that implementation cannot take it:
``"native"`` on a tensor that is not on the CPU, a dtype the implementation does not compute in
(Triton: float32, bf16, fp16, and float64 in float32 only when named explicitly), tensors that
are not contiguous and of the parameter's dtype, or an implementation chosen without being named
that cannot run here (not built, Triton missing: warned about once).
"""

from __future__ import annotations

import importlib.util
import warnings

import torch

from .. import install_hint
from .resolve import Op, resolve

__all__ = ["implementation_status", "run"]

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


def run(op: Op, requested: str | None, lists, options: dict, checked: int) -> None:
    """Call ``op.implementations[name](*sublists, **options)`` once per implementation ``name``,
    each with the positions of ``lists`` it takes. The first ``checked`` lists hold the tensors
    whose layout decides (the parameter first); a tensor no other implementation takes goes to
    ``"reference"``."""
    named = requested not in (None, "auto")
    by_name: dict[str, list[int]] = {}
    for i, x in enumerate(lists[0]):
        name = resolve(op, requested, x.device.type)
        if name in _DTYPES and not _fits(name, [lst[i] for lst in lists[:checked]], named):
            name = "reference"
        by_name.setdefault(name, []).append(i)
    for name in [n for n in by_name if n in _DTYPES]:
        available, reason = implementation_status(name)
        if available or named:  # a named implementation was checked by whoever named it
            continue
        if (op.name, name) not in _warned:
            _warned.add((op.name, name))
            warnings.warn(
                f"{op.name}: the {name} implementation is unavailable ({reason}); using the reference (same step, "
                "slower)",
                RuntimeWarning,
                stacklevel=4,
            )
        by_name.setdefault("reference", []).extend(by_name.pop(name))
    for name, idx in by_name.items():
        whole = len(idx) == len(lists[0])
        op.implementations[name](*(lst if whole else [lst[i] for i in idx] for lst in lists), **options)
