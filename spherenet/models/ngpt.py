"""nGPT, the normalized Transformer (Loshchilov et al. 2024), as a decoder-only language model.

Read top to bottom: config, then the model. Every matrix is a stack of unit vectors along its
d_model-sized side (a geoopt ``ManifoldParameter`` on the Sphere, declared by the layer that
owns it), and the hidden state stays on the unit sphere through every block (Table 1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from ..layers import (
    RESIDUAL_UPDATES,
    KVCache,
    NGPTBlock,
    RotaryEmbedding,
    Scale,
    SphereEmbedding,
    SphereLinear,
    fused,
)
from ..layers.scale import SCALE_MODES
from . import common
from .hub import HubMixin

__all__ = ["NGPTConfig", "NGPT"]


@dataclass
class NGPTConfig:
    """Sizes and nGPT's choices. Defaults are the paper's (Section 2.6, Table 1).

    Scalings use the ``init``/``scale`` parametrization of Section 2.5; a ``*_scale`` of
    ``None`` means ``1/sqrt(d_model)``. ``*_mode`` is ``"vector"`` (paper), ``"scalar"`` or
    ``"fixed"`` (Table 5).
    """

    vocab_size: int
    n_layers: int
    d_model: int
    n_heads: int
    d_mlp: int | None = None  # None -> 4 * d_model
    max_seq_len: int = 1024
    rope_base: float = 10000.0
    causal: bool = True
    # residual update (eq. 10, 11 / eq. 6 / eq. 25, 26) and its eigen learning rates alpha_A, alpha_M
    update: str = "lerp"
    alpha_init: float = 0.05
    alpha_scale: float | None = None
    alpha_abs: bool = True  # |alpha| in the forward pass (Appendix A.2)
    alpha_mode: str = "vector"
    # attention: q, k normalization (eq. 15, 16; Table 6) and s_qk
    qk_norm: bool = True
    s_qk_mode: str = "vector"
    s_qk_init: float = 1.0
    s_qk_scale: float | None = None
    # MLP: s_u, s_v (eq. 20, 21)
    s_uv_mode: str = "vector"
    s_uv_init: float = 1.0
    s_uv_scale: float = 1.0
    # logits: s_z (eq. 3)
    s_z_mode: str = "vector"
    s_z_init: float = 1.0
    s_z_scale: float | None = None

    def __post_init__(self):
        common.check_transformer_shape(self)
        common.check_choice(self, "update", RESIDUAL_UPDATES)
        for field in ("alpha_mode", "s_qk_mode", "s_uv_mode", "s_z_mode"):
            common.check_choice(self, field, SCALE_MODES)
        for field in ("alpha_abs", "qk_norm"):
            common.check_bool(self, field)
        for field in ("alpha_init", "s_qk_init", "s_uv_init", "s_z_init"):
            common.check_finite_float(self, field)
        for field in ("alpha_scale", "s_qk_scale", "s_z_scale"):
            common.check_positive_float(self, field, allow_none=True)
        common.check_positive_float(self, "s_uv_scale")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads


class NGPT(nn.Module, HubMixin):
    """The normalized Transformer.

    ``h = E_in[ids]`` (unit rows), then L blocks ``h <- Norm(h + alpha (Norm(block(h)) - h))``
    (eq. 10, 11), then logits ``z = (E_out h) * s_z`` (eq. 1, 3): cosine similarities scaled
    per token. No final normalization (h is already unit).
    """

    config_class = NGPTConfig  # save_pretrained / from_pretrained (spherenet.models.hub)
    model_type = "ngpt"
    architecture = "NGPT"

    def __init__(self, config: NGPTConfig):
        super().__init__()
        self.config = c = config
        self.embed_in = SphereEmbedding(c.vocab_size, c.d_model)  # E_input, unit rows
        self.rope = RotaryEmbedding(
            c.head_dim, c.rope_base, initial_length=c.max_seq_len
        )  # shared by all blocks, stateless
        self.blocks = nn.ModuleList(
            NGPTBlock(
                c.d_model,
                c.n_heads,
                c.d_mlp,
                rope=self.rope,
                causal=c.causal,
                update=c.update,
                alpha_init=c.alpha_init,
                alpha_scale=c.alpha_scale,
                alpha_mode=c.alpha_mode,
                alpha_abs=c.alpha_abs,
                qk_norm=c.qk_norm,
                s_qk_mode=c.s_qk_mode,
                s_qk_init=c.s_qk_init,
                s_qk_scale=c.s_qk_scale,
                s_uv_mode=c.s_uv_mode,
                s_uv_init=c.s_uv_init,
                s_uv_scale=c.s_uv_scale,
            )
            for _ in range(c.n_layers)
        )
        self.embed_out = SphereLinear(c.d_model, c.vocab_size, sphere="in")  # E_output, unit rows
        s_z_scale = 1 / math.sqrt(c.d_model) if c.s_z_scale is None else c.s_z_scale
        self.s_z = Scale(c.vocab_size, c.s_z_init, s_z_scale, mode=c.s_z_mode)
        self.activation_checkpointing = False  # set_activation_checkpointing

    def init_weights(self) -> None:
        """(Re)initialize every parameter: random unit vectors for the sphere weights, the
        paper's initial values for the scalings. For a model built on the meta device and then
        materialized with ``to_empty``. (Fixed scalings' constant buffers are refilled too.)"""
        for module in self.modules():
            if isinstance(module, (SphereLinear, SphereEmbedding, Scale)):
                module.reset_parameters()

    def forward(self, input_ids: torch.Tensor, kv_caches: list[KVCache] | None = None) -> torch.Tensor:
        """Token ids ``(B, T)`` -> logits ``(B, T, vocab_size)``.

        ``kv_caches``: one :class:`KVCache` per block, for incremental decoding; the new tokens
        are then at positions ``cache length .. cache length + T - 1``.
        """
        if kv_caches is not None and len(kv_caches) != len(self.blocks):
            raise ValueError(f"kv_caches has {len(kv_caches)} entries, the model has {len(self.blocks)} blocks")
        offset = 0 if kv_caches is None else kv_caches[0].length
        common.check_input_ids(input_ids, self.config.max_seq_len, offset)
        common.assert_ids_in_vocab(input_ids, self.config.vocab_size)  # device-side: no host sync
        caches = kv_caches if kv_caches is not None else [None] * len(self.blocks)

        h = self.embed_in(input_ids)  # (B, T, d), unit
        for block, cache in zip(self.blocks, caches):
            if self.activation_checkpointing and cache is None and torch.is_grad_enabled():
                h = fused.checkpoint(block, h)  # keep h only; recompute in backward
            else:
                h = block(h, cache=cache)
        if not fused.is_enabled():
            return self.embed_out(h) * self.s_z()  # eq. 1, 3
        s_z = self.s_z()
        logits = self.embed_out(h, out_scale=s_z)  # eq. 1, 3, s_z folded into E_out's rows
        return logits.to(torch.promote_types(logits.dtype, s_z.dtype))  # the dtype of (E_out h) s_z

    def set_activation_checkpointing(self, enabled: bool = True) -> None:
        """Activation checkpointing per block: in training forwards (gradients enabled, no KV
        caches) each block keeps only its input for the backward pass and recomputes its forward
        there (``torch.utils.checkpoint``, non-reentrant: works under DDP, FSDP2 and
        ``torch.compile``). Same loss and gradients, less activation memory, one more forward."""
        self.activation_checkpointing = bool(enabled)

    def generate(
        self,
        input_ids: torch.Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Sample ``max_new_tokens`` tokens after ``input_ids`` with a KV cache; see
        :func:`spherenet.models.common.generate`."""
        return common.generate(self, input_ids, max_new_tokens, temperature, top_k, generator)
