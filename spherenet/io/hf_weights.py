"""The weight files of a saved model (:mod:`spherenet.io.pretrained`): one ``model.safetensors``,
or shards of at most ``max_shard_size`` bytes listed in ``model.safetensors.index.json``
(transformers' layout and shard names), the checks of the tensors read from them (names, shapes,
finite values, and unit rows of the sphere weights: Section 2.6 of the paper), and the upload of a
saved directory to the Hub.

safetensors and huggingface_hub are imported only when used (``pip install "spherenet-torch[hub]"``).
"""

from __future__ import annotations

import importlib
import json
import os
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch import nn

from .. import install_hint
from ..checkpoint import holds_checkpoints
from ..manifolds import Sphere, point_tolerance

__all__ = [
    "WEIGHTS_NAME",
    "INDEX_NAME",
    "HUB_ARGS",
    "INSTALL_HINT",
    "PretrainedFileError",
    "require",
    "shard_limit",
    "write_weights",
    "read_weights",
    "upload_folder",
    "check_finite",
    "check_tensors",
    "check_unit_rows",
    "off_sphere",
    "OFF_SPHERE_REMEDY",
    "pick_dtype",
    "pick_device",
    "resolve",
    "resolve_weights",
]

WEIGHTS_NAME = "model.safetensors"
INDEX_NAME = "model.safetensors.index.json"
INSTALL_HINT = install_hint("hub")
#: the Hub arguments that ``save_pretrained(push_to_hub=True, ...)`` and ``push_to_hub`` take
HUB_ARGS = ("commit_message", "commit_description", "private", "token", "revision", "create_pr")

_SHARD_NAME = re.compile(r"model-\d{5}-of-\d{5}\.safetensors")
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}


class PretrainedFileError(ValueError):
    """A saved model's config.json or model.safetensors does not describe a loadable model."""


def require(module: str) -> ModuleType:
    """Import ``module``, or raise an ``ImportError`` saying which extra installs it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ImportError(
            f"saving and loading models in the Hugging Face format needs the package {module.split('.')[0]!r}; "
            f"install it with: {INSTALL_HINT}"
        ) from None


def shard_limit(max_shard_size: int | str | None) -> int | None:
    """Bytes of ``max_shard_size``: an int, or digits and a unit as transformers writes them
    (``"5MB"``, ``"2GiB"``); ``None``: no limit (one file)."""
    if max_shard_size is None:
        return None
    if isinstance(max_shard_size, int) and not isinstance(max_shard_size, bool):
        size = max_shard_size
    else:
        match = re.fullmatch(r"\s*(\d+)\s*([A-Za-z]*)\s*", str(max_shard_size))
        unit = match.group(2).upper() if match else None
        if unit not in _UNITS:
            raise ValueError(
                f"max_shard_size={max_shard_size!r} is not a size: use bytes (an int) or digits and a unit, "
                f"e.g. '500MB' ({', '.join(u for u in _UNITS if u)})"
            )
        size = int(match.group(1)) * _UNITS[unit]
    if size <= 0:
        raise ValueError(f"max_shard_size must be positive, got {max_shard_size!r}")
    return size


def write_weights(directory: Path, tensors: dict[str, torch.Tensor], max_shard_size: int | str | None) -> list[str]:
    """Write ``tensors`` into ``directory`` as model.safetensors, or as shards of at most
    ``max_shard_size`` bytes (a tensor larger than that alone in its shard) with their index
    when they do not fit in one. Removes the weight files of an earlier save there, so that one
    layout remains. Returns the names of the files written."""
    safetensors_torch = require("safetensors.torch")
    limit = shard_limit(max_shard_size)
    shards: list[list[str]] = [[]]
    used = 0
    for name, tensor in tensors.items():
        nbytes = tensor.numel() * tensor.element_size()
        if limit is not None and shards[-1] and used + nbytes > limit:
            shards.append([])
            used = 0
        shards[-1].append(name)
        used += nbytes
    for old in [directory / WEIGHTS_NAME, directory / INDEX_NAME, *directory.glob("model-*-of-*.safetensors")]:
        if old.name in (WEIGHTS_NAME, INDEX_NAME) or _SHARD_NAME.fullmatch(old.name):
            old.unlink(missing_ok=True)
    files = [WEIGHTS_NAME]
    if len(shards) > 1:  # transformers' shard names
        files = [f"model-{i:05d}-of-{len(shards):05d}.safetensors" for i in range(1, len(shards) + 1)]
    weight_map = {}
    for file, names in zip(files, shards):
        part = {name: tensors[name].detach().contiguous().cpu() for name in names}
        safetensors_torch.save_file(part, str(directory / file), metadata={"format": "pt"})
        weight_map |= dict.fromkeys(names, file)
    if len(files) == 1:
        return files
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (directory / INDEX_NAME).write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
    return [*files, INDEX_NAME]


def shard_names(index_file: Path) -> list[str]:
    """The shard files an index lists (plain file names); :class:`PretrainedFileError` naming the
    index when it is not one."""
    try:
        weight_map = json.loads(Path(index_file).read_text(encoding="utf-8"))["weight_map"]
        assert isinstance(weight_map, dict) and all(isinstance(f, str) for f in weight_map.values())
    except (OSError, ValueError, KeyError, TypeError, AssertionError):
        raise PretrainedFileError(
            f"{index_file}: not a JSON object with a weight_map of tensor names to files"
        ) from None
    shards = sorted(set(weight_map.values()))
    bad = [s for s in shards if Path(s).name != s]
    if bad:
        raise PretrainedFileError(f"{index_file} lists shard {bad[0]!r}, which is not a file beside it")
    return shards


def read_weights(files: list[Path]) -> dict[str, torch.Tensor]:
    """The tensors of model.safetensors or of its shards (on the CPU); a tensor in two shards,
    or a file safetensors cannot read, is a :class:`PretrainedFileError` naming the file."""
    safetensors_torch = require("safetensors.torch")
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        try:
            part = safetensors_torch.load_file(str(file), device="cpu")
        except Exception as exc:  # noqa: BLE001 - safetensors raises its own error type for a bad file
            raise PretrainedFileError(f"cannot read {file}: {exc}") from None
        twice = sorted(set(part) & set(tensors))
        if twice:
            raise PretrainedFileError(f"{file}: tensor {twice[0]!r} is also in another shard")
        tensors |= part
    return tensors


_DTYPES = {
    "float32": torch.float32,
    "float": torch.float32,
    "float64": torch.float64,
    "double": torch.float64,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "half": torch.float16,
}


def pick_dtype(**given) -> torch.dtype | None:
    """The dtype asked for by ``dtype=`` or ``torch_dtype=`` (None: keep the saved one)."""
    asked = {name: value for name, value in given.items() if value is not None}
    if len(asked) == 2 and asked["dtype"] != asked["torch_dtype"]:
        raise ValueError(f"from_pretrained: dtype={asked['dtype']!r} and torch_dtype={asked['torch_dtype']!r} disagree")
    if not asked:
        return None
    name, value = next(iter(asked.items()))
    if isinstance(value, torch.dtype):
        if not value.is_floating_point:
            raise ValueError(f"from_pretrained: {name}={value} is not a floating-point dtype")
        return value
    if value == "auto":
        return None
    if isinstance(value, str) and value.removeprefix("torch.") in _DTYPES:
        return _DTYPES[value.removeprefix("torch.")]
    raise ValueError(
        f"from_pretrained: {name}={value!r} is not a dtype; use one of {sorted(_DTYPES)}, 'auto' or a torch.dtype"
    )


def pick_device(**given) -> torch.device:
    """Where the model goes: ``device=``, ``device_map=`` (one device or "auto") or ``map_location=``."""
    location = given.pop("map_location")
    asked = {name: value for name, value in given.items() if value is not None}
    if isinstance(asked.get("device_map"), dict):
        raise ValueError(
            "from_pretrained: device_map as a dict (parts of the model on different devices) is not supported; "
            "pass one device, e.g. device_map='cuda'"
        )
    if asked.get("device_map") == "auto":
        asked["device_map"] = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        devices = {name: torch.device(value) for name, value in asked.items()}
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"from_pretrained: {asked} does not name a device: {exc}") from None
    if len(set(devices.values())) > 1:
        raise ValueError(f"from_pretrained: {', '.join(f'{k}={v!r}' for k, v in asked.items())} disagree")
    return next(iter(devices.values())) if devices else torch.device(location)


def _run_hint(directory: Path) -> str:
    """What to do with a training run or one of its checkpoints, which hold weights in their own format."""
    if holds_checkpoints(directory):
        return (
            "; it holds a training run (or a checkpoint of one): export it first with "
            f"`python -m recipes.export {directory} OUT_DIR`, then load OUT_DIR"
        )
    return ""


def resolve(path_or_repo: str | os.PathLike, filename: str, download: dict[str, Any]) -> Path:
    """The local path of ``filename`` in a directory, or downloaded from a Hub repository."""
    local = Path(path_or_repo).expanduser()
    if local.is_dir():
        if not (local / filename).is_file():
            raise FileNotFoundError(
                f"no {filename} in {local}: not a directory written by save_pretrained(){_run_hint(local)}"
            )
        return local / filename
    repo_id = os.fspath(path_or_repo)
    if local.exists() or not _REPO_ID.fullmatch(repo_id):
        raise FileNotFoundError(f"{local} is not a directory written by save_pretrained() nor a Hub repository id")
    hub = require("huggingface_hub")
    try:
        return Path(hub.hf_hub_download(repo_id=repo_id, filename=filename, **download))
    except Exception as exc:  # noqa: BLE001 - network, authentication, missing repo or file
        raise FileNotFoundError(
            f"no directory {local}, and {filename} of the Hub repository {repo_id!r} cannot be fetched: "
            f"{type(exc).__name__}: {exc}"
        ) from None


def resolve_weights(path_or_repo: str | os.PathLike, download: dict[str, Any]) -> list[Path]:
    """model.safetensors, or the shards its index lists (``max_shard_size``), local or downloaded."""
    try:
        return [resolve(path_or_repo, WEIGHTS_NAME, download)]
    except FileNotFoundError as single:
        try:
            index = resolve(path_or_repo, INDEX_NAME, download)
        except FileNotFoundError:
            raise single from None
    return [resolve(path_or_repo, shard, download) for shard in shard_names(index)]


# "name" or "owner/name", the form of a Hub repository id
_REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")


def check_finite(tensors: dict[str, torch.Tensor], where) -> None:
    """Refuse NaN or inf in any floating-point tensor (a model that would only output NaN)."""
    bad = [name for name, t in tensors.items() if t.is_floating_point() and not bool(torch.isfinite(t).all())]
    if bad:
        raise PretrainedFileError(f"{where}: non-finite values (NaN/inf) in {', '.join(map(repr, bad))}")


def check_tensors(model: nn.Module, tensors: dict[str, torch.Tensor], weights_file: Path) -> None:
    """Every tensor the model expects, with its shape, and no other: one error naming all that differ."""
    expected = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    problems = [
        f"missing tensor {name!r} (expected shape {shape})" for name, shape in expected.items() if name not in tensors
    ]
    problems += [
        f"unexpected tensor {name!r} (shape {tuple(t.shape)})" for name, t in tensors.items() if name not in expected
    ]
    problems += [
        f"tensor {name!r} has shape {tuple(t.shape)}, expected {expected[name]}"
        for name, t in tensors.items()
        if name in expected and tuple(t.shape) != expected[name]
    ]
    if problems:
        raise PretrainedFileError(
            f"{weights_file} does not match the {type(model).__name__} its config.json describes: {'; '.join(problems)}"
        )


def check_unit_rows(named_tensors: dict[str, torch.Tensor], where: str) -> None:
    """Refuse sphere weights whose rows are not unit vectors (within the dtype's tolerance)."""
    bad = []
    for name, tensor in named_tensors.items():
        error, tolerance = float(Sphere.norm_error(tensor)), point_tolerance(tensor.dtype)
        if not error <= tolerance:  # also catches NaN
            bad.append(f"{name!r} (|row norm - 1| up to {error:.3g}, tolerance {tolerance:g} for {tensor.dtype})")
    if bad:
        raise PretrainedFileError(
            f"{where}: sphere weights must be matrices of unit rows, but these are not: {'; '.join(bad)}"
        )


#: How to put sphere weights that an optimizer moved off the sphere back, and keep them there.
OFF_SPHERE_REMEDY = (
    "put them back with spherenet.optim.normalize_(model) (the paper's normalization after each step, Section 2.6); "
    "to keep them there, train with spherenet's optimizers (spherenet.optim.build_optimizer; with transformers.Trainer: "
    "optimizers=build_optimizer(...)) or pass callbacks=[spherenet.hf.SphereCallback()] to transformers.Trainer"
)


def off_sphere(named_tensors) -> tuple[int, str, float, float] | None:
    """``(how many, worst name, its |row norm - 1|, its tolerance)`` of the sphere weights in
    ``named_tensors`` (``(name, tensor)`` pairs) whose rows are not unit vectors within
    :func:`~spherenet.manifolds.point_tolerance` of their dtype; ``None`` when all are. One
    read of each tensor and one host synchronization (a DTensor: the rows this rank holds)."""
    named = [(name, t.to_local() if hasattr(t, "to_local") else t) for name, t in named_tensors]  # FSDP2: own rows
    if not named:
        return None
    errors = [Sphere.norm_error(t) for _, t in named]
    errors = torch.stack([e.to(device=errors[0].device, dtype=torch.float64) for e in errors]).tolist()
    bad = [
        (error, name, tolerance)
        for (name, t), error in zip(named, errors)
        if not error <= (tolerance := point_tolerance(t.dtype))  # also catches NaN
    ]
    if not bad:
        return None
    error, name, tolerance = max(bad, key=lambda b: b[0] if b[0] == b[0] else float("inf"))
    return len(bad), name, error, tolerance


def upload_folder(folder: str | os.PathLike, repo_id: str, hub_args: dict[str, Any]) -> str:
    """Upload the saved model in ``folder`` to the Hub repository ``repo_id`` (created when
    missing; ``revision``'s branch too). ``hub_args``: :data:`HUB_ARGS`. Returns the commit's URL."""
    hub = require("huggingface_hub")
    unknown = sorted(set(hub_args) - set(HUB_ARGS))
    if unknown:
        raise TypeError(f"push_to_hub does not take {', '.join(unknown)}; it takes {', '.join(HUB_ARGS)}")
    token, revision = hub_args.get("token"), hub_args.get("revision")
    api = hub.HfApi(token=token)
    repo = api.create_repo(repo_id, private=hub_args.get("private"), exist_ok=True)
    if revision is not None and not revision.startswith("refs/pr"):
        api.create_branch(repo_id=repo.repo_id, branch=revision, exist_ok=True)
    commit = api.upload_folder(
        repo_id=repo.repo_id,
        folder_path=str(folder),
        commit_message=hub_args.get("commit_message") or "Upload model",
        commit_description=hub_args.get("commit_description"),
        revision=revision,
        create_pr=bool(hub_args.get("create_pr", False)),
    )
    return commit.commit_url
