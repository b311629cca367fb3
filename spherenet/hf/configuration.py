"""transformers configs of nGPT and GPT: the fields of :class:`spherenet.models.NGPTConfig` /
:class:`spherenet.models.GPTConfig` under the same names, as in an export's config.json.

A field left at ``None`` takes spherenet's default. transformers' generic names
(``hidden_size``, ``num_hidden_layers``, ...) are aliases of spherenet's (``attribute_map``).
"""

import dataclasses
import json
import os
from pathlib import Path
from typing import Any, ClassVar

from transformers import PretrainedConfig

from ..io import CONFIG_NAME, exported_model_type, is_published_directory
from ..layers import ScaleSpec
from ..models import MODEL_CLASSES, GPTConfig, NGPTConfig, PretrainedFileError, nemotron_config_of

__all__ = ["SpherenetNGPTConfig", "SpherenetGPTConfig", "SpherenetConfigBase", "check_is_export"]

#: transformers' download arguments of ``from_pretrained``, which a local directory does not use
_HUB_ARGS = ("cache_dir", "force_download", "local_files_only", "token", "revision", "proxies", "subfolder")

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
    def from_pretrained(cls, pretrained_model_name_or_path, **kwargs):
        """transformers' ``from_pretrained``, with the model classes' checks: a local directory
        that is not a spherenet export of this model raises :class:`PretrainedFileError` saying
        what it holds (transformers would only log it and build a config of the other's fields).
        A directory in NVIDIA's Normalized-Nemotron layout gives nGPT's config of it, as
        :func:`spherenet.models.nemotron_config_of` reads it (GPT's config refuses it)."""
        if is_published_directory(pretrained_model_name_or_path):
            if cls.spherenet_config_class is not NGPTConfig:
                raise PretrainedFileError(
                    f"{pretrained_model_name_or_path} holds an nGPT in the Normalized-Nemotron layout, not a "
                    f"GPT: read its config with {SpherenetNGPTConfig.__name__}.from_pretrained"
                )
            for name in _HUB_ARGS:
                kwargs.pop(name, None)
            values = cls.from_spherenet_config(nemotron_config_of(pretrained_model_name_or_path)).to_dict()
            values.pop("model_type", None)
            config = cls.from_dict(values, **kwargs)
            target = config[0] if isinstance(config, tuple) else config  # return_unused_kwargs=True
            target.name_or_path = os.fspath(pretrained_model_name_or_path)
            return config
        where = Path(pretrained_model_name_or_path) / kwargs.get("subfolder", "")  # a subfolder holds the config
        check_is_export(where, cls.model_type, reader="transformers.AutoConfig")
        return super().from_pretrained(pretrained_model_name_or_path, **kwargs)

    @classmethod
    def register_for_auto_class(cls, auto_class="AutoConfig") -> None:
        """Nothing: :mod:`spherenet.hf` registers these classes with ``AutoConfig`` by model_type, and
        an export's code is these classes where spherenet is installed. transformers registers the
        class an export's code gives, so that ``config.save_pretrained`` copies its source file
        beside the config: here that would be spherenet's, not the export's code."""

    @classmethod
    def from_spherenet_config(cls, config, **kwargs):
        """The transformers config of spherenet's ``config``; ``kwargs``: transformers' own fields."""
        values = {}
        for f in dataclasses.fields(config):
            value = getattr(config, f.name)
            values[f.name] = value.to_dict() if isinstance(value, ScaleSpec) else value
        return cls(**values, **kwargs)


class SpherenetNGPTConfig(SpherenetConfigBase):
    """nGPT's fields (:class:`spherenet.models.NGPTConfig`); a scaling is a dict of
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
    """The baseline GPT's fields (:class:`spherenet.models.GPTConfig`)."""

    model_type = "spherenet-gpt"
    spherenet_config_class: ClassVar[type] = GPTConfig

    init_std: float | None = None
    norm_eps: float | None = None


def check_is_export(path, model_type: str, reader: str = "transformers.AutoModelForCausalLM") -> None:
    """Refuse, saying what it holds, a local directory that is not a spherenet export of
    ``model_type``; an export of the other model is pointed to ``reader``."""
    local = Path(path).expanduser()
    if not local.is_dir():
        return  # a Hub repository id, or nothing: spherenet's loader says which
    config_file = local / CONFIG_NAME
    if not config_file.is_file():
        found = sorted(os.listdir(local))
        listing = ", ".join(found[:10]) + (", ..." if len(found) > 10 else "") if found else "nothing"
        raise PretrainedFileError(f"{local} is not a spherenet export: it has no {CONFIG_NAME} (it holds {listing})")
    try:
        values = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise PretrainedFileError(f"{config_file} is not readable JSON: {exc}") from None
    found_type = values.get("model_type") if isinstance(values, dict) else None
    if found_type == model_type:
        return
    exported = {exported_model_type(t) for t in MODEL_CLASSES}
    if found_type in exported:
        raise PretrainedFileError(
            f"{local} is a spherenet export of model_type {found_type!r}, not {model_type!r}: load it with {reader}"
        )
    architectures = values.get("architectures") if isinstance(values, dict) else None
    raise PretrainedFileError(
        f"{local} is not a spherenet export: its {CONFIG_NAME} has model_type {found_type!r}"
        + (f" and architectures {architectures}" if architectures else "")
        + f"; spherenet's exports have model_type {' or '.join(map(repr, sorted(exported)))}"
    )
