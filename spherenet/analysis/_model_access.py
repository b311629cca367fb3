"""Access to the inside of a model under inspection: the NGPT/GPT under its wrappers, its
matrices in one convention, float64 copies."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from ..models import MODEL_CLASSES


def _unwrap(model: nn.Module) -> nn.Module:
    """The NGPT/GPT inside ``torch.compile`` (``_orig_mod``) and DDP (``module``) wrappers."""
    for _ in range(8):  # nested wrappers, e.g. DDP(torch.compile(model))
        inner = getattr(model, "_orig_mod", None)
        if not isinstance(inner, nn.Module):
            inner = getattr(model, "module", None)
        if not isinstance(inner, nn.Module):
            break
        model = inner
    return model


def _family(model: nn.Module) -> str:
    """The model's ``model_type`` (``"ngpt"``, ``"gpt"``); a TypeError for a model that is not
    one of :data:`spherenet.models.MODEL_CLASSES`."""
    for model_type, cls in MODEL_CLASSES.items():
        if isinstance(model, cls):
            return model_type
    known = ", ".join(cls.__name__ for cls in MODEL_CLASSES.values())
    raise TypeError(f"expected one of the model classes ({known}), got {type(model).__name__}")


def _matrix(layer: nn.Module) -> torch.Tensor:
    """A linear layer's weight in torch's ``(out_features, in_features)`` convention.

    :class:`~spherenet.layers.SphereLinear` stores its ``sphere="out"`` weights transposed;
    ``matrix()`` undoes that. ``nn.Linear``/``nn.Embedding`` weights are used as they are.
    """
    if hasattr(layer, "matrix"):
        return layer.matrix()
    return layer.weight


def _f64(t: torch.Tensor) -> np.ndarray:
    return t.detach().to(device="cpu", dtype=torch.float64).numpy().copy()


def _attr(module: nn.Module, dotted: str) -> nn.Module:
    for part in dotted.split("."):
        module = getattr(module, part)
    return module
