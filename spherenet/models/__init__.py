"""The two language models compared in the nGPT paper, their parts (attention, MLP, block: one
file per architecture), the encoder-decoder blocks built from them, and named presets of their
sizes.

Each model class enters itself in :data:`MODEL_CLASSES` under its ``model_type`` when defined;
everything that needs "every model class" (loading, presets, analysis, recipes) reads it there.
Saving and loading go through :mod:`spherenet.io`, which holds the files' layouts:
``model.save_pretrained(dir)``, ``NGPT.from_pretrained(dir)``, :func:`load_pretrained` (any
export), :func:`from_normalized_nemotron` (NVIDIA's published layout) and :func:`load_saved`
(either).
"""

from ..io import PretrainedFileError
from ..layers.config import ScaleSpec
from .common import LanguageModel
from .encoder_decoder import GPTCrossAttention, GPTCrossBlock, NGPTCrossAttention, NGPTCrossBlock
from .generation import GenerationMixin, generate, sample_next_token
from .gpt import GPT, GPTMLP, GPTAttention, GPTBlock, GPTConfig, GPTReLU2MLP, gpt_mlp
from .hub import MODEL_CLASSES, HubMixin, model_class, model_class_of
from .inference import fold_for_inference, is_folded
from .loading import from_normalized_nemotron, load_pretrained, load_saved, nemotron_config, nemotron_config_of
from .ngpt import NGPT, NGPTMLP, NGPTAttention, NGPTBlock, NGPTConfig, NGPTReLU2MLP, ngpt_mlp, residual_alpha
from .presets import PRESETS, from_preset, model_from_config, preset_config

__all__ = [
    "NGPT",
    "NGPTConfig",
    "NGPTAttention",
    "NGPTMLP",
    "NGPTReLU2MLP",
    "ngpt_mlp",
    "residual_alpha",
    "NGPTBlock",
    "ScaleSpec",
    "GPT",
    "GPTConfig",
    "GPTAttention",
    "GPTMLP",
    "GPTReLU2MLP",
    "gpt_mlp",
    "GPTBlock",
    "NGPTCrossAttention",
    "GPTCrossAttention",
    "NGPTCrossBlock",
    "GPTCrossBlock",
    "LanguageModel",
    "GenerationMixin",
    "HubMixin",
    "MODEL_CLASSES",
    "model_class",
    "model_class_of",
    "PRESETS",
    "preset_config",
    "from_preset",
    "model_from_config",
    "generate",
    "sample_next_token",
    "fold_for_inference",
    "is_folded",
    "load_pretrained",
    "from_normalized_nemotron",
    "nemotron_config",
    "nemotron_config_of",
    "load_saved",
    "PretrainedFileError",
]
