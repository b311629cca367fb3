"""spherenet.optim's steps: every method keeps every sphere row unit after every step (bfloat16
too), RiemannianAdam (row and element second moment) matches geoopt, torch's Adam/AdamW and a
reference loop, the Riemannian wrapper around torch's Adam equals RiemannianAdam, and the real
nGPT model in row mode. All on small models, all fast. The model and helpers: optim_helpers.py."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch_optimizer
from optim_helpers import (
    SPHERE_NAMES,
    D,
    batches,
    loss_of,
    make_model,
    max_norm_error,
    max_param_diff,
    named_params,
    train,
)
from torch import nn
from torch.nn import functional as F

from spherenet.manifolds import point_tolerance
from spherenet.manifolds.sphere import geoopt
from spherenet.optim import (
    MAGNITUDE_STATES,
    Riemannian,
    RiemannianAdam,
    build_optimizer,
    normalize_,
    param_groups,
    sphere_parameters,
)

pytestmark = pytest.mark.usefixtures("one_thread")


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
