"""Linear maps and embeddings whose weights are unit vectors, declared on the Sphere.

Every weight here is a ``geoopt.ManifoldParameter`` on :data:`spherenet.manifolds.UNIT_SPHERE`,
stored with its sphere dimension **last** (geoopt's Sphere normalizes the last dimension, and
FSDP2 shards dim 0, so a unit vector is never split across ranks). The owning module also
declares it (:func:`spherenet.manifolds.declare_sphere`), so optimizers still find it after the
parameter is re-wrapped by FSDP2 or ``load_state_dict(assign=True)``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .. import kernels
from ..manifolds import UNIT_SPHERE, declare_sphere
from ..manifolds.sphere import geoopt

__all__ = ["SphereLinear", "SphereEmbedding", "scaled", "is_plain"]


def _check_size(name: str, value) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


def _sphere_parameter(shape: tuple[int, ...]) -> geoopt.ManifoldParameter:
    # Normal init then Norm (Section A.5: the std does not matter once normalized).
    return geoopt.ManifoldParameter(UNIT_SPHERE.random_point(*shape), manifold=UNIT_SPHERE)


class SphereLinear(nn.Module):
    """``y = x W`` with W made of unit vectors along its d_model-sized side.

    ``sphere="in"``: the input side is the embedding dimension (W_q, W_k, W_v, W_u, W_v-gate,
    and E_out for the logits): each output feature is a cosine similarity between ``x`` and a
    unit vector of size ``in_features``. Stored as ``(out_features, in_features)``.

    ``sphere="out"``: the output side is the embedding dimension (W_o, W_o_mlp): each input
    feature contributes a unit vector of size ``out_features``. Stored **transposed**, as
    ``(in_features, out_features)``, so the unit vectors are the rows.

    No bias (nGPT has none; a bias would not live on the sphere).
    """

    def __init__(self, in_features: int, out_features: int, sphere: str = "in"):
        super().__init__()
        _check_size("in_features", in_features)
        _check_size("out_features", out_features)
        if sphere not in ("in", "out"):
            raise ValueError(f"SphereLinear sphere must be 'in' or 'out', got {sphere!r}")
        self.in_features, self.out_features, self.sphere = in_features, out_features, sphere
        shape = (out_features, in_features) if sphere == "in" else (in_features, out_features)
        self.weight = _sphere_parameter(shape)
        declare_sphere(self, "weight")

    def reset_parameters(self) -> None:
        with torch.no_grad():
            self.weight.copy_(
                UNIT_SPHERE.random_point(*self.weight.shape, dtype=self.weight.dtype, device=self.weight.device)
            )

    def matrix(self) -> torch.Tensor:
        """The weight in torch's ``(out_features, in_features)`` convention."""
        return self.weight if self.sphere == "in" else self.weight.t()

    def forward(self, x: torch.Tensor, out_scale: torch.Tensor | None = None) -> torch.Tensor:
        """``x W``, or ``(x W) * out_scale`` (one factor per output feature, shape
        ``(out_features,)`` or ``(1,)``: s_u, s_v, s_z of eq. 20, 21, 3), through
        :func:`spherenet.kernels.scaled_linear`."""
        if x.shape[-1] != self.in_features:
            raise ValueError(
                f"SphereLinear expected input with last dimension {self.in_features}, got shape {tuple(x.shape)}"
            )
        if out_scale is None:
            return F.linear(x, self.matrix())
        return kernels.scaled_linear(x, self.matrix(), out_scale)

    def scaled_matrix(self, scale: torch.Tensor) -> torch.Tensor:
        """``matrix()`` with row ``i`` times ``scale[i]`` (``scale``: ``(out_features,)`` or
        ``(1,)``), in the weight's dtype: the output scaling folded into the weight."""
        matrix = self.matrix()
        return (matrix * scale.unsqueeze(-1)).to(matrix.dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, sphere={self.sphere}"


def is_plain(linear: nn.Module) -> bool:
    """Whether ``linear`` computes ``x W`` from its own ``weight`` alone: a :class:`SphereLinear`
    not wrapped (a LoRA wrapper adds its update to the weight) and not re-defined."""
    return isinstance(linear, SphereLinear) and type(linear).forward is SphereLinear.forward


def scaled(linear: nn.Module, x: torch.Tensor, scale, factor: float = 1.0) -> torch.Tensor:
    """``(x W) * (scale() * factor)`` through ``linear``'s ``forward(x, out_scale=...)`` (a
    :class:`SphereLinear`, or a LoRA wrapper of one) for a :class:`~spherenet.layers.Scale`
    ``scale``: s_u, s_v, s_z of eq. 20, 21, 3."""
    return linear(x, out_scale=scale() if factor == 1.0 else scale() * factor)


class SphereEmbedding(nn.Module):
    """An embedding table whose rows are unit vectors of size ``dim`` (E_input, Section 2.1)."""

    def __init__(self, num_embeddings: int, dim: int):
        super().__init__()
        _check_size("num_embeddings", num_embeddings)
        _check_size("dim", dim)
        self.num_embeddings, self.dim = num_embeddings, dim
        self.weight = _sphere_parameter((num_embeddings, dim))
        declare_sphere(self, "weight")

    def reset_parameters(self) -> None:
        with torch.no_grad():
            self.weight.copy_(
                UNIT_SPHERE.random_point(*self.weight.shape, dtype=self.weight.dtype, device=self.weight.device)
            )

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if ids.dtype not in (torch.int64, torch.int32, torch.int16, torch.uint8, torch.int8):
            raise TypeError(f"SphereEmbedding expects integer token ids, got dtype {ids.dtype}")
        # Values are not read here (a device sync per call); the models assert them on the device.
        return F.embedding(ids, self.weight)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.dim}"
