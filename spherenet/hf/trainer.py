"""Training nGPT with ``transformers.Trainer`` on the sphere, and resuming it.

:class:`~spherenet.hf.SpherenetNGPTForCausalLM` follows every step of any torch optimizer that
holds its sphere weights with :func:`spherenet.optim.normalize_` (the paper's method, Section 2.6),
so Trainer's defaults (AdamW) keep it on the unit sphere. Two more ways:

- ``callbacks=[SphereCallback()]``: the same normalization as a Trainer callback, for a model that
  does not do it itself (spherenet's own ``NGPT``);
- ``optimizers=spherenet.optim.build_optimizer(model, lr=..., total_steps=...)``: spherenet's
  optimizer (Riemannian Adam by default, which keeps them on the sphere itself) and its schedule.

A training forward warns once when the weights are off the sphere anyway (changed by hand), and
``save_pretrained`` refuses them.

``trainer.train(resume_from_checkpoint=True)`` resumes from the last complete checkpoint
(:func:`last_complete_checkpoint`): importing :mod:`spherenet.hf` makes Trainer pass over a
checkpoint it was stopped while writing, which transformers would pick and then fail on.
"""

from __future__ import annotations

import os
import re
import sys
import warnings

import transformers.trainer_utils
from transformers import TrainerCallback

from ..manifolds import named_sphere_parameters
from ..optim import normalize_

__all__ = ["SphereCallback", "last_complete_checkpoint"]

#: the file Trainer writes last into a checkpoint: a checkpoint without it was not finished
TRAINER_STATE_NAME = "trainer_state.json"
_CHECKPOINT = re.compile(rf"^{transformers.trainer_utils.PREFIX_CHECKPOINT_DIR}-(\d+)$")


class SphereCallback(TrainerCallback):
    """Renormalize the model's sphere weights after every optimizer step of ``transformers.Trainer``
    (``W <- Norm(W)`` along the embedding dimension, Section 2.6 step 2), with
    :func:`spherenet.optim.normalize_` on the parameters the model declares on the sphere
    (:func:`spherenet.manifolds.named_sphere_parameters`). Runs before the learning-rate schedule
    steps and before any checkpoint is saved, so every saved state is on the sphere.

    Refuses, when training begins, a model that declares no sphere weights (the baseline GPT:
    nothing to normalize)."""

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if model is None:
            raise ValueError("SphereCallback needs the model: use it as transformers.Trainer(callbacks=[...])")
        if not named_sphere_parameters(model):
            raise ValueError(
                f"SphereCallback: {type(model).__name__} declares no sphere weights, so there is nothing to "
                "normalize (the baseline GPT trains without it)"
            )

    def on_optimizer_step(self, args, state, control, model=None, **kwargs):
        normalize_(model)


def last_complete_checkpoint(folder: str | os.PathLike) -> str | None:
    """The ``checkpoint-N`` of a Trainer's output ``folder`` to resume from: the one of the highest
    step that Trainer finished writing (it has ``trainer_state.json``, which Trainer writes last);
    later ones (the run was stopped while writing them) are passed over with a warning naming
    them. None where ``folder`` holds no checkpoint; where it holds only unfinished ones, a
    ``ValueError`` in one line naming them and what to do. What ``resume_from_checkpoint=True`` reads
    (transformers' ``get_last_checkpoint`` takes the highest step, finished or not)."""
    found = {}
    for name in os.listdir(folder):
        match = _CHECKPOINT.match(name)
        if match and os.path.isdir(os.path.join(folder, name)):
            found[int(match.group(1))] = name
    if not found:
        return None
    steps = sorted(found, reverse=True)
    complete = next((s for s in steps if os.path.isfile(os.path.join(folder, found[s], TRAINER_STATE_NAME))), None)
    unfinished = ", ".join(found[s] for s in steps if complete is None or s > complete)
    if complete is None:
        raise ValueError(
            f"{folder}: no checkpoint to resume from: {unfinished} has no {TRAINER_STATE_NAME} (the run was stopped "
            "while writing it); delete it and train from the start, without resume_from_checkpoint"
        )
    if unfinished:
        warnings.warn(
            f"{folder}: resuming from {found[complete]}, passing over {unfinished}, which has no {TRAINER_STATE_NAME} "
            "(the run was stopped while writing it; the resumed run writes it again)",
            UserWarning,
            stacklevel=3,
        )
    return os.path.join(folder, found[complete])


def _resume_from_complete_checkpoints() -> None:
    """Make Trainer's ``resume_from_checkpoint=True`` read :func:`last_complete_checkpoint`: in
    transformers.trainer_utils, whose function transformers.trainer takes when it is imported, and in
    transformers.trainer itself when it already is. For a checkpoint it finished, the same answer."""
    transformers.trainer_utils.get_last_checkpoint = last_complete_checkpoint
    trainer_module = sys.modules.get("transformers.trainer")
    if trainer_module is not None:
        trainer_module.get_last_checkpoint = last_complete_checkpoint


_resume_from_complete_checkpoints()
