"""Save and load a model in the Hugging Face Hub layout, and push it to the Hub: what a model's
``save_pretrained`` / ``from_pretrained`` / ``push_to_hub`` (:class:`spherenet.models.hub.HubMixin`)
do, on what this package knows of a model: its names, its config's fields, its tensors and
which of them are sphere weights (:class:`PretrainedContents`).

A saved model is a directory (or a Hub repository) holding

    config.json          the config dataclass's fields, plus ``model_type`` ("spherenet-ngpt" /
                         "spherenet-gpt"), ``architectures`` (["NGPT"] / ["GPT"]),
                         ``spherenet_version`` and ``auto_map`` (transformers' classes); an
                         export saved again by transformers also has transformers' own keys
                         (``TRANSFORMERS_KEYS``), which loading passes over
    model.safetensors    the model's state dict, tensor names as in ``model.state_dict()``; or,
                         saved with ``max_shard_size``, shards ``model-0000i-of-0000n.safetensors``
                         and their index ``model.safetensors.index.json`` (transformers' layout)
    configuration_spherenet.py, guards_spherenet.py, modeling_spherenet.py
                         the portable model code (:mod:`spherenet.hf.portable`: its config classes,
                         the sphere's guards, and its model classes, which import both; torch and
                         transformers only), so that transformers'
                         ``AutoModelForCausalLM.from_pretrained(dir, trust_remote_code=True)``
                         loads the model where spherenet is not installed
    sha256sums.json      the size and sha256 of the files above (every shard and the index too) (the
                         entries of a checkpoint's manifest): a damaged file is refused on load with
                         an error naming it; a directory without it (saved by hand, or before it
                         existed) loads with a :class:`PretrainedFileWarning`

config.json's metadata, the portable code and the manifest: :mod:`spherenet.io.hf_layout`;
the weight files and the checks of their tensors: :mod:`spherenet.io.hf_weights`.

nGPT's sphere weights are stored as the model holds them: matrices of unit rows (the unit
vectors along the last dimension, Section 2.6 of the paper). Loading checks every tensor's name
and shape against the model the config builds, and that the sphere weights are unit rows, and
refuses a file that fails either check with a :class:`PretrainedFileError` naming the tensor.

safetensors and huggingface_hub are optional (``pip install "spherenet-torch[hub]"``); they are
imported only when a model is saved, loaded or pushed.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .. import __version__
from ..manifolds import named_sphere_parameters
from .hf_layout import (
    CONFIG_NAME,
    METADATA_KEYS,
    TRANSFORMERS_KEYS,
    auto_map,
    exported_model_type,
    verify_manifest,
    write_manifest,
    write_portable_code,
)
from .hf_weights import (
    HUB_ARGS,
    INDEX_NAME,
    OFF_SPHERE_REMEDY,
    WEIGHTS_NAME,
    PretrainedFileError,
    check_finite,
    check_tensors,
    check_unit_rows,
    off_sphere,
    pick_device,
    pick_dtype,
    read_weights,
    require,
    resolve,
    resolve_weights,
    shard_limit,
    upload_folder,
    write_weights,
)

__all__ = [
    "PretrainedContents",
    "PretrainedDirectory",
    "config_from_dict",
    "check_on_sphere",
    "save_pretrained",
    "push_to_hub",
    "open_pretrained",
    "saved_model_type",
]

_DOWNLOAD_ARGS = ("revision", "cache_dir", "force_download", "token", "local_files_only")


@dataclasses.dataclass(frozen=True)
class PretrainedContents:
    """What a saved model is made of: ``class_name`` (in messages: ``"NGPT"``), ``architecture``
    (config.json's ``architectures`` entry), ``model_type`` (the registry's: ``"ngpt"``), the
    config's fields, the state dict and the sphere weights (``{name: parameter}``)."""

    class_name: str
    architecture: str
    model_type: str
    config: dict[str, Any]
    state_dict: dict[str, torch.Tensor]
    sphere_weights: dict[str, torch.Tensor]

    def config_json(self) -> dict[str, Any]:
        """What ``config.json`` holds: the config's fields and which model they build."""
        return {
            "model_type": exported_model_type(self.model_type),
            "architectures": [self.architecture],
            "spherenet_version": __version__,
            "auto_map": auto_map(self.architecture),
            **self.config,
        }


def config_from_dict(config_class: type, values: dict[str, Any], where: str):
    """The ``config_class`` of a saved config dict (config.json, a checkpoint's model.json).
    Raises ``ValueError`` naming ``where`` and every field this version does not know (a file
    written by another version), or the field that is bad."""
    known = {f.name for f in dataclasses.fields(config_class)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(
            f"{where} has field(s) {', '.join(map(repr, unknown))} that {config_class.__name__} "
            f"does not know (saved by another spherenet version?); valid fields: {', '.join(sorted(known))}"
        )
    try:
        return config_class(**values)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where} does not build a {config_class.__name__}: {exc}") from None


def check_on_sphere(
    architecture: str,
    sphere_weights: dict[str, torch.Tensor],
    tensors: dict[str, torch.Tensor] | None = None,
    action: str = "save",
) -> None:
    """Refuse, in one :class:`PretrainedFileError` saying how to put them back, sphere weights
    (those of ``tensors``, a state dict, when given) whose rows are not unit vectors."""
    named = sphere_weights
    if tensors is not None:
        named = {name: tensors[name] for name in named if name in tensors}
    found = off_sphere(named.items())
    if found is not None:
        count, name, error, tolerance = found
        raise PretrainedFileError(
            f"cannot {action} {architecture}: {count} of its {len(named)} sphere weights have left the unit "
            f"sphere (|row norm - 1| up to {error:.3g} in {name!r}, tolerance {tolerance:g}): an optimizer stepped "
            f"them without renormalizing; {OFF_SPHERE_REMEDY}"
        )


def save_pretrained(
    save_directory: str | os.PathLike,
    contents: PretrainedContents,
    *,
    state_dict: dict[str, torch.Tensor] | None = None,
    max_shard_size: int | str | None = None,
    safe_serialization: bool | None = True,
    is_main_process: bool = True,
    variant: str | None = None,
    push_to_hub: bool = False,
    repo_id: str | None = None,
    **hub_args,
) -> str | None:
    """Write ``config.json``, the weights and the portable model code into ``save_directory``, with
    their manifest; with ``push_to_hub=True`` also upload the directory to ``repo_id``
    (default: the directory's name) and return the commit's URL.

    The arguments transformers passes (``Trainer.save_model``, its checkpoints, ``push_to_hub``):
    ``state_dict`` (default: the model's) is what is saved, checked against the model's
    tensor names; ``max_shard_size`` (bytes, or ``"500MB"``; default: one file) splits the
    weights into shards with an index; ``is_main_process=False`` writes nothing (another
    rank saves); ``hub_args``: the Hub's ``commit_message``, ``commit_description``,
    ``private``, ``token``, ``revision``, ``create_pr``. ``safe_serialization=False`` and a
    ``variant`` are refused: an export is safetensors under fixed names.

    Sphere weights off the sphere are refused before anything is written or created on the
    Hub (:func:`check_on_sphere`)."""
    if safe_serialization is False:
        raise ValueError("save_pretrained: safe_serialization=False is not supported; spherenet saves safetensors")
    if variant is not None:
        raise ValueError(
            f"save_pretrained: variant={variant!r} is not supported; an export holds {WEIGHTS_NAME} (or its shards) "
            "under fixed names: save each variant into its own directory"
        )
    unknown = sorted(set(hub_args) - set(HUB_ARGS))
    if unknown:
        raise TypeError(
            f"{contents.class_name}.save_pretrained does not take {', '.join(unknown)}; besides state_dict, "
            f"max_shard_size, safe_serialization, is_main_process, push_to_hub and repo_id it takes {', '.join(HUB_ARGS)}"
        )
    given = sorted(k for k, v in hub_args.items() if v not in (None, False))  # transformers passes token=None
    if given and not push_to_hub:
        raise TypeError(f"save_pretrained: {', '.join(given)} apply with push_to_hub=True only")
    shard_limit(max_shard_size)
    own = contents.state_dict
    if state_dict is None:
        state_dict = own
    elif set(state_dict) != set(own):
        missing, extra = sorted(set(own) - set(state_dict)), sorted(set(state_dict) - set(own))
        raise ValueError(
            f"save_pretrained: state_dict does not match {contents.architecture}'s tensors "
            f"(missing {missing[:5]}, unexpected {extra[:5]})"
        )
    check_on_sphere(contents.architecture, contents.sphere_weights, state_dict)
    require("safetensors.torch")
    if not is_main_process:
        return None
    directory = Path(save_directory)
    directory.mkdir(parents=True, exist_ok=True)
    weight_files = write_weights(directory, dict(state_dict), max_shard_size)
    (directory / CONFIG_NAME).write_text(json.dumps(contents.config_json(), indent=2) + "\n", encoding="utf-8")
    code_files = write_portable_code(directory)
    write_manifest(directory, (CONFIG_NAME, *weight_files, *code_files))
    if push_to_hub:
        return upload_folder(directory, repo_id or directory.name, hub_args)
    return None


def push_to_hub(
    repo_id: str, contents: PretrainedContents, *, max_shard_size: int | str | None = None, **hub_args
) -> str:
    """Save the model into a temporary directory (``max_shard_size`` as in
    :func:`save_pretrained`) and upload it to the Hub repository ``repo_id`` (created when
    missing). ``hub_args``: ``commit_message``, ``commit_description``, ``private``,
    ``token``, ``revision``, ``create_pr``. Returns the commit's URL. A model whose sphere
    weights are off the sphere is refused before the repository is created."""
    unknown = sorted(set(hub_args) - set(HUB_ARGS))
    if unknown:
        raise TypeError(
            f"push_to_hub does not take {', '.join(unknown)}; it takes max_shard_size, {', '.join(HUB_ARGS)}"
        )
    check_on_sphere(contents.architecture, contents.sphere_weights, action="push")
    shard_limit(max_shard_size)
    require("huggingface_hub")
    with tempfile.TemporaryDirectory() as tmp:
        save_pretrained(tmp, contents, max_shard_size=max_shard_size)
        return upload_folder(tmp, repo_id, hub_args)


@dataclasses.dataclass(frozen=True)
class PretrainedDirectory:
    """A saved model's files, found (downloaded from a Hub repository) and checked against their
    manifest, with the dtype and device it is to be loaded with (:func:`open_pretrained`)."""

    config_file: Path
    weight_files: list[Path]
    dtype: torch.dtype | None
    device: torch.device

    @property
    def weights_file(self) -> Path:
        """model.safetensors, or the index of its shards (in messages)."""
        return self.weight_files[0].parent / (WEIGHTS_NAME if len(self.weight_files) == 1 else INDEX_NAME)

    def config_fields(self, model_type: str, classes: dict[str, type]) -> dict[str, Any]:
        """config.json's config fields (its metadata and transformers' keys left out), when its
        ``model_type`` is ``model_type`` (config.json's spelling); ``classes``: the model classes by
        config.json's model_type, to name the one that loads another."""
        try:
            values = json.loads(Path(self.config_file).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise PretrainedFileError(f"cannot read {self.config_file}: {exc}") from None
        if not isinstance(values, dict):
            raise PretrainedFileError(f"{self.config_file} must hold a JSON object, got {type(values).__name__}")
        if values.get("model_type") != model_type:
            other = classes.get(values.get("model_type"))
            raise PretrainedFileError(
                f"{self.config_file} describes model_type {values.get('model_type')!r}, not {model_type!r}: load it "
                f"with {other.__name__ if other else 'the class that saved it'}.from_pretrained"
            )
        return {k: v for k, v in values.items() if k not in METADATA_KEYS + TRANSFORMERS_KEYS}

    def load_into(self, model: nn.Module) -> nn.Module:
        """``model`` (built from config.json) holding the saved tensors, in their dtype unless
        another was asked for, on the device asked for, in eval mode; the tensors checked first:
        names and shapes as the model's, finite, and the sphere weights unit rows."""
        tensors = read_weights(self.weight_files)
        check_tensors(model, tensors, self.weights_file)
        check_finite(tensors, self.weights_file)
        spheres = [name for name, _ in named_sphere_parameters(model)]
        check_unit_rows({name: tensors[name] for name in spheres}, str(self.weights_file))
        dtypes = {t.dtype for t in tensors.values() if t.is_floating_point()}
        if len(dtypes) == 1:
            model.to(dtypes.pop())
        model.load_state_dict(tensors, strict=True)
        if self.dtype is not None:
            model.to(self.dtype)
        return model.to(self.device).eval()


def open_pretrained(
    pretrained_model_name_or_path: str | os.PathLike,
    *,
    map_location: str | torch.device = "cpu",
    revision: str | None = None,
    cache_dir: str | os.PathLike | None = None,
    force_download: bool = False,
    token: str | None = None,
    local_files_only: bool = False,
    dtype: torch.dtype | str | None = None,
    torch_dtype: torch.dtype | str | None = None,
    device: str | torch.device | None = None,
    device_map: str | torch.device | None = None,
) -> PretrainedDirectory:
    """The saved model at a local directory or a Hub repository id, its files checked against
    their manifest: what a model class's ``from_pretrained`` takes.

    Its tensors keep the dtype they were saved in, unless ``dtype`` (or its Hugging Face
    spelling ``torch_dtype``) names another: a ``torch.dtype``, its name (``"bfloat16"``) or
    ``"auto"`` (the saved one). ``device`` (or ``device_map``: one device, or ``"auto"`` for
    CUDA when available) is where it goes; ``map_location`` is the older name for it.
    Loading raises :class:`PretrainedFileError`
    when a file differs from the size or sha256 its manifest records,
    when config.json describes another model or bad values, when model.safetensors misses
    a tensor, has an unexpected one or one of another shape, when any tensor holds NaN or
    inf, and when a sphere weight's rows are not unit vectors.
    """
    require("safetensors.torch")
    target_dtype = pick_dtype(dtype=dtype, torch_dtype=torch_dtype)
    map_location = pick_device(map_location=map_location, device=device, device_map=device_map)
    download = {
        "revision": revision,
        "cache_dir": cache_dir,
        "force_download": force_download,
        "token": token,
        "local_files_only": local_files_only,
    }
    config_file = resolve(pretrained_model_name_or_path, CONFIG_NAME, download)
    weight_files = resolve_weights(pretrained_model_name_or_path, download)
    saved = PretrainedDirectory(config_file, weight_files, target_dtype, map_location)
    names = [f.name for f in weight_files] + ([INDEX_NAME] if len(weight_files) > 1 else [])
    verify_manifest(pretrained_model_name_or_path, config_file, download, names)
    return saved


def saved_model_type(pretrained_model_name_or_path: str | os.PathLike, known, **kwargs) -> str:
    """config.json's ``model_type`` of a saved model, one of ``known`` (config.json's spellings:
    ``"spherenet-ngpt"``), else a :class:`PretrainedFileError` naming them. ``kwargs``:
    :func:`open_pretrained`'s; the download ones apply."""
    download = {k: kwargs[k] for k in _DOWNLOAD_ARGS if k in kwargs}
    config_file = resolve(pretrained_model_name_or_path, CONFIG_NAME, download)
    try:
        model_type = json.loads(Path(config_file).read_text(encoding="utf-8")).get("model_type")
    except (OSError, ValueError, AttributeError) as exc:
        raise PretrainedFileError(f"cannot read the model_type of {config_file}: {exc}") from None
    if model_type not in known:
        raise PretrainedFileError(f"{config_file} has model_type {model_type!r}; spherenet knows {sorted(known)}")
    return model_type
