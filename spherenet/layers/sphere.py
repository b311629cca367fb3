"""What every nGPT layer is built of: weights whose rows are unit vectors, declared on the
Sphere, and the learned scalings that give the unit-norm outputs their magnitudes back.

**Sphere weights** (:class:`SphereLinear`, :class:`SphereEmbedding`). Every weight here is a
``geoopt.ManifoldParameter`` on :data:`spherenet.manifolds.UNIT_SPHERE`, stored with its sphere
dimension **last** (geoopt's Sphere normalizes the last dimension, and FSDP2 shards dim 0, so a
unit vector is never split across ranks). The owning module also declares it
(:func:`spherenet.manifolds.declare_sphere`), so optimizers still find it after the parameter is
re-wrapped by FSDP2 or ``load_state_dict(assign=True)``.

**Scalings** (:class:`Scale`, described by a :class:`~spherenet.layers.config.ScaleSpec`). Section 2.5 of the nGPT paper: "for any
trainable vector of scaling parameters such as s_a, we use two scalars s_a,init and s_a,scale".
The vector is stored initialized at ``s_a,scale`` and multiplied by ``s_a,init / s_a,scale`` in
the forward pass, so its effective learning rate is the global one times ``s_a,init /
s_a,scale``. nGPT has six such scalings: alpha_A, alpha_M (eq. 10, 11), s_qk (eq. 15, 16), s_u,
s_v (eq. 20, 21) and s_z (eq. 3). Each is described by a :class:`ScaleSpec` and built by
:meth:`Scale.from_spec`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .. import kernels
from ..manifolds import UNIT_SPHERE, declare_sphere
from ..manifolds.sphere import geoopt
from .config import SCALE_MODES, ScaleSpec

__all__ = ["Scale", "SphereLinear", "SphereEmbedding", "scaled"]

# ---------------------------------------------------------------- scalings (Section 2.5)


class Scale(nn.Module):
    """A scaling factor ``s`` stored at ``scale`` and used as ``s * (init / scale)`` (Section 2.5).

    Adam moves every stored element by about ``lr`` per step, so the effective learning rate of
    the used value is ``lr * init / scale``: ``scale = 1/sqrt(d_model)`` makes it move like an
    element of a unit vector of size d_model.

    ``mode``: ``"vector"`` (one learnable value per element, the paper's default),
    ``"scalar"`` (one learnable value, broadcast; Table 5), ``"fixed"`` (no parameter, the
    constant ``init``; Table 5). ``absolute``: return ``|s * (init / scale)|`` (Appendix A.2).
    ``forward()`` returns the effective value, shape ``(size,)`` or ``(1,)``, computed from the
    stored one at every call.
    """

    def __init__(self, size: int, init: float = 1.0, scale: float = 1.0, mode: str = "vector", absolute: bool = False):
        super().__init__()
        if mode not in SCALE_MODES:
            raise ValueError(f"Scale mode must be one of {SCALE_MODES}, got {mode!r}")
        if not isinstance(size, int) or size < 1:
            raise ValueError(f"Scale size must be a positive int, got {size!r}")
        if not scale > 0:
            raise ValueError(f"Scale 'scale' (s_scale) must be > 0, got {scale!r}")
        self.size, self.init, self.scale, self.mode = size, float(init), float(scale), mode
        self.absolute = bool(absolute)
        if mode == "fixed":
            self.register_buffer("value", torch.full((1,), self.init), persistent=False)
            self.param = None
        else:
            self.param = nn.Parameter(torch.empty(size if mode == "vector" else 1))
        self.reset_parameters()

    @classmethod
    def from_spec(cls, size: int, spec: ScaleSpec, d_model: int) -> Scale:
        """The scaling of ``size`` elements that ``spec`` describes; a ``None`` scale is
        ``1/sqrt(d_model)`` whatever ``size`` is (s_z has vocab_size elements, s_u d_MLP)."""
        if not isinstance(spec, ScaleSpec):
            raise TypeError(f"Scale.from_spec expects a ScaleSpec, got {type(spec).__name__}")
        return cls(size, spec.init, spec.stored_scale(d_model), spec.mode, spec.absolute)

    def reset_parameters(self) -> None:
        with torch.no_grad():
            if self.param is not None:
                self.param.fill_(self.scale)
            else:  # the constant, e.g. after materializing from the meta device
                self.value.fill_(self.init)

    @property
    def source(self) -> torch.Tensor:
        """The tensor the effective value is computed from: the parameter, or the constant."""
        return self.value if self.param is None else self.param

    def forward(self) -> torch.Tensor:
        """The effective value, computed from the stored one."""
        value = self.value if self.param is None else self.param * (self.init / self.scale)
        return value.abs() if self.absolute else value

    def extra_repr(self) -> str:
        absolute = ", absolute=True" if self.absolute else ""
        return f"size={self.size}, init={self.init:g}, scale={self.scale:g}, mode={self.mode}{absolute}"


# ---------------------------------------------------------------- sphere weights (Section 2.1, 2.6)


def _check_size(name: str, value) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


def _sphere_parameter(shape: tuple[int, ...]) -> geoopt.ManifoldParameter:
    # Normal init then Norm (Section A.5: the std does not matter once normalized).
    return geoopt.ManifoldParameter(UNIT_SPHERE.random_point(*shape), manifold=UNIT_SPHERE)


@torch.no_grad()
def _reset_sphere(weight: torch.Tensor) -> None:
    weight.copy_(UNIT_SPHERE.random_point(*weight.shape, dtype=weight.dtype, device=weight.device))


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
        _reset_sphere(self.weight)

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
        _reset_sphere(self.weight)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if ids.dtype not in (torch.int64, torch.int32, torch.int16, torch.uint8, torch.int8):
            raise TypeError(f"SphereEmbedding expects integer token ids, got dtype {ids.dtype}")
        # Values are not read here (a device sync per call); the models assert them on the device.
        return F.embedding(ids, self.weight)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.dim}"
