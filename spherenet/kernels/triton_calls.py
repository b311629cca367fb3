"""The layer ops' ``"triton"`` implementations as :mod:`spherenet.kernels.layer_ops` lists them:
each imports its Triton module (and Triton) on its first call, so that importing spherenet never
needs Triton."""

from __future__ import annotations

import torch

__all__ = [
    "update_takes",
    "normalize_triton",
    "scaled_normalize_triton",
    "lerp_triton",
    "slerp_triton",
    "riemannian_triton",
    "swiglu_triton",
    "relu2_triton",
]


def normalize_triton(x):
    from . import norm_triton  # imports Triton: on first use only

    return norm_triton.normalize(x)


def scaled_normalize_triton(x, scale):
    from . import norm_triton

    return norm_triton.scaled_normalize(x, scale)


def lerp_triton(h, h_block, alpha):
    from . import residual_triton

    return residual_triton.lerp_normalize(h, h_block, alpha)


def slerp_triton(h, h_block, alpha):
    from . import residual_triton

    return residual_triton.slerp_normalize(h, h_block, alpha)


def riemannian_triton(h, h_block, alpha):
    from . import residual_triton

    return residual_triton.riemannian_normalize(h, h_block, alpha)


def swiglu_triton(u, v):
    from . import activation_triton

    return activation_triton.swiglu(u, v)


def relu2_triton(x):
    from . import activation_triton

    return activation_triton.relu2(x)


def update_takes(h: torch.Tensor, h_block: torch.Tensor, alpha) -> bool:
    """Whether the Triton updates take a call: they compute in float32, with ``alpha`` a tensor."""
    return (
        torch.float64 not in (h.dtype, h_block.dtype)
        and isinstance(alpha, torch.Tensor)
        and alpha.dtype != torch.float64
    )
