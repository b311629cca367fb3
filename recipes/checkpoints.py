"""Rebuild a trained model (and its tokenizer) from a run directory or a checkpoint, for the
recipes that read checkpoints (sample, analyze)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from spherenet.checkpoint import STATE_FILE, CheckpointError, CheckpointManager
from spherenet.data import Tokenizer, build_tokenizer
from spherenet.models import GPT, NGPT, GPTConfig, NGPTConfig

_MODELS = {"NGPT": (NGPT, NGPTConfig), "GPT": (GPT, GPTConfig)}


@dataclass
class Trained:
    model: nn.Module
    tokenizer: Tokenizer
    config: dict[str, Any]  # the run's config (RunConfig.to_dict())
    step: int
    path: Path


def find_checkpoint(path: str | Path) -> Path:
    """``path`` is a run directory (``runs/x``), its ``checkpoints/`` directory, or one
    ``step_*`` directory; returns the newest checkpoint directory under it."""
    path = Path(path)
    if (path / "MANIFEST.json").is_file():
        return path
    for directory in (path / "checkpoints", path):
        found = CheckpointManager(directory).checkpoints() if directory.is_dir() else []
        if found:
            return found[-1][1]
    raise CheckpointError(f"no checkpoint found at {path} (expected a run dir, its checkpoints/ dir, or a step_* dir)")


def load_trained(path: str | Path, device: str | torch.device = "cpu") -> Trained:
    """The model of the newest checkpoint at ``path`` (weights verified and loaded in place),
    its tokenizer and run config. Falls back to an older checkpoint if the newest is damaged."""
    ckpt_dir = find_checkpoint(path)
    state_file = ckpt_dir / STATE_FILE
    try:
        values = torch.load(state_file, map_location="cpu", weights_only=True)["values"]
        model_cls, config_cls = _MODELS[values["model_class"]]
        model_config = config_cls(**values["model_config"])
    except (OSError, KeyError, RuntimeError, TypeError) as exc:
        raise CheckpointError(f"{ckpt_dir} does not hold a spherenet training run's model description: {exc}") from None
    model = model_cls(model_config)
    loaded = CheckpointManager(ckpt_dir.parent).load(ckpt_dir, {"model": model}, restore_rng=False)
    tokenizer = build_tokenizer(values["tokenizer"])
    model.to(device).eval()
    return Trained(model, tokenizer, values.get("config", {}), loaded.step, ckpt_dir)
