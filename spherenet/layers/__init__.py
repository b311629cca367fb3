"""Reusable spherical layers (and the baseline's plain parts) for nGPT-style models. The
element-wise operations they share, and the choice of their implementation, are in
:mod:`spherenet.kernels`."""

from .attention import GPTAttention, KVCache, NGPTAttention
from .blocks import GPTBlock, NGPTBlock
from .head import SphereClassifier
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
    "SphereClassifier",
]
