"""nGPT, the normalized Transformer (Loshchilov et al. 2024), as a decoder-only language model.

Read top to bottom: config, then the model. Every matrix is a stack of unit vectors along its
d_model-sized side (a geoopt ``ManifoldParameter`` on the Sphere, declared by the layer that
owns it), and the hidden state stays on the unit sphere through every block (Table 1).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import nn

from .. import kernels
from ..layers import (
    RESIDUAL_UPDATES,
    KVCache,
    NGPTBlock,
    RotaryEmbedding,
    Scale,
    ScaleSpec,
    SphereEmbedding,
    SphereLinear,
)
from ..layers.attention import S_QK
from ..layers.mlp import S_U, S_V
from ..layers.residual import ALPHA
from . import common
from .hub import HubMixin

__all__ = ["NGPTConfig", "NGPT", "S_Z"]

#: The paper's s_z (Section 2.6, step 6): init 1, scale 1/sqrt(d_model), one per vocabulary entry.
S_Z = ScaleSpec(init=1.0)


@dataclass
class NGPTConfig:
    """Sizes and nGPT's choices. Defaults are the paper's (Section 2.6, Table 1).

    Each learnable scaling is one :class:`~spherenet.layers.ScaleSpec` (``init``, ``scale``,
    ``mode``, ``absolute``; Section 2.5), named as in the paper; its default is the constant
    next to the layer that uses it. A field may also be given as a dict of some of the spec's
    fields (TOML ``alpha_attn = {init = 0.1}``): the others keep their defaults.
    """

    vocab_size: int
    n_layers: int
    d_model: int
    n_heads: int
    d_mlp: int | None = None  # None -> 4 * d_model
    max_seq_len: int = 1024
    rope_base: float = 10000.0
    causal: bool = True
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
    s_z: ScaleSpec = S_Z

    def __post_init__(self):
        common.check_transformer_shape(self)
        common.check_choice(self, "update", RESIDUAL_UPDATES)
        common.check_bool(self, "qk_norm")
        for f in _scaling_fields():
            value = getattr(self, f.name)
            if not isinstance(value, ScaleSpec):
                value = ScaleSpec.from_dict(value, base=f.default, where=f"NGPTConfig.{f.name}")
                setattr(self, f.name, value)

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads


def _scaling_fields() -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(NGPTConfig) if isinstance(f.default, ScaleSpec)]


class NGPT(nn.Module, HubMixin):
    """The normalized Transformer.

    ``h = E_in[ids]`` (unit rows), then L blocks ``h <- Norm(h + alpha (Norm(block(h)) - h))``
    (eq. 10, 11), then logits ``z = (E_out h) * s_z`` (eq. 1, 3): cosine similarities, each
    scaled by its vocabulary entry's s_z. No final normalization (h is already unit).
    """

    config_class = NGPTConfig  # save_pretrained / from_pretrained (spherenet.models.hub)
    model_type = "ngpt"
    architecture = "NGPT"

    def __init__(self, config: NGPTConfig):
        super().__init__()
        self.config = c = config
        self.embed_in = SphereEmbedding(c.vocab_size, c.d_model)  # E_input, unit rows
        self.rope = RotaryEmbedding(c.head_dim, c.rope_base, initial_length=c.max_seq_len)  # shared, stateless
        self.blocks = nn.ModuleList(
            NGPTBlock(
                c.d_model,
                c.n_heads,
                c.d_mlp,
                rope=self.rope,
                causal=c.causal,
                update=c.update,
                alpha_attn=c.alpha_attn,
                alpha_mlp=c.alpha_mlp,
                qk_norm=c.qk_norm,
                s_qk=c.s_qk,
                s_u=c.s_u,
                s_v=c.s_v,
            )
            for _ in range(c.n_layers)
        )
        self.embed_out = SphereLinear(c.d_model, c.vocab_size, sphere="in")  # E_output, unit rows
        self.s_z = Scale.from_spec(c.vocab_size, c.s_z, c.d_model)
        self.activation_checkpointing = False  # set_activation_checkpointing

    def get_input_embeddings(self) -> nn.Module:
        """``embed_in`` (the Hugging Face name for the input embedding)."""
        return self.embed_in

    def get_output_embeddings(self) -> nn.Module:
        """``embed_out``, the output layer (the Hugging Face name; Muon leaves it to Adam)."""
        return self.embed_out

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
                h = kernels.checkpoint(block, h)  # keep h only; recompute in backward
            else:
                h = block(h, cache=cache)  # eq. 10, 11
        s_z = self.s_z()
        logits = self.embed_out(h, out_scale=s_z)  # z = (E_out h) * s_z, eq. 1, 3
        return logits.to(torch.promote_types(logits.dtype, s_z.dtype))

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
        eos_token_id: int | None = None,
        stop=None,
    ) -> torch.Tensor:
        """Sample up to ``max_new_tokens`` tokens after ``input_ids`` with a KV cache, sliding
        past the context; see :func:`spherenet.models.common.generate`."""
        return common.generate(self, input_ids, max_new_tokens, temperature, top_k, generator, eos_token_id, stop)
