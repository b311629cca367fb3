"""Training nGPT with ``transformers.Trainer`` on the sphere.

Trainer's default optimizer (AdamW) steps nGPT's sphere weights off the unit sphere. Two ways
keep them there (Section 2.6 of the paper):

- ``callbacks=[SphereCallback()]``: the paper's method, any optimizer's step followed by
  :func:`spherenet.optim.normalize_` of every declared sphere weight;
- ``optimizers=spherenet.optim.build_optimizer(model, lr=..., total_steps=...)``: spherenet's
  optimizer (Riemannian Adam by default, which keeps them on the sphere itself) and its schedule.

Without either, a training forward of :class:`~spherenet.hf.SpherenetNGPTForCausalLM` warns once
when the weights have left the sphere, and ``save_pretrained`` refuses them.
"""

from __future__ import annotations

from transformers import TrainerCallback

from ..manifolds import named_sphere_parameters
from ..optim import normalize_

__all__ = ["SphereCallback"]


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
