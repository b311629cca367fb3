"""The run config's sections build the run's parts: ``[model]`` the preset's typed model config,
``[optim]`` the optimizer and schedule of a model; the [optim] choices are the optimizers' own."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from spherenet.models import GPTConfig, NGPTConfig, model_from_config
from spherenet.optim import GRADIENTS, METHODS, SECOND_MOMENTS, SPHERE_KERNELS, build_optimizer
from spherenet.train.config import ConfigError, load_config, model_config, resolved
from spherenet.train.config_rules import CHOICES


def test_the_model_section_builds_the_presets_typed_config():
    cfg = load_config(None, ["model.preset=gpt-tiny", "model.n_layers=3", "model.d_model=48"])
    config = cfg.model.build(300)
    assert type(config) is GPTConfig and (config.n_layers, config.d_model, config.vocab_size) == (3, 48, 300)
    assert cfg.model.build(300) == model_config(cfg, 300)
    ngpt = load_config(None, ["model.vocab_size=100"]).model.build(300)
    assert type(ngpt) is NGPTConfig and ngpt.vocab_size == 100  # the section's own vocab_size wins


@pytest.mark.parametrize(
    "override, named",
    [("model.nonsense=1", "'nonsense'"), ("model.n_layers=-2", "n_layers"), ("model.preset=ngpt-huge", "ngpt-huge")],
)
def test_the_model_section_refuses_an_unknown_or_ill_typed_key_in_one_line(override, named):
    cfg = load_config(None, [override])
    with pytest.raises(ConfigError) as info:
        cfg.model.build()
    message = str(info.value)
    assert message.startswith("[model] preset") and named in message and "\n" not in message


def test_the_optim_section_builds_what_build_optimizer_builds():
    cfg = resolved(load_config(None, ["optim.lr=0.01", "optim.beta2=0.99", "optim.sphere_kernel=torch"]))
    torch.manual_seed(0)
    model = model_from_config(dataclasses.replace(cfg.model.build(256), n_layers=1))
    optimizer, scheduler = cfg.optim.build(model, total_steps=20)
    o = cfg.optim
    by_hand, by_hand_schedule = build_optimizer(
        model, o.method, lr=o.lr, total_steps=20, weight_decay=o.weight_decay, warmup_steps=o.warmup_steps,
        betas=(o.beta1, o.beta2), eps=o.eps, second_moment=o.second_moment, gradient=o.gradient,
        sphere_kernel=o.sphere_kernel, muon_lr=o.muon_lr, matrix_lr=o.matrix_lr, muon_momentum=o.muon_momentum,
    )  # fmt: skip  # the keywords recipes.train passed by hand, together
    assert type(optimizer) is type(by_hand) and optimizer.defaults == by_hand.defaults
    assert [len(g["params"]) for g in optimizer.param_groups] == [len(g["params"]) for g in by_hand.param_groups]
    assert optimizer.defaults["betas"] == (0.9, 0.99) and optimizer.defaults["lr"] == 0.01
    for _ in range(5):  # each optimizer steps first (no gradients: nothing moves), as training does
        optimizer.step()
        by_hand.step()
        scheduler.step()
        by_hand_schedule.step()
    assert scheduler.get_last_lr() == by_hand_schedule.get_last_lr()


def test_the_optim_section_refuses_what_the_method_cannot_do_naming_it():
    cfg = resolved(load_config(None, ["model.preset=gpt-tiny", "optim.method=adamw", "optim.warmup_steps=50"]))
    model = model_from_config(dataclasses.replace(cfg.model.build(256), n_layers=1))
    with pytest.raises(ConfigError, match=r"^\[optim\] method 'adamw' with train.steps=10: "):
        cfg.optim.build(model, total_steps=10)  # the warmup is longer than the run


def test_the_optim_choices_are_the_optimizers_own():
    assert CHOICES["optim", "method"] == METHODS
    # the sphere-Adam keys are checked by the options object alone, its message naming the key once
    assert not {"second_moment", "gradient", "sphere_kernel"} & {key for section, key in CHOICES if section == "optim"}
    for key, bad, allowed in (
        ("second_moment", "column", SECOND_MOMENTS),
        ("gradient", "paper", GRADIENTS),
        ("sphere_kernel", "cuda", SPHERE_KERNELS),
        ("sphere_kernel", "foreach", SPHERE_KERNELS),
    ):
        with pytest.raises(ConfigError) as info:
            load_config(None, [f"optim.{key}={bad}"])
        message = str(info.value)
        assert message.startswith(f"optim.{key}") and message.endswith(f"must be one of {allowed}, got {bad!r}")
        assert message.count(key) == 1 and "\n" not in message, message
