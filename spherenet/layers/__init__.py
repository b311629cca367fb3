"""Reusable spherical layers (and the baseline's plain parts) for nGPT-style models."""

from .linear import SPHERE, SphereEmbedding, SphereLinear
from .scale import Scale

__all__ = ["Scale", "SphereLinear", "SphereEmbedding", "SPHERE"]
