"""Reading NGPT from the published Normalized-Nemotron layout (model_type "ngpt", ``NGPTForCausalLM``).

That layout, of NVIDIA's released normalized models, is a directory holding ``config.json`` and
``model.safetensors`` (or shards listed by ``model.safetensors.index.json``). Its model is an
nGPT with grouped-query attention (``num_key_value_heads``), a free ``head_dim``, a squared-ReLU
MLP without a gate, s_qk applied squared to the queries only, and its learnable scalings stored
as spherenet stores them (Section 2.5: the stored vector times ``init / scale``), so every tensor
maps verbatim onto an :class:`~spherenet.models.NGPT` of ``n_kv_heads``, ``head_dim``,
``mlp="relu2"`` (see :func:`~spherenet.io.nemotron_layout.layout_tensors` for the names):

============================  ==========================================
layout scaling                ScaleSpec of NGPTConfig
============================  ==========================================
``attn_alpha``, ``mlp_alpha``  ``init=*_alpha_init_value, scale=initializer_range, absolute``
``sqk.weight``                ``s_qk``: ``init=sqk_init_value, scale=initializer_range``
``suv.weight``                ``s_uv``: ``init=suv_init_value, scale=suv_init_scaling``
``sz.weight``                 ``s_z``: ``init=sz_init_value, scale=initializer_range``
============================  ==========================================

:func:`open_normalized_nemotron` reads a directory's config and the headers of its tensors and
checks them; its :meth:`~NemotronDirectory.read_into` then reads each tensor from the files
straight into the parameter of a built model (:mod:`spherenet.io.safetensors_stream`), so that
:func:`spherenet.models.from_normalized_nemotron`, which builds the model on the meta device,
peaks at one copy of the model. Config fields, tensors and values it cannot map are refused with
a :class:`PretrainedFileError` naming them, never ignored. When the directory has the
sha256sums.json that :func:`~spherenet.io.nemotron_write.to_normalized_nemotron` writes, its
files are checked against it (NVIDIA's directories have none). The config map is
:mod:`spherenet.io.nemotron_config_map`'s, the tensor table :mod:`spherenet.io.nemotron_layout`'s.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

from ..checkpoint import CheckpointCorruptError, verify_files_manifest
from ..manifolds import named_sphere_parameters
from .hf_layout import CONFIG_NAME, MANIFEST_NAME
from .hf_weights import WEIGHTS_NAME, PretrainedFileError
from .nemotron_config_map import nemotron_fields
from .nemotron_layout import INDEX_NAME, TOKENIZER_FILES, layout_tensors, layout_view
from .safetensors_stream import StoredTensor, TensorFileError, read_header, read_into

__all__ = [
    "NemotronDirectory",
    "open_normalized_nemotron",
    "read_normalized_nemotron_into",
    "nemotron_fields_of",
    "UNIT_TOLERANCE",
]

#: the largest |norm - 1| of a sphere weight's unit vectors that loads (bfloat16 rounding fits)
UNIT_TOLERANCE = 1e-2


def _stored_tensors(directory: Path) -> dict:
    """``{name: StoredTensor}`` over model.safetensors or the shards its index lists."""
    single, index = directory / WEIGHTS_NAME, directory / INDEX_NAME
    if single.is_file() and index.is_file():
        raise PretrainedFileError(f"{directory} holds both {WEIGHTS_NAME} and {INDEX_NAME}; keep one")
    try:
        if single.is_file():
            return read_header(single)
        if not index.is_file():
            raise PretrainedFileError(f"{directory} holds neither {WEIGHTS_NAME} nor {INDEX_NAME}")
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            assert isinstance(weight_map, dict) and all(isinstance(f, str) for f in weight_map.values())
        except (OSError, ValueError, KeyError, TypeError, AssertionError):
            raise PretrainedFileError(
                f"{index}: not a JSON object with a weight_map of tensor names to files"
            ) from None
        stored = {}
        for shard in sorted(set(weight_map.values())):
            if Path(shard).name != shard or not (directory / shard).is_file():
                raise PretrainedFileError(f"{index} lists shard {shard!r}, which is not a file in {directory}")
            for name, tensor in read_header(directory / shard).items():
                if weight_map.get(name) != shard:
                    raise PretrainedFileError(f"{directory / shard}: unexpected tensor {name!r} (not indexed there)")
                stored[name] = tensor
        absent = [name for name in weight_map if name not in stored]
        if absent:
            raise PretrainedFileError(f"{index}: missing tensor {absent[0]!r} (indexed in {weight_map[absent[0]]!r})")
        return stored
    except TensorFileError as exc:
        raise PretrainedFileError(str(exc)) from None


def _check_names_and_shapes(table, stored: dict, directory: Path) -> None:
    expected = {name: shape for name, _, _, shape in table}
    problems = [f"missing tensor {name!r}" for name in expected if name not in stored]
    problems += [f"unexpected tensor {name!r}" for name in stored if name not in expected]
    problems += [
        f"tensor {name!r} has shape {t.shape}, expected {expected[name]}"
        for name, t in stored.items()
        if name in expected and t.shape != expected[name]
    ]
    problems += [f"tensor {n!r} has dtype {t.dtype}, not a float" for n, t in stored.items() if t.torch_dtype is None]
    if problems:
        raise PretrainedFileError(f"{directory} does not match its config.json: {'; '.join(problems)}")


def _check_finite(name: str):
    def check(chunk: torch.Tensor) -> None:
        if not bool(torch.isfinite(chunk).all()):
            raise PretrainedFileError(f"tensor {name!r} holds non-finite values (NaN/inf)")

    return check


def _check_unit(name: str, parameter: torch.Tensor, how: str, rows_per_check: int = 4096) -> None:
    """Refuse a sphere weight whose unit vectors (rows of ``parameter``) are not unit, or that
    holds NaN or inf (its row norm is then not finite: one pass over the values checks both)."""
    worst, work = 0.0, torch.float64 if parameter.dtype == torch.float64 else torch.float32
    for start in range(0, parameter.shape[0], rows_per_check):
        norms = torch.linalg.vector_norm(parameter[start : start + rows_per_check], dim=-1, dtype=work)
        error = float((norms - 1).abs().max())
        if not math.isfinite(error):
            raise PretrainedFileError(f"tensor {name!r} holds non-finite values (NaN/inf)")
        worst = max(worst, error)
    if worst > UNIT_TOLERANCE:
        axis = "columns (unit along axis 0)" if how == "transposed" else "rows (unit along axis 1)"
        raise PretrainedFileError(
            f"tensor {name!r}: its {axis} must be unit vectors, but |norm - 1| reaches {worst:.3g} "
            f"(> {UNIT_TOLERANCE:g})"
        )


def _read_fields(directory: Path) -> dict[str, Any]:
    if not directory.is_dir():
        raise PretrainedFileError(f"{directory} is not a directory")
    config_file = directory / CONFIG_NAME
    try:
        values = json.loads(config_file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PretrainedFileError(f"{directory} has no {CONFIG_NAME}") from None
    except (OSError, ValueError) as exc:
        raise PretrainedFileError(f"cannot read {config_file}: {exc}") from None
    return nemotron_fields(values, str(config_file))


def _verify_manifest(directory: Path) -> None:
    """Check the model's files (config.json, the weights, the index and its shards) and the
    tokenizer's files the manifest lists (those still there) against the sha256sums.json that
    :func:`to_normalized_nemotron` writes: a damaged file is refused naming it. A directory
    without one (as NVIDIA publishes the layout) is not checked."""
    manifest = directory / MANIFEST_NAME
    if not manifest.is_file():
        return
    names = [CONFIG_NAME]
    if (directory / WEIGHTS_NAME).is_file() or not (directory / INDEX_NAME).is_file():
        names.append(WEIGHTS_NAME)
    else:
        names.append(INDEX_NAME)
        try:  # the shards it lists; an unreadable index is refused by _stored_tensors, after its own check here
            names += sorted(
                set(json.loads((directory / INDEX_NAME).read_text(encoding="utf-8"))["weight_map"].values())
            )
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            pass
    try:
        listed = json.loads(manifest.read_text(encoding="utf-8"))["files"]
        names += [name for name in TOKENIZER_FILES if name in listed and (directory / name).is_file()]
    except (OSError, ValueError, KeyError, TypeError):
        pass  # verify_files_manifest says what is wrong with it
    try:
        verify_files_manifest(directory, names, MANIFEST_NAME)
    except CheckpointCorruptError as exc:
        raise PretrainedFileError(str(exc)) from None


def _read_tensors(model: nn.Module, table, stored: dict) -> None:
    """Read every tensor of ``table`` from the files straight into ``model``'s parameters
    (converting dtype and device on the way), checking values as they pass."""
    parameters = dict(model.named_parameters())
    spheres = dict(named_sphere_parameters(model))
    for name, target, how, _ in table:
        parameter = parameters[target]
        try:
            check = None if target in spheres else _check_finite(name)  # spheres: by _check_unit
            read_into(stored[name], layout_view(parameter.data, how), check=check)
        except TensorFileError as exc:
            raise PretrainedFileError(str(exc)) from None
        if target in spheres:
            _check_unit(name, parameter.data, how)


@dataclasses.dataclass(frozen=True)
class NemotronDirectory:
    """A directory in the Normalized-Nemotron layout, checked (:func:`open_normalized_nemotron`):
    its config's NGPTConfig fields, the tensors its files hold (their headers) and the layout's
    table of them."""

    directory: Path
    fields: dict[str, Any]
    stored: dict[str, StoredTensor]
    table: list[tuple[str, str, str, tuple[int, ...]]]

    def stored_dtype(self) -> torch.dtype:
        """The dtype the tensors are stored in (the widest of them when they differ)."""
        dtype = self.stored[self.table[0][0]].torch_dtype
        for t in self.stored.values():
            dtype = torch.promote_types(dtype, t.torch_dtype)
        return dtype

    def read_into(self, model: nn.Module) -> None:
        """Read every tensor from the files straight into the parameters of ``model`` (an NGPT of
        :attr:`fields`, in its own dtype and on its own device), checking values as they pass."""
        _read_tensors(model, self.table, self.stored)


def open_normalized_nemotron(path: str | os.PathLike) -> NemotronDirectory:
    """The directory ``path`` in the Normalized-Nemotron layout, checked: its files against
    their manifest when it has one, its config.json mapped to NGPTConfig's fields, and the
    names, shapes and dtypes of its tensors against the layout's. Raises
    :class:`PretrainedFileError` naming the path, the field or the tensor."""
    directory = Path(path).expanduser()
    _verify_manifest(directory)
    fields = _read_fields(directory)
    stored = _stored_tensors(directory)
    table = layout_tensors(SimpleNamespace(**fields))
    _check_names_and_shapes(table, stored, directory)
    return NemotronDirectory(directory, fields, stored, table)


def read_normalized_nemotron_into(model: nn.Module, path: str | os.PathLike) -> None:
    """Fill an already built ``model`` (an NGPT, in its own dtype and on its own device) with the
    weights saved at ``path`` in the Normalized-Nemotron layout, one tensor at a time, so that no
    second copy of the model is made (a fine-tuning run builds its model first). The model's
    config must be the directory's (:func:`spherenet.models.nemotron_config_of`); the same checks as
    :func:`spherenet.models.from_normalized_nemotron`."""
    directory = Path(path).expanduser()
    _verify_manifest(directory)
    fields = _read_fields(directory)
    differ = {name: value for name, value in fields.items() if getattr(model.config, name, None) != value}
    if differ:
        raise ValueError(f"{directory}: the model's config is not the directory's, which has {differ}")
    stored = _stored_tensors(directory)
    table = layout_tensors(model.config)
    _check_names_and_shapes(table, stored, directory)
    _read_tensors(model, table, stored)


def nemotron_fields_of(path: str | os.PathLike) -> dict[str, Any]:
    """The NGPTConfig fields of a directory in the Normalized-Nemotron layout (refusals as in
    :func:`open_normalized_nemotron`); :func:`spherenet.models.nemotron_config_of` builds the config."""
    return _read_fields(Path(path).expanduser())
