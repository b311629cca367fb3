"""``train.init_from``: a fresh run that starts from trained weights (a run directory, a
checkpoint, an exported directory or a Hub id) with a fresh optimizer. The weights must fit the
model the run builds: the same tokenizer, class and config, or one ``ConfigError`` that names
every field that differs and the override that sets it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from recipes.checkpoints import load_weights, model_class_name
from spherenet.checkpoint import CheckpointError
from spherenet.data import DataError
from spherenet.train.config import ConfigError

__all__ = ["check_init_from_target", "init_from_weights"]


def check_init_from_target(source: str | None, out_dir: Path, overwrite: bool) -> None:
    """Before anything moves: ``--overwrite`` moves train.out_dir's run aside, so weights inside
    it would be gone by the time they are loaded; refused, naming both."""
    if not (source and overwrite):
        return
    where, run = Path(source).resolve(), out_dir.resolve()
    if where == run or run in where.parents:
        raise ConfigError(
            f"train.init_from={source} is inside train.out_dir {out_dir}, whose run --overwrite moves aside: "
            "copy the weights elsewhere first (or recipes.export them), or train into another train.out_dir"
        )


def init_from_weights(model: torch.nn.Module, tokenizer, source: str, is_main: bool) -> None:
    """Load the weights of ``source`` (``train.init_from``) into the freshly built ``model``:
    the same tokenizer as the data's, the same class and the same config, field by field, or
    ``ConfigError`` naming every field that differs and how to set it."""
    try:
        given = load_weights(source)
    except (CheckpointError, DataError) as exc:
        raise ConfigError(f"train.init_from={source}: {exc}") from None
    if given.tokenizer.fingerprint != tokenizer.fingerprint:
        raise ConfigError(
            f"train.init_from={source} was trained with the {given.tokenizer.name} tokenizer (vocab "
            f"{given.tokenizer.vocab_size}), the data here is tokenized with {tokenizer.name} (vocab "
            f"{tokenizer.vocab_size}): set data.tokenizer to the weights' tokenizer"
        )
    theirs, ours = model_class_name(given.model), model_class_name(model)
    if theirs != ours:
        raise ConfigError(
            f"train.init_from={source} holds {theirs} weights, but [model] builds a {ours}: set model.preset to "
            f"one of the {theirs.lower()}-* presets"
        )
    saved, built = dataclasses.asdict(given.model.config), dataclasses.asdict(model.config)
    differ = _differences(saved, built)
    if differ:
        raise ConfigError(
            f"train.init_from={source}: the weights' model config differs from the run's in "
            + ", ".join(f"{key} ({there!r} there, {here!r} here)" for key, there, here in differ)
            + "; set "
            + " ".join(f"model.{key}={_spelled(there)}" for key, there, _ in differ)
        )
    model.load_state_dict(given.model.state_dict())  # same class and config: the same tensors
    if is_main:
        print(f"init_from: weights of {given.describe()} (a fresh optimizer)", flush=True)


def _differences(saved: dict, built: dict, prefix: str = "") -> list[tuple[str, object, object]]:
    """``(dotted key, saved value, built value)`` of every field that differs; a table (a
    scaling) is compared field by field, so that only the fields that differ are named."""
    out = []
    for key, here in built.items():
        there = saved.get(key)
        if isinstance(here, dict) and isinstance(there, dict):
            out += _differences(there, here, f"{prefix}{key}.")
        elif there != here:
            out.append((f"{prefix}{key}", there, here))
    return out


def _spelled(value) -> str:
    """A config value as a ``model.key=value`` override spells it."""
    return str(value).lower() if isinstance(value, bool) else str(value)
