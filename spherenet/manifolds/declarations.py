"""The one way to declare a weight on the unit sphere, and the one way to ask about it.

A layer declares: :func:`declare_sphere` (``module.<attr>`` is a stack of unit vectors along
its last dimension). Everything else reads: :func:`sphere_dim` for one parameter,
:func:`declared_spheres` (or its ``(name, param)`` view :func:`named_sphere_parameters`) for a
model -- the optimizers (param groups), the
renormalization of Section 2.6 step 2, checkpoint export, training diagnostics. The declaration
lives on the owning module (:mod:`spherenet.manifolds.registry`), so it survives FSDP2's
``fully_shard`` and ``load_state_dict(assign=True)``, which re-wrap the parameter and drop
geoopt's ``ManifoldParameter`` class.

:data:`SPHERE` is the sphere's name, the value of ``group["manifold"]`` in param groups;
:data:`UNIT_SPHERE` is the manifold itself (geoopt's operations, random points).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from .matrix_sphere import MatrixSphere
from .registry import declare_manifold, declared_manifolds, named_manifold_parameters, registered_geometries
from .sphere import Sphere, geoopt

__all__ = [
    "SPHERE",
    "UNIT_SPHERE",
    "SphereParameter",
    "declare_sphere",
    "sphere_dim",
    "declared_spheres",
    "named_sphere_parameters",
    "is_unit_sphere",
    "is_sphere_tensor",
    "declare_matrix_sphere",
    "declared_matrix_spheres",
    "declared_on_geometries",
]

#: The name of the unit sphere: ``group["manifold"]`` of a param group of sphere weights.
SPHERE = "sphere"
#: The unit sphere along the last dimension, shared by all sphere weights (stateless).
UNIT_SPHERE = Sphere()


class SphereParameter(NamedTuple):
    name: str  # qualified name, as in model.named_parameters()
    param: torch.Tensor  # the parameter the model holds now (possibly re-wrapped)
    dim: int  # the axis of the unit vectors, >= 0 (always the last one)
    module: nn.Module  # the owning module
    attr: str  # the attribute name on the owning module


def is_unit_sphere(manifold) -> bool:
    """geoopt's Sphere (or spherenet's subclass) without a subspace constraint: the unit sphere
    along the last dimension, retraction ``x / ||x||``."""
    return isinstance(manifold, geoopt.manifolds.Sphere) and getattr(manifold, "projector", None) is None


def is_sphere_tensor(p: torch.Tensor) -> bool:
    """Whether the tensor itself carries geoopt's mark of the unit sphere (a ``ManifoldParameter``).
    Only for refusing: the mark is lost on re-wrapping; ask :func:`sphere_dim` instead."""
    return isinstance(p, geoopt.ManifoldParameter) and is_unit_sphere(p.manifold)


def declare_sphere(module: nn.Module, attr: str = "weight", dim: int = -1) -> None:
    """Declare that ``module.<attr>`` (a direct parameter of ``module``) is made of unit vectors
    along ``dim``. Only the last dimension is supported: the optimizers normalize rows, and FSDP2
    shards dim 0, so a row is never split across ranks (store a matrix transposed instead)."""
    param = module._parameters.get(attr)
    if param is None:
        raise KeyError(f"{type(module).__name__} has no direct parameter named {attr!r} to declare")
    if param.dim() < 1 or dim not in (-1, param.dim() - 1):
        raise ValueError(
            f"{type(module).__name__}.{attr} of shape {tuple(param.shape)}: sphere weights hold their unit "
            f"vectors along the last dimension, got dim={dim}; store the tensor with that axis last"
        )
    declare_manifold(module, attr, UNIT_SPHERE)


def sphere_dim(module: nn.Module, attr: str = "weight") -> int | None:
    """The axis (``>= 0``) along which ``module.<attr>`` holds unit vectors, or ``None`` when it
    is not declared on the unit sphere."""
    manifold = declared_manifolds(module).get(attr)
    param = module._parameters.get(attr)
    if manifold is None or param is None or not is_unit_sphere(manifold):
        return None
    return param.dim() - 1


def declared_spheres(model: nn.Module) -> list[SphereParameter]:
    """Every parameter of ``model`` declared on the unit sphere, in ``named_parameters()``
    order, each once (a tied parameter under its first name).

    The parameter objects are those the model holds *now*, whatever their class (``DTensor``
    after ``fully_shard``, plain ``Parameter`` after ``load_state_dict(assign=True)``). Raises
    ``ValueError`` for a parameter declared on a manifold spherenet does not know (nothing would
    keep it there), and for a geoopt ``ManifoldParameter`` on a sphere that its module did not declare
    (re-wrapping would silently lose it).
    """
    declared: dict[int, tuple] = {}
    for entry in named_manifold_parameters(model):
        if getattr(entry.manifold, "name", None) in registered_geometries():
            continue  # a registered geometry (e.g. the whole-matrix sphere): declared_on_geometries
        if not is_unit_sphere(entry.manifold):
            raise ValueError(
                f"parameter {entry.name!r} is declared on {entry.manifold!r}; spherenet supports the unit "
                "sphere along the last dimension (spherenet.manifolds.declare_sphere) and the whole-matrix "
                "sphere (spherenet.manifolds.declare_matrix_sphere)"
            )
        declared.setdefault(id(entry.param), (entry.module, entry.attr))
    out = []
    for name, p in model.named_parameters():
        if id(p) in declared:
            module, attr = declared.pop(id(p))
            out.append(SphereParameter(name, p, p.dim() - 1, module, attr))
        elif isinstance(p, geoopt.ManifoldParameter) and not isinstance(p.manifold, geoopt.manifolds.Euclidean):
            raise ValueError(
                f"parameter {name!r} is a geoopt ManifoldParameter on {p.manifold!r} but its module does "
                "not declare it (spherenet.manifolds.declare_sphere(module, attr)). An undeclared "
                "manifold is lost when the parameter is re-wrapped (FSDP2, load_state_dict(assign=True)); "
                "declare it so every optimizer can find it."
            )
    return out


def named_sphere_parameters(model: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """``(name, parameter)`` of every sphere weight of ``model``: :func:`declared_spheres` in
    the form of ``model.named_parameters()``."""
    return [(entry.name, entry.param) for entry in declared_spheres(model)]


def declare_matrix_sphere(module: nn.Module, attr: str = "weight", radius: float | None = None) -> MatrixSphere:
    """Declare that ``module.<attr>`` lies on the sphere of its Frobenius norm (the whole tensor
    is one point: Hyperball's constraint). ``radius=None`` keeps the norm it has when an
    optimizer first steps it; a given ``radius`` scales it onto that sphere now. Returns the
    manifold. Refused for a parameter already declared on the row sphere."""
    param = module._parameters.get(attr)
    if param is None:
        raise KeyError(f"{type(module).__name__} has no direct parameter named {attr!r} to declare")
    if attr in declared_manifolds(module) and not isinstance(declared_manifolds(module)[attr], MatrixSphere):
        raise ValueError(
            f"{type(module).__name__}.{attr} is declared on {declared_manifolds(module)[attr]!r} already; a tensor "
            "lies on one manifold"
        )
    if param.dim() < 1 or param.numel() < 2 or not param.is_floating_point():
        raise ValueError(
            f"{type(module).__name__}.{attr} of shape {tuple(param.shape)} ({param.dtype}): a whole-tensor sphere "
            "needs a floating-point tensor of at least 2 elements"
        )
    manifold = MatrixSphere(radius)
    if radius is not None:
        with torch.no_grad():
            param.copy_(manifold.projx(param, torch.tensor(float(radius))))
    declare_manifold(module, attr, manifold)
    return manifold


def declared_on_geometries(model: nn.Module) -> list[tuple[str, torch.Tensor, object]]:
    """``(name, parameter, manifold)`` of every parameter of ``model`` declared on a registered
    geometry (:func:`spherenet.manifolds.register_geometry`; the row sphere is not one), in
    ``named_parameters()`` order, each once. ``manifold.name`` is its param groups' ``"manifold"``."""
    known = registered_geometries()
    declared = {}
    for entry in named_manifold_parameters(model):
        if getattr(entry.manifold, "name", None) in known:
            declared.setdefault(id(entry.param), entry.manifold)
    return [(name, p, declared.pop(id(p))) for name, p in model.named_parameters() if id(p) in declared]


def declared_matrix_spheres(model: nn.Module) -> list[tuple[str, torch.Tensor, MatrixSphere]]:
    """:func:`declared_on_geometries` restricted to whole-matrix spheres."""
    return [entry for entry in declared_on_geometries(model) if isinstance(entry[2], MatrixSphere)]
