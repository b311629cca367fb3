"""The parts custom spherical models share (nGPT's and the baseline's own attention, MLP and
block classes are in :mod:`spherenet.models.ngpt` and :mod:`spherenet.models.gpt`): unit-vector
linear maps and embeddings, learnable scalings, RoPE, the attention plumbing (KV cache, masks,
heads, SDPA), RMSNorm, a classifier head on the sphere, and the models'
configs (:mod:`spherenet.layers.config`, with the paper's constants). The element-wise
operations they share, and the choice of their implementation, are in :mod:`spherenet.kernels`."""

from .attention import Attention, RotaryEmbedding, apply_rotary
from .config import RESIDUAL_UPDATES, GPTConfig, NGPTConfig, ScaleSpec
from .head import SphereClassifier
from .kv_cache import KVCache
from .norm import RMSNorm
from .sphere import Scale, SphereEmbedding, SphereLinear

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
    "Attention",
    "RMSNorm",
    "SphereClassifier",
]
