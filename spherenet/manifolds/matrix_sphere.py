"""The sphere of whole matrices: ``{W : ||W||_F = R}`` (Hyperball).

Layout: the **whole tensor** is one point (not its rows, as for :class:`Sphere`); the radius
``R`` is the tensor's Frobenius norm. Wen, Dang, Lyu, Ma and Liang (arXiv 2606.16899) hold
each hidden matrix of a Transformer on such a sphere and each update at a fixed norm:

    W <- R Normalize(W - lr R Normalize(u))

where ``u`` is the base optimizer's direction (Adam's ``m / (sqrt(v) + eps)``: AdamH; Muon's
orthogonalized momentum: MuonH) and ``Normalize(A) = A / ||A||_F``. So every step turns the
matrix by an angle of about ``lr`` radians, whatever the scale of ``u``.

The operations follow geoopt's names (``projx``, ``proju``, ``retr``) and add the one this
geometry needs beyond them, :meth:`MatrixSphere.normalize_update`. Every norm and inner
product is over the whole tensor. On an FSDP2 shard (a ``DTensor`` sharded along dim 0) they
take the *local* tensor and ``like=`` the DTensor, and sum over the ranks that hold the other
rows (one all-reduce of a scalar per tensor).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from .registry import register_geometry

__all__ = ["MATRIX_SPHERE", "MatrixSphere"]

#: The name of the whole-matrix sphere: ``group["manifold"]`` of a param group of such matrices.
MATRIX_SPHERE = "matrix_sphere"

# Below this norm a direction is taken as zero (no update) instead of divided by.
_TINY_NORM = 1e-30


def _sum_over_shards(value: torch.Tensor, like: torch.Tensor | None) -> torch.Tensor:
    """``value`` (a 0-d partial sum over this rank's rows) summed over the ranks of ``like``'s
    mesh when ``like`` is a sharded DTensor; else ``value``."""
    try:
        from torch.distributed.tensor import DTensor, Shard
    except ImportError:  # pragma: no cover - torch.distributed missing
        return value
    if isinstance(like, DTensor) and any(isinstance(p, Shard) for p in like.placements):
        for dim, placement in enumerate(like.placements):
            if isinstance(placement, Shard):
                dist.all_reduce(value, group=like.device_mesh.get_group(dim))
    return value


class MatrixSphere:
    """The sphere of tensors of Frobenius norm ``radius``.

    ``radius=None`` (the default): the norm the tensor has when an optimizer first steps it,
    kept from then on in the optimizer's state (``state["radius"]``), so it is saved and
    restored with the optimizer and a resumed run keeps it exactly. A given ``radius``: the
    tensor is scaled onto that sphere when declared (:func:`declare_matrix_sphere`). Radii are
    Python floats.
    """

    name = MATRIX_SPHERE

    def __init__(self, radius: float | None = None):
        if radius is not None and not (isinstance(radius, (int, float)) and radius > 0 and radius < float("inf")):
            raise ValueError(f"MatrixSphere: radius must be a positive finite number or None, got {radius!r}")
        self.radius = None if radius is None else float(radius)

    def __repr__(self) -> str:
        return f"MatrixSphere(radius={self.radius})"

    # -- norms and inner products over the whole tensor (fp32 accumulation) -----------------

    @staticmethod
    def inner(x: torch.Tensor, u: torch.Tensor, like: torch.Tensor | None = None) -> torch.Tensor:
        """``<x, u>_F`` as a 0-d float32+ tensor (summed over shards with ``like``)."""
        work = torch.float64 if x.dtype == torch.float64 else torch.float32
        value = (x.to(work) * u.to(work)).sum()
        return _sum_over_shards(value, like)

    @classmethod
    def norm(cls, x: torch.Tensor, like: torch.Tensor | None = None) -> torch.Tensor:
        """``||x||_F`` as a 0-d float32+ tensor (summed over shards with ``like``)."""
        return cls.inner(x, x, like).sqrt()

    def initial_radius(self, x: torch.Tensor, like: torch.Tensor | None = None) -> float:
        """The radius an optimizer keeps for ``x`` (a Python float, so that loading a state
        never casts it to a low-precision parameter dtype): the given one, or ``||x||_F`` now."""
        if self.radius is not None:
            return self.radius
        return float(self.norm(x, like))

    # -- the geometry --------------------------------------------------------------------------

    def projx(self, x: torch.Tensor, radius, like: torch.Tensor | None = None) -> torch.Tensor:
        """``radius * x / ||x||_F``: the nearest point of the sphere."""
        return x * (radius / self.norm(x, like).clamp_min(_TINY_NORM)).to(x.dtype)

    def proju(self, x: torch.Tensor, u: torch.Tensor, like: torch.Tensor | None = None) -> torch.Tensor:
        """``u - <x, u> / <x, x> x``: the part of ``u`` tangent to the sphere at ``x``."""
        coef = self.inner(x, u, like) / self.inner(x, x, like).clamp_min(_TINY_NORM)
        return u - coef.to(u.dtype) * x

    def normalize_update(self, u: torch.Tensor, radius, like: torch.Tensor | None = None) -> torch.Tensor:
        """``radius * u / ||u||_F``: the update at the sphere's scale (zero stays zero)."""
        n = self.norm(u, like)
        scale = torch.where(n > _TINY_NORM, radius / n.clamp_min(_TINY_NORM), torch.zeros_like(n))
        return u * scale.to(u.dtype)

    def retr(self, x: torch.Tensor, u: torch.Tensor, radius, like: torch.Tensor | None = None) -> torch.Tensor:
        """``radius * Normalize(x + u)``: the retraction."""
        return self.projx(x + u, radius, like)

    # -- what an optimizer asks (spherenet.manifolds.registry) ---------------------------------

    def init_state(self, x: torch.Tensor, like: torch.Tensor | None = None) -> dict:
        """``{"radius": R}``: the radius kept in the optimizer's state for ``x``."""
        return {"radius": self.initial_radius(x, like)}

    def step_(self, x: torch.Tensor, direction: torch.Tensor, lr: float, state: dict, like=None) -> None:
        """``x <- R Normalize(x - lr R Normalize(direction))`` in place (the Hyperball update),
        ``R = state["radius"]``."""
        radius = state["radius"]
        update = self.normalize_update(direction, radius, like)
        x.copy_(self.retr(x, update.mul_(-lr), radius, like))

    def norm_error(self, x: torch.Tensor, radius) -> torch.Tensor:
        """``| ||x||_F / radius - 1 |`` (relative)."""
        return (self.norm(x) / radius - 1).abs()


register_geometry(MatrixSphere())  # the operations; each declaration may carry its own radius
