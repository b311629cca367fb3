"""Which implementation of a row op (sphere-Adam, row normalization, the spherical-Muon tail)
steps which tensors: each op hands in its table (name -> function, one signature) and the
requested name, and the tensors are grouped by the implementation that takes them.

``None`` (or ``"auto"``): native on CPU, Triton on CUDA, the reference (``"foreach"``)
elsewhere; ``SPHERENET_KERNELS=triton``: Triton on every device (CPU tensors under
``TRITON_INTERPRET=1``), ``=torch``: never Triton. A named implementation is used where it can be
(``"native"``: CPU tensors), the reference elsewhere. Either way a tensor goes to the reference
when the chosen implementation is not in the op's table, its dtype is not one that
implementation takes, or its tensors are not contiguous and of the parameter's dtype. An
implementation chosen by ``None`` that cannot run (not built, Triton missing) is warned about
once and the reference takes its tensors.
"""

from __future__ import annotations

import importlib.util
import os
import warnings

import torch

__all__ = ["IMPLEMENTATION_CHOICES", "implementation_status", "run_by_implementation"]

IMPLEMENTATION_CHOICES = ("auto", "native", "triton", "foreach")
_ENVIRONMENT = os.environ.get("SPHERENET_KERNELS", "").strip().lower()
_DTYPES = {
    "native": (torch.float32, torch.float64, torch.bfloat16, torch.float16),
    # float64 is stepped in float32 by Triton: only when asked for by name
    "triton": (torch.float32, torch.bfloat16, torch.float16),
}
_warned: set[tuple[str, str]] = set()


def implementation_status(name: str) -> tuple[bool, str | None]:
    """Whether ``name`` can run here, and why not."""
    if name == "native":
        from . import native

        return native.native_status()
    if name == "triton" and importlib.util.find_spec("triton") is None:
        return False, "triton is not installed (pip install 'spherenet[triton]')"
    return True, None


def _wanted(requested: str, device_type: str) -> str:
    if requested == "auto":
        if _ENVIRONMENT == "triton":
            return "triton"
        if _ENVIRONMENT == "torch" and device_type == "cuda":
            return "foreach"
        return {"cpu": "native", "cuda": "triton"}.get(device_type, "foreach")
    if requested == "native" and device_type != "cpu":
        return "foreach"
    return requested


def _fits(name: str, tensors: list[torch.Tensor], explicit: bool) -> bool:
    x = tensors[0]
    dtypes = _DTYPES[name] + ((torch.float64,) if explicit and name == "triton" else ())
    return x.dtype in dtypes and all(t.is_contiguous() and t.dtype == x.dtype for t in tensors)


def run_by_implementation(op: str, table: dict, requested: str | None, lists, options: dict, checked: int = 4) -> None:
    """Call ``table[name](*sublists, **options)`` once per implementation ``name``, each with the
    positions of ``lists`` it takes; the first ``checked`` lists hold the tensors whose layout
    decides (the parameter first)."""
    requested = "auto" if requested is None else requested
    if requested not in IMPLEMENTATION_CHOICES:
        raise ValueError(f"{op}: implementation must be one of {IMPLEMENTATION_CHOICES} or None, got {requested!r}")
    by_name: dict[str, list[int]] = {}
    for i, x in enumerate(lists[0]):
        name = _wanted(requested, x.device.type)
        tensors = [lst[i] for lst in lists[:checked]]
        if name != "foreach" and (name not in table or not _fits(name, tensors, requested == name)):
            name = "foreach"
        by_name.setdefault(name, []).append(i)
    for name in [n for n in by_name if n != "foreach"]:
        available, reason = implementation_status(name)
        if available or requested == name:  # a named choice was checked by whoever named it
            continue
        if (op, name) not in _warned:
            _warned.add((op, name))
            warnings.warn(
                f"{op}: the {name} implementation is unavailable ({reason}); using the foreach one (same step, slower)",
                RuntimeWarning,
                stacklevel=4,
            )
        by_name.setdefault("foreach", []).extend(by_name.pop(name))
    for name, idx in by_name.items():
        whole = len(idx) == len(lists[0])
        table[name](*(lst if whole else [lst[i] for i in idx] for lst in lists), **options)
