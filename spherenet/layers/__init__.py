"""The parts custom spherical models share (nGPT's and the baseline's own attention, MLP and
block classes are in :mod:`spherenet.models.ngpt` and :mod:`spherenet.models.gpt`): unit-vector
linear maps and embeddings, learnable scalings, RoPE, the attention plumbing (KV cache, masks,
heads, SDPA), RMSNorm, a classifier head on the sphere, and what the models' configs are made of
(:mod:`spherenet.layers.config`: ``ScaleSpec``, the paper's constants, the field checks; the
configs sit beside their models). The element-wise
operations they share, and the choice of their implementation, are in :mod:`spherenet.kernels`."""

from .attention import Attention, RotaryEmbedding, apply_rotary
from .config import RESIDUAL_UPDATES, ScaleSpec
from .head import SphereClassifier
from .kv_cache import KVCache
from .norm import RMSNorm
from .sphere import Scale, SphereEmbedding, SphereLinear

__all__ = [
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
