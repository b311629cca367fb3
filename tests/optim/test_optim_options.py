"""The sphere-Adam options object on its way through the optimizer: the keywords of
``build_optimizer`` and ``RiemannianAdam`` build one ``SphereAdamOptions``, which reaches
``sphere_adam_`` unchanged; a group's own values override it; the step reaches the retraction in
few calls."""

from __future__ import annotations

import inspect

import pytest
import torch

from spherenet.kernels import sphere_adam as sphere_adam_module
from spherenet.kernels import sphere_rows
from spherenet.layers import SphereLinear
from spherenet.models import from_preset
from spherenet.optim import RiemannianAdam, SphereAdamOptions, build_optimizer, param_groups


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
        small(), lr=1e-2, total_steps=5, second_moment="row", gradient="riemannian", sphere_kernel="foreach"
    )
    assert optimizer.options == SphereAdamOptions("row", "riemannian", "torch")  # "foreach" kept as "torch"
    assert seen_options(monkeypatch, optimizer) == [optimizer.options]


def test_an_options_object_is_handed_through_as_it_is(monkeypatch):
    options = SphereAdamOptions(second_moment="row", implementation="reference")
    optimizer, _ = build_optimizer(small(), lr=1e-2, total_steps=5, options=options)
    assert optimizer.options is options
    assert seen_options(monkeypatch, optimizer)[0] is options
    with pytest.raises(ValueError, match=r"build_optimizer: got options= and gradient=; give the options object"):
        build_optimizer(small(), lr=1e-2, total_steps=5, options=options, gradient="riemannian")
    with pytest.raises(TypeError, match="options must be a SphereAdamOptions, got dict"):
        RiemannianAdam(small(), options={"second_moment": "row"})


def test_a_groups_own_values_override_the_options_and_are_checked(monkeypatch):
    model = small()
    groups = param_groups(model)
    sphere = next(g for g in groups if g["manifold"] == "sphere")
    sphere["gradient"] = "riemannian"
    optimizer = RiemannianAdam(groups, lr=1e-2, model=model, sphere_kernel="torch")
    assert seen_options(monkeypatch, optimizer) == [SphereAdamOptions(gradient="riemannian", implementation="torch")]
    sphere["second_moment"] = "column"
    with pytest.raises(ValueError, match=r"second_moment must be one of \('element', 'row'\), got 'column'"):
        RiemannianAdam(groups, model=model)


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
