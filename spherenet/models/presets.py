"""Named model sizes: the paper's (Table 2) and small ones that run on a CPU.

``preset_config(name, **overrides)`` returns the config; ``from_preset(name, **overrides)``
builds the model. Build on the meta device to count parameters without allocating::

    with torch.device("meta"):
        model = from_preset("ngpt-1b")
"""

from __future__ import annotations

import dataclasses
from typing import Any

from torch import nn

from .hub import MODEL_CLASSES, model_class_of

__all__ = ["PRESETS", "preset_config", "from_preset", "model_from_config"]

# Table 2: 0.5B = 24 layers, d 1024, 16 heads; 1B = 36 layers, d 1280, 20 heads;
# d_MLP = 4 d (the configs' default), LLaMA-2 vocabulary of 32k tokens.
_SIZES = {
    "0.5b": dict(vocab_size=32000, n_layers=24, d_model=1024, n_heads=16, max_seq_len=4096),
    "1b": dict(vocab_size=32000, n_layers=36, d_model=1280, n_heads=20, max_seq_len=4096),
    "tiny": dict(vocab_size=256, n_layers=2, d_model=64, n_heads=4, max_seq_len=128),
    # the README's main job: a few minutes of training on a laptop CPU
    "cpu": dict(vocab_size=256, n_layers=4, d_model=128, n_heads=4, max_seq_len=128),
    "small": dict(vocab_size=256, n_layers=4, d_model=256, n_heads=4, max_seq_len=256),
    # GPT-2 small's shape (12 layers, d 768, 12 heads) with the paper's 32k vocabulary: the GPU plan of
    # the budget study (benchmarks/budget.py --gpu-plan)
    "base": dict(vocab_size=32000, n_layers=12, d_model=768, n_heads=12, max_seq_len=4096),
    # NVIDIA's released Normalized-Nemotron-8B (its config.json): grouped-query attention, head size
    # 128, the squared-ReLU MLP, rope base 1e6, untied embeddings
    "nemotron-8b": dict(
        vocab_size=131072,
        n_layers=32,
        d_model=4096,
        n_heads=32,
        n_kv_heads=8,
        head_dim=128,
        d_mlp=21504,
        mlp="relu2",
        max_seq_len=8192,
        rope_base=1e6,
    ),
}

#: ``{name: (config class, fields)}``: ``<model_type>-<size>`` for every registered model class
#: (:data:`spherenet.models.hub.MODEL_CLASSES`) and every size
PRESETS: dict[str, tuple[type, dict]] = {
    f"{model_type}-{size}": (cls.config_class, fields)
    for model_type, cls in MODEL_CLASSES.items()
    for size, fields in _SIZES.items()
}


def preset_config(name: str, **overrides) -> Any:
    """The config of preset ``name`` with any field replaced by ``overrides``.

    Raises ``ValueError`` for an unknown preset or an unknown field, listing the valid ones.
    """
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; valid presets: {', '.join(sorted(PRESETS))}")
    config_cls, fields = PRESETS[name]
    valid = [f.name for f in dataclasses.fields(config_cls)]
    unknown = [key for key in overrides if key not in valid]
    if unknown:
        raise ValueError(
            f"unknown override(s) {', '.join(map(repr, unknown))} for preset {name!r} "
            f"({config_cls.__name__}); valid fields: {', '.join(valid)}"
        )
    return config_cls(**{**fields, **overrides})


def model_from_config(config) -> nn.Module:
    """The model ``config`` describes (``NGPT(config)`` for an ``NGPTConfig``, ...), by the
    config's type (:func:`spherenet.models.hub.model_class_of`)."""
    return model_class_of(config)(config)


def from_preset(name: str, **overrides) -> nn.Module:
    """Build the model of preset ``name`` (see :func:`preset_config`)."""
    return model_from_config(preset_config(name, **overrides))
