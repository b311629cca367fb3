"""The sphere's guards of an export's classes (``modeling_spherenet.py`` mixes :class:`SphereGuards`
in), needing torch and transformers only: an export carries this file as ``guards_spherenet.py``.

nGPT's matrices are unit rows (Loshchilov et al. 2024, Section 2.6): every step of any torch
optimizer that holds them is followed by their normalization, a training forward warns when they
are off the sphere anyway, ``save_pretrained`` refuses them and writes the export's files with
their manifest (``sha256sums.json``, every file's size and sha256, as spherenet writes it), and
``from_pretrained`` checks the files against it.
"""

import hashlib
import json
import math
import os
import shutil
import warnings
import weakref
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook
from transformers.utils import (
    CONFIG_NAME,
    GENERATION_CONFIG_NAME,
    SAFE_WEIGHTS_INDEX_NAME,
    SAFE_WEIGHTS_NAME,
    cached_file,
)

#: the |row norm - 1| a sphere weight may have, by dtype (spherenet's tolerances)
SPHERE_TOLERANCE = {torch.float64: 1e-10, torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}
#: every file's size and sha256, as spherenet writes and checks it
MANIFEST_NAME = "sha256sums.json"
_MANIFEST_FORMAT = {"format": "spherenet-files", "version": 1}
_CODE_FILES = ("configuration_spherenet.py", "guards_spherenet.py", "modeling_spherenet.py")  # the export's code
# from_pretrained's arguments that say where and how to fetch a Hub repository's files
_HUB_ARGS = ("cache_dir", "force_download", "local_files_only", "proxies", "revision", "subfolder", "token")
# save_pretrained's arguments of the push that push_to_hub=True makes (token goes to both)
_PUSH_ARGS = ("repo_id", "commit_message", "commit_description", "private", "create_pr", "revision", "tags")
_OFF_SPHERE_REMEDY = (
    "they were changed other than by an optimizer step (after each of which the model renormalizes them, "
    "Section 2.6); put them back with model.normalize_sphere_weights_()"
)


def _rows(weight: torch.Tensor) -> torch.Tensor:
    """``weight``'s rows in float32 at least, detached: where their norms are computed."""
    return weight.detach().to(torch.float64 if weight.dtype == torch.float64 else torch.float32)


def off_sphere(weights: dict[str, torch.Tensor]) -> tuple[int, str, float, float] | None:
    """``(how many, the worst's name, its |row norm - 1|, its tolerance)`` of the ``weights`` whose
    rows are not unit vectors within their dtype's tolerance; ``None`` when all are."""
    if not weights:
        return None
    errors = [(_rows(w).norm(dim=-1) - 1).abs().max() for w in weights.values()]
    errors = torch.stack([e.to(errors[0].device, torch.float64) for e in errors]).tolist()  # one synchronization
    bad = [
        (error, name, tolerance)
        for (name, w), error in zip(weights.items(), errors)
        if not error <= (tolerance := SPHERE_TOLERANCE.get(w.dtype, 1e-5))  # also catches NaN
    ]
    if not bad:
        return None
    error, name, tolerance = max(bad, key=lambda b: b[0] if b[0] == b[0] else math.inf)
    return len(bad), name, error, tolerance


_KEPT_ON_SPHERE = weakref.WeakSet()  # the models whose sphere weights every optimizer step is followed by normalizing
_STEP_HOOK = []  # torch's handle of _normalize_after_step, once registered


def _normalize_after_step(optimizer, args, kwargs) -> None:
    """After every step of any torch optimizer: each model whose sphere weights it holds puts them
    back on the sphere ("after each training step, normalize all matrices", Section 2.6 step 2)."""
    held = {id(p) for group in optimizer.param_groups for p in group["params"]}
    for model in list(_KEPT_ON_SPHERE):
        if any(id(w) in held for w in model.sphere_weights().values()):
            model.normalize_sphere_weights_()


def keep_on_sphere(model) -> None:
    """Renormalize ``model``'s sphere weights after every step of any torch optimizer that holds one."""
    if not _STEP_HOOK:
        _STEP_HOOK.append(register_optimizer_step_post_hook(_normalize_after_step))
    _KEPT_ON_SPHERE.add(model)


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _shards(index_file: str) -> list[str]:
    with open(index_file, encoding="utf-8") as f:
        return sorted(set(json.load(f)["weight_map"].values()))


def write_export_files(directory: str) -> None:
    """This code's files beside a saved config and weights, and ``sha256sums.json`` over every
    file of the save (config.json, generation_config.json, the weights or their shards and index,
    the code), in spherenet's layout."""
    here = os.path.dirname(os.path.abspath(__file__))
    for name in _CODE_FILES:
        try:
            shutil.copyfile(os.path.join(here, name), os.path.join(directory, name))
        except shutil.SameFileError:
            pass
    index = os.path.join(directory, SAFE_WEIGHTS_INDEX_NAME)
    weights = [SAFE_WEIGHTS_INDEX_NAME, *_shards(index)] if os.path.isfile(index) else [SAFE_WEIGHTS_NAME]
    names = [CONFIG_NAME, GENERATION_CONFIG_NAME, *weights, *_CODE_FILES]
    files = {}
    for name in sorted(n for n in names if os.path.isfile(os.path.join(directory, n))):
        path = os.path.join(directory, name)
        files[name] = {"size": os.path.getsize(path), "sha256": _sha256(path)}
    with open(os.path.join(directory, MANIFEST_NAME), "w", encoding="utf-8") as f:
        f.write(json.dumps({**_MANIFEST_FORMAT, "files": files}, indent=1, sort_keys=True) + "\n")


def check_export_files(where: str, hub_args: dict[str, Any]) -> None:
    """Check config.json and the weights of the export ``where`` (a directory, or a Hub repository
    fetched as transformers fetches it) against its ``sha256sums.json``: a ``ValueError`` in one line
    naming a file that is not listed, missing or different (damaged or altered); a warning where
    there is no manifest."""

    def fetch(name: str) -> str | None:
        return cached_file(where, name, _raise_exceptions_for_missing_entries=False, **hub_args)

    manifest = fetch(MANIFEST_NAME)
    if manifest is None:
        warnings.warn(
            f"{where} has no {MANIFEST_NAME}: its files cannot be checked for damage (saved by hand or by an older "
            "spherenet); loading them unchecked",
            UserWarning,
            stacklevel=3,
        )
        return
    with open(manifest, encoding="utf-8") as f:
        listed = json.load(f)
    files = listed.get("files") if isinstance(listed, dict) else None
    if not isinstance(files, dict) or listed.get("format") != _MANIFEST_FORMAT["format"]:
        raise ValueError(f"{manifest} is not a spherenet file manifest")
    index = fetch(SAFE_WEIGHTS_INDEX_NAME)
    for name in [CONFIG_NAME, *([SAFE_WEIGHTS_INDEX_NAME, *_shards(index)] if index else [SAFE_WEIGHTS_NAME])]:
        entry, path = files.get(name), fetch(name)
        if not (isinstance(entry, dict) and {"size", "sha256"} <= set(entry)):
            raise ValueError(f"{where}: {name} is not listed in {MANIFEST_NAME}")
        if path is None:
            raise ValueError(f"{where}: {name} is missing")
        if os.path.getsize(path) != entry["size"]:
            raise ValueError(
                f"{where}: {name} has {os.path.getsize(path)} bytes but {MANIFEST_NAME} records {entry['size']} "
                "(truncated or overwritten)"
            )
        digest = _sha256(path)
        if digest != entry["sha256"]:
            raise ValueError(
                f"{where}: {name} has sha256 {digest[:16]}... but {MANIFEST_NAME} records {entry['sha256'][:16]}... "
                "(contents altered)"
            )


class SphereGuards:
    """What an export's causal LM classes add to transformers' ``PreTrainedModel`` (mixed in before
    it): the sphere weights (none unless the class names them), kept, watched and checked, and the
    export's files on save and load."""

    sphere_check_every = 10  # a training forward checks the sphere weights every so many calls (_watch_sphere)

    def sphere_weights(self) -> dict[str, torch.Tensor]:
        """``{name: weight}`` of the matrices kept on the unit sphere, as unit rows: none here."""
        return {}

    @torch.no_grad()
    def normalize_sphere_weights_(self) -> None:
        """Put every sphere weight back on the unit sphere, in place: ``W <- Norm(W)`` along the
        embedding dimension (Section 2.6, step 2)."""
        for weight in self.sphere_weights().values():
            rows = _rows(weight)
            weight.copy_(rows / rows.norm(dim=-1, keepdim=True).clamp_min(1e-30))

    def _off_sphere(self, state_dict: dict | None = None) -> str | None:
        """What is off the sphere, in words, of the sphere weights (of ``state_dict`` when given); None if nothing."""
        weights = self.sphere_weights()
        if state_dict is not None:
            weights = {name: state_dict[name] for name in weights if name in state_dict}
        found = off_sphere(weights)
        if found is None:
            return None
        count, name, error, tolerance = found
        return (
            f"{count} of its {len(weights)} sphere weights have left the unit sphere (|row norm - 1| up to "
            f"{error:.3g} in {name!r}, tolerance {tolerance:g}): {_OFF_SPHERE_REMEDY}"
        )

    def _refuse_off_sphere(self, action: str, state_dict: dict | None = None) -> None:
        found = self._off_sphere(state_dict)
        if found is not None:
            raise ValueError(f"cannot {action} {type(self).__name__}: {found}")

    @torch.compiler.disable  # a counter torch.compile would guard on, recompiling at every call
    def _watch_sphere(self) -> None:
        """Warn once per model when a training forward (every :attr:`sphere_check_every`-th) finds
        sphere weights off the sphere; an inference forward never checks."""
        if self.__dict__.get("_sphere_warned") or not (self.training and torch.is_grad_enabled()):
            return
        calls = self.__dict__["_training_forwards"] = self.__dict__.get("_training_forwards", 0) + 1
        found = self._off_sphere() if calls % self.sphere_check_every == 0 else None
        if found is not None:
            self.__dict__["_sphere_warned"] = True
            warnings.warn(f"{type(self).__name__}: {found}; save_pretrained refuses them", UserWarning, stacklevel=4)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, **kwargs):
        """transformers' ``from_pretrained``, after checking config.json and the weights against the
        export's ``sha256sums.json`` (a file that differs is refused, naming it). A local directory's
        path is kept absolute as ``name_or_path``, which peft records as an adapter's base."""
        if pretrained_model_name_or_path is None:
            return super().from_pretrained(pretrained_model_name_or_path, *model_args, **kwargs)
        where = os.fspath(pretrained_model_name_or_path)
        check_export_files(where, {k: kwargs[k] for k in _HUB_ARGS if kwargs.get(k) is not None})
        model = super().from_pretrained(where, *model_args, **kwargs)
        if os.path.isdir(where):
            model.name_or_path = model.config.name_or_path = os.path.abspath(where)
        return model

    def save_pretrained(self, save_directory, is_main_process=True, state_dict=None, push_to_hub=False, **kwargs):
        """transformers' ``save_pretrained``, writing an export: config.json (with the ``auto_map`` of
        this code), the weights, this code's files and ``sha256sums.json`` over them. Sphere
        weights off the sphere are refused, in one error saying how to put them back, before anything
        is written. ``push_to_hub=True`` saves, then pushes as :meth:`push_to_hub` does (transformers
        would upload the files before the manifest is written)."""
        self._refuse_off_sphere("save", state_dict)
        if push_to_hub:
            if state_dict is not None:
                raise ValueError("save_pretrained: push_to_hub=True pushes the model's own weights: pass no state_dict")
            hub = {k: kwargs.pop(k) for k in _PUSH_ARGS if k in kwargs}
            self.save_pretrained(save_directory, is_main_process, **kwargs)
            if not is_main_process:
                return None
            repo_id = hub.pop("repo_id", os.path.basename(os.path.abspath(save_directory)))
            max_shard_size = kwargs.get("max_shard_size", "50GB")
            return self.push_to_hub(repo_id, token=kwargs.get("token"), max_shard_size=max_shard_size, **hub)
        if getattr(self.config, "auto_map", None) is None:  # built here, not loaded from an export
            self.config.auto_map = {
                "AutoConfig": f"configuration_spherenet.{type(self.config).__name__}",
                "AutoModelForCausalLM": f"modeling_spherenet.{type(self).__name__}",
            }
        super().save_pretrained(save_directory, is_main_process, state_dict, **kwargs)
        if is_main_process:
            write_export_files(os.fspath(save_directory))
        return None

    def push_to_hub(self, *args, **kwargs):
        """transformers' ``push_to_hub`` (through :meth:`save_pretrained`), refusing sphere weights off
        the sphere before the Hub repository is created."""
        self._refuse_off_sphere("push")
        return super().push_to_hub(*args, **kwargs)
