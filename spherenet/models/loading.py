"""The model a saved directory holds, built: :func:`load_pretrained` (spherenet's export, of the
class its config.json names in :data:`~spherenet.models.hub.MODEL_CLASSES`),
:func:`from_normalized_nemotron` (NVIDIA's published Normalized-Nemotron layout: an NGPT) and
:func:`load_saved` (either), which every recipe that loads a saved model goes through; and the
:class:`NGPTConfig` of the published layout's config.json (:func:`nemotron_config`,
:func:`nemotron_config_of`). Reading and checking the files is :mod:`spherenet.io`'s.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch import nn

from ..io import (
    CONFIG_NAME,
    PretrainedFileError,
    is_published_directory,
    nemotron_fields,
    nemotron_fields_of,
    open_normalized_nemotron,
    pick_device,
    pick_dtype,
    saved_model_type,
)
from .hub import exported_classes
from .ngpt import NGPT, NGPTConfig

__all__ = ["load_pretrained", "from_normalized_nemotron", "load_saved", "nemotron_config", "nemotron_config_of"]


def _config(fields: dict, where: str) -> NGPTConfig:
    try:
        return NGPTConfig(**fields)
    except ValueError as exc:  # NGPTConfig's own checks, past the layout's
        raise PretrainedFileError(f"{where}: {exc}") from None


def nemotron_config(values: dict, where: str = CONFIG_NAME) -> NGPTConfig:
    """The :class:`NGPTConfig` of a config.json in the Normalized-Nemotron layout (a dict); a
    :class:`~spherenet.io.PretrainedFileError` naming ``where`` and the field for any field or
    value it cannot map (:func:`spherenet.io.nemotron_fields`)."""
    return _config(nemotron_fields(values, where), where)


def nemotron_config_of(path: str | os.PathLike) -> NGPTConfig:
    """The :class:`NGPTConfig` of a directory in the Normalized-Nemotron layout (refusals as in
    :func:`from_normalized_nemotron`)."""
    return _config(nemotron_fields_of(path), str(Path(path).expanduser() / CONFIG_NAME))


def load_pretrained(pretrained_model_name_or_path: str | os.PathLike, **kwargs) -> nn.Module:
    """A model saved by ``save_pretrained``, of the class its config.json's ``model_type`` names
    in :data:`~spherenet.models.hub.MODEL_CLASSES` (keyword arguments as in
    :meth:`~spherenet.models.hub.HubMixin.from_pretrained`)."""
    classes = exported_classes()
    model_type = saved_model_type(pretrained_model_name_or_path, classes, **kwargs)
    return classes[model_type].from_pretrained(pretrained_model_name_or_path, **kwargs)


def from_normalized_nemotron(
    path: str | os.PathLike, dtype: torch.dtype | str | None = None, device: str | torch.device | None = None
) -> NGPT:
    """The :class:`NGPT` saved at ``path`` in the Normalized-Nemotron layout, in eval mode.

    ``dtype``: of every parameter, a ``torch.dtype`` or its name (default or ``"auto"``: the
    stored one, or the widest of them when the tensors differ); ``device`` (default CPU): where
    the parameters are built and read into. The model is built on the meta device and each tensor
    is read from the files straight into its parameter, so memory peaks at one copy of the model.
    Raises :class:`~spherenet.io.PretrainedFileError` in one line naming the path, the field or
    the tensor: no config.json, a config field it cannot map, a missing, unexpected, misshapen
    or non-float tensor, a non-finite value, or a sphere weight whose unit vectors (rows of
    embed_tokens, q/k/v_proj, up_proj, lm_head; columns of o_proj, down_proj) are not unit
    within :data:`~spherenet.io.UNIT_TOLERANCE`; and, when the directory has the sha256sums.json
    that :func:`~spherenet.io.to_normalized_nemotron` writes, a file whose size or sha256 differs
    from it (:mod:`spherenet.io.nemotron_read`).
    """
    saved = open_normalized_nemotron(path)
    config = _config(saved.fields, str(saved.directory / CONFIG_NAME))
    dtype = pick_dtype(dtype=dtype, torch_dtype=None)
    if dtype is None:
        dtype = saved.stored_dtype()
    with torch.device("meta"):
        model = NGPT(config)
    model = model.to(dtype).to_empty(device=torch.device("cpu" if device is None else device))
    saved.read_into(model)
    return model.eval()


def load_saved(path: str | os.PathLike, **kwargs) -> nn.Module:
    """The model saved at ``path``, in eval mode: a local directory in the published layout
    (:func:`~spherenet.io.is_published_directory`) through :func:`from_normalized_nemotron`, else
    :func:`load_pretrained` (a spherenet export, a local directory or a Hub id). ``kwargs`` are
    :meth:`~spherenet.models.hub.HubMixin.from_pretrained`'s; for the published layout only
    dtype, torch_dtype, device, device_map and map_location apply."""
    if not is_published_directory(path):
        return load_pretrained(path, **kwargs)
    dtype = pick_dtype(dtype=kwargs.get("dtype"), torch_dtype=kwargs.get("torch_dtype"))
    device = pick_device(
        map_location=kwargs.get("map_location", "cpu"), device=kwargs.get("device"), device_map=kwargs.get("device_map")
    )
    return from_normalized_nemotron(Path(path).expanduser(), dtype=dtype, device=device).eval()
