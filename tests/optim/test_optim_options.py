"""The sphere-Adam options object on its way from the run config to the kernel: the ``[optim]``
section and the keywords of ``build_optimizer`` and ``RiemannianAdam`` build one
``SphereAdamOptions``, which reaches ``sphere_adam_`` unchanged; a bad value is reported once,
naming its config key; param groups carry no options of their own; the step reaches the
retraction in few calls."""

from __future__ import annotations

import inspect

import pytest
import torch

from spherenet.kernels import sphere_adam as sphere_adam_module
from spherenet.kernels import sphere_rows
from spherenet.layers import SphereLinear
from spherenet.models import from_preset
from spherenet.optim import RiemannianAdam, SphereAdamOptions, build_optimizer, param_groups
from spherenet.optim.builders import declare_hidden_matrix_spheres
from spherenet.train.config import ConfigError, OptimSection, load_config


def small():
    torch.manual_seed(0)
    return from_preset("ngpt-tiny", vocab_size=32, d_model=16, n_heads=2, n_layers=1, max_seq_len=8)


def seen_options(monkeypatch, optimizer) -> list[SphereAdamOptions]:
    """The options each ``sphere_adam_`` call of one step receives."""
    seen, original = [], sphere_adam_module.sphere_adam_

    def spy(*args, options, **kwargs):
        seen.append(options)
        return original(*args, options=options, **kwargs)

    monkeypatch.setattr("spherenet.optim.riemannian_adam.sphere_adam_", spy)
    for group in optimizer.param_groups:
        for p in group["params"]:
            p.grad = torch.full_like(p, 0.01)
    optimizer.step()
    return seen


def test_the_keywords_build_one_options_object_that_reaches_the_step(monkeypatch):
    optimizer, _ = build_optimizer(
        small(), lr=1e-2, total_steps=5, second_moment="row", gradient="riemannian", sphere_kernel="torch"
    )
    assert optimizer.options == SphereAdamOptions("row", "riemannian", "torch")
    (seen,) = seen_options(monkeypatch, optimizer)
    assert seen is optimizer.options


def test_the_configs_options_object_is_the_one_the_kernel_receives(monkeypatch):
    cfg = load_config(None, ["optim.second_moment=row", "optim.gradient=riemannian", "optim.sphere_kernel=torch"])
    built = []
    original = OptimSection.sphere_adam_options

    def record(section):
        built.append(original(section))
        return built[-1]

    monkeypatch.setattr(OptimSection, "sphere_adam_options", record)
    optimizer, _ = cfg.optim.build(small(), total_steps=5)
    (options,) = built  # built once, by the section's build
    assert options == SphereAdamOptions("row", "riemannian", "torch") and optimizer.options is options
    for _ in range(3):  # the same object at every step: nothing is rebuilt
        (seen,) = seen_options(monkeypatch, optimizer)
        assert seen is options


@pytest.mark.parametrize(
    "override, message",
    [
        ("optim.second_moment=column", "optim.second_moment must be one of ('element', 'row'), got 'column'"),
        ("optim.gradient=tangent", "optim.gradient must be one of ('riemannian', 'euclidean'), got 'tangent'"),
        (
            "optim.sphere_kernel=foreach",
            "optim.sphere_kernel (the sphere-Adam implementation) must be one of "
            "('auto', 'reference', 'torch', 'native', 'triton'), got 'foreach'",
        ),
    ],
)
def test_a_bad_config_value_is_reported_once_naming_its_key(monkeypatch, override, message):
    checks = []
    original = SphereAdamOptions.__post_init__

    def counted(options):
        checks.append(options)
        return original(options)

    monkeypatch.setattr(SphereAdamOptions, "__post_init__", counted)
    with pytest.raises(ConfigError) as info:
        load_config(None, [override])
    assert str(info.value) == message  # the key once, the allowed values, the bad one
    assert len(checks) == 1  # one check: the options object's own


def test_an_options_object_is_handed_through_as_it_is(monkeypatch):
    options = SphereAdamOptions(second_moment="row", implementation="reference")
    optimizer, _ = build_optimizer(small(), lr=1e-2, total_steps=5, options=options)
    assert optimizer.options is options
    assert seen_options(monkeypatch, optimizer)[0] is options
    with pytest.raises(ValueError, match=r"build_optimizer: got options= and gradient=; give the options object"):
        build_optimizer(small(), lr=1e-2, total_steps=5, options=options, gradient="riemannian")
    with pytest.raises(TypeError, match="options must be a SphereAdamOptions, got dict"):
        RiemannianAdam(small(), options={"second_moment": "row"})


@pytest.mark.parametrize("key", ["gradient", "second_moment", "options"])
def test_a_group_carries_no_options_of_its_own(key):
    model = small()
    groups = param_groups(model)
    sphere = next(g for g in groups if g["manifold"] == "sphere")
    sphere[key] = {"gradient": "riemannian", "second_moment": "row", "options": SphereAdamOptions()}[key]
    with pytest.raises(ValueError, match=rf"a param group with '{key}': the options .* are the optimizer's"):
        RiemannianAdam(groups, lr=1e-2, model=model)
    assert not any(set(g) & {"second_moment", "gradient", "options"} for g in RiemannianAdam(model).param_groups)


def test_the_adam_part_of_spherical_muon_keeps_the_euclidean_gradient():
    optimizer, _ = build_optimizer(small(), "spherical_muon", lr=1e-2, total_steps=5, gradient="riemannian")
    (adam,) = [part for part in optimizer.optimizers if isinstance(part, RiemannianAdam)]
    assert adam.options.gradient == "euclidean"


@pytest.mark.parametrize("implementation", ["torch", "reference"])
def test_the_step_reaches_the_retraction_in_at_most_four_calls(monkeypatch, implementation):
    """step -> sphere_adam_ -> the implementation (-> the row sphere's step_ -> its retr_)."""
    frames = []
    retractions = {"torch": (sphere_rows.RowOps, "retr_"), "reference": (torch.linalg, "vector_norm")}
    owner, name = retractions[implementation]
    original = getattr(owner, name)

    def spy(*args, **kwargs):
        if not frames:
            stack = [f.function for f in inspect.stack()[1:]]
            frames.extend(stack[: stack.index("step") + 1])
        return original(*args, **kwargs)

    layer = SphereLinear(8, 4)
    optimizer = RiemannianAdam(layer, lr=1e-2, sphere_kernel=implementation)
    layer(torch.randn(3, 8)).square().sum().backward()
    optimizer.step()  # the first step's checks (norms of new rows) done
    monkeypatch.setattr(owner, name, spy)
    optimizer.step()
    assert frames[-1] == "step" and len(frames) <= 4, frames


def test_a_geometrys_group_refuses_a_row_second_moment_when_added_and_steps_with_torch(monkeypatch):
    torch.manual_seed(0)
    gpt = from_preset("gpt-tiny", vocab_size=32, d_model=16, n_heads=2, n_layers=1, max_seq_len=8)
    declare_hidden_matrix_spheres(gpt)
    with pytest.raises(ValueError, match="second_moment='row' is for the row sphere; a matrix_sphere group"):
        RiemannianAdam(gpt, lr=1e-2, second_moment="row")
    optimizer = RiemannianAdam(gpt, lr=1e-2, sphere_kernel="reference")
    seen = seen_options(monkeypatch, optimizer)
    assert seen == [SphereAdamOptions(implementation="torch")]  # the one implementation that steps it
    assert seen_options(monkeypatch, optimizer)[0] is seen[0]  # made once, not at every step
