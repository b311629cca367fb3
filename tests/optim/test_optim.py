"""spherenet.optim's bookkeeping: how parameters are discovered and grouped (the manifold, weight
decay, tied weights), state_dict round trips and re-wrapped models, and the refusals (misplaced
or off-sphere parameters, bad shapes, unclassified state, a model changed after the first step),
with the wrapper's closure and scheduler and the compiled step. All on small models, all fast.
The model and helpers: optim_helpers.py."""

from __future__ import annotations

import copy
import io

import pytest
import torch
from optim_helpers import SPHERE_NAMES, D, Tiny, batches, loss_of, make_model, max_norm_error, named_params, train
from torch import nn
from torch.nn import functional as F

from spherenet.layers import SphereLinear
from spherenet.manifolds import Sphere, declare_manifold
from spherenet.manifolds.sphere import geoopt
from spherenet.optim import (
    Riemannian,
    RiemannianAdam,
    add_normalize_hook,
    build_optimizer,
    named_sphere_parameters,
    param_groups,
    sphere_parameters,
)

pytestmark = pytest.mark.usefixtures("one_thread")


# ---------------------------------------------------------------------------------------------
# discovery


def test_param_groups_carry_the_manifold_and_split_weight_decay():
    model = make_model()
    groups = param_groups(model, weight_decay=0.1)
    by_key = {(g["manifold"], g["weight_decay"]): {n for n, _ in g["params"]} for g in groups}
    assert by_key[("sphere", 0.0)] == SPHERE_NAMES
    assert by_key[("euclidean", 0.1)] == {"mix.weight"}  # ndim >= 2 only
    assert by_key[("euclidean", 0.0)] == {"s.param", "mix.bias"}
    # no weight decay: a single Euclidean group
    assert [g["manifold"] for g in param_groups(model)] == ["sphere", "euclidean"]


def test_discovery_survives_load_state_dict_assign():
    model = make_model()
    fresh = Tiny()
    fresh.load_state_dict(model.state_dict(), assign=True)
    # The premise: assign=True drops geoopt's ManifoldParameter class ...
    assert not any(isinstance(p, geoopt.ManifoldParameter) for p in fresh.parameters())
    # ... but the declarations still find every sphere weight, as the objects the model holds now.
    found = dict(named_sphere_parameters(fresh))
    assert set(found) == SPHERE_NAMES
    for name, p in found.items():
        assert p is named_params(fresh)[name]


def test_tied_sphere_weight_is_listed_once():
    model = make_model()
    model.out.weight = model.emb.weight  # tie E_out to E_in (both (V, D), sphere last)
    declare_manifold(model.out, "weight", Sphere())
    assert [n for n, _ in named_sphere_parameters(model)].count("emb.weight") == 1
    assert sum(p is model.emb.weight for p in sphere_parameters(model)) == 1


def test_undeclared_manifold_parameter_is_refused():
    model = make_model()
    model.extra = nn.Module()
    model.extra.w = geoopt.ManifoldParameter(Sphere().random_point(3, D), manifold=Sphere())
    with pytest.raises(ValueError, match="extra.w.*does not declare"):
        param_groups(model)
    with pytest.raises(ValueError, match="extra.w"):
        RiemannianAdam(model, lr=1e-3)


def test_other_manifolds_are_refused():
    model = make_model()
    declare_manifold(model.mix, "weight", geoopt.Stiefel())
    with pytest.raises(ValueError, match="mix.weight.*spherenet supports the unit sphere along the last dimension"):
        param_groups(model)


# ---------------------------------------------------------------------------------------------
# state_dict, re-wrapped models


def _round_trip_next_step_identical(make_opt, steps=5):
    model = make_model()
    opt = make_opt(model)
    data = batches(steps + 1)
    train(model, opt, data[:steps])
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, buf)
    buf.seek(0)
    saved = torch.load(buf, weights_only=True)
    train(model, opt, data[steps:])  # the original continues

    clone = Tiny()
    clone.load_state_dict(saved["model"])
    opt2 = make_opt(clone)
    opt2.load_state_dict(saved["opt"])
    train(clone, opt2, data[steps:])
    for (n, p), q in zip(model.named_parameters(), clone.parameters()):
        assert torch.equal(p, q), n
    for p, q in zip(model.parameters(), clone.parameters()):
        for key, value in opt.state[p].items():
            assert torch.equal(value, opt2.state[q][key]), key


@pytest.mark.parametrize("make_opt", [
    lambda m: RiemannianAdam(m, lr=2e-2, second_moment="element"),
    lambda m: RiemannianAdam(m, lr=2e-2, second_moment="row", weight_decay=0.1),
    lambda m: Riemannian(torch.optim.SGD(param_groups(m), lr=0.3, momentum=0.9), m),
], ids=["element", "row", "wrapped-SGD"])  # fmt: skip  # one case per line
def test_state_dict_round_trip_gives_the_same_next_step(make_opt):
    _round_trip_next_step_identical(make_opt)


def test_state_dict_of_other_second_moment_is_refused():
    model = make_model()
    opt = RiemannianAdam(model, lr=1e-2, second_moment="row")
    train(model, opt, batches(2))
    opt2 = RiemannianAdam(model, lr=1e-2, second_moment="element")
    opt2.load_state_dict(opt.state_dict())
    with pytest.raises(ValueError, match="second_moment='element' needs"):
        train(model, opt2, batches(1))


@pytest.mark.parametrize("method", ["riemannian_adam", "adam_normalize"])
def test_assign_rewrapped_model_is_still_optimized_on_the_sphere(method):
    source = make_model()
    model = Tiny()
    model.load_state_dict(source.state_dict(), assign=True)
    assert not isinstance(model.q.weight, geoopt.ManifoldParameter)
    opt, _ = build_optimizer(model, method, lr=5e-2, total_steps=50)
    before = model.q.weight.detach().clone()
    errors = []
    train(model, opt, batches(10), after_step=lambda: errors.append(max_norm_error(model)))
    assert max(errors) <= 1e-6
    assert float((model.q.weight.detach() - before).abs().max()) > 1e-2  # it did move
    # The premise: geoopt on the same re-wrapped model takes Euclidean steps off the sphere.
    model2 = Tiny()
    model2.load_state_dict(source.state_dict(), assign=True)
    train(model2, geoopt.optim.RiemannianAdam(model2.parameters(), lr=5e-2), batches(10))
    assert max_norm_error(model2) > 1e-3


def test_optimizer_built_before_assign_is_refused_at_step():
    model = make_model()
    opt = RiemannianAdam(model, lr=1e-2)
    model.load_state_dict(make_model(seed=1).state_dict(), assign=True)
    with pytest.raises(RuntimeError, match="were replaced"):
        train(model, opt, batches(1))
    opt2 = torch.optim.Adam(make_model().parameters(), lr=1e-2)
    with pytest.raises(ValueError, match="does not hold"):
        add_normalize_hook(opt2, model)


def test_model_watch_walks_the_model_once_then_confirms(monkeypatch):
    """After one full walk, a step confirms the links it saw instead of walking the model again."""
    from spherenet.optim import _checks

    walks = []
    real = _checks.named_sphere_parameters
    monkeypatch.setattr(_checks, "named_sphere_parameters", lambda m: walks.append(1) or real(m))
    model = make_model()
    opt = RiemannianAdam(model, lr=1e-2)
    train(model, opt, batches(5))
    assert len(walks) == 1
    opt._watch.full_every = 3
    train(model, opt, batches(6))
    assert len(walks) == 3  # steps 6 and 9 walk again


@pytest.mark.parametrize("change", ["replace_module", "replace_param", "add_module"])
def test_model_change_after_the_first_step_is_refused(change):
    model = make_model()
    opt = RiemannianAdam(model, lr=1e-2)
    opt._watch.full_every = 4
    train(model, opt, batches(2))
    if change == "replace_module":  # a sphere layer swapped for a new one
        model.q = SphereLinear(D, model.q.out_features, sphere="in")
    elif change == "replace_param":
        model.q.weight = torch.nn.Parameter(model.q.weight.detach().clone())
    else:  # a new sphere layer: not on any confirmed link, caught by the periodic full walk
        model.extra = SphereLinear(D, D, sphere="in")
        train(model, opt, batches(2))  # steps 3 and 4 confirm; step 5 walks
    with pytest.raises(RuntimeError, match="were replaced"):
        train(model, opt, batches(1))


# ---------------------------------------------------------------------------------------------
# refusals


def test_manifold_parameter_in_a_euclidean_group_is_refused():
    model = make_model()
    with pytest.raises(ValueError, match="ManifoldParameter on the sphere but sits in a 'euclidean'"):
        RiemannianAdam(model.parameters(), lr=1e-3)
    with pytest.raises(ValueError, match="ManifoldParameter on the sphere"):
        Riemannian(torch.optim.Adam(model.parameters(), lr=1e-3))


def test_declared_parameter_in_no_sphere_group_is_refused():
    model = make_model()
    plain = Tiny()
    plain.load_state_dict(model.state_dict(), assign=True)  # no ManifoldParameter left
    groups = [
        {"params": [p for n, p in plain.named_parameters() if n in SPHERE_NAMES - {"q.weight"}], "manifold": "sphere"},
        {"params": [p for n, p in plain.named_parameters() if n not in SPHERE_NAMES]},
    ]
    with pytest.raises(ValueError, match="'emb.weight' is declared on the sphere but is in a 'euclidean'"):
        RiemannianAdam(list(plain.parameters()), lr=1e-3, model=plain)
    with pytest.raises(ValueError, match="'q.weight' is declared on the sphere but is in no param group"):
        RiemannianAdam(groups, lr=1e-3, model=plain)
    with pytest.raises(ValueError, match="'q.weight' is not in the base optimizer"):
        Riemannian(torch.optim.Adam(groups, lr=1e-3), plain)


def test_weight_decay_on_the_sphere_is_refused():
    model = make_model()
    groups = param_groups(model)
    groups[0]["weight_decay"] = 0.1
    with pytest.raises(ValueError, match="weight_decay=0.1 in a sphere param group"):
        RiemannianAdam(groups, lr=1e-3)
    with pytest.raises(ValueError, match="weight_decay=0.01"):
        Riemannian(torch.optim.AdamW(model.parameters(), lr=1e-3), model)  # AdamW's default decay
    # the module form applies the constructor's weight decay to Euclidean matrices only
    opt = RiemannianAdam(model, lr=1e-3, weight_decay=0.1)
    assert {(g["manifold"], g["weight_decay"]) for g in opt.param_groups} == {
        ("sphere", 0.0),
        ("euclidean", 0.1),
        ("euclidean", 0.0),
    }


def test_bad_sphere_shapes_are_refused():
    p = nn.Parameter(torch.ones(5, 1))
    with pytest.raises(ValueError, match="last dimension, which must have size >= 2"):
        RiemannianAdam([{"params": [p], "manifold": "sphere"}], lr=1e-3)
    with pytest.raises(ValueError, match="manifold must be one of"):
        RiemannianAdam([{"params": [p], "manifold": "stiefel"}], lr=1e-3)


@pytest.mark.parametrize("make_opt", [
    lambda m, policy: RiemannianAdam(m, lr=1e-2, off_sphere=policy),
    lambda m, policy: Riemannian(torch.optim.Adam(param_groups(m), lr=1e-2), m, off_sphere=policy),
], ids=["RiemannianAdam", "Riemannian"])  # fmt: skip  # one case per line
def test_off_sphere_rows_at_first_step(make_opt):
    model = make_model()
    with torch.no_grad():
        model.o.weight.mul_(1.5)
    with pytest.raises(ValueError, match="not unit.*'o.weight'"):
        train(model, make_opt(model, "error"), batches(1))
    assert max_norm_error(model) > 0.4  # refused before touching anything
    with pytest.warns(UserWarning, match="projecting sphere parameters.*'o.weight'"):
        train(model, make_opt(model, "project"), batches(1))
    assert max_norm_error(model) <= 1e-6
    with pytest.raises(ValueError, match="off_sphere must be one of"):
        make_opt(model, "ignore")


def test_wrapper_closure_and_scheduler():
    """A closure's gradients are projected before the base uses them; an LR scheduler on the
    wrapper drives the base's learning rate (the groups are shared)."""
    model = make_model()
    base = torch.optim.SGD(param_groups(model), lr=0.2)
    opt = Riemannian(base, model)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5**s)
    ids, tgt = batches(1)[0]

    def closure():
        opt.zero_grad()
        loss = loss_of(model, ids, tgt)
        loss.backward()
        return loss

    for _ in range(3):
        before = model.q.weight.detach().clone()
        lr = base.param_groups[0]["lr"]
        loss = opt.step(closure)
        sched.step()
        u = model.q.weight.grad  # what the base used: the closure's gradient, projected
        assert float((before * u).sum(-1).abs().max()) < 1e-6
        assert torch.allclose(model.q.weight.detach(), F.normalize(before - lr * u, dim=-1), atol=1e-6)
    assert isinstance(loss, torch.Tensor)
    assert base.param_groups[0]["lr"] == pytest.approx(0.2 * 0.5**3)
    assert max_norm_error(model) <= 1e-6


def test_unclassified_state_of_a_wrapped_optimizer_is_refused():
    class Odd(torch.optim.SGD):
        @torch.no_grad()
        def step(self, closure=None):
            for group in self.param_groups:
                for p in group["params"]:
                    if p.grad is not None:
                        self.state[p]["mystery"] = p.grad.clone()
            return super().step(closure)

    model = make_model()
    opt = Riemannian(Odd(param_groups(model), lr=0.1), model)
    with pytest.raises(RuntimeError, match="'mystery'.*vector_states"):
        train(model, opt, batches(1))
    model = make_model()
    opt = Riemannian(Odd(param_groups(model), lr=0.1), model, vector_states={"mystery"})
    train(model, opt, batches(2))
    for p in sphere_parameters(model):
        assert float((p.detach() * opt.state[p]["mystery"]).sum(-1).abs().max()) < 1e-6


@pytest.mark.parametrize("make_opt", [
    lambda m: RiemannianAdam(m, lr=2e-2, second_moment="element"),
    lambda m: RiemannianAdam(m, lr=2e-2, second_moment="row"),
    lambda m: Riemannian(torch.optim.Adam(param_groups(m), lr=2e-2), m),
], ids=["element", "row", "wrapped-Adam"])  # fmt: skip  # one case per line
def test_compiled_step_keeps_norms_and_matches_eager(make_opt):
    torch._dynamo.reset()
    eager_model = make_model()
    compiled_model = copy.deepcopy(eager_model)
    eager, compiled = make_opt(eager_model), make_opt(compiled_model)
    compiled_step = torch.compile(compiled.step)
    for ids, tgt in batches(4):
        for model, step, opt in ((eager_model, eager.step, eager), (compiled_model, compiled_step, compiled)):
            opt.zero_grad()
            loss_of(model, ids, tgt).backward()
            step()
    assert max_norm_error(compiled_model) <= 1e-6
    assert all(torch.equal(p, q) for p, q in zip(eager_model.parameters(), compiled_model.parameters()))
