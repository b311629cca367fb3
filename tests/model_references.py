"""Helpers the layer and model tests share (importable from any test: pytest puts ``tests/`` on
``sys.path`` for its root ``conftest.py``): random unit rows, RoPE as an explicit rotation matrix,
and scalings moved off their constant init."""

from __future__ import annotations

import math

import torch

from spherenet.manifolds import normalize


def unit(*shape, dtype=torch.float64, seed=0):
    """Random rows of unit norm (the last dimension), float64 by default."""
    g = torch.Generator().manual_seed(seed)
    return normalize(torch.randn(*shape, dtype=dtype, generator=g))


def rotation_matrix(position: float, head_dim: int, base: float = 10000.0) -> torch.Tensor:
    """The documented RoPE convention as an explicit (head_dim x head_dim) rotation: pair i is
    coordinates (i, i + head_dim/2), turned by position * base^(-2i/head_dim)."""
    half = head_dim // 2
    R = torch.zeros(head_dim, head_dim, dtype=torch.float64)
    for i in range(half):
        theta = position * base ** (-2 * i / head_dim)
        c, s = math.cos(theta), math.sin(theta)
        R[i, i], R[i, i + half] = c, -s
        R[i + half, i], R[i + half, i + half] = s, c
    return R


def randomize_scales(module: torch.nn.Module, seed: int = 0) -> None:
    """Move every 1-D (scaling) parameter away from its constant init, so that a wrong
    reshape or broadcast of a per-element scaling shows up in the outputs."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            if p.ndim == 1:
                p.mul_(1 + 0.5 * torch.rand(p.shape, generator=g, dtype=p.dtype))
