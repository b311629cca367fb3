"""The two language models compared in the nGPT paper, and named presets of their sizes.

Each model class enters itself in :data:`MODEL_CLASSES` under its ``model_type`` when defined;
everything that needs "every model class" (loading, presets, analysis, recipes) reads it there.
"""

from ..layers.scale import ScaleSpec
from .common import LanguageModel, generate, sample_next_token
from .gpt import GPT, GPTConfig
from .hub import MODEL_CLASSES, PretrainedFileError, load_pretrained, model_class, model_class_of
from .ngpt import NGPT, NGPTConfig
from .presets import PRESETS, from_preset, model_from_config, preset_config

__all__ = [
    "NGPT",
    "NGPTConfig",
    "ScaleSpec",
    "GPT",
    "GPTConfig",
    "LanguageModel",
    "MODEL_CLASSES",
    "model_class",
    "model_class_of",
    "PRESETS",
    "preset_config",
    "from_preset",
    "model_from_config",
    "generate",
    "sample_next_token",
    "load_pretrained",
    "PretrainedFileError",
]
