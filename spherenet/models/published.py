"""Saved models of either layout: :func:`load_saved` reads a directory in the published
Normalized-Nemotron layout through the converter (:func:`~spherenet.models.nemotron.from_normalized_nemotron`)
and anything else through :func:`~spherenet.models.hub.load_pretrained`; every recipe that loads
a saved model goes through it. (The converter imports hub.py, so hub.py cannot call it back.)

The layout is that of transformers' ``ngpt`` model: config.json says ``model_type`` "ngpt" and
``architectures`` names "NGPTForCausalLM". spherenet's own exports say "spherenet-ngpt", so the
two are never confused.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from torch import nn

from .nemotron_config import LAYOUT_ARCHITECTURE, LAYOUT_MODEL_TYPE

__all__ = [
    "is_published_config",
    "is_published_directory",
    "load_saved",
]


def is_published_config(values: Any) -> bool:
    """Whether a config.json's contents describe a model in the published layout."""
    if not isinstance(values, dict) or values.get("model_type") != LAYOUT_MODEL_TYPE:
        return False
    architectures = values.get("architectures")
    return isinstance(architectures, list) and LAYOUT_ARCHITECTURE in architectures


def is_published_directory(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a local directory whose config.json describes the published layout
    (an unreadable config.json is not; loading it says why)."""
    config_file = Path(path).expanduser() / "config.json"
    try:
        return config_file.is_file() and is_published_config(json.loads(config_file.read_text(encoding="utf-8")))
    except (OSError, ValueError):
        return False


def load_saved(path: str | os.PathLike, **kwargs) -> nn.Module:
    """The model saved at ``path``, in eval mode: a local directory in the published layout
    through the converter, else :func:`~spherenet.models.hub.load_pretrained` (a spherenet
    export, a local directory or a Hub id). ``kwargs`` are
    :meth:`~spherenet.models.hub.HubMixin.from_pretrained`'s; for the published layout only
    dtype, torch_dtype, device, device_map and map_location apply."""
    from .hub import _pick_device, _pick_dtype, load_pretrained

    if not is_published_directory(path):
        return load_pretrained(path, **kwargs)
    from .nemotron import from_normalized_nemotron

    dtype = _pick_dtype(dtype=kwargs.get("dtype"), torch_dtype=kwargs.get("torch_dtype"))
    device = _pick_device(
        map_location=kwargs.get("map_location", "cpu"), device=kwargs.get("device"), device_map=kwargs.get("device_map")
    )
    return from_normalized_nemotron(Path(path).expanduser(), dtype=dtype, device=device).eval()
