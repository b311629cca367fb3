"""spherenet.optim's recipes: the paper's normalize hook, build_optimizer's methods and the values
it refuses (bad settings, a warmup longer than the run, a method that cannot hold the sphere),
and RiemannianAdam's bad values. All on small models, all fast. The model and helpers:
optim_helpers.py."""

from __future__ import annotations

import math

import pytest
import torch
from optim_helpers import batches, make_model, max_norm_error, train
from torch import nn

from spherenet.optim import RiemannianAdam, WarmupCosine, add_normalize_hook, build_optimizer

pytestmark = pytest.mark.usefixtures("one_thread")


# ---------------------------------------------------------------------------------------------
# the paper's normalize hook and the recipes


def test_normalize_hook_renormalizes_after_each_step():
    model = make_model()
    opt = torch.optim.Adam(model.parameters(), lr=5e-2)
    handle = add_normalize_hook(opt, model)
    errors = []
    train(model, opt, batches(5), after_step=lambda: errors.append(max_norm_error(model)))
    assert max(errors) <= 1e-6
    handle.remove()
    train(model, opt, batches(3))
    assert max_norm_error(model) > 1e-3  # without the hook Adam leaves the sphere


def test_build_optimizer_recipes():
    ngpt = make_model()
    opt, sched = build_optimizer(ngpt, "riemannian_adam", lr=1e-3, total_steps=100)
    assert isinstance(opt, RiemannianAdam)
    assert all(g["weight_decay"] == 0.0 for g in opt.param_groups)
    assert isinstance(sched, torch.optim.lr_scheduler.LambdaLR)
    lrs = []
    for _ in range(100):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs[0] == pytest.approx(1e-3)  # no warmup
    assert lrs[50] == pytest.approx(0.5e-3)  # cosine
    assert lrs[-1] == pytest.approx(1e-3 * 0.5 * (1 + math.cos(math.pi * 99 / 100)))
    assert opt.param_groups[0]["lr"] == pytest.approx(0.0, abs=1e-12)  # annealed to 0

    gpt = nn.Sequential(nn.Embedding(10, 8), nn.Linear(8, 8), nn.LayerNorm(8))
    opt, sched = build_optimizer(gpt, "adamw", lr=1e-3, total_steps=10_000)
    assert isinstance(opt, torch.optim.AdamW)
    decay = {n for g in opt.param_groups if g["weight_decay"] == 0.1 for n in g["param_names"]}
    assert decay == {"0.weight", "1.weight"}  # matrices only, not biases / LayerNorm
    assert opt.param_groups[0]["lr"] == pytest.approx(1e-3 / 2000)  # warmup step 1 of 2000
    for _ in range(1999):
        opt.step()
        sched.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(1e-3)

    opt, _ = build_optimizer(make_model(), "adam_normalize", lr=1e-3, total_steps=10, weight_decay=0.1)
    assert {(g["manifold"], g["weight_decay"]) for g in opt.param_groups} >= {("sphere", 0.0), ("euclidean", 0.1)}

    state = sched.state_dict()
    assert state["lr_lambdas"][0] == {"total_steps": 10_000, "warmup_steps": 2000}
    assert WarmupCosine(10, 0)(10) == pytest.approx(0.0)


@pytest.mark.parametrize("kwargs,match", [
    (dict(method="sgd"), "unknown method 'sgd'"),
    (dict(lr=0.0), "lr must be > 0"),
    (dict(lr=float("nan")), "lr must be > 0"),
    (dict(total_steps=0), "total_steps must be an int >= 1"),
    (dict(warmup_steps=-1), "warmup_steps must be an int >= 0"),
    (dict(warmup_steps=100), r"warmup_steps \(100\) must be < total_steps \(100\)"),
    (dict(weight_decay=-0.1), "weight_decay must be >= 0"),
    (dict(betas=(0.9, 1.0)), r"betas\[1\] must be in \[0, 1\)"),
    (dict(second_moment="col"), "second_moment must be one of"),
    (dict(method="adamw", total_steps=5000), "method 'adamw' on a model with sphere parameters"),
])  # fmt: skip  # one case per line
def test_build_optimizer_names_bad_values(kwargs, match):
    args = dict(method="riemannian_adam", lr=1e-3, total_steps=100) | kwargs
    with pytest.raises(ValueError, match=match):
        build_optimizer(make_model(), **args)


def test_a_default_warmup_longer_than_the_run_is_named_as_the_recipes_default():
    plain = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 2))
    with pytest.raises(ValueError, match=r"warmup_steps \(2000\) \(the 'adamw' recipe's default.*< total_steps"):
        build_optimizer(plain, "adamw", lr=1e-3, total_steps=300)


@pytest.mark.parametrize("method", ["adamw", "muon", "adamh"])
@pytest.mark.parametrize("settings", [dict(total_steps=300), dict(lr=-1.0, total_steps=5000)], ids=["short", "bad_lr"])
def test_a_method_that_cannot_hold_the_sphere_is_refused_before_its_settings(method, settings):
    """Whatever else is wrong, the method itself is named first: no setting would make it fit."""
    with pytest.raises(ValueError, match=f"method '{method}' on a model with (row-)?sphere parameters"):
        build_optimizer(make_model(), method, **{"lr": 1e-3} | settings)


def test_riemannian_adam_names_bad_values():
    model = make_model()
    for kwargs, match in [
        (dict(lr=-1.0), "lr must be >= 0"),
        (dict(eps=-1.0), "eps must be >= 0"),
        (dict(betas=(1.0, 0.9)), r"betas\[0\]"),
        (dict(second_moment="diag"), "second_moment must be one of"),
        (dict(fused="yes"), "fused must be"),
    ]:
        with pytest.raises(ValueError, match=match):
            RiemannianAdam(model, **{"lr": 1e-3, **kwargs})
