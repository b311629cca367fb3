"""The model classes by ``model_type`` (:data:`MODEL_CLASSES`) and their base :class:`HubMixin`:
``save_pretrained`` / ``from_pretrained`` / ``push_to_hub`` in the Hugging Face Hub layout.

The files (their layout, their checks, the upload) are :mod:`spherenet.io`'s, which knows a model
only as its config's fields, its state dict and its sphere weights; this module builds the model.
The options of the three methods are documented there (:mod:`spherenet.io.pretrained`).
huggingface_hub's ``PyTorchModelHubMixin`` is not the base: a base class cannot be optional, and
it decodes a dataclass ``config`` from its annotation, a string under ``from __future__ import
annotations``. The file layout is the same.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, ClassVar

import torch

from ..io import (
    PretrainedContents,
    PretrainedFileError,
    check_on_sphere,
    config_from_dict,
    exported_model_type,
    open_pretrained,
    push_to_hub,
    save_pretrained,
)
from ..manifolds import named_sphere_parameters

__all__ = ["MODEL_CLASSES", "HubMixin", "model_class", "model_class_of", "exported_classes"]

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


def exported_classes() -> dict[str, type]:
    """The model classes by the ``model_type`` their exports' config.json holds (``"spherenet-ngpt"``)."""
    return {exported_model_type(model_type): cls for model_type, cls in MODEL_CLASSES.items()}


class HubMixin:
    """The models' base: ``save_pretrained`` / ``from_pretrained`` / ``push_to_hub`` for ``Model(config)``
    of one config dataclass (kept as ``model.config``); a subclass that sets ``model_type`` in its
    class body enters :data:`MODEL_CLASSES`."""

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
        """The ``config_class`` of a saved config dict (:func:`spherenet.io.config_from_dict`)."""
        return config_from_dict(cls.config_class, values, where)

    def sphere_weights(self) -> dict[str, torch.Tensor]:
        """``{name: tensor}`` of the parameters declared on the unit sphere."""
        return dict(named_sphere_parameters(self))

    def check_on_sphere(self, tensors: dict[str, torch.Tensor] | None = None, action: str = "save") -> None:
        """Refuse sphere weights (of ``tensors``, a state dict, or else the model's) off the sphere."""
        check_on_sphere(self.architecture, self.sphere_weights(), tensors, action)

    def pretrained_contents(self) -> PretrainedContents:
        """What ``save_pretrained`` writes: names, config fields, state dict, sphere weights."""
        if self.__dict__.get("folded_for_inference"):  # spherenet.models.inference: other tensors, no sphere weights
            raise ValueError(
                "save_pretrained: this model was folded for inference (fold_for_inference); save the model it was "
                "folded from"
            )
        names = (type(self).__name__, self.architecture, self.model_type)
        return PretrainedContents(*names, dataclasses.asdict(self.config), self.state_dict(), self.sphere_weights())

    def save_pretrained(self, save_directory: str | os.PathLike, **options) -> str | None:
        """Write the model into ``save_directory`` (``options``: :func:`spherenet.io.save_pretrained`'s)."""
        return save_pretrained(save_directory, self.pretrained_contents(), **options)

    def push_to_hub(self, repo_id: str, **options) -> str:
        """Upload the model to the Hub repository ``repo_id`` (:func:`spherenet.io.push_to_hub`)."""
        return push_to_hub(repo_id, self.pretrained_contents(), **options)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str | os.PathLike, **options):
        """The model saved at a local directory or a Hub repository id, in eval mode (``options``
        and refusals: :func:`spherenet.io.open_pretrained`'s)."""
        saved = open_pretrained(pretrained_model_name_or_path, **options)
        fields = saved.config_fields(exported_model_type(cls.model_type), exported_classes())
        try:
            config = cls.config_from_dict(fields, str(saved.config_file))
        except ValueError as exc:
            raise PretrainedFileError(str(exc)) from None
        return saved.load_into(cls(config))
