"""``train.init_from``: a fresh run that starts from trained weights (a run directory, a
checkpoint, an exported directory or a Hub id) with a fresh optimizer. The weights must fit the
model the run builds: the same tokenizer, class and config, or one ``ConfigError`` that names
every field that differs and the override that sets it. The weights are read before the data is
prepared (:func:`read_starting_weights`) and checked against the tokenizer and model config as
soon as the tokenizer is loaded, before the data is tokenized (:meth:`StartingWeights.check_fits`).

A local directory in the published Normalized-Nemotron layout (:func:`spherenet.io.is_published_directory`)
gives the run its model and its tokenizer (:func:`adopt_published_model`): ``[model]`` becomes
the directory's config, and ``data.tokenizer`` its ``tokenizer.json``; a ``model.*`` override or
a ``data.tokenizer`` that says otherwise is refused by name."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import torch

from recipes.checkpoints import Trained, load_weights, model_class_name
from recipes.config_files import DEFAULT_CONFIG
from recipes.run_data import trained_bpe
from spherenet.checkpoint import CheckpointError
from spherenet.data import DataError, build_tokenizer
from spherenet.data.tokenizer import TOKENIZER_JSON
from spherenet.io import is_published_directory, read_normalized_nemotron_into
from spherenet.models import NGPT, PRESETS, model_class_of, nemotron_config
from spherenet.train.config import ConfigError, RunConfig, parse_override

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

__all__ = ["StartingWeights", "adopt_published_model", "check_init_from_target", "read_starting_weights"]


def read_starting_weights(train, resuming: bool) -> StartingWeights | None:
    """``train.init_from``'s weights, read before the data is prepared, so that a path that holds
    none is refused before any work; None when ``train.init_from`` is empty (the model's random
    initialization) or the run resumes (its own checkpoint holds its weights)."""
    source = train.init_from
    if not source or resuming:
        return None
    if is_published_directory(source):  # read tensor by tensor into the built model, never whole
        return StartingWeights(source, None)
    try:
        return StartingWeights(source, load_weights(source))
    except (CheckpointError, DataError) as exc:
        raise _refused(source, exc) from None


@dataclasses.dataclass
class StartingWeights:
    """The weights of ``train.init_from`` (``source``): ``trained`` as read, or None for a directory
    in the published layout, whose config and tokenizer the run adopted
    (:func:`adopt_published_model`) and whose tensors are read straight into the built model."""

    source: str
    trained: Trained | None

    def check_fits(self, tokenizer, config) -> None:
        """The weights against the run's tokenizer and the model ``config`` it builds (known once the
        tokenizer is, before the data is tokenized): the same tokenizer, class and config, field by
        field, or ``ConfigError`` naming every field that differs and how to set it."""
        given, source = self.trained, self.source
        if given is None:
            return
        if given.tokenizer.fingerprint != tokenizer.fingerprint:
            raise ConfigError(
                f"train.init_from={source} was trained with the {given.tokenizer.name} tokenizer (vocab "
                f"{given.tokenizer.vocab_size}), the data here is tokenized with {tokenizer.name} (vocab "
                f"{tokenizer.vocab_size}): set data.tokenizer to the weights' tokenizer"
            )
        theirs, ours = model_class_name(given.model), model_class_of(config).architecture
        if theirs != ours:
            raise ConfigError(
                f"train.init_from={source} holds {theirs} weights, but [model] builds a {ours}: set model.preset to "
                f"one of the {theirs.lower()}-* presets"
            )
        differ = _differences(dataclasses.asdict(given.model.config), dataclasses.asdict(config))
        if differ:
            raise ConfigError(
                f"train.init_from={source}: the weights' model config differs from the run's in "
                + ", ".join(f"{key} ({there!r} there, {here!r} here)" for key, there, here in differ)
                + "; set "
                + " ".join(f"model.{key}={_spelled(there)}" for key, there, _ in differ)
            )

    def load_into(self, model: torch.nn.Module, is_main: bool) -> None:
        """The weights into the freshly built ``model`` (before sharding: whole tensors), checked by
        :meth:`check_fits` against its config."""
        if self.trained is None:
            try:
                read_normalized_nemotron_into(model, self.source)
            except ValueError as exc:  # PretrainedFileError included: one line naming the file or tensor
                raise _refused(self.source, exc) from None
            if is_main:
                print(
                    f"init_from: weights of {self.source} (Normalized-Nemotron layout; a fresh optimizer)", flush=True
                )
            return
        model.load_state_dict(self.trained.model.state_dict())  # same class and config: the same tensors
        if is_main:
            print(f"init_from: weights of {self.trained.describe()} (a fresh optimizer)", flush=True)


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


def _refused(source: str, exc: Exception) -> ConfigError:
    """The load's own message under ``train.init_from``, naming the path once: the message
    usually names it already."""
    message = str(exc)
    return ConfigError(
        f"train.init_from: {message}" if str(source) in message else f"train.init_from={source}: {message}"
    )


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


def adopt_published_model(cfg: RunConfig, config_file: Path | None, overrides: list[str]) -> RunConfig:
    """``cfg`` with the model and tokenizer of ``train.init_from`` when that is a local directory
    in the published Normalized-Nemotron layout; ``cfg`` unchanged otherwise. What the user stated
    (``overrides`` and a ``--config`` file other than the default one) must agree with the
    directory: a ``model.*`` key of another value, a preset of another model class, or a
    ``data.tokenizer`` other than the directory's ``tokenizer.json`` is a ``ConfigError`` naming
    both values. Unstated keys take the directory's values."""
    source = cfg.train.init_from
    if not source or not is_published_directory(source):
        return cfg
    directory = Path(source).expanduser().resolve()
    layout_file = directory / "config.json"
    try:
        saved = dataclasses.asdict(
            nemotron_config(json.loads(layout_file.read_text(encoding="utf-8")), str(layout_file))
        )
    except (OSError, ValueError) as exc:
        raise ConfigError(f"train.init_from={source}: {' '.join(str(exc).split())}") from None
    stated_model, stated_tokenizer = _stated(config_file, overrides)
    preset = stated_model.pop("preset", cfg.model.preset)
    if PRESETS.get(preset, (None,))[0] is not NGPT.config_class:
        raise ConfigError(
            f"train.init_from={source} is an nGPT (Normalized-Nemotron layout), but model.preset={preset} builds "
            "another model: leave model.preset out"
        )
    unknown = sorted(set(stated_model) - set(saved))
    if unknown:
        raise ConfigError(
            f"model.{unknown[0]} is not a field of {NGPT.config_class.__name__} (train.init_from={source} sets the "
            f"model; valid fields: {', '.join(saved)})"
        )
    differ = _differences(saved, stated_model)
    if differ:
        raise ConfigError(
            f"train.init_from={source} sets the model, and it differs from the given "
            + ", ".join(
                f"model.{key}={_spelled(given)} (the directory's: {_spelled(there)})" for key, there, given in differ
            )
            + ": leave these out"
        )
    tokenizer_file = directory / TOKENIZER_JSON
    if not tokenizer_file.is_file():
        raise ConfigError(f"train.init_from={source} has no {TOKENIZER_JSON}: copy the model's tokenizer there")
    theirs = _build_tokenizer(f"hf:{tokenizer_file}", source)
    if stated_tokenizer is not None:
        given = _build_tokenizer(stated_tokenizer, "data.tokenizer") if not trained_bpe(stated_tokenizer) else None
        if given is None or given.fingerprint != theirs.fingerprint:
            raise ConfigError(
                f"data.tokenizer={stated_tokenizer} is not the tokenizer of train.init_from={source} "
                f"({tokenizer_file}): leave data.tokenizer out"
            )
    if theirs.vocab_size > saved["vocab_size"]:
        raise ConfigError(
            f"train.init_from={source}: {tokenizer_file} has {theirs.vocab_size} tokens, more than the model's "
            f"vocab_size {saved['vocab_size']}"
        )
    out = dataclasses.replace(cfg)
    out.model = dataclasses.replace(cfg.model, preset=preset, overrides=saved)
    out.data = dataclasses.replace(cfg.data, tokenizer=stated_tokenizer or f"hf:{tokenizer_file}")
    return out


def _stated(config_file: Path | None, overrides: list[str]) -> tuple[dict, str | None]:
    """What the user stated: the ``[model]`` keys (``preset`` included) and ``data.tokenizer``
    (None when not stated) of a config file other than the default one, then the overrides."""
    model: dict = {}
    tokenizer = None
    if config_file is not None and Path(config_file).resolve() != DEFAULT_CONFIG.resolve():
        try:
            tables = tomllib.loads(Path(config_file).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ConfigError(f"config file {config_file}: {exc}") from None
        model.update(tables.get("model", {}))
        tokenizer = tables.get("data", {}).get("tokenizer", tokenizer)
    for text in overrides:
        section, key, value = parse_override(text)
        if section == "model" and "." in key:  # model.alpha_attn.init=0.1: one field of a table
            table, sub = key.split(".", 1)
            model[table] = {**(model.get(table) if isinstance(model.get(table), dict) else {}), sub: value}
        elif section == "model":
            model[key] = value
        elif (section, key) == ("data", "tokenizer"):
            tokenizer = value
    return model, tokenizer


def _build_tokenizer(spec: str, what: str):
    try:
        return build_tokenizer(spec)
    except DataError as exc:
        raise ConfigError(f"{what}: {exc}") from None
