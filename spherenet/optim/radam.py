"""Deprecated name of :mod:`spherenet.optim.riemannian_adam` (the Riemannian Adam, not RAdam)."""

import warnings

from .riemannian_adam import (
    GRADIENTS,
    SECOND_MOMENTS,
    SPHERE_KERNELS,
    RiemannianAdam,
    resolve_sphere_kernel,
    split_fused,
)

__all__ = ["RiemannianAdam", "SECOND_MOMENTS", "GRADIENTS", "SPHERE_KERNELS", "resolve_sphere_kernel", "split_fused"]

warnings.warn(
    "spherenet.optim.radam is renamed spherenet.optim.riemannian_adam; import from there",
    DeprecationWarning,
    stacklevel=2,
)
