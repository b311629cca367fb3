"""The unit hypersphere S^{d-1} as a geoopt manifold.

Layout, stated once for all of ``spherenet.manifolds``: the **last** dimension of a tensor is
the vector on the sphere; every leading dimension is batch. A weight matrix declared on the
sphere is therefore a stack of unit rows, stored with its d_model-sized side last.
"""

from __future__ import annotations

import warnings

import torch

with warnings.catch_warnings():
    # geoopt 0.5.1 decorates ~70 functions with torch.jit.script, deprecated in torch 2.x;
    # the warnings say nothing about spherenet and would drown a user's own output.
    warnings.filterwarnings("ignore", message="`torch.jit.script` is deprecated", category=DeprecationWarning)
    import geoopt

__all__ = ["Sphere", "point_tolerance"]

# Largest |‖x‖ - 1| accepted as "on the sphere", per dtype. bf16 keeps 8 bits of mantissa
# (relative spacing 2^-8 ~ 4e-3), so a unit vector rounded to bf16 can be ~1e-2 off.
_POINT_TOLERANCE = {
    torch.float64: 1e-10,
    torch.float32: 1e-5,
    torch.float16: 2e-3,
    torch.bfloat16: 1e-2,
}


def point_tolerance(dtype: torch.dtype) -> float:
    """Tolerance on |‖x‖ - 1| that suits ``dtype`` (float32: 1e-5, bfloat16: 1e-2)."""
    return _POINT_TOLERANCE.get(dtype, 1e-5)


class Sphere(geoopt.manifolds.Sphere):
    """Unit sphere along the last dimension: geoopt's ``Sphere`` with spherenet's additions.

    Inherits ``projx`` (x / ‖x‖), ``proju`` (u - <x,u> x), ``retr`` (projx(x + u)),
    ``expmap``, ``transp`` (proju at the new point), ``inner``, ``dist`` unchanged, so a
    ``ManifoldParameter`` on it works with geoopt's optimizers as they are. Adds a random point
    of a given shape/dtype and point checks with a dtype-aware tolerance.
    """

    def random_point(
        self,
        *shape: int,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """A plain tensor of ``shape`` whose last-dimension vectors are uniform on the sphere.

        Sampled as a standard normal then normalized (uniform by rotational symmetry); the
        normal is drawn in float32 or float64 and cast, so bf16 points are rounded unit vectors.
        """
        if len(shape) == 1 and isinstance(shape[0], (tuple, list, torch.Size)):
            shape = tuple(shape[0])
        if len(shape) == 0 or shape[-1] < 1 or any(s < 0 for s in shape):
            raise ValueError(f"Sphere.random_point: shape {tuple(shape)} needs a last dimension >= 1")
        dtype = dtype or torch.get_default_dtype()
        work = torch.float64 if dtype == torch.float64 else torch.float32
        x = torch.randn(*shape, dtype=work, device=device, generator=generator)
        return self.projx(x).to(dtype)

    @staticmethod
    def norm_error(x: torch.Tensor) -> torch.Tensor:
        """max |‖x‖ - 1| over the leading dimensions (a 0-dim tensor, computed in float32+)."""
        work = x.detach().to(torch.float64 if x.dtype == torch.float64 else torch.float32)
        if work.numel() == 0:
            return work.new_zeros(())
        return (work.norm(dim=-1) - 1).abs().max()

    def is_on_sphere(self, x: torch.Tensor, atol: float | None = None) -> bool:
        """True when every last-dimension vector has norm 1 within ``atol``
        (default: :func:`point_tolerance` of ``x.dtype``)."""
        atol = point_tolerance(x.dtype) if atol is None else atol
        return bool(self.norm_error(x) <= atol)

    def assert_on_sphere(self, x: torch.Tensor, atol: float | None = None, name: str = "tensor") -> None:
        """Raise ``ValueError`` naming ``name``, its shape and the worst norm error when ``x``
        is off the sphere."""
        atol = point_tolerance(x.dtype) if atol is None else atol
        err = float(self.norm_error(x))
        if not err <= atol:  # also catches NaN
            raise ValueError(
                f"{name} of shape {tuple(x.shape)} ({x.dtype}) is not on the unit sphere along its "
                f"last dimension: max |norm - 1| = {err:.3g} > atol {atol:.3g}"
            )
