"""transformers configs of nGPT and GPT: the fields of :class:`spherenet.layers.NGPTConfig` /
:class:`spherenet.layers.GPTConfig` under the same names, as in an export's config.json.

A field left at ``None`` takes spherenet's default. transformers' generic names
(``hidden_size``, ``num_hidden_layers``, ...) are aliases of spherenet's (``attribute_map``).
"""

import dataclasses
from typing import Any, ClassVar

from transformers import PretrainedConfig

from ..layers import GPTConfig, NGPTConfig, ScaleSpec

__all__ = ["SpherenetNGPTConfig", "SpherenetGPTConfig", "SpherenetConfigBase"]

_GENERIC_NAMES = {
    "hidden_size": "d_model",
    "num_hidden_layers": "n_layers",
    "num_attention_heads": "n_heads",
    "num_key_value_heads": "n_kv_heads",
    "intermediate_size": "d_mlp",
    "max_position_embeddings": "max_seq_len",
}


class SpherenetConfigBase(PretrainedConfig):
    """What nGPT's and GPT's configs share: the fields both models have (each config adds its
    own) and the conversion to and from spherenet's config dataclass."""

    attribute_map: ClassVar[dict[str, str]] = _GENERIC_NAMES

    vocab_size: int | None = None
    n_layers: int | None = None
    d_model: int | None = None
    n_heads: int | None = None
    d_mlp: int | None = None
    max_seq_len: int | None = None
    rope_base: float | None = None
    causal: bool | None = None
    n_kv_heads: int | None = None
    head_dim: int | None = None
    mlp: str | None = None
    use_cache: bool = True
    tie_word_embeddings: bool = False

    spherenet_config_class: ClassVar[type]

    def spherenet_config(self):
        """spherenet's config (``NGPTConfig`` / ``GPTConfig``) of these fields; ``None`` fields
        take its defaults. Its own checks name a bad field."""
        values = {}
        for f in dataclasses.fields(self.spherenet_config_class):
            value = getattr(self, f.name, None)
            if value is not None:
                values[f.name] = value
        return self.spherenet_config_class(**values)

    @classmethod
    def from_spherenet_config(cls, config, **kwargs):
        """The transformers config of spherenet's ``config``; ``kwargs``: transformers' own fields."""
        values = {}
        for f in dataclasses.fields(config):
            value = getattr(config, f.name)
            values[f.name] = value.to_dict() if isinstance(value, ScaleSpec) else value
        return cls(**values, **kwargs)


class SpherenetNGPTConfig(SpherenetConfigBase):
    """nGPT's fields (:class:`spherenet.layers.NGPTConfig`); a scaling is a dict of
    :class:`~spherenet.layers.ScaleSpec`'s fields."""

    model_type = "spherenet-ngpt"
    spherenet_config_class: ClassVar[type] = NGPTConfig

    update: str | None = None
    alpha_attn: dict[str, Any] | None = None
    alpha_mlp: dict[str, Any] | None = None
    qk_norm: bool | None = None
    s_qk: dict[str, Any] | None = None
    s_u: dict[str, Any] | None = None
    s_v: dict[str, Any] | None = None
    s_uv: dict[str, Any] | None = None
    s_z: dict[str, Any] | None = None


class SpherenetGPTConfig(SpherenetConfigBase):
    """The baseline GPT's fields (:class:`spherenet.layers.GPTConfig`)."""

    model_type = "spherenet-gpt"
    spherenet_config_class: ClassVar[type] = GPTConfig

    init_std: float | None = None
    norm_eps: float | None = None
