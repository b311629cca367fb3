"""Rebuild a trained model (and its tokenizer) from a run directory or a checkpoint, for the
recipes that read checkpoints (sample, analyze, export, train's ``init_from``), and from an
exported directory or a Hub repository where a recipe accepts those too (:func:`load_weights`).

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
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from spherenet.checkpoint import (
    MANIFEST,
    RUN_CHECKPOINTS,
    CheckpointError,
    CheckpointManager,
    VerifiedCheckpoint,
    check_finite_weights,
)
from spherenet.data import DataError, Tokenizer, build_tokenizer
from spherenet.data.tokenizer import SPEC_FILE, TOKENIZER_JSON, load_tokenizer
from spherenet.io import (
    CONFIG_NAME,
    INDEX_NAME,
    MANIFEST_NAME,
    WEIGHTS_NAME,
    PretrainedFileError,
    is_published_directory,
)
from spherenet.models import MODEL_CLASSES, load_saved

MODEL_FILE = "model.json"
TOKENIZER_DIR = "tokenizer"
_MODELS = {cls.architecture: cls for cls in MODEL_CLASSES.values()}  # by class name: "NGPT", "GPT"


@dataclass
class Trained:
    model: nn.Module
    tokenizer: Tokenizer
    config: dict[str, Any]  # the run's config (RunConfig.to_dict()); {} for an exported model
    step: int | None  # None for an exported model
    path: Path
    #: The checkpoint's own tokenizer files (name -> bytes, checked against its manifest), read while the
    #: checkpoint was pinned: a live run may prune it once it has been read. {} for an export.
    tokenizer_files: dict[str, bytes] = field(default_factory=dict)

    @property
    def exported(self) -> bool:
        """Whether this came from an exported directory (no run config, no optimizer, no step)."""
        return self.step is None

    def describe(self) -> str:
        """``<path> (step N, NGPT)`` or ``<path> (exported NGPT)``."""
        kind = type(self.model).__name__
        return f"{self.path} (exported {kind})" if self.exported else f"{self.path} (step {self.step}, {kind})"


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


def saved_model_config(class_name: str, config: dict[str, Any]) -> Any:
    """The config of a saved model description (model.json, or ``model_config`` in the state).
    Raises ``ValueError`` naming every field this version does not know."""
    return _MODELS[class_name].config_from_dict(config, f"the saved {class_name} config")


def find_checkpoint(path: str | Path) -> VerifiedCheckpoint:
    """``path`` is a run directory (``runs/x``), its ``checkpoints/`` directory, or one
    ``step_*`` directory. Returns the newest *sound* checkpoint under it: a damaged one is
    skipped with a ``CheckpointWarning`` (the same verification ``--resume`` uses); a ``step_*``
    directory given explicitly is verified and never replaced by another one."""
    path = Path(path)
    if (path / MANIFEST).is_file() or path.name.startswith("step_"):
        return CheckpointManager(path.parent).verify(path)
    for directory in (path / RUN_CHECKPOINTS, path):
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


def _tokenizer(ckpt: VerifiedCheckpoint, values: dict[str, Any], files: dict[str, bytes]) -> Tokenizer:
    """The checkpoint's tokenizer, built from ``files``, its tokenizer directory's bytes as read."""
    if ckpt.has_file(f"{TOKENIZER_DIR}/{SPEC_FILE}"):
        return load_tokenizer(ckpt.path / TOKENIZER_DIR, files=files)
    if "tokenizer" not in values:
        raise CheckpointError(f"{ckpt.path} records no tokenizer")
    try:  # written before checkpoints stored their tokenizer: rebuild it from the recorded spec
        return build_tokenizer(values["tokenizer"])
    except DataError as exc:
        raise CheckpointError(
            f"{ckpt.path} was written before checkpoints held their tokenizer, and the tokenizer it records "
            f"cannot be loaded ({exc}); restore that file, or sample from a checkpoint written since"
        ) from None


#: How often :func:`load_trained` moves on to the newest remaining checkpoint when the one it
#: read was deleted under it (a live run prunes to ``train.keep_last``).
READ_TRIES = 5


def load_trained(path: str | Path, device: str | torch.device = "cpu") -> Trained:
    """The model of the newest sound checkpoint at ``path`` (weights verified and loaded in
    place), its tokenizer and run config. A damaged newest checkpoint is skipped with a warning
    (see :func:`find_checkpoint`); when none is sound, ``CheckpointCorruptError`` names the
    directory and what is wrong with each. Read beside a live run, the checkpoint being read can
    be pruned under it before it is pinned: then the newest remaining one is read (a ``step_*``
    directory named explicitly is never replaced: its removal is reported as a failed read).
    Once verified it is pinned, and the run's pruning passes over it until it has been read."""
    path = Path(path)
    for _ in range(READ_TRIES):
        ckpt = find_checkpoint(path)  # pinned: a live run's pruning passes over it until it is read
        try:
            return _load_trained(ckpt, device)
        except (OSError, CheckpointError) as exc:
            if ckpt.path.exists():
                raise
            if ckpt.path == path or not isinstance(exc, (FileNotFoundError, CheckpointError)):
                raise CheckpointError(
                    f"cannot read {ckpt.path}: it was deleted while it was read (a live run prunes its "
                    "checkpoints to train.keep_last)"
                ) from None
        finally:
            ckpt.release()
    raise CheckpointError(
        f"cannot read a checkpoint of {path}: {READ_TRIES} in a row were deleted while they were read (a live run "
        "prunes its checkpoints to train.keep_last); raise train.keep_last, or read after the run ends"
    )


def _load_trained(ckpt: VerifiedCheckpoint, device: str | torch.device) -> Trained:
    try:
        values = ckpt.read_state()["values"]
    except Exception as exc:  # noqa: BLE001 - verified, yet not a state.pt this code can read
        raise CheckpointError(f"{ckpt.path} does not hold a spherenet training run's state: {exc}") from None
    class_name, config = _model_description(ckpt, values)
    class_name = model_class_name(class_name)
    if class_name not in _MODELS:
        raise CheckpointError(f"{ckpt.path} holds a model of unknown class {class_name!r}; known: {sorted(_MODELS)}")
    model_cls = _MODELS[class_name]
    try:
        model = model_cls(saved_model_config(class_name, config))
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"{ckpt.path}: the recorded {class_name} config does not build a model: {exc}") from None
    # Read once, before load() releases the checkpoint's pin: the tokenizer is built from the same
    # bytes that recipes.export writes, so the two cannot differ.
    tokenizer_files = {
        name[len(TOKENIZER_DIR) + 1 :]: ckpt.read_file(name)  # checked against the manifest as read
        for name in ckpt.files_under(TOKENIZER_DIR)
        if "/" not in name[len(TOKENIZER_DIR) + 1 :]
    }
    tokenizer = _tokenizer(ckpt, values, tokenizer_files)
    CheckpointManager(ckpt.path.parent).load(ckpt, {"model": model}, restore_rng=False)
    check_finite_weights(model, str(ckpt.path))  # nothing trains from, samples or exports NaN weights
    model.to(device).eval()
    return Trained(model, tokenizer, values.get("config", {}), ckpt.step, ckpt.path, tokenizer_files)


def is_exported(path: str | Path) -> bool:
    """Whether ``path`` is a directory written by ``recipes.export`` / ``save_pretrained``."""
    return (Path(path).expanduser() / CONFIG_NAME).is_file()


def load_exported(path: str | Path, device: str | torch.device = "cpu") -> Trained:
    """The model and tokenizer of a directory written by ``recipes.export`` or ``save_pretrained``
    (``config.json``, ``model.safetensors`` or its shards and their index, and the tokenizer's
    files). ``CheckpointError`` names what is missing."""
    path = Path(path).expanduser()
    published = is_published_directory(path)  # its weights may be sharded: the converter reads them
    if not published and not any((path / name).is_file() for name in (WEIGHTS_NAME, INDEX_NAME)):
        raise CheckpointError(
            f"{path} holds {CONFIG_NAME} but no {WEIGHTS_NAME} (nor the {INDEX_NAME} of shards): not a model "
            "written by recipes.export or save_pretrained"
        )
    tokenizer_dir = next((d for d in (path, path / TOKENIZER_DIR) if (d / SPEC_FILE).is_file()), None)
    if tokenizer_dir is None and (path / TOKENIZER_JSON).is_file():
        tokenizer_dir = path
    if tokenizer_dir is None and published:
        raise CheckpointError(
            f"{path} holds a Normalized-Nemotron model but no {TOKENIZER_JSON}: copy its tokenizer there"
        )
    if tokenizer_dir is None:
        raise CheckpointError(
            f"{path} holds a model but no tokenizer ({SPEC_FILE} or {TOKENIZER_JSON}); recipes.export writes "
            "both, save_pretrained only the model: save the tokenizer there with Tokenizer.save()"
        )
    try:
        model = load_saved(path, map_location=device)  # either layout
    except (PretrainedFileError, FileNotFoundError, ImportError) as exc:
        raise CheckpointError(f"{path}: {exc}") from None
    return Trained(model, load_tokenizer(tokenizer_dir), {}, None, path)


_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")


def load_weights(source: str | Path, device: str | torch.device = "cpu") -> Trained:
    """A trained model from wherever one is kept: a run directory, its ``checkpoints/``
    directory or a ``step_*`` checkpoint (:func:`load_trained`), a directory written by
    ``recipes.export`` (:func:`load_exported`), or a Hugging Face Hub repository id
    (``owner/name``, downloaded into the Hub cache, then read as an exported directory).
    ``CheckpointError`` names the source and why it cannot be read."""
    path = Path(source).expanduser()
    if path.exists():
        return load_exported(path, device) if is_exported(path) else load_trained(path, device)
    if not _HUB_ID.match(str(source)):
        raise CheckpointError(
            f"no run directory, checkpoint or exported model at {source} (and it is not a Hub id like 'owner/name')"
        )
    try:
        from huggingface_hub import snapshot_download

        local = snapshot_download(
            repo_id=str(source),
            allow_patterns=[CONFIG_NAME, WEIGHTS_NAME, MANIFEST_NAME, "tokenizer*.json", "model*.safetensors*"],
        )
    except Exception as exc:  # noqa: BLE001 - offline, missing repo, authentication, no huggingface_hub
        raise CheckpointError(
            f"no local path {source}, and the Hub repository {source!r} cannot be fetched: {type(exc).__name__}: "
            + " ".join(str(exc).split())
        ) from None
    return load_exported(local, device)
