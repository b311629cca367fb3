"""nGPT, the normalized Transformer (Loshchilov et al. 2024), as a decoder-only language model:
every part of it, top to bottom, in the order a token meets them.

Every matrix is a stack of unit vectors along its d_model-sized side (a geoopt
``ManifoldParameter`` on the Sphere, declared by :class:`~spherenet.layers.SphereLinear` /
:class:`~spherenet.layers.SphereEmbedding`), and the hidden state stays on the unit sphere through
every block (Table 1):

- :class:`NGPTAttention`: q, k, v as cosine similarities, ``Norm`` and ``s_qk`` on q and k after
  RoPE (eq. 15, 16), softmax scale ``sqrt(d_k)``; the heads, RoPE, masks and SDPA call it shares
  with the baseline are :class:`spherenet.layers.attention.Attention`'s.
- :class:`NGPTMLP` (SwiGLU, eq. 20, 21) or :class:`NGPTReLU2MLP` (``mlp="relu2"``), picked by
  :func:`ngpt_mlp`.
- :class:`NGPTBlock`: ``h <- Norm(h + alpha (Norm(block(h)) - h))`` (eq. 10, 11).
- :class:`NGPT`: ``E_in[ids]``, the blocks (the stack and its forward pass are
  :class:`spherenet.models.common.LanguageModel`'s), logits ``(E_out h) * s_z`` (eq. 1, 3).

The config, with the paper's defaults, is :class:`NGPTConfig`, first below. Every mode computes these equations as written; faster decoding is a transform applied to a trained
model (:func:`spherenet.models.inference.fold_for_inference`), not a branch in here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from einops import rearrange
from torch import nn

from .. import kernels
from ..kernels.layer_ops import normalized_update, update_op
from ..layers import KVCache, RotaryEmbedding, Scale, ScaleSpec, SphereEmbedding, SphereLinear
from ..layers.attention import Attention
from ..layers.config import ALPHA, S_QK, S_U, S_UV, S_V, S_Z, check_ngpt_config, ngpt_softmax_scale
from ..layers.sphere import scaled
from .common import LanguageModel
from .generation import GenerationMixin

__all__ = [
    "NGPTConfig",
    "NGPTAttention",
    "NGPTMLP",
    "NGPTReLU2MLP",
    "ngpt_mlp",
    "ngpt_attention",
    "residual_alpha",
    "NGPTBlock",
    "NGPT",
]

# ---------------------------------------------------------------------------------------------
# Config (Section 2.6)


@dataclass
class NGPTConfig:
    """Sizes and nGPT's choices; the defaults are the paper's (Section 2.6, Table 1). Each
    learnable scaling is one :class:`~spherenet.layers.ScaleSpec` named as in the paper, its
    default the constant of :mod:`spherenet.layers.config`; a dict of some of its fields (TOML
    ``alpha_attn = {init = 0.1}``) keeps the others' defaults."""

    vocab_size: int
    n_layers: int
    d_model: int
    n_heads: int
    d_mlp: int | None = None  # None -> 4 * d_model
    max_seq_len: int = 1024
    rope_base: float = 10000.0
    causal: bool = True
    # grouped-query attention: key/value heads, each shared by n_heads / n_kv_heads query heads;
    # s_qk then applies squared to the queries only. None -> n_heads (the paper's).
    n_kv_heads: int | None = None
    head_dim: int | None = None  # None -> d_model // n_heads
    mlp: str = "swiglu"  # "swiglu" (eq. 20, 21) | "relu2" (squared ReLU, scaled by s_uv)
    # residual update (eq. 10, 11 / eq. 6 / eq. 25, 26) and its eigen learning rates
    update: str = "lerp"
    alpha_attn: ScaleSpec = ALPHA  # alpha_A, eq. 10
    alpha_mlp: ScaleSpec = ALPHA  # alpha_M, eq. 11
    # attention: q, k normalization (eq. 15, 16; Table 6) and s_qk
    qk_norm: bool = True
    s_qk: ScaleSpec = S_QK  # eq. 15, 16
    # MLP (eq. 20, 21) and logits (eq. 3)
    s_u: ScaleSpec = S_U
    s_v: ScaleSpec = S_V
    s_uv: ScaleSpec = S_UV  # mlp = "relu2"
    s_z: ScaleSpec = S_Z

    def __post_init__(self):
        check_ngpt_config(self)  # each error names the field and the value; dict scalings become ScaleSpecs


# ---------------------------------------------------------------------------------------------
# Attention (Section 2.3.2)


class NGPTAttention(Attention):
    """nGPT attention (Section 2.3.2).

    ``W_q``, ``W_k``, ``W_v`` are unit vectors along their d_model-sized input side (so q, k, v
    are cosine similarities with ``h``); ``W_o`` is unit along its d_model-sized output side
    (stored transposed, ``(n_heads * head_dim, d_model)``). After RoPE, each head's q and k are
    normalized over ``d_k`` and scaled (eq. 15, 16)::

        q <- Norm(q) * s_qk,    k <- Norm(k) * s_qk

    with ``s_qk`` of :data:`S_QK` (the paper's): ``d_k`` factors per head, ``n_heads * d_k`` in
    all. The softmax scale is ``sqrt(d_k)`` instead of ``1/sqrt(d_k)``: the dot product of two
    random unit vectors of size d_k has variance 1/d_k.

    With grouped-query attention (``n_kv_heads < n_heads``) a key head serves several query
    heads, each with its own ``s_qk``, so ``s_qk`` applies squared on the query side only::

        q <- Norm(q) * s_qk**2,    k <- Norm(k)

    The scores ``q . k`` are those of eq. 15, 16 with each query head's own ``s_qk`` (equal in
    exact arithmetic): only the keys, shared by a group, no longer carry it. With ``n_kv_heads ==
    n_heads`` the form of eq. 15, 16 is kept.

    ``qk_norm=False`` drops the ``Norm`` of eq. 15, 16 (keeping ``s_qk``; Table 6). The output is
    not normalized here: the block applies ``Norm`` (``h_A = Norm(ATTN(h))``).
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        *,
        n_kv_heads: int | None = None,
        head_dim: int | None = None,
        rope: RotaryEmbedding | None = None,
        rope_base: float = 10000.0,
        causal: bool = True,
        qk_norm: bool = True,
        s_qk: ScaleSpec = S_QK,
    ):
        super().__init__(d_model, n_heads, rope, rope_base, causal, n_kv_heads, head_dim)
        self.qk_norm = bool(qk_norm)
        self.softmax_scale = ngpt_softmax_scale(self.head_dim)
        inner, kv_inner = self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim
        self.w_q = SphereLinear(d_model, inner, sphere="in")
        self.w_k = SphereLinear(d_model, kv_inner, sphere="in")
        self.w_v = SphereLinear(d_model, kv_inner, sphere="in")
        self.w_o = SphereLinear(inner, d_model, sphere="out")
        self.s_qk = Scale.from_spec(inner, s_qk, d_model)

    def _qk_scales(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The queries' and the keys' factors, per head (``(H, 1, d_k)``, or ``(1,)`` for a scalar
        ``s_qk``): ``s_qk`` and ``s_qk``, or ``s_qk**2`` and None with grouped key/value heads."""
        s_qk = self.s_qk()
        if s_qk.numel() > 1:
            s_qk = rearrange(s_qk, "(h d) -> h 1 d", h=self.n_heads)
        return (s_qk * s_qk, None) if self.grouped else (s_qk, s_qk)

    def _scale_q(self, x: torch.Tensor) -> torch.Tensor:
        """eq. 15 for q of shape (B, H, T, d_k): ``Norm(q) * s_qk``; ``Norm(q) * s_qk**2`` with
        grouped key/value heads."""
        return kernels.qk_normalize(x, self._qk_scales()[0], self.qk_norm)

    def _scale_k(self, x: torch.Tensor) -> torch.Tensor:
        """eq. 16 for k of shape (B, H, T, d_k): ``Norm(k) * s_qk``; ``Norm(k)`` alone with
        grouped key/value heads (their s_qk is on the queries)."""
        if not self.grouped:
            return kernels.qk_normalize(x, self._qk_scales()[1], self.qk_norm)
        return kernels.normalize(x) if self.qk_norm else x

    def extra_repr(self) -> str:
        return (
            f"d_model={self.d_model}, n_heads={self.n_heads}, n_kv_heads={self.n_kv_heads}, head_dim={self.head_dim}, "
            f"causal={self.causal}, qk_norm={self.qk_norm}"
        )


def ngpt_attention(config: NGPTConfig, rope: RotaryEmbedding | None, attention: type = NGPTAttention, **options):
    """``attention`` (nGPT's self-attention, or a class built on it: the cross-attention of
    :mod:`spherenet.models.encoder_decoder`) with the heads and q/k scaling of ``config``;
    ``options``: the class's own (``causal``, ``cross_positions``)."""
    c = config
    heads = dict(n_kv_heads=c.n_kv_heads, head_dim=c.head_dim, rope=rope, rope_base=c.rope_base)
    return attention(c.d_model, c.n_heads, **heads, qk_norm=c.qk_norm, s_qk=c.s_qk, **options)


# ---------------------------------------------------------------------------------------------
# MLP (Section 2.4.2)


class NGPTMLP(nn.Module):
    """nGPT's SwiGLU MLP (Section 2.4.2).

    ``W_u``, ``W_v`` (the gate) are unit vectors along their d_model-sized input side, so
    ``u`` and ``v`` are cosine similarities; they are rescaled (eq. 20, 21)::

        u <- u * s_u
        v <- v * s_v * sqrt(d_model)     # brings v to unit variance, where SiLU is non-linear (A.1)
        out = (u * SiLU(v)) W_o_mlp

    ``W_o_mlp`` is unit along its d_model-sized output side (stored transposed,
    ``(d_mlp, d_model)``). ``s_u``, ``s_v`` default to :data:`S_U`, :data:`S_V` (the paper's).
    The output is not normalized here: the block applies ``Norm`` (``h_M = Norm(MLP(h))``).
    """

    def __init__(self, d_model: int, d_mlp: int, *, s_u: ScaleSpec = S_U, s_v: ScaleSpec = S_V):
        super().__init__()
        self.d_model, self.d_mlp = d_model, d_mlp
        self.w_u = SphereLinear(d_model, d_mlp, sphere="in")
        self.w_v = SphereLinear(d_model, d_mlp, sphere="in")
        self.w_o = SphereLinear(d_mlp, d_model, sphere="out")
        self.s_u = Scale.from_spec(d_mlp, s_u, d_model)
        self.s_v = Scale.from_spec(d_mlp, s_v, d_model)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        u = scaled(self.w_u, h, self.s_u)  # eq. 20
        v = scaled(self.w_v, h, self.s_v, math.sqrt(self.d_model))  # eq. 21
        return self.w_o(kernels.swiglu(u, v))  # eq. 19


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


# ---------------------------------------------------------------------------------------------
# Block (Section 2.2.2, eq. 10, 11)


def residual_alpha(config: NGPTConfig, spec: ScaleSpec) -> nn.ModuleDict:
    """An eigen learning rate of ``spec`` (eq. 10, 11), held in a ModuleDict so that its saved
    name is ``<residual>.alpha``."""
    return nn.ModuleDict({"alpha": Scale.from_spec(config.d_model, spec, config.d_model)})


class NGPTBlock(nn.Module):
    """One nGPT layer: the hidden state ``h`` stays on the unit sphere throughout::

        h_A = Norm(ATTN(h));   h <- Norm(h + alpha_A (h_A - h))      (eq. 10)
        h_M = Norm(MLP(h));    h <- Norm(h + alpha_M (h_M - h))      (eq. 11)

    with ``config.update == "lerp"``; ``"slerp"`` and ``"riemannian"`` swap in eq. 6 or eq.
    24-26 (the Norm and the update in one call,
    :func:`spherenet.kernels.layer_ops.normalized_update`). ``alpha_A``, ``alpha_M``: the eigen
    learning rates (Section 2.2.2), :class:`Scale` s of ``config.alpha_attn``, ``.alpha_mlp``,
    held as ``residual_attn.alpha`` and ``residual_mlp.alpha``. No RMSNorm/LayerNorm anywhere.
    """

    def __init__(self, config: NGPTConfig, rope: RotaryEmbedding | None = None):
        super().__init__()
        if not isinstance(config, NGPTConfig):
            raise TypeError(f"NGPTBlock takes an NGPTConfig, got {config!r}")
        c = self.config = config
        self.update = update_op(c.update, "NGPTBlock")  # LERP, SLERP or the Riemannian update: chosen here, once
        self.attn = ngpt_attention(c, rope, causal=c.causal)
        self.residual_attn = residual_alpha(c, c.alpha_attn)
        self.mlp = ngpt_mlp(c)
        self.residual_mlp = residual_alpha(c, c.alpha_mlp)

    def forward(
        self,
        h: torch.Tensor,
        cache: KVCache | None = None,
        attn_mask: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        attn = self.attn(h, cache=cache, attn_mask=attn_mask, positions=positions)
        h = normalized_update(self.update, h, attn, self.residual_attn.alpha())  # h_A = Norm(ATTN(h)), eq. 10
        return normalized_update(self.update, h, self.mlp(h), self.residual_mlp.alpha())  # h_M = Norm(MLP(h)), eq. 11


# ---------------------------------------------------------------------------------------------
# Model: embedding, blocks, logits (eq. 1, 3)


class NGPT(LanguageModel, GenerationMixin):
    """The normalized Transformer.

    ``h = E_in[ids]`` (unit rows), then L blocks ``h <- Norm(h + alpha (Norm(block(h)) - h))``
    (eq. 10, 11), then logits ``z = (E_out h) * s_z`` (eq. 1, 3): cosine similarities, each
    scaled by its vocabulary entry's s_z. No final normalization (h is already unit).
    """

    config_class = NGPTConfig  # save_pretrained / from_pretrained (spherenet.models.hub)
    model_type = "ngpt"
    architecture = "NGPT"

    def __init__(self, config: NGPTConfig):
        c = config
        super().__init__(c, SphereEmbedding(c.vocab_size, c.d_model), NGPTBlock)  # E_input, unit rows
        self.embed_out = SphereLinear(c.d_model, c.vocab_size, sphere="in")  # E_output, unit rows
        self.s_z = Scale.from_spec(c.vocab_size, c.s_z, c.d_model)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        logits = scaled(self.embed_out, h, self.s_z)  # z = (E_out h) * s_z, eq. 1, 3
        return logits.to(torch.promote_types(logits.dtype, self.s_z.source.dtype))

    def init_weights(self) -> None:
        """(Re)initialize every parameter: random unit vectors for the sphere weights, the
        paper's initial values for the scalings. For a model built on the meta device and then
        materialized with ``to_empty``. (Fixed scalings' constant buffers are refilled too.)"""
        for module in self.modules():
            if isinstance(module, (SphereLinear, SphereEmbedding, Scale)):
                module.reset_parameters()
