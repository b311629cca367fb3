"""Save and load NGPT / GPT in the Hugging Face Hub layout, and push them to the Hub.

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

config.json's metadata, the portable code and the manifest: :mod:`spherenet.models.hub_layout`;
the weight files and the checks of their tensors: :mod:`spherenet.models.hub_files`.

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
from typing import Any, ClassVar

import torch
from torch import nn

from ..manifolds import named_sphere_parameters
from .hub_files import (
    HUB_ARGS,
    INDEX_NAME,
    INSTALL_HINT,
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
from .hub_layout import (
    CONFIG_NAME,
    CONFIGURATION_NAME,
    MANIFEST_NAME,
    METADATA_KEYS,
    MODELING_NAME,
    PORTABLE_MODELING,
    TRANSFORMERS_KEYS,
    PretrainedFileWarning,
    auto_map,
    exported_model_type,
    verify_manifest,
    write_manifest,
    write_portable_code,
)

_pick_device, _pick_dtype, _require = pick_device, pick_dtype, require  # older names (nemotron, published)

__all__ = [
    "CONFIG_NAME",
    "INDEX_NAME",
    "INSTALL_HINT",
    "MANIFEST_NAME",
    "WEIGHTS_NAME",
    "MODELING_NAME",
    "CONFIGURATION_NAME",
    "PORTABLE_MODELING",
    "write_manifest",
    "exported_model_type",
    "MODEL_CLASSES",
    "HubMixin",
    "PretrainedFileError",
    "PretrainedFileWarning",
    "OFF_SPHERE_REMEDY",
    "off_sphere",
    "load_pretrained",
    "model_class",
    "model_class_of",
]

#: The model classes by ``model_type``, in the order they were defined. A subclass of
#: :class:`HubMixin` that sets ``model_type`` in its class body enters itself here.
MODEL_CLASSES: dict[str, type] = {}


def model_class(model_type: str) -> type:
    """The model class saved as ``model_type`` (``"ngpt"``, ``"gpt"``); a ``ValueError`` listing
    the known ones for any other."""
    if model_type not in MODEL_CLASSES:
        raise ValueError(f"unknown model_type {model_type!r}; spherenet knows {sorted(MODEL_CLASSES)}")
    return MODEL_CLASSES[model_type]


def model_class_of(config: Any) -> type:
    """The model class that ``config`` builds (the one whose ``config_class`` is its type); a
    ``TypeError`` naming the known config classes for any other."""
    for cls in MODEL_CLASSES.values():
        if type(config) is cls.config_class:
            return cls
    known = ", ".join(cls.config_class.__name__ for cls in MODEL_CLASSES.values())
    raise TypeError(f"expected a model config ({known}), got {type(config).__name__}")


class HubMixin:
    """``save_pretrained`` / ``from_pretrained`` / ``push_to_hub`` for a model built from one
    config dataclass (``Model(config)``, kept as ``model.config``). A subclass that sets
    ``model_type`` in its class body is entered in :data:`MODEL_CLASSES`.

    huggingface_hub's ``PyTorchModelHubMixin`` is not a base class here: a base class cannot be
    optional, and the mixin decodes a dataclass ``config`` argument from its annotation, which
    is a string under ``from __future__ import annotations``. The file layout is the same.
    """

    config_class: ClassVar[type]
    model_type: ClassVar[str]  # config.json's "model_type"
    architecture: ClassVar[str]  # config.json's "architectures" entry: the class name

    config: Any

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        model_type = cls.__dict__.get("model_type")
        if model_type is None:  # a shared base class, or a wrapper's subclass (FSDP2's FSDP<name>)
            return
        if model_type in MODEL_CLASSES:
            raise TypeError(
                f"{cls.__name__}: model_type {model_type!r} is taken by {MODEL_CLASSES[model_type].__name__}"
            )
        MODEL_CLASSES[model_type] = cls

    @classmethod
    def config_from_dict(cls, values: dict[str, Any], where: str):
        """The ``config_class`` of a saved config dict (config.json, a checkpoint's model.json).
        Raises ``ValueError`` naming ``where`` and every field this version does not know (a file
        written by another version), or the field that is bad."""
        known = {f.name for f in dataclasses.fields(cls.config_class)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(
                f"{where} has field(s) {', '.join(map(repr, unknown))} that {cls.config_class.__name__} "
                f"does not know (saved by another spherenet version?); valid fields: {', '.join(sorted(known))}"
            )
        try:
            return cls.config_class(**values)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{where} does not build a {cls.config_class.__name__}: {exc}") from None

    def sphere_weights(self) -> dict[str, torch.Tensor]:
        """``{name: tensor}`` of the parameters declared on the unit sphere."""
        return dict(named_sphere_parameters(self))

    def hub_config(self) -> dict[str, Any]:
        """What ``config.json`` holds: the config's fields and which model they build."""
        from .. import __version__

        return {
            "model_type": exported_model_type(self.model_type),
            "architectures": [self.architecture],
            "spherenet_version": __version__,
            "auto_map": auto_map(self.architecture),
            **dataclasses.asdict(self.config),
        }

    def check_on_sphere(self, tensors: dict[str, torch.Tensor] | None = None, action: str = "save") -> None:
        """Refuse, in one :class:`PretrainedFileError` saying how to put them back, sphere weights
        (of ``tensors``, a state dict, or else the model's) whose rows are not unit vectors."""
        named = self.sphere_weights()
        if tensors is not None:
            named = {name: tensors[name] for name in named if name in tensors}
        found = off_sphere(named.items())
        if found is not None:
            count, name, error, tolerance = found
            raise PretrainedFileError(
                f"cannot {action} {self.architecture}: {count} of its {len(named)} sphere weights have left the unit "
                f"sphere (|row norm - 1| up to {error:.3g} in {name!r}, tolerance {tolerance:g}): an optimizer stepped "
                f"them without renormalizing; {OFF_SPHERE_REMEDY}"
            )

    def save_pretrained(
        self,
        save_directory: str | os.PathLike,
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
        Hub (:meth:`check_on_sphere`)."""
        if self.__dict__.get("folded_for_inference"):  # spherenet.models.inference: other tensors, no sphere weights
            raise ValueError(
                "save_pretrained: this model was folded for inference (fold_for_inference); save the model it was "
                "folded from"
            )
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
                f"{type(self).__name__}.save_pretrained does not take {', '.join(unknown)}; besides state_dict, "
                f"max_shard_size, safe_serialization, is_main_process, push_to_hub and repo_id it takes {', '.join(HUB_ARGS)}"
            )
        given = sorted(k for k, v in hub_args.items() if v not in (None, False))  # transformers passes token=None
        if given and not push_to_hub:
            raise TypeError(f"save_pretrained: {', '.join(given)} apply with push_to_hub=True only")
        shard_limit(max_shard_size)
        own = self.state_dict()
        if state_dict is None:
            state_dict = own
        elif set(state_dict) != set(own):
            missing, extra = sorted(set(own) - set(state_dict)), sorted(set(state_dict) - set(own))
            raise ValueError(
                f"save_pretrained: state_dict does not match {self.architecture}'s tensors "
                f"(missing {missing[:5]}, unexpected {extra[:5]})"
            )
        self.check_on_sphere(state_dict)
        require("safetensors.torch")
        if not is_main_process:
            return None
        directory = Path(save_directory)
        directory.mkdir(parents=True, exist_ok=True)
        weight_files = write_weights(directory, dict(state_dict), max_shard_size)
        (directory / CONFIG_NAME).write_text(json.dumps(self.hub_config(), indent=2) + "\n", encoding="utf-8")
        code_files = write_portable_code(directory)
        write_manifest(directory, (CONFIG_NAME, *weight_files, *code_files))
        if push_to_hub:
            return upload_folder(directory, repo_id or directory.name, hub_args)
        return None

    def push_to_hub(self, repo_id: str, *, max_shard_size: int | str | None = None, **hub_args) -> str:
        """Save the model into a temporary directory (``max_shard_size`` as in
        :meth:`save_pretrained`) and upload it to the Hub repository ``repo_id`` (created when
        missing). ``hub_args``: ``commit_message``, ``commit_description``, ``private``,
        ``token``, ``revision``, ``create_pr``. Returns the commit's URL. A model whose sphere
        weights are off the sphere is refused before the repository is created."""
        unknown = sorted(set(hub_args) - set(HUB_ARGS))
        if unknown:
            raise TypeError(
                f"push_to_hub does not take {', '.join(unknown)}; it takes max_shard_size, {', '.join(HUB_ARGS)}"
            )
        self.check_on_sphere(action="push")
        shard_limit(max_shard_size)
        require("huggingface_hub")
        with tempfile.TemporaryDirectory() as tmp:
            self.save_pretrained(tmp, max_shard_size=max_shard_size)
            return upload_folder(tmp, repo_id, hub_args)

    @classmethod
    def from_pretrained(
        cls,
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
    ):
        """The model saved at a local directory or a Hub repository id, in eval mode.

        Its tensors keep the dtype they were saved in, unless ``dtype`` (or its Hugging Face
        spelling ``torch_dtype``) names another: a ``torch.dtype``, its name (``"bfloat16"``) or
        ``"auto"`` (the saved one). ``device`` (or ``device_map``: one device, or ``"auto"`` for
        CUDA when available) is where it goes; ``map_location`` is the older name for it.
        Raises :class:`PretrainedFileError`
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
        weights_file = weight_files[0].parent / (WEIGHTS_NAME if len(weight_files) == 1 else INDEX_NAME)
        names = [f.name for f in weight_files] + ([INDEX_NAME] if len(weight_files) > 1 else [])
        verify_manifest(pretrained_model_name_or_path, config_file, download, names)
        model = cls(cls._config_from_file(config_file))
        tensors = read_weights(weight_files)
        check_tensors(model, tensors, weights_file)
        check_finite(tensors, weights_file)
        check_unit_rows({name: tensors[name] for name in model.sphere_weights()}, str(weights_file))
        dtypes = {t.dtype for t in tensors.values() if t.is_floating_point()}
        if len(dtypes) == 1:
            model.to(dtypes.pop())
        model.load_state_dict(tensors, strict=True)
        if target_dtype is not None:
            model.to(target_dtype)
        return model.to(map_location).eval()

    @classmethod
    def _config_from_file(cls, config_file: Path):
        try:
            values = json.loads(Path(config_file).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise PretrainedFileError(f"cannot read {config_file}: {exc}") from None
        if not isinstance(values, dict):
            raise PretrainedFileError(f"{config_file} must hold a JSON object, got {type(values).__name__}")
        model_type, expected = values.get("model_type"), exported_model_type(cls.model_type)
        if model_type != expected:
            other = _exported_classes().get(model_type)
            raise PretrainedFileError(
                f"{config_file} describes model_type {model_type!r}, not {expected!r}: load it with "
                f"{other.__name__ if other else 'the class that saved it'}.from_pretrained"
            )
        fields = {k: v for k, v in values.items() if k not in METADATA_KEYS + TRANSFORMERS_KEYS}
        try:
            return cls.config_from_dict(fields, str(config_file))
        except ValueError as exc:
            raise PretrainedFileError(str(exc)) from None


def load_pretrained(pretrained_model_name_or_path: str | os.PathLike, **kwargs) -> nn.Module:
    """A model saved by ``save_pretrained``, of the class its config.json's ``model_type`` names
    in :data:`MODEL_CLASSES` (keyword arguments as in :meth:`HubMixin.from_pretrained`)."""
    download = {
        k: kwargs[k] for k in ("revision", "cache_dir", "force_download", "token", "local_files_only") if k in kwargs
    }
    config_file = resolve(pretrained_model_name_or_path, CONFIG_NAME, download)
    try:
        model_type = json.loads(Path(config_file).read_text(encoding="utf-8")).get("model_type")
    except (OSError, ValueError, AttributeError) as exc:
        raise PretrainedFileError(f"cannot read the model_type of {config_file}: {exc}") from None
    classes = _exported_classes()
    if model_type not in classes:
        raise PretrainedFileError(f"{config_file} has model_type {model_type!r}; spherenet knows {sorted(classes)}")
    return classes[model_type].from_pretrained(pretrained_model_name_or_path, **kwargs)


def _exported_classes() -> dict[str, type]:
    """The model classes by the ``model_type`` their exports' config.json holds."""
    return {exported_model_type(model_type): cls for model_type, cls in MODEL_CLASSES.items()}
