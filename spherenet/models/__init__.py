"""The two language models compared in the nGPT paper, and named presets of their sizes."""

from ..layers.scale import ScaleSpec
from .common import generate, sample_next_token
from .gpt import GPT, GPTConfig
from .hub import PretrainedFileError, load_pretrained
from .ngpt import NGPT, NGPTConfig
from .presets import PRESETS, from_preset, model_from_config, preset_config

__all__ = [
    "NGPT",
    "NGPTConfig",
    "ScaleSpec",
    "GPT",
    "GPTConfig",
    "PRESETS",
    "preset_config",
    "from_preset",
    "model_from_config",
    "generate",
    "sample_next_token",
    "load_pretrained",
    "PretrainedFileError",
]
