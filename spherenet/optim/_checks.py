"""Pieces shared by the optimizers: argument checks, the sphere layout and first-step point
checks, the local shard of an FSDP2 tensor, and the model-staleness check."""

from __future__ import annotations

import math
import warnings
import weakref

import torch
from torch import nn

from ..kernels.sphere_rows import RowOps
from ..manifolds import SPHERE, declared_spheres, named_sphere_parameters, point_tolerance
from .groups import describe

try:  # torch >= 2.4 public path
    from torch.distributed.tensor import DTensor, Partial, Shard
except ImportError:  # pragma: no cover - torch.distributed missing or too old
    DTensor = Partial = Shard = None  # type: ignore[assignment]

OFF_SPHERE_POLICIES = ("project", "error")
_ROWS = RowOps()


def is_dtensor(t: torch.Tensor) -> bool:
    return DTensor is not None and isinstance(t, DTensor)


def local(t: torch.Tensor) -> torch.Tensor:
    """The local shard of an FSDP2/DTensor tensor (a view sharing its storage), else ``t``.

    Callers run under ``torch.no_grad()``, where ``to_local()`` returns the shard itself, so
    in-place updates of the result update the parameter.
    """
    return t.to_local() if is_dtensor(t) else t


def check_sphere_layout(p: torch.Tensor, name: str) -> None:
    """Refuse a sphere parameter whose rows would not be whole on this rank.

    Raises ``ValueError`` for 0-d tensors, a last dimension of size < 2 (a "sphere" of isolated
    points), complex dtypes, and DTensors sharded along the last dimension or holding partial
    sums (a row norm on the local data would then be wrong without communication).
    """
    if p.dim() < 1 or p.shape[-1] < 2:
        raise ValueError(
            f"sphere parameter {name!r} has shape {tuple(p.shape)}: the unit vectors lie along the "
            "last dimension, which must have size >= 2"
        )
    if p.is_complex() or not p.is_floating_point():
        raise ValueError(f"sphere parameter {name!r} has dtype {p.dtype}; only real floating point is supported")
    if is_dtensor(p):
        last = p.dim() - 1
        for placement in p.placements:
            if isinstance(placement, Shard) and placement.dim % p.dim() == last:
                raise ValueError(
                    f"sphere parameter {name!r} is sharded along its last dimension ({p.placements}): "
                    "its unit vectors would be split across ranks. Shard another dimension (FSDP2 "
                    "shards dim 0; store the sphere dimension last and keep ndim >= 2)."
                )
            if isinstance(placement, Partial):
                raise ValueError(f"sphere parameter {name!r} has a Partial placement; cannot normalize rows locally")


def check_positive_float(name: str, value, *, allow_zero: bool = False) -> None:
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"{name} must be a scalar, got a tensor of shape {tuple(value.shape)}")
        value = float(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number, got {value!r}")
    ok = value >= 0 if allow_zero else value > 0
    if not (ok and math.isfinite(value)):
        raise ValueError(f"{name} must be {'>= 0' if allow_zero else '> 0'} and finite, got {value!r}")


def check_betas(betas) -> None:
    try:
        b1, b2 = betas
    except (TypeError, ValueError):
        raise ValueError(f"betas must be a pair (beta1, beta2), got {betas!r}") from None
    for i, b in enumerate((b1, b2)):
        if isinstance(b, torch.Tensor):
            b = float(b)
        if isinstance(b, bool) or not isinstance(b, (int, float)) or not 0.0 <= b < 1.0:
            raise ValueError(f"betas[{i}] must be in [0, 1), got {b!r}")


def check_off_sphere(policy: str) -> None:
    if policy not in OFF_SPHERE_POLICIES:
        raise ValueError(f"off_sphere must be one of {OFF_SPHERE_POLICIES}, got {policy!r}")


def ensure_on_sphere(
    params: list[torch.Tensor],
    locals_: list[torch.Tensor],
    names: dict[int, str],
    policy: str,
    owner: str,
    stacklevel: int = 6,
) -> None:
    """The first-step check: every row of every sphere parameter must be unit.

    ``policy="project"``: rows off the sphere (beyond :func:`point_tolerance` of the dtype) are
    normalized in place with a ``UserWarning`` naming the parameters; ``policy="error"``: raise
    ``ValueError``. A zero row (no direction to project to) always raises.
    """
    if not params:
        return
    errors = [float(e) for e in _ROWS.norm_errors(locals_)]
    bad = [(p, x, e) for p, x, e in zip(params, locals_, errors) if not e <= point_tolerance(x.dtype)]
    # A rank holding no rows of a parameter has nothing to check; the check is local (rows whole).
    if not bad:
        return
    listing = ", ".join(f"{describe(p, names)} (max |norm - 1| = {e:.3g})" for p, _, e in bad[:5])
    more = f" and {len(bad) - 5} more" if len(bad) > 5 else ""
    for p, x, _ in bad:
        if x.numel() and bool((torch.linalg.vector_norm(x, dim=-1) == 0).any()):
            raise ValueError(f"{owner}: sphere parameter {describe(p, names)} has a zero row: it has no direction")
    if policy == "error":
        raise ValueError(
            f"{owner}: sphere parameters are not unit along their last dimension at the first step: "
            f"{listing}{more}. Normalize them (spherenet.optim.normalize_(model)) or pass off_sphere='project'."
        )
    warnings.warn(
        f"{owner}: projecting sphere parameters onto the sphere at the first step: {listing}{more}",
        UserWarning,
        stacklevel=stacklevel,  # the user's optimizer.step() call, through torch's step wrappers
    )
    _ROWS.retr_([x for _, x, _ in bad])


class ModelWatch:
    """Remembers the model an optimizer was built for and checks, at each step, that every
    sphere parameter the model declares *now* is one that the optimizer keeps on the sphere.

    Catches an optimizer built before ``fully_shard`` or ``load_state_dict(assign=True)``
    replaced the parameters: it would update tensors the model no longer uses.

    The full check walks the whole model. Once it has passed, a step only confirms what it saw: each sphere
    parameter is still the object its module holds, and each module on the way from the root
    to it is still its parent's child. That catches every replacement of a parameter or of a
    module holding one; the full walk runs again when the optimizer's sphere groups change,
    when anything confirmed differs, and every ``full_every`` steps (a sphere module *added*
    to the model after the optimizer was built is caught there).
    """

    full_every = 100

    def __init__(self, model: nn.Module | None):
        self._ref = weakref.ref(model) if model is not None else None
        self._seen: tuple | None = None  # (ids of the placed parameters, [(owner, key, child)])
        self._steps_since_full = 0

    @property
    def model(self) -> nn.Module | None:
        return self._ref() if self._ref is not None else None

    def check(self, param_groups: list[dict], owner: str) -> None:
        model = self.model
        if model is None:
            return
        placed = tuple(id(p) for g in param_groups if g.get("manifold") == SPHERE for p in g["params"])
        self._steps_since_full += 1
        if (
            self._seen is not None
            and self._seen[0] == placed
            and self._steps_since_full < self.full_every
            and all(table.get(key) is child for table, key, child in self._seen[1])
        ):
            return
        placed_set = set(placed)
        for name, p in named_sphere_parameters(model):
            if id(p) not in placed_set and p.requires_grad:  # a frozen one (e.g. under LoRA) is not trained
                raise RuntimeError(
                    f"{owner}: the model's sphere parameter {name!r} is not one this optimizer holds in a sphere "
                    "group. Its parameters were replaced after the optimizer was built (fully_shard, "
                    "load_state_dict(assign=True), ...): build the optimizer again from the model."
                )
        self._seen = (placed, _sphere_links(model))
        self._steps_since_full = 0


def _sphere_links(model: nn.Module) -> list[tuple[dict, str, object]]:
    """``(table, key, object)`` with ``table[key] is object`` for every sphere parameter of
    ``model`` (``module._parameters``) and every module on the path from ``model`` to its owner
    (``parent._modules``), each link once."""
    links: dict[tuple[int, str], tuple[dict, str, object]] = {}
    modules = dict(model.named_modules(remove_duplicate=True))
    for entry in declared_spheres(model):
        links[(id(entry.module._parameters), entry.attr)] = (entry.module._parameters, entry.attr, entry.param)
        path = entry.name.split(".")[:-1]  # the owning module's qualified name, split
        for depth in range(len(path)):
            parent = modules[".".join(path[:depth])]
            links[(id(parent._modules), path[depth])] = (parent._modules, path[depth], parent._modules[path[depth]])
    return list(links.values())
