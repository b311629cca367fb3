"""Reusable spherical layers (and the baseline's plain parts) for nGPT-style models, and the
models' configs (:mod:`spherenet.layers.config`, with the paper's constants). The element-wise
operations they share, and the choice of their implementation, are in
:mod:`spherenet.kernels`."""

from .attention import GPTAttention, KVCache, NGPTAttention
from .blocks import GPTBlock, NGPTBlock
from .config import RESIDUAL_UPDATES, GPTConfig, NGPTConfig
from .cross_attention import GPTCrossAttention, GPTCrossBlock, NGPTCrossAttention, NGPTCrossBlock
from .head import SphereClassifier
from .linear import SphereEmbedding, SphereLinear
from .mlp import GPTMLP, NGPTMLP, GPTReLU2MLP, NGPTReLU2MLP, gpt_mlp, ngpt_mlp
from .norm import RMSNorm
from .rotary import RotaryEmbedding, apply_rotary
from .scale import Scale, ScaleSpec

__all__ = [
    "NGPTConfig",
    "GPTConfig",
    "RESIDUAL_UPDATES",
    "Scale",
    "ScaleSpec",
    "SphereLinear",
    "SphereEmbedding",
    "RotaryEmbedding",
    "apply_rotary",
    "KVCache",
    "NGPTAttention",
    "GPTAttention",
    "NGPTMLP",
    "GPTMLP",
    "NGPTReLU2MLP",
    "GPTReLU2MLP",
    "ngpt_mlp",
    "gpt_mlp",
    "RMSNorm",
    "NGPTBlock",
    "GPTBlock",
    "NGPTCrossAttention",
    "GPTCrossAttention",
    "NGPTCrossBlock",
    "GPTCrossBlock",
    "SphereClassifier",
]
