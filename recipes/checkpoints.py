"""Rebuild a trained model (and its tokenizer) from a run directory or a checkpoint, for the
recipes that read checkpoints (sample, analyze).

A checkpoint written by ``recipes.train`` is self-contained: besides the weights it holds, as
files covered by its manifest's hashes,

    model.json                   the model class and its config
    tokenizer/tokenizer_spec.json
    tokenizer/tokenizer.json     (BPE / Hub tokenizers: the vocabulary and merges themselves)

so a run directory can be copied elsewhere, and the data cache deleted, and still be sampled.
Checkpoints written before these files existed are read through the description in their
``state.pt`` (the tokenizer then comes from the path recorded at training time).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from spherenet.checkpoint import (
    MANIFEST,
    CheckpointError,
    CheckpointManager,
    VerifiedCheckpoint,
)
from spherenet.data import DataError, Tokenizer, build_tokenizer
from spherenet.data.tokenizer import load_tokenizer
from spherenet.models import GPT, NGPT, GPTConfig, NGPTConfig

MODEL_FILE = "model.json"
TOKENIZER_DIR = "tokenizer"
_MODELS = {"NGPT": (NGPT, NGPTConfig), "GPT": (GPT, GPTConfig)}


@dataclass
class Trained:
    model: nn.Module
    tokenizer: Tokenizer
    config: dict[str, Any]  # the run's config (RunConfig.to_dict())
    step: int
    path: Path


def model_class_name(model_or_name: nn.Module | str) -> str:
    """``"NGPT"`` or ``"GPT"``. FSDP2's ``fully_shard`` swaps a model's class for a subclass
    named ``FSDP<name>``, which runs sharded with FSDP recorded before this was fixed."""
    name = model_or_name if isinstance(model_or_name, str) else type(model_or_name).__name__
    if name.startswith("FSDP") and name[4:] in _MODELS:
        return name[4:]
    return name


def checkpoint_files(model: nn.Module, tokenizer: Tokenizer) -> dict[str, str]:
    """The files that make a checkpoint self-contained (``CheckpointManager.save(files=...)``)."""
    files = {MODEL_FILE: json.dumps({"class": model_class_name(model), "config": asdict(model.config)}, indent=1)}
    files.update({f"{TOKENIZER_DIR}/{name}": text for name, text in tokenizer.to_files().items()})
    return files


def saved_model_config(class_name: str, config: dict[str, Any]) -> NGPTConfig | GPTConfig:
    """The config of a saved model description (model.json, or ``model_config`` in the state).
    Raises ``ValueError`` naming every field this version does not know."""
    model_cls, _ = _MODELS[class_name]
    return model_cls.config_from_dict(config, f"the saved {class_name} config")


def find_checkpoint(path: str | Path) -> VerifiedCheckpoint:
    """``path`` is a run directory (``runs/x``), its ``checkpoints/`` directory, or one
    ``step_*`` directory. Returns the newest *sound* checkpoint under it: a damaged one is
    skipped with a ``CheckpointWarning`` (the same verification ``--resume`` uses); a ``step_*``
    directory given explicitly is verified and never replaced by another one."""
    path = Path(path)
    if (path / MANIFEST).is_file() or path.name.startswith("step_"):
        return CheckpointManager(path.parent).verify(path)
    for directory in (path / "checkpoints", path):
        manager = CheckpointManager(directory)
        if manager.checkpoints():
            found = manager.latest_verified()  # raises, naming the directory, when all are damaged
            if found is not None:
                return found
    raise CheckpointError(f"no checkpoint found at {path} (expected a run dir, its checkpoints/ dir, or a step_* dir)")


def _model_description(ckpt: VerifiedCheckpoint, values: dict[str, Any] | None) -> tuple[str, dict[str, Any]]:
    try:
        if ckpt.has_file(MODEL_FILE):
            desc = json.loads(ckpt.read_file(MODEL_FILE))
            return desc["class"], desc["config"]
        return values["model_class"], values["model_config"]  # written before model.json existed
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(
            f"{ckpt.path} does not hold a spherenet training run's model description: {exc!r}"
        ) from None


def _tokenizer(ckpt: VerifiedCheckpoint, values: dict[str, Any]) -> Tokenizer:
    if ckpt.has_file(f"{TOKENIZER_DIR}/tokenizer_spec.json"):
        return load_tokenizer(ckpt.path / TOKENIZER_DIR)
    if "tokenizer" not in values:
        raise CheckpointError(f"{ckpt.path} records no tokenizer")
    try:  # written before checkpoints stored their tokenizer: rebuild it from the recorded spec
        return build_tokenizer(values["tokenizer"])
    except DataError as exc:
        raise CheckpointError(
            f"{ckpt.path} was written before checkpoints held their tokenizer, and the tokenizer it records "
            f"cannot be loaded ({exc}); restore that file, or sample from a checkpoint written since"
        ) from None


def load_trained(path: str | Path, device: str | torch.device = "cpu") -> Trained:
    """The model of the newest sound checkpoint at ``path`` (weights verified and loaded in
    place), its tokenizer and run config. A damaged newest checkpoint is skipped with a warning
    (see :func:`find_checkpoint`); when none is sound, ``CheckpointCorruptError`` names the
    directory and what is wrong with each."""
    ckpt = find_checkpoint(path)
    try:
        values = ckpt.read_state()["values"]
    except Exception as exc:  # noqa: BLE001 - verified, yet not a state.pt this code can read
        raise CheckpointError(f"{ckpt.path} does not hold a spherenet training run's state: {exc}") from None
    class_name, config = _model_description(ckpt, values)
    class_name = model_class_name(class_name)
    if class_name not in _MODELS:
        raise CheckpointError(f"{ckpt.path} holds a model of unknown class {class_name!r}; known: {sorted(_MODELS)}")
    model_cls = _MODELS[class_name][0]
    try:
        model = model_cls(saved_model_config(class_name, config))
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"{ckpt.path}: the recorded {class_name} config does not build a model: {exc}") from None
    CheckpointManager(ckpt.path.parent).load(ckpt, {"model": model}, restore_rng=False)
    tokenizer = _tokenizer(ckpt, values)
    model.to(device).eval()
    return Trained(model, tokenizer, values.get("config", {}), ckpt.step, ckpt.path)
