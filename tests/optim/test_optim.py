"""spherenet.optim: discovery, RiemannianAdam (element / row), the Riemannian wrapper, the
paper's normalize hook, the recipes, and the refusals. All on small models, all fast."""

from __future__ import annotations

import copy
import io
import math

import pytest
import torch
import torch_optimizer
from torch import nn
from torch.nn import functional as F

from spherenet.layers import Scale, SphereEmbedding, SphereLinear
from spherenet.manifolds import Sphere, declare_manifold, point_tolerance
from spherenet.manifolds.sphere import geoopt
from spherenet.optim import (
    MAGNITUDE_STATES,
    Riemannian,
    RiemannianAdam,
    WarmupCosine,
    add_normalize_hook,
    build_optimizer,
    named_sphere_parameters,
    normalize_,
    param_groups,
    sphere_parameters,
)

pytestmark = pytest.mark.usefixtures("one_thread")


V, D, H = 13, 8, 12
SPHERE_NAMES = {"emb.weight", "q.weight", "o.weight", "out.weight"}


class Tiny(nn.Module):
    """Every kind of parameter nGPT has: a sphere embedding, sphere matrices with the sphere
    on the input side and (stored transposed) on the output side, a Scale, and plain Linear."""

    def __init__(self, vocab: int = V, d: int = D, hidden: int = H):
        super().__init__()
        self.emb = SphereEmbedding(vocab, d)
        self.q = SphereLinear(d, hidden, sphere="in")
        self.o = SphereLinear(hidden, d, sphere="out")
        self.s = Scale(hidden, init=1.0, scale=1 / math.sqrt(d))
        self.mix = nn.Linear(d, d)
        self.out = SphereLinear(d, vocab, sphere="in")

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.emb(ids)
        h = F.normalize(h + self.o(torch.tanh(self.q(h) * self.s())), dim=-1)
        return self.out(h + 0.1 * self.mix(h)) * 5.0


def make_model(dtype=torch.float32, seed=0) -> Tiny:
    torch.manual_seed(seed)
    model = Tiny().to(dtype)
    normalize_(model)  # unit in the working dtype (a float32 unit row is 1e-8 off in float64)
    return model


def batches(n: int, seed: int = 1, vocab: int = V):
    g = torch.Generator().manual_seed(seed)
    draw = lambda: torch.randint(0, vocab, (4, 6), generator=g)  # noqa: E731
    return [(draw(), draw()) for _ in range(n)]


def loss_of(model, ids, tgt):
    logits = model(ids)
    return F.cross_entropy(logits.flatten(0, 1), tgt.flatten())


def train(model, opt, data, after_step=None, scheduler=None) -> list[float]:
    losses = []
    for ids, tgt in data:
        opt.zero_grad(set_to_none=True)
        loss = loss_of(model, ids, tgt)
        loss.backward()
        opt.step()
        if scheduler is not None:
            scheduler.step()
        losses.append(loss.item())
        if after_step is not None:
            after_step()
    return losses


def max_norm_error(model) -> float:
    return max(float((p.detach().double().norm(dim=-1) - 1).abs().max()) for p in sphere_parameters(model))


def max_param_diff(a: nn.Module, b: nn.Module) -> float:
    return max(float((p.detach() - q.detach()).abs().max()) for p, q in zip(a.parameters(), b.parameters()))


def named_params(model):
    return dict(model.named_parameters())


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
# every method keeps every sphere row unit after every step


def _rows_unit_after_every_step(model, opt, data, tol):
    errors = []
    train(model, opt, data, after_step=lambda: errors.append(max_norm_error(model)))
    assert len(errors) == len(data)
    assert max(errors) <= tol, errors


@pytest.mark.parametrize("method,second_moment", [
    ("riemannian_adam", "element"),
    ("riemannian_adam", "row"),
    ("adam_normalize", "element"),
])  # fmt: skip  # one case per line
def test_recipes_keep_rows_unit(method, second_moment):
    model = make_model()
    opt, _ = build_optimizer(model, method, lr=3e-2, total_steps=100, second_moment=second_moment)
    _rows_unit_after_every_step(model, opt, batches(20), 1e-6)


@pytest.mark.parametrize("second_moment", ["element", "row"])
def test_bfloat16_weights_stay_on_the_sphere(second_moment):
    """bf16 sphere weights: norms are accumulated in float32, rows stay within bf16's point
    tolerance (1e-2) and training still works."""
    model = make_model(torch.bfloat16)
    opt = RiemannianAdam(model, lr=1e-2, second_moment=second_moment)
    losses = train(model, opt, batches(1) * 15)
    assert max_norm_error(model) <= point_tolerance(torch.bfloat16)
    assert losses[-1] < 0.8 * losses[0]


@pytest.mark.parametrize("make_base", [
    lambda groups: torch.optim.Adam(groups, lr=3e-2),
    lambda groups: torch.optim.SGD(groups, lr=0.5, momentum=0.9),
    lambda groups: torch_optimizer.Lamb(groups, lr=3e-2, weight_decay=0.0),
    lambda groups: torch_optimizer.AdaBelief(groups, lr=3e-2, weight_decay=0.0),
    lambda groups: torch.optim.SGD([p for g in groups for _, p in g["params"]], lr=0.5, momentum=0.9),
], ids=["Adam", "SGD-momentum", "Lamb", "AdaBelief", "SGD-one-mixed-group"])  # fmt: skip  # one case per line
def test_wrapper_keeps_rows_unit_and_reduces_loss(make_base):
    model = make_model()
    opt = Riemannian(make_base(param_groups(model)), model)
    data = batches(1) * 30  # the same batch: the loss must go down
    errors = []
    losses = train(model, opt, data, after_step=lambda: errors.append(max_norm_error(model)))
    assert max(errors) <= 1e-6
    assert losses[-1] < 0.8 * losses[0], losses
    # momentum-like state is tangent at the new point, unless a per-element magnitude sits
    # beside it (Adam-like: then it is not projected, which keeps the step bounded);
    # magnitudes are untouched (non-negative)
    for p in sphere_parameters(model):
        elementwise = any(k in MAGNITUDE_STATES and v.shape == p.shape for k, v in opt.state[p].items())
        for key, value in opt.state[p].items():
            if key in ("exp_avg", "momentum_buffer") and not elementwise:
                assert float((p.detach() * value).sum(-1).abs().max()) < 1e-6
            if key in ("exp_avg_sq", "exp_avg_var"):
                assert float(value.min()) >= 0


# ---------------------------------------------------------------------------------------------
# parity


def _geoopt_groups(model, sphere_wd=0.0):
    named = named_params(model)
    return [
        {"params": [named[n] for n in sorted(SPHERE_NAMES)], "weight_decay": sphere_wd},
        {"params": [p for n, p in named.items() if n not in SPHERE_NAMES]},
    ]


def _ours_groups(model):
    named = named_params(model)
    return [
        {"params": [named[n] for n in sorted(SPHERE_NAMES)], "manifold": "sphere"},
        {"params": [p for n, p in named.items() if n not in SPHERE_NAMES]},
    ]


@pytest.mark.parametrize("dtype,tol,geoopt_sphere_wd", [
    (torch.float32, 1e-6, 0.0),
    (torch.float64, 1e-10, 0.0),
    (torch.float64, 1e-10, 0.1),
])  # fmt: skip  # one case per line
def test_row_second_moment_matches_geoopt(dtype, tol, geoopt_sphere_wd):
    """second_moment="row" is geoopt's RiemannianAdam, step for step (60 steps, same data).

    geoopt's L2 weight decay on a sphere parameter is projected away with the gradient, so
    geoopt with weight decay on its sphere group must match ours (which has none there). (In
    float64 only: in float32 the projection of ``g + wd x`` cancels ~wd/|g| digits.)"""
    ours = make_model(dtype)
    ref = copy.deepcopy(ours)  # keeps geoopt's ManifoldParameter class
    opt = RiemannianAdam(
        _ours_groups(ours), lr=2e-2, betas=(0.9, 0.99), second_moment="row", gradient="riemannian", model=ours
    )
    ref_opt = geoopt.optim.RiemannianAdam(_geoopt_groups(ref, geoopt_sphere_wd), lr=2e-2, betas=(0.9, 0.99))
    worst = 0.0
    for ids, tgt in batches(60):
        for model, o in ((ours, opt), (ref, ref_opt)):
            o.zero_grad()
            loss_of(model, ids, tgt).backward()
            o.step()
        worst = max(worst, max_param_diff(ours, ref))
    assert worst <= tol
    # The run moved the weights: the comparison is not between two frozen models.
    assert max_param_diff(ours, make_model(dtype)) > 1e-2


def test_default_kernel_choice_is_fused_for_small_cpu_tensors_too():
    """fused=None: torch's fused Adam for every tensor it has a kernel for, small CPU ones
    included (faster than foreach at every size measured, see split_fused), so a small model's
    Euclidean group steps bitwise like torch.optim.Adam(fused=True)."""
    from spherenet.optim.groups import split_fused

    tensors = [torch.zeros(8), torch.zeros(3, 5, dtype=torch.float64), torch.zeros(4, dtype=torch.int64)]
    assert split_fused(None, tensors) == [True, True, False]
    assert split_fused(False, tensors) == [False, False, False]
    torch.manual_seed(0)
    ours = nn.Linear(6, 3)
    ref = copy.deepcopy(ours)
    opt, ref_opt = RiemannianAdam(ours, lr=1e-2), torch.optim.Adam(ref.parameters(), lr=1e-2, fused=True)
    g = torch.Generator().manual_seed(4)
    for _ in range(10):
        x = torch.randn(5, 6, generator=g)
        for m, o in ((ours, opt), (ref, ref_opt)):
            o.zero_grad()
            m(x).square().mean().backward()
            o.step()
    assert all(torch.equal(p, q) for p, q in zip(ours.parameters(), ref.parameters()))


@pytest.mark.parametrize("fused", [True, False])
def test_euclidean_params_match_torch_adam_and_adamw(fused):
    """Euclidean groups run torch's own Adam kernels: bitwise equal to torch.optim.Adam with
    the same kernel, 1e-6 from the single-tensor one; weight decay is AdamW's (decoupled)."""
    torch.manual_seed(0)
    ours = nn.Sequential(nn.Linear(6, 7), nn.Tanh(), nn.Linear(7, 3))
    ref_same, ref_plain = copy.deepcopy(ours), copy.deepcopy(ours)
    opt = RiemannianAdam(ours, lr=1e-2, fused=fused)
    same = torch.optim.Adam(ref_same.parameters(), lr=1e-2, **({"fused": True} if fused else {"foreach": True}))
    plain = torch.optim.Adam(ref_plain.parameters(), lr=1e-2, foreach=False)
    g = torch.Generator().manual_seed(3)
    for _ in range(50):
        x = torch.randn(5, 6, generator=g)
        for m, o in ((ours, opt), (ref_same, same), (ref_plain, plain)):
            o.zero_grad()
            m(x).square().mean().backward()
            o.step()
    assert all(torch.equal(p, q) for p, q in zip(ours.parameters(), ref_same.parameters()))
    assert max_param_diff(ours, ref_plain) <= 1e-6
    assert max_param_diff(ours, ref_plain) > 0 or fused is False  # (the kernels do differ in rounding)
    torch.manual_seed(0)
    ours = nn.Linear(6, 3)
    ref_w = copy.deepcopy(ours)
    opt = RiemannianAdam(ours, lr=1e-2, weight_decay=0.5, fused=fused)
    adamw = torch.optim.AdamW(
        [{"params": [ref_w.weight], "weight_decay": 0.5}, {"params": [ref_w.bias], "weight_decay": 0.0}], lr=1e-2
    )
    for _ in range(20):
        x = torch.randn(5, 6, generator=g)
        for m, o in ((ours, opt), (ref_w, adamw)):
            o.zero_grad()
            m(x).square().mean().backward()
            o.step()
    assert max_param_diff(ours, ref_w) <= 1e-6


def _reference_element_run(model, data, lr, betas, eps, transport=False):
    """RiemannianAdam with per-element second moment, written as a plain loop: tangent
    projection, Adam moments, bias-corrected direction, retraction (and, with ``transport``,
    the projection transport of m that Riemannian(torch.optim.Adam) applies); Adam on the
    Euclidean parameters."""
    b1, b2 = betas
    sphere = {id(p) for p in sphere_parameters(model)}
    state = {id(p): (torch.zeros_like(p), torch.zeros_like(p)) for p in model.parameters()}
    for t, (ids, tgt) in enumerate(data, start=1):
        model.zero_grad()
        loss_of(model, ids, tgt).backward()
        with torch.no_grad():
            for p in model.parameters():
                m, v = state[id(p)]
                x, g = p.detach().clone(), p.grad.clone()
                if id(p) in sphere:
                    g = g - (x * g).sum(-1, keepdim=True) * x
                m = b1 * m + (1 - b1) * g
                v = b2 * v + (1 - b2) * g * g
                x = x - lr * (m / (1 - b1**t)) / ((v / (1 - b2**t)).sqrt() + eps)
                if id(p) in sphere:
                    x = x / x.norm(dim=-1, keepdim=True)
                    if transport:
                        m = m - (x * m).sum(-1, keepdim=True) * x
                p.copy_(x)
                state[id(p)] = (m, v)


@pytest.mark.parametrize("fused", [None, True])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-6), (torch.float64, 1e-10)])
def test_element_second_moment_matches_reference_loop(dtype, tol, fused):
    ours = make_model(dtype)
    ref = copy.deepcopy(ours)
    data = batches(50)
    opt = RiemannianAdam(
        ours, lr=2e-2, betas=(0.9, 0.99), eps=1e-8, second_moment="element", gradient="riemannian", fused=fused
    )
    train(ours, opt, data)
    _reference_element_run(ref, data, 2e-2, (0.9, 0.99), 1e-8)
    assert max_param_diff(ours, ref) <= tol
    assert max_param_diff(ours, make_model(dtype)) > 1e-2


@pytest.mark.parametrize("make_opt", [
    lambda m: RiemannianAdam(m, lr=2e-2, second_moment="element", fused=True),
    lambda m: RiemannianAdam(m, lr=2e-2, second_moment="element", fused=False),
    lambda m: RiemannianAdam(m, lr=2e-2, second_moment="row"),
    lambda m: Riemannian(torch.optim.Adam(param_groups(m), lr=2e-2), m),
], ids=["element-fused", "element-foreach", "row", "wrapped-Adam"])  # fmt: skip  # one case per line
def test_cache_blocking_does_not_change_results(make_opt, monkeypatch):
    """The optimizers cut the parameters into row blocks ("waves") to stay in cache; blocks of
    a few rows (every tensor split, blocks spanning tensors) give bitwise the same steps."""
    from spherenet.kernels import sphere_rows

    whole, blocked = make_model(), make_model()
    data = batches(5)
    train(whole, make_opt(whole), data)
    opt = make_opt(blocked)
    monkeypatch.setattr(sphere_rows, "WAVE_BYTES", 3 * D * 4)  # three float32 rows
    chunks = list(sphere_rows.waves([sphere_parameters(blocked)]))
    assert len(chunks) > len(sphere_parameters(blocked))  # the tensors really are split
    train(blocked, opt, data)
    assert all(torch.equal(p, q) for p, q in zip(whole.parameters(), blocked.parameters()))


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-6), (torch.float64, 1e-10)])
@pytest.mark.parametrize("kernel", ["native", "torch"])
def test_wrapped_torch_adam_equals_riemannian_adam_element(dtype, tol, kernel):
    """Riemannian(torch.optim.Adam) and RiemannianAdam(element) take the same step: neither
    transports exp_avg by projection, since with a per-element second moment that would break
    Adam's step bound (spherenet.optim.riemannian_adam). Both match the plain loop without transport."""
    a = make_model(dtype)
    b, ref = copy.deepcopy(a), copy.deepcopy(a)
    data = batches(30)
    train(a, RiemannianAdam(a, lr=2e-2, betas=(0.9, 0.99), gradient="riemannian", sphere_kernel=kernel), data)
    train(b, Riemannian(torch.optim.Adam(param_groups(b), lr=2e-2, betas=(0.9, 0.99)), b), data)
    _reference_element_run(ref, data, 2e-2, (0.9, 0.99), 1e-8)
    assert max_param_diff(a, ref) <= tol
    assert max_param_diff(b, ref) <= tol


def test_step_size_per_row_element_vs_row():
    """First step, where m_hat = u and v_hat = u*u exactly. "row" (one second moment per row):
    direction u / ||u||, each row turns by atan(lr). "element": direction sign(u), not tangent,
    x <- Norm(x - lr sign(u)), a turn of about lr sqrt(d) (like Adam + renormalize)."""
    lr = 1e-3
    for mode in ("row", "element"):
        model = make_model(torch.float64)
        before = model.q.weight.detach().clone()
        opt = RiemannianAdam(model, lr=lr, eps=1e-30, second_moment=mode, gradient="riemannian")
        train(model, opt, batches(1))
        after = model.q.weight.detach()
        angle = torch.arccos((before * after).sum(-1).clamp(-1, 1))
        if mode == "row":
            assert torch.allclose(angle, torch.full_like(angle, math.atan(lr)), rtol=1e-6), angle
        else:
            g = model.q.weight.grad  # the step leaves the Euclidean gradient in p.grad
            u = g - (before * g).sum(-1, keepdim=True) * before
            expected = F.normalize(before - lr * torch.sign(u), dim=-1)
            assert torch.allclose(after, expected, rtol=0, atol=1e-12)
            assert 0.8 < float(angle.mean()) / (lr * math.sqrt(D)) <= 1.0


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


# ---------------------------------------------------------------------------------------------
# the real model


def test_ngpt_row_mode_matches_geoopt_and_stays_on_the_sphere():
    models = pytest.importorskip("spherenet.models")
    if not hasattr(models, "from_preset"):
        pytest.skip("spherenet.models.from_preset not available")
    torch.manual_seed(0)
    ours = models.from_preset("ngpt-tiny", n_layers=1, vocab_size=64).double()
    normalize_(ours)
    ref = copy.deepcopy(ours)
    assert len(sphere_parameters(ours)) >= 8  # E_in, E_out, W_q, W_k, W_v, W_o, W_u, W_v, W_o_mlp
    opt = RiemannianAdam(ours, lr=1e-2, second_moment="row", gradient="riemannian")  # geoopt's semantics
    ref_opt = geoopt.optim.RiemannianAdam(ref.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(0)
    for _ in range(6):
        ids = torch.randint(0, 64, (2, 9), generator=g)
        for model, o in ((ours, opt), (ref, ref_opt)):
            o.zero_grad()
            logits = model(ids[:, :-1])
            F.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten()).backward()
            o.step()
    assert max_param_diff(ours, ref) <= 1e-10
    assert max_norm_error(ours) <= 1e-12


def test_bf16_retraction_divides_in_float32():
    """Rows 0.3% too long: a bf16-rounded norm reads exactly 1 and would leave them there."""
    from spherenet.kernels.sphere_rows import RowOps

    x = torch.nn.functional.normalize(torch.randn(64, 1024, generator=torch.Generator().manual_seed(0)), dim=-1)
    x = (x * 1.003).bfloat16()
    before = float((x.float().norm(dim=-1) - 1).abs().max())
    RowOps().retr_([x])
    after = float((x.float().norm(dim=-1) - 1).abs().max())
    assert x.dtype == torch.bfloat16
    assert before > 2.5e-3 and after < 2e-3, (before, after)
