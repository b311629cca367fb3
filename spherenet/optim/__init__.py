"""Optimizers that keep declared sphere weights on the unit sphere (nGPT, Loshchilov et al. 2024).

- :func:`param_groups` / :func:`sphere_parameters`: which parameters lie on which manifold, read
  from the modules' declarations (survives FSDP2 and ``load_state_dict(assign=True)``); each
  group carries ``"manifold"``: ``"sphere"`` (unit rows), a registered geometry such as
  ``"matrix_sphere"`` (whole matrices, Hyperball), or ``"euclidean"``.
- :class:`RiemannianAdam`: Adam on the sphere and on registered geometries, AdamW elsewhere;
  ``gradient="euclidean"`` is the paper's Adam + renormalize, ``"riemannian"`` Adam on the
  tangent-projected gradient; ``second_moment="element" | "row"`` (``"row"`` is geoopt's). Its
  step is :func:`spherenet.kernels.sphere_adam.sphere_adam_`, its options one
  :class:`SphereAdamOptions`.
- :class:`Riemannian`: wraps any torch optimizer the same way.
- :func:`normalize_`, :func:`add_normalize_hook`: the paper's "Euclidean step, then normalize".
- :class:`SphericalMuon`: Muon (orthogonalized momentum) on matrices of unit rows;
  :class:`CombinedOptimizer`: several optimizers seen as one (the Muon recipes).
- :func:`build_optimizer`: the paper's recipes (Table 3) with a warmup + cosine schedule, the
  Muon recipes ``"spherical_muon"`` (nGPT) and ``"muon"`` (GPT), and Hyperball's ``"adamh"`` and
  ``"muonh"`` (GPT's hidden matrices each on the sphere of its Frobenius norm).
"""

from .build import METHOD_DEFAULTS, METHODS, MUON_METHODS, WarmupCosine, build_optimizer
from .combined import CombinedOptimizer
from .groups import EUCLIDEAN, SPHERE, is_matrix, named_sphere_parameters, param_groups, sphere_parameters
from .muon import SphericalMuon, hidden_matrices, zeropower_via_newton_schulz
from .normalize import add_normalize_hook, normalize_
from .riemannian_adam import GRADIENTS, SECOND_MOMENTS, SPHERE_KERNELS, RiemannianAdam, SphereAdamOptions
from .wrapper import MAGNITUDE_STATES, POINT_STATES, VECTOR_STATES, Riemannian

__all__ = [
    "SPHERE",
    "EUCLIDEAN",
    "sphere_parameters",
    "named_sphere_parameters",
    "param_groups",
    "is_matrix",
    "RiemannianAdam",
    "SphereAdamOptions",
    "SECOND_MOMENTS",
    "SPHERE_KERNELS",
    "GRADIENTS",
    "SphericalMuon",
    "zeropower_via_newton_schulz",
    "hidden_matrices",
    "CombinedOptimizer",
    "Riemannian",
    "VECTOR_STATES",
    "POINT_STATES",
    "MAGNITUDE_STATES",
    "normalize_",
    "add_normalize_hook",
    "build_optimizer",
    "WarmupCosine",
    "METHODS",
    "MUON_METHODS",
    "METHOD_DEFAULTS",
]
