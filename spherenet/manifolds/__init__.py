"""Geometry on the unit hypersphere.

Layout: the last dimension of a tensor is the vector on the sphere; leading dimensions are
batch; ``alpha`` is a scalar or a tensor that broadcasts against the input.
"""

from .declarations import (
    SPHERE,
    UNIT_SPHERE,
    SphereParameter,
    declare_matrix_sphere,
    declare_sphere,
    declared_matrix_spheres,
    declared_on_geometries,
    declared_spheres,
    is_sphere_tensor,
    is_unit_sphere,
    named_sphere_parameters,
    sphere_dim,
)
from .geodesic import angle, lerp, normalize, riemannian_update, slerp, tangent
from .matrix_sphere import MATRIX_SPHERE, MatrixSphere
from .registry import (
    GeometryLists,
    ManifoldEntry,
    declare_manifold,
    declared_manifolds,
    geometry_for,
    named_manifold_parameters,
    register_geometry,
    registered_geometries,
)
from .sphere import Sphere, point_tolerance

__all__ = [
    "Sphere",
    "MatrixSphere",
    "MATRIX_SPHERE",
    "declare_matrix_sphere",
    "declared_matrix_spheres",
    "declared_on_geometries",
    "register_geometry",
    "geometry_for",
    "GeometryLists",
    "registered_geometries",
    "point_tolerance",
    "normalize",
    "tangent",
    "angle",
    "lerp",
    "slerp",
    "riemannian_update",
    "declare_manifold",
    "declared_manifolds",
    "named_manifold_parameters",
    "ManifoldEntry",
    "SPHERE",
    "UNIT_SPHERE",
    "SphereParameter",
    "declare_sphere",
    "sphere_dim",
    "declared_spheres",
    "named_sphere_parameters",
    "is_unit_sphere",
    "is_sphere_tensor",
]
