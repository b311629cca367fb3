"""LoRA fine-tuning in ``recipes.train``: ``train.lora_rank=R`` (with ``train.init_from``).

    spherenet-train train.init_from=exported/ngpt train.lora_rank=8 data.source=my.txt

The model's weights are frozen and rank-R adapters of ``train.lora_targets`` are trained
(:mod:`spherenet.hf.lora`: for nGPT a sphere-aware LoRA unless ``train.lora_sphere_aware=false``).
Validation runs the adapted model. Each checkpoint holds the merged model as its ``model`` (what
``recipes.export``, ``spherenet-eval`` and ``recipes.sample`` read: an export is the merged model,
an ordinary nGPT or GPT) and the adapted model, base weights and adapters, as ``lora`` (what
``--resume`` continues). Needs peft (``pip install "spherenet-torch[hf]"``).
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from spherenet import install_hint
from spherenet.train.config import ConfigError

__all__ = ["LoraTraining", "lora_training", "checkpoint_models"]


def lora_training(model: nn.Module, train, is_main: bool = True) -> LoraTraining | None:
    """The run's LoRA adapters on ``model`` (in place) when ``train.lora_rank`` asks for them,
    else ``None`` (every weight trains)."""
    return LoraTraining(model, train, is_main) if train.lora_rank else None


def checkpoint_models(model: nn.Module, lora: LoraTraining | None) -> dict[str, object]:
    """The checkpoint's model entries: ``{"model": model}``, or, fine-tuning with LoRA, the merged
    model as ``model`` (what export, evaluation and sampling read) and the adapted one as ``lora``
    (what ``--resume`` continues)."""
    return {"model": lora.merged, "lora": lora} if lora is not None else {"model": model}


class LoraTraining:
    """The adapters of a model being fine-tuned, and a merged copy of it for checkpoints.

    ``model`` (spherenet's NGPT / GPT) gets its LoRA layers in place, so that training and
    validation run through them; :attr:`merged` is a model of the same class whose weights
    :meth:`refresh_merged` sets to the merged ones. As a checkpoint entry this object saves and
    restores the adapted model's whole state (base weights and adapters)."""

    def __init__(self, model: nn.Module, train, is_main: bool = True):
        try:
            from peft import inject_adapter_in_model

            from spherenet.hf.lora import sphere_lora_config
        except ImportError as exc:
            raise ConfigError(f"train.lora_rank needs peft and transformers: {install_hint('hf')} ({exc})") from None
        targets = train.lora_targets[0] if train.lora_targets == ["all-linear"] else list(train.lora_targets)
        try:
            config = sphere_lora_config(
                model,
                target_modules=targets,
                sphere_aware=train.lora_sphere_aware,
                r=train.lora_rank,
                lora_alpha=train.lora_alpha or train.lora_rank,
            )
        except ValueError as exc:  # a model without SphereLinear asked for the sphere-aware LoRA
            raise ConfigError(f"train.lora_sphere_aware: {exc}; set train.lora_sphere_aware=false") from None
        self.merged = copy.deepcopy(model)
        self.merged.requires_grad_(False)
        try:
            inject_adapter_in_model(config, model)
        except ValueError as exc:  # peft: no module matched the names
            raise ConfigError(f"train.lora_targets={train.lora_targets}: {' '.join(str(exc).split())}") from None
        self.model = model
        self.trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        self.adapted = sorted({n.rsplit(".lora_", 1)[0] for n, p in model.named_parameters() if p.requires_grad})
        if is_main:
            total = sum(p.numel() for p in self.merged.parameters())
            kind = "sphere-aware" if train.lora_sphere_aware and _has_sphere_linear(model) else "plain"
            print(
                f"lora: {kind} rank-{train.lora_rank} adapters on {len(self.adapted)} projections, "
                f"{self.trainable:,} trainable parameters of {total:,} (the rest frozen)",
                flush=True,
            )

    def refresh_merged(self) -> nn.Module:
        """:attr:`merged` with the adapted model's merged weights (before a checkpoint)."""
        from spherenet.hf.lora import merged_state_dict

        self.merged.load_state_dict(merged_state_dict(self.model))
        return self.merged

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().as_subclass(torch.Tensor).clone() for k, v in self.model.state_dict().items()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.model.load_state_dict(state)
        self.refresh_merged()


def _has_sphere_linear(model: nn.Module) -> bool:
    from spherenet.layers import SphereLinear

    return any(isinstance(m, SphereLinear) for m in model.modules())
