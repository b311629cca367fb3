"""MLP blocks: SwiGLU, the baseline's (eq. 17-19) and nGPT's (eq. 20, 21), and the squared-ReLU
MLP without a gate (``mlp="relu2"``) of both; :func:`ngpt_mlp` and :func:`gpt_mlp` build the one
a config names."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .. import kernels
from .config import S_U, S_UV, S_V, GPTConfig, NGPTConfig
from .fold import Folding, cached, folding
from .linear import SphereLinear, is_plain, scaled
from .scale import Scale, ScaleSpec

__all__ = ["NGPTMLP", "GPTMLP", "NGPTReLU2MLP", "GPTReLU2MLP", "ngpt_mlp", "gpt_mlp"]


class GPTMLP(nn.Module):
    """The baseline SwiGLU MLP: ``u = h W_u``, ``v = h W_v`` (eq. 17),
    ``h_M = (u * SiLU(v)) W_o_mlp`` (eq. 18, 19). No biases.

    ``w_v`` is the gate: its output goes through SiLU. Weights keep ``nn.Linear``'s default
    init; :class:`spherenet.models.GPT` re-initializes them (normal 0.02, and 0.02/sqrt(2L) for
    ``w_o``).
    """

    def __init__(self, d_model: int, d_mlp: int):
        super().__init__()
        self.w_u = nn.Linear(d_model, d_mlp, bias=False)
        self.w_v = nn.Linear(d_model, d_mlp, bias=False)
        self.w_o = nn.Linear(d_mlp, d_model, bias=False)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.w_o(self.w_u(h) * F.silu(self.w_v(h)))


class NGPTMLP(Folding, nn.Module):
    """nGPT's SwiGLU MLP (Section 2.4.2).

    ``W_u``, ``W_v`` (the gate) are unit vectors along their d_model-sized input side, so
    ``u`` and ``v`` are cosine similarities; they are rescaled (eq. 20, 21)::

        u <- u * s_u
        v <- v * s_v * sqrt(d_model)     # brings v to unit variance, where SiLU is non-linear (A.1)
        out = (u * SiLU(v)) W_o_mlp

    ``W_o_mlp`` is unit along its d_model-sized output side (stored transposed,
    ``(d_mlp, d_model)``). ``s_u``, ``s_v`` default to :data:`S_U`, :data:`S_V` (the paper's).
    The output is not normalized here: the block applies ``Norm`` (``h_M = Norm(MLP(h))``).
    In eval mode without gradients ``W_u s_u`` and ``W_v s_v sqrt(d_model)`` are folded into one
    weight, computed once (:mod:`spherenet.layers.fold`): one matmul for ``u`` and ``v``.
    """

    def __init__(self, d_model: int, d_mlp: int, *, s_u: ScaleSpec = S_U, s_v: ScaleSpec = S_V):
        super().__init__()
        self.d_model, self.d_mlp = d_model, d_mlp
        self.w_u = SphereLinear(d_model, d_mlp, sphere="in")
        self.w_v = SphereLinear(d_model, d_mlp, sphere="in")
        self.w_o = SphereLinear(d_mlp, d_model, sphere="out")
        self.s_u = Scale.from_spec(d_mlp, s_u, d_model)
        self.s_v = Scale.from_spec(d_mlp, s_v, d_model)

    def _folded_up(self) -> torch.Tensor:
        """``[W_u s_u; W_v s_v sqrt(d_model)]``, ``(2 d_mlp, d_model)``: eq. 20, 21 in one weight."""
        v_scale = self.s_v() * math.sqrt(self.d_model)
        return torch.cat((self.w_u.scaled_matrix(self.s_u()), self.w_v.scaled_matrix(v_scale)))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        plain = is_plain(self.w_u) and is_plain(self.w_v) and h.shape[-1] == self.d_model
        if plain and folding(self) and self.fold_weights:
            sources = (self.w_u.weight, self.w_v.weight, self.s_u.source, self.s_v.source)
            u, v = F.linear(h, cached(self, "up", sources, self._folded_up)).chunk(2, dim=-1)
            return self.w_o(kernels.swiglu(u, v))
        u = scaled(self.w_u, h, self.s_u)  # eq. 20
        v = scaled(self.w_v, h, self.s_v, math.sqrt(self.d_model))  # eq. 21
        return self.w_o(kernels.swiglu(u, v))  # eq. 19


class GPTReLU2MLP(nn.Module):
    """The baseline's squared-ReLU MLP, no gate and no biases: ``h_M = ReLU(h W_u)^2 W_o_mlp``.

    Weights keep ``nn.Linear``'s default init; :class:`spherenet.models.GPT` re-initializes them.
    """

    def __init__(self, d_model: int, d_mlp: int):
        super().__init__()
        self.w_u = nn.Linear(d_model, d_mlp, bias=False)
        self.w_o = nn.Linear(d_mlp, d_model, bias=False)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.w_o(kernels.relu2(self.w_u(h)))


class NGPTReLU2MLP(nn.Module):
    """nGPT's squared-ReLU MLP, without a gate (not in the paper; the layout of NVIDIA's
    released normalized models). ``W_u`` is unit along its d_model-sized input side, so ``u`` is
    a cosine similarity, rescaled as the gate of eq. 21 is::

        u <- (h W_u) * s_uv * sqrt(d_model)     # unit variance, where ReLU^2 is non-linear
        out = ReLU(u)^2 W_o_mlp

    ``W_o_mlp`` is unit along its d_model-sized output side (stored transposed, ``(d_mlp,
    d_model)``); ``s_uv`` defaults to :data:`S_UV`. With ``d_mlp`` 1.5 times the SwiGLU's it
    has as many weights (two matrices instead of three). The output is not normalized here: the
    block applies ``Norm``.
    """

    def __init__(self, d_model: int, d_mlp: int, *, s_uv: ScaleSpec = S_UV):
        super().__init__()
        self.d_model, self.d_mlp = d_model, d_mlp
        self.w_u = SphereLinear(d_model, d_mlp, sphere="in")
        self.w_o = SphereLinear(d_mlp, d_model, sphere="out")
        self.s_uv = Scale.from_spec(d_mlp, s_uv, d_model)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        u = scaled(self.w_u, h, self.s_uv, math.sqrt(self.d_model))
        return self.w_o(kernels.relu2(u))


def ngpt_mlp(config: NGPTConfig) -> nn.Module:
    """The MLP ``config.mlp`` names: :class:`NGPTMLP` (``"swiglu"``) or :class:`NGPTReLU2MLP` (``"relu2"``)."""
    if config.mlp == "relu2":
        return NGPTReLU2MLP(config.d_model, config.d_mlp, s_uv=config.s_uv)
    return NGPTMLP(config.d_model, config.d_mlp, s_u=config.s_u, s_v=config.s_v)


def gpt_mlp(config: GPTConfig) -> nn.Module:
    """The MLP ``config.mlp`` names: :class:`GPTMLP` (``"swiglu"``) or :class:`GPTReLU2MLP` (``"relu2"``)."""
    if config.mlp == "relu2":
        return GPTReLU2MLP(config.d_model, config.d_mlp)
    return GPTMLP(config.d_model, config.d_mlp)
