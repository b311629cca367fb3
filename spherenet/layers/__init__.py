"""Reusable spherical layers (and the baseline's plain parts) for nGPT-style models."""

from .attention import GPTAttention, KVCache, NGPTAttention
from .blocks import GPTBlock, NGPTBlock
from .linear import SphereEmbedding, SphereLinear
from .mlp import GPTMLP, NGPTMLP
from .norm import RMSNorm
from .residual import RESIDUAL_UPDATES, SphericalResidual
from .rotary import RotaryEmbedding, apply_rotary
from .scale import Scale, ScaleSpec

__all__ = [
    "Scale",
    "ScaleSpec",
    "SphereLinear",
    "SphereEmbedding",
    "SphericalResidual",
    "RESIDUAL_UPDATES",
    "RotaryEmbedding",
    "apply_rotary",
    "KVCache",
    "NGPTAttention",
    "GPTAttention",
    "NGPTMLP",
    "GPTMLP",
    "RMSNorm",
    "NGPTBlock",
    "GPTBlock",
]


def __getattr__(name: str):
    if name == "SPHERE":  # deprecated: spherenet.manifolds.UNIT_SPHERE (the warning comes from .linear)
        from . import linear

        return linear.SPHERE
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
