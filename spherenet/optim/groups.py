"""Param groups that tell an optimizer which parameters to keep on the sphere.

geoopt's optimizers recognise a sphere parameter by its tensor class (``ManifoldParameter``).
That class is lost when FSDP2's ``fully_shard`` or ``load_state_dict(assign=True)`` re-wraps the
parameter, and the optimizer then silently runs Euclidean Adam. spherenet instead reads the
owning modules' declarations (:func:`spherenet.manifolds.named_sphere_parameters`, a lookup by
attribute name made at call time) and writes the answer into the **param group**:
``group["manifold"]`` is ``"sphere"`` (:data:`spherenet.manifolds.SPHERE`, the unit sphere row by
row), the name of a registered geometry (``"matrix_sphere"``, :data:`spherenet.manifolds.MATRIX_SPHERE`,
or one registered with :func:`spherenet.manifolds.register_geometry`), or ``"euclidean"``.
The optimizers read that key and never inspect tensor classes.

The tensor class is still consulted in one place, to *refuse*: a ``ManifoldParameter`` on a
Sphere that sits in a Euclidean group (:func:`spherenet.manifolds.is_sphere_tensor`).
"""

from __future__ import annotations

from typing import Callable, Iterable

import torch
from torch import nn

from ..manifolds import (
    MATRIX_SPHERE,
    SPHERE,
    declared_on_geometries,
    is_sphere_tensor,
    named_sphere_parameters,
    registered_geometries,
)

__all__ = [
    "SPHERE",
    "MATRIX_SPHERE",
    "EUCLIDEAN",
    "known_manifolds",
    "sphere_parameters",
    "named_sphere_parameters",
    "param_groups",
    "is_matrix",
]

EUCLIDEAN = "euclidean"
_FUSED_DEVICES = ("cpu", "cuda", "xpu")
_FUSED_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def known_manifolds() -> tuple[str, ...]:
    """The values a param group's ``"manifold"`` may take: the row sphere, Euclidean space, and
    every registered geometry (:func:`spherenet.manifolds.register_geometry`)."""
    return (SPHERE, *registered_geometries(), EUCLIDEAN)


def sphere_parameters(model: nn.Module) -> list[torch.Tensor]:
    """The parameters of ``model`` declared on the unit sphere (see :func:`named_sphere_parameters`)."""
    return [p for _, p in named_sphere_parameters(model)]


def is_matrix(name: str, p: torch.Tensor) -> bool:
    """The GPT recipe's weight-decay rule: decay tensors with ``ndim >= 2`` (matrices and
    embeddings), not vectors (biases, norm gains, nGPT's scalings)."""
    return p.dim() >= 2


def param_groups(
    model: nn.Module,
    weight_decay: float = 0.0,
    *,
    decay: Callable[[str, torch.Tensor], bool] = is_matrix,
    **options,
) -> list[dict]:
    """Param groups for ``model`` with the manifold written into each group.

    Returns the groups below, empty ones left out, each with ``params`` given as
    ``(name, tensor)`` pairs (torch stores the names as ``group["param_names"]``):

    - ``{"manifold": "sphere", "weight_decay": 0.0}``: every declared sphere parameter. Weight
      decay never applies on the sphere: the retraction ``Norm`` undoes any shrinking, and an
      L2 term ``wd * x`` is normal to the sphere, so its tangent projection is zero.
    - ``{"manifold": <name>, "weight_decay": 0.0}``, one per registered geometry with declared
      parameters: e.g. ``"matrix_sphere"``, the parameters declared on a whole-matrix sphere
      (:func:`spherenet.manifolds.declare_matrix_sphere`); no decay, for the same reason.
    - ``{"manifold": "euclidean", "weight_decay": weight_decay}``: the other parameters for which
      ``decay(name, p)`` is true (default: ``ndim >= 2``, Table 3's GPT recipe).
    - ``{"manifold": "euclidean", "weight_decay": 0.0}``: the remaining parameters.

    ``options`` (``lr``, ``betas``, ...) are copied into every group. Parameters with
    ``requires_grad=False`` are left out. Raises ``ValueError`` when nothing is trainable and for
    the refusals of :func:`named_sphere_parameters`.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"param_groups expects an nn.Module, got {type(model).__name__}")
    if not weight_decay >= 0:
        raise ValueError(f"weight_decay must be >= 0, got {weight_decay!r}")
    sphere_ids = {id(p) for _, p in named_sphere_parameters(model)}
    on_geometry = {id(p): manifold.name for _, p, manifold in declared_on_geometries(model)}
    sphere, decayed, plain = [], [], []
    by_geometry: dict[str, list] = {}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if id(p) in sphere_ids:
            sphere.append((name, p))
        elif id(p) in on_geometry:
            by_geometry.setdefault(on_geometry[id(p)], []).append((name, p))
        elif weight_decay > 0 and decay(name, p):
            decayed.append((name, p))
        else:
            plain.append((name, p))
    groups = []
    if sphere:
        groups.append({"params": sphere, "manifold": SPHERE, "weight_decay": 0.0, **options})
    for geometry, params in by_geometry.items():
        groups.append({"params": params, "manifold": geometry, "weight_decay": 0.0, **options})
    if decayed:
        groups.append({"params": decayed, "manifold": EUCLIDEAN, "weight_decay": float(weight_decay), **options})
    if plain:
        groups.append({"params": plain, "manifold": EUCLIDEAN, "weight_decay": 0.0, **options})
    if not groups:
        raise ValueError(f"{type(model).__name__} has no trainable parameters")
    return groups


def _names_of(groups: Iterable[dict]) -> dict[int, str]:
    """``id(param) -> name`` from torch's ``param_names`` group key (when the groups are named)."""
    names = {}
    for g in groups:
        for name, p in zip(g.get("param_names", ()), g["params"]):
            names[id(p)] = name
    return names


def describe(p: torch.Tensor, names: dict[int, str]) -> str:
    name = names.get(id(p))
    return repr(name) if name is not None else f"of shape {tuple(p.shape)}"


def check_groups(
    groups: Iterable[dict], model: nn.Module | None, owner: str, names: dict[int, str] | None = None
) -> None:
    """Refuse param groups that would let a sphere parameter take Euclidean steps.

    - ``group["manifold"]`` must be one of :func:`known_manifolds`;
    - a ``ManifoldParameter`` on a sphere must sit in a sphere group;
    - with ``model``: every declared sphere parameter of ``model`` must sit in a sphere group.
    """
    groups = list(groups)
    names = _names_of(groups) if names is None else names
    placed = {}
    for g in groups:
        manifold = g.get("manifold", EUCLIDEAN)
        if manifold not in known_manifolds():
            raise ValueError(f"{owner}: param group manifold must be one of {known_manifolds()}, got {manifold!r}")
        for p in g["params"]:
            placed[id(p)] = manifold
            if manifold != SPHERE and is_sphere_tensor(p):
                raise ValueError(
                    f"{owner}: parameter {describe(p, names)} is a ManifoldParameter on the sphere but sits in "
                    f"a {manifold!r} param group; it would take Euclidean steps and leave the sphere. Build "
                    "the groups with spherenet.optim.param_groups(model), or pass the model."
                )
    if model is not None:
        declared = [(name, p, SPHERE) for name, p in named_sphere_parameters(model)]
        declared += [(name, p, manifold.name) for name, p, manifold in declared_on_geometries(model)]
        for name, p, manifold in declared:
            if not p.requires_grad:  # frozen (e.g. under LoRA): param_groups leaves it out
                continue
            where = placed.get(id(p))
            if where != manifold:
                raise ValueError(
                    f"{owner}: {name!r} is declared on {'the sphere' if manifold == SPHERE else repr(manifold)}"
                    " but is "
                    + ("in no param group" if where is None else f"in a {where!r} param group")
                    + ". Build the optimizer after fully_shard / load_state_dict(assign=True), from "
                    "spherenet.optim.param_groups(model)."
                )


def split_fused(option, tensors: list[torch.Tensor]) -> list[bool]:
    """Per tensor of a Euclidean group: take torch's fused Adam kernel? ``option=True/False``
    forces it; ``None`` picks it wherever torch has one (CPU/CUDA/XPU, float dtypes), small CPU
    tensors included (BENCHMARKS.md)."""
    if option is not None:
        return [bool(option)] * len(tensors)
    return [t.device.type in _FUSED_DEVICES and t.dtype in _FUSED_DTYPES for t in tensors]
