"""Which parameters of a model lie on which manifold, declared by the module that owns them.

geoopt marks a manifold parameter by its tensor subclass (``ManifoldParameter``). That mark is
lost whenever a parameter is re-wrapped: FSDP2's ``fully_shard`` replaces it with
``nn.Parameter(DTensor)``, and ``load_state_dict(assign=True)`` with a plain ``nn.Parameter``.
An optimizer that relies on the subclass then silently runs Euclidean updates.

So each module also records, by attribute name, which of its own parameters lie on which
manifold. The record lives on the module, not on the tensor, and survives any re-wrapping:
``named_manifold_parameters`` looks the parameter up by name at call time.
"""

from __future__ import annotations

from typing import Iterator, NamedTuple

import torch
from torch import nn

__all__ = [
    "declare_manifold",
    "declared_manifolds",
    "named_manifold_parameters",
    "ManifoldEntry",
    "register_geometry",
    "geometry_for",
    "registered_geometries",
]

_ATTR = "_spherenet_manifolds"


class ManifoldEntry(NamedTuple):
    name: str  # qualified parameter name, as in model.named_parameters()
    param: torch.Tensor  # the parameter object the model holds now (possibly re-wrapped)
    manifold: nn.Module  # e.g. spherenet.manifolds.Sphere()
    module: nn.Module  # the owning module
    attr: str  # the attribute name on the owning module


def declare_manifold(module: nn.Module, attr: str, manifold: nn.Module) -> None:
    """Record that ``module.<attr>`` (a direct parameter of ``module``) lies on ``manifold``."""
    if attr not in module._parameters:
        raise KeyError(f"{type(module).__name__} has no direct parameter named {attr!r} to declare")
    # object.__setattr__: a dict must not be registered as a submodule or buffer.
    table = module.__dict__.setdefault(_ATTR, {})
    table[attr] = manifold


def declared_manifolds(module: nn.Module) -> dict[str, nn.Module]:
    """The ``{attr: manifold}`` declarations of ``module`` itself (not of its children)."""
    return dict(module.__dict__.get(_ATTR, {}))


def named_manifold_parameters(model: nn.Module) -> Iterator[ManifoldEntry]:
    """Every declared manifold parameter of ``model``, found through the owning modules.

    Works after ``fully_shard`` and ``load_state_dict(assign=True)``: the parameter is looked up
    by name on its module each time, so the current object is returned whatever its class.
    Raises ``RuntimeError`` when a declared parameter has disappeared from its module.
    """
    for mod_name, module in model.named_modules(remove_duplicate=True):
        for attr, manifold in declared_manifolds(module).items():
            param = module._parameters.get(attr)
            if param is None:
                raise RuntimeError(
                    f"{mod_name or type(model).__name__}.{attr} is declared on {manifold} "
                    "but the module no longer holds such a parameter"
                )
            full = f"{mod_name}.{attr}" if mod_name else attr
            yield ManifoldEntry(full, param, manifold, module, attr)


# ---------------------------------------------------------------------------------------------
# Geometries the optimizers step by asking them (every manifold but the row sphere, whose fused
# kernels live in spherenet.optim). A geometry is an object with:
#   name                                   the param groups' "manifold" value
#   init_state(x, like) -> dict            per-tensor constants kept in the optimizer state
#   proju(x, u, like) -> tensor            the tangent projection (gradient="riemannian")
#   step_(x, direction, lr, state, like)   x moved against ``direction`` and retracted, in place
# ``x``, ``u`` and ``direction`` are local tensors; ``like`` is the parameter (a DTensor under
# FSDP2) so that a whole-tensor reduction can sum over the ranks.

_GEOMETRIES: dict[str, object] = {}


def register_geometry(geometry) -> None:
    """Make ``geometry`` (see above) known to the optimizers under ``geometry.name``."""
    for attr in ("name", "init_state", "proju", "step_"):
        if not hasattr(geometry, attr):
            raise TypeError(f"register_geometry: {geometry!r} has no {attr!r}")
    if geometry.name in ("sphere", "euclidean"):
        raise ValueError(f"register_geometry: {geometry.name!r} is a built-in manifold name")
    _GEOMETRIES[geometry.name] = geometry


def geometry_for(name: str):
    """The registered geometry called ``name`` (``KeyError`` naming the known ones)."""
    try:
        return _GEOMETRIES[name]
    except KeyError:
        raise KeyError(f"no geometry {name!r}; registered: {sorted(_GEOMETRIES)}") from None


def registered_geometries() -> tuple[str, ...]:
    """The names of the registered geometries, in registration order."""
    return tuple(_GEOMETRIES)


class GeometryLists:
    """A registered geometry's operations over lists of local tensors, as
    :func:`spherenet.kernels.sphere_adam_` asks a manifold for them: ``states[i]`` holds the
    geometry's constants of ``xs[i]`` (:meth:`init_state`), ``likes[i]`` is its parameter (a
    DTensor under FSDP2, so that whole-tensor reductions sum over the ranks)."""

    def __init__(self, geometry, states: list[dict], likes: list):
        self.geometry, self.states, self.likes = geometry, states, likes

    def __repr__(self) -> str:
        return f"GeometryLists({self.geometry!r})"

    def proju_(self, xs, us) -> None:
        """Each ``u`` replaced by its part tangent at ``x``."""
        for x, u, like in zip(xs, us, self.likes):
            u.copy_(self.geometry.proju(x, u, like=like))

    def step_(self, xs, directions, lr: float) -> None:
        """Each ``x`` moved against its direction and retracted, by the geometry's ``step_``."""
        for x, d, state, like in zip(xs, directions, self.states, self.likes):
            self.geometry.step_(x, d, lr, state, like=like)

    @staticmethod
    def blocks(lists):
        """The lists whole, once: the geometry's norms are over whole tensors."""
        yield list(range(len(lists[0]))), lists
