"""Which implementation runs an accelerated op: the one resolver, for the layer ops and the
optimizer's steps alike.

Every op of :mod:`spherenet.kernels` has implementations with the same signature and the same
values (to float rounding), named from one set, :data:`VALUES`:

- ``"reference"``: plain torch, written in the algorithm's order (every intermediate kept for
  autograd). The readable definition, and what the others are tested against.
- ``"torch"``: torch alone, fused where it pays: autograd functions that keep fewer activations,
  torch's foreach and fused kernels.
- ``"native"``: C++ (``torch.ops.spherenet``, compiled on first use), for CPU tensors.
- ``"triton"``: Triton kernels, for CUDA tensors (CPU tensors under ``TRITON_INTERPRET=1``).
- ``"auto"``: the op's own choice for the tensors' device type (its :attr:`Op.auto` table).

An op declares its implementations in one table and what ``"auto"`` takes per device type, as an
:class:`Op`; :func:`resolve` names the implementation to run. The choice, first that applies:

1. the op's explicit argument (the optimizer's ``sphere_kernel=``), unless ``None`` or ``"auto"``;
   an implementation the op lacks is a ``ValueError``;
2. the setting, :func:`setting`: ``SPHERENET_KERNELS`` as read at import (unset: ``"auto"``), or
   what :func:`configure` set since;
3. ``"auto"``.

The setting covers every op, so an op that lacks it takes its ``"auto"`` choice instead:
``SPHERENET_KERNELS=triton`` leaves the scaled linear (which has no Triton kernel: its scale is
folded into the matmul) on ``"torch"``. ``SPHERENET_KERNELS=reference`` runs every op's plain
reference; ``=torch`` keeps everything in torch (no C++ build, no Triton). Whether the named
implementation can run for given tensors (Triton installed, a dtype it computes in, the native
kernel built) is decided here too: an op declares, per implementation, which calls it takes
(:attr:`Op.takes`, e.g. Triton: no float64), and a call it does not take runs the op's
``"torch"`` implementation; the row ops do the same tensor by tensor
(:mod:`spherenet.kernels._choice`). An implementation never falls back on its family's module.

A call of a layer op (:func:`spherenet.kernels.layer_ops.run`) is decided once per device type,
dtype and whether a ``torch.func`` transform is active (:meth:`Op.decide`), and the decision is
kept on the op: the next call with the same three goes straight to the implementation.
:func:`configure` forgets every kept decision.

Under ``torch.func``'s transforms (``vmap``, ``grad``, ``jvp``, ``jacrev``, ...) a call runs
``"reference"``, whatever was chosen: plain torch operations, which the transforms batch and
differentiate, where the fused autograd functions and kernels declare no rules for them.
"""

from __future__ import annotations

import contextlib
import os
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.utils.checkpoint

from ..manifolds.geodesic import peek_transform

__all__ = [
    "VALUES",
    "ENVIRONMENT_VARIABLE",
    "Op",
    "resolve",
    "check",
    "setting",
    "configure",
    "environment",
    "checkpoint",
]

IMPLEMENTATIONS = ("reference", "torch", "native", "triton")
VALUES = ("auto", *IMPLEMENTATIONS)
ENVIRONMENT_VARIABLE = "SPHERENET_KERNELS"


def check(value: str, what: str = "kernel implementation") -> str:
    """``value`` if it is one of :data:`VALUES`, else a ``ValueError`` naming ``what``, the value
    and the allowed ones."""
    if value not in VALUES:
        raise ValueError(f"{what} must be one of {', '.join(VALUES)}, got {value!r}")
    return value


def _from_environment() -> str:
    value = os.environ.get(ENVIRONMENT_VARIABLE, "").strip().lower() or "auto"
    return check(value, ENVIRONMENT_VARIABLE)


_ENVIRONMENT = _from_environment()
_setting = _ENVIRONMENT
_OPS: weakref.WeakSet = weakref.WeakSet()  # every op, whose kept decisions configure() forgets


@dataclass(frozen=True, eq=False)  # an op is itself: compared and hashed by identity
class Op:
    """An accelerated op: ``implementations`` maps each name of :data:`VALUES` it has (never
    ``"auto"``) to whatever the op runs (a function, or a kernel name the op's code knows);
    ``auto`` maps a device type (``"cpu"``, ``"cuda"``, ...) to the implementation ``"auto"``
    takes there, ``"*"`` to the one for every other device type. ``takes`` maps an
    implementation to a predicate on a call's arguments: a call for which it is false runs
    ``"torch"`` instead (:func:`resolve` with ``args``)."""

    name: str
    implementations: Mapping[str, Any]
    auto: Mapping[str, str]
    takes: Mapping[str, Callable[..., bool]] = field(default_factory=dict)
    #: (device type, dtype, transform active) -> (implementation's name, its takes predicate or None)
    decided: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self):
        unknown = [k for k in self.implementations if k not in IMPLEMENTATIONS]
        if unknown:
            raise ValueError(f"op {self.name}: implementations {unknown} are not among {', '.join(IMPLEMENTATIONS)}")
        if "*" not in self.auto:
            raise ValueError(f"op {self.name}: its auto table needs a '*' entry (every other device type)")
        missing = sorted({v for v in self.auto.values() if v not in self.implementations})
        if missing:
            raise ValueError(f"op {self.name}: auto names {missing}, which it does not implement")
        if self.takes and "torch" not in self.implementations:
            raise ValueError(f"op {self.name}: its takes table needs a 'torch' implementation to send the rest to")
        unknown = sorted(k for k in self.takes if k not in self.implementations)
        if unknown:
            raise ValueError(f"op {self.name}: takes names {unknown}, which it does not implement")
        _OPS.add(self)

    def pick(self, device_type: str, requested: str | None = None) -> Any:
        """The implementation :func:`resolve` names, from the table."""
        return self.implementations[resolve(self, requested, device_type)]

    def implementation_name(self, *args) -> str:
        """The name of the implementation a call on ``args`` runs."""
        return resolve(self, None, args[0].device.type, args)

    def decide(self, device_type: str, dtype: torch.dtype, transform: bool) -> tuple[str, Any]:
        """``(name, its takes predicate or None)`` for calls on tensors of ``device_type`` and
        ``dtype`` (``transform``: a ``torch.func`` transform is active): decided by
        :func:`resolve` and kept in :attr:`decided` until :func:`configure`."""
        name = "reference" if transform and "reference" in self.implementations else resolve(self, None, device_type)
        decision = self.decided[device_type, dtype, transform] = (name, self.takes.get(name))
        return decision


def resolve(op: Op, requested: str | None = None, device_type: str = "cpu", args: tuple | None = None) -> str:
    """The name of the implementation of ``op`` to run on tensors of ``device_type``, by the order
    of the module docstring; ``requested`` is the op's explicit argument. Given the call's
    ``args``, an implementation whose :attr:`Op.takes` predicate refuses them gives way to
    ``"torch"``."""
    if requested is not None and requested != "auto":
        if requested not in op.implementations:
            check(requested, f"{op.name}'s implementation")
            raise ValueError(
                f"{op.name} has no {requested!r} implementation; it has {', '.join(op.implementations)} (or 'auto')"
            )
        name = requested
    else:
        name = _setting
        if name == "auto" or name not in op.implementations:
            name = op.auto.get(device_type, op.auto["*"])
    if args is not None and name != "reference" and "reference" in op.implementations and peek_transform() is not None:
        return "reference"
    if args is not None and name in op.takes and not op.takes[name](*args):
        return "torch"
    return name


def environment() -> str:
    """``SPHERENET_KERNELS``'s value as read at import (unset: ``"auto"``), whatever
    :func:`configure` set since: what decides whether the native kernel may be built at all."""
    return _ENVIRONMENT


def setting() -> str:
    """The name every op not given an explicit one follows: ``SPHERENET_KERNELS``'s, or the last
    :func:`configure`'s."""
    return _setting


def configure(name: str) -> str:
    """Make ``name`` (one of :data:`VALUES`) the setting every op not given an explicit
    implementation follows from now on, in this process, and forget every kept decision; returns
    the previous setting (to restore it). Under ``torch.compile`` the choice is fixed when the
    graph is traced."""
    global _setting
    check(name)
    previous, _setting = _setting, name
    for op in list(_OPS):
        op.decided.clear()
    return previous


@contextlib.contextmanager
def _setting_of(name: str):
    previous = configure(name) if name != _setting else None
    try:
        yield
    finally:
        if previous is not None:
            configure(previous)


def checkpoint(function, *args):
    """``torch.utils.checkpoint.checkpoint(function, *args, use_reentrant=False)`` whose
    recomputation in the backward pass runs the implementations of the forward pass, whatever the
    setting is by then (recomputing another graph would not match what the forward saved)."""
    if torch.compiler.is_compiling():
        return torch.utils.checkpoint.checkpoint(function, *args, use_reentrant=False)
    name = _setting
    contexts = lambda: (contextlib.nullcontext(), _setting_of(name))  # noqa: E731  (forward, recomputation)
    return torch.utils.checkpoint.checkpoint(function, *args, use_reentrant=False, context_fn=contexts)
