"""SphericalMuon and CombinedOptimizer: Newton-Schulz, the step against a float64 reference, rows
on the sphere and bounded steps, parity with Riemannian(torch.optim.Muon), state and argument
checks. The Muon recipes ("spherical_muon", "muon"): test_optim_muon_recipes.py."""

from __future__ import annotations

import io
import math

import pytest
import torch
from torch import nn

from spherenet.manifolds import point_tolerance
from spherenet.optim import CombinedOptimizer, Riemannian, SphericalMuon, zeropower_via_newton_schulz
from spherenet.optim.muon import NS_COEFFICIENTS, update_scale

pytestmark = pytest.mark.usefixtures("one_thread")


def unit_rows(*shape, dtype=torch.float32, seed=0) -> nn.Parameter:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g, dtype=torch.float64)
    return nn.Parameter((x / x.norm(dim=-1, keepdim=True)).to(dtype))


def random_grads(shapes, steps, dtype, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [[torch.randn(*s, generator=g, dtype=torch.float64).to(dtype) for s in shapes] for _ in range(steps)]


def run(opt, params, grads):
    for step_grads in grads:
        for p, g in zip(params, step_grads):
            p.grad = g.clone()
        opt.step()


# Shapes: wide (rows < sphere dim), tall (rows > sphere dim), square.
SHAPES = [(4, 9), (10, 6), (7, 7)]


# ---------------------------------------------------------------------------------------------
# Newton-Schulz


@pytest.mark.parametrize("shape", [(6, 20), (20, 6), (12, 12)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_newton_schulz_brings_every_singular_value_near_one(shape, dtype):
    m = torch.randn(*shape, generator=torch.Generator().manual_seed(0)) * 37.0  # the scale does not matter
    o = zeropower_via_newton_schulz(m, dtype=dtype)
    assert o.shape == m.shape and o.dtype == dtype
    s = torch.linalg.svdvals(o.double())
    assert float(s.min()) > 0.6 and float(s.max()) < 1.25, s
    # The singular vectors are those of m: o is close to U V^T.
    u, _, vh = torch.linalg.svd(m.double(), full_matrices=False)
    assert float(((u @ vh) - o.double()).norm() / (u @ vh).norm()) < 0.35


def test_newton_schulz_refuses_non_matrices():
    with pytest.raises(ValueError, match="shape \\(2, 3, 4\\)"):
        zeropower_via_newton_schulz(torch.randn(2, 3, 4))


# ---------------------------------------------------------------------------------------------
# the step, against a float64 reference written from the equations


def reference_ns(n: torch.Tensor, steps: int = 5) -> torch.Tensor:
    a, b, c = NS_COEFFICIENTS
    tall = n.shape[0] > n.shape[1]
    x = n.T if tall else n
    x = x / x.norm()
    for _ in range(steps):
        gram = x @ x.T
        x = a * x + b * gram @ x + c * gram @ gram @ x
    return x.T if tall else x


def tangent(x: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return v - (x * v).sum(-1, keepdim=True) * x


def reference_run(xs, grads, lr, mu, nesterov, adjust_lr, project_update):
    xs = [x.detach().clone() for x in xs]
    ms = [torch.zeros_like(x) for x in xs]
    for step_grads in grads:
        for i, g in enumerate(step_grads):
            x, m = xs[i], ms[i]
            u = tangent(x, g)
            m = mu * m + (1 - mu) * u
            n = (1 - mu) * u + mu * m if nesterov else m
            o = reference_ns(n)
            if project_update:
                o = tangent(x, o)
            rows, cols = x.shape
            s = 0.2 * math.sqrt(max(rows, cols)) if adjust_lr == "match_rms_adamw" else math.sqrt(max(1, rows / cols))
            y = x - lr * s * o
            x = y / y.norm(dim=-1, keepdim=True)
            xs[i], ms[i] = x, tangent(x, m)
    return xs, ms


@pytest.mark.parametrize("nesterov", [True, False])
@pytest.mark.parametrize("adjust_lr", ["match_rms_adamw", "original"])
@pytest.mark.parametrize("project_update", [True, False])
def test_step_matches_float64_reference(nesterov, adjust_lr, project_update):
    params = [unit_rows(*s, dtype=torch.float64, seed=i) for i, s in enumerate(SHAPES)]
    start = [p.detach().clone() for p in params]
    grads = random_grads(SHAPES, 6, torch.float64)
    want_x, want_m = reference_run(params, grads, 0.05, 0.9, nesterov, adjust_lr, project_update)
    opt = SphericalMuon(
        params,
        lr=0.05,
        momentum=0.9,
        nesterov=nesterov,
        adjust_lr=adjust_lr,
        project_update=project_update,
        ns_dtype="float64",
    )
    run(opt, params, grads)
    for p, x, m, x0 in zip(params, want_x, want_m, start):
        assert float((p.detach() - x).abs().max()) < 1e-12
        assert float((opt.state[p]["momentum_buffer"] - m).abs().max()) < 1e-12
        assert float((x - x0).abs().max()) > 0.05  # it moved


def test_gradient_is_left_as_it_is():
    p = unit_rows(5, 7)
    g = torch.randn(5, 7)
    p.grad = g.clone()
    SphericalMuon([p], lr=0.01).step()
    assert torch.equal(p.grad, g)


# ---------------------------------------------------------------------------------------------
# on the sphere, bounded steps


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rows_stay_unit_over_many_steps(dtype):
    params = [unit_rows(*s, dtype=dtype, seed=i) for i, s in enumerate(SHAPES)]
    opt = SphericalMuon(params, lr=0.05)
    start = [p.detach().clone() for p in params]
    for step_grads in random_grads(SHAPES, 300, dtype):
        for p, g in zip(params, step_grads):
            p.grad = g
        opt.step()
        for p in params:
            err = float((p.detach().float().norm(dim=-1) - 1).abs().max())
            assert err <= point_tolerance(dtype), err
            m = opt.state[p]["momentum_buffer"].float()
            # the momentum stays tangent (relative to its size)
            assert float((p.detach().float() * m).sum(-1).abs().max()) <= 2e-2 * float(m.norm(dim=-1).max()) + 1e-12
    assert all(float((p.detach().float() - s.float()).abs().max()) > 0.1 for p, s in zip(params, start))


@pytest.mark.parametrize("adjust_lr", ["match_rms_adamw", "original"])
@pytest.mark.parametrize("ns_dtype", ["float32", "bfloat16"])
def test_largest_one_step_move_is_bounded(adjust_lr, ns_dtype):
    """No element moves more than ``1.21 * lr * s`` (the quintic's largest singular value is
    1.2023), and the bound is nearly reached: a rank-1 gradient is blown up to a unit step."""
    lr = 0.01
    largest = 0.0
    for seed in range(20):
        g = torch.Generator().manual_seed(seed)
        shape = SHAPES[seed % len(SHAPES)]
        p = unit_rows(*shape, seed=seed)
        opt = SphericalMuon([p], lr=lr, adjust_lr=adjust_lr, ns_dtype=ns_dtype)
        for k in range(3):
            before = p.detach().clone()
            if seed % 2:  # rank-1 gradients: Newton-Schulz turns them into one unit direction
                grad = torch.outer(torch.randn(shape[0], generator=g), torch.randn(shape[1], generator=g))
            else:
                grad = torch.randn(*shape, generator=g) * 10 ** (k - 1)
            p.grad = grad
            opt.step()
            move = float((p.detach() - before).abs().max()) / (lr * update_scale(shape, adjust_lr))
            assert move <= 1.21 + (0.02 if ns_dtype == "bfloat16" else 1e-4), (seed, k, move)
            largest = max(largest, move)
    assert largest > 0.7, largest


# ---------------------------------------------------------------------------------------------
# against Riemannian(torch.optim.Muon)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("adjust_lr", ["match_rms_adamw", "original"])
@pytest.mark.parametrize("nesterov", [True, False])
def test_wrapped_torch_muon_equals_spherical_muon_without_update_projection(dtype, adjust_lr, nesterov):
    """``Riemannian(torch.optim.Muon)`` projects the gradient, steps (momentum, Newton-Schulz in
    bfloat16, ``x - lr s O``), retracts and projects the momentum: SphericalMuon with
    ``project_update=False``, the bfloat16 iteration and no weight decay, exactly."""
    ours = [unit_rows(*s, dtype=dtype, seed=i) for i, s in enumerate(SHAPES)]
    theirs = [nn.Parameter(p.detach().clone()) for p in ours]
    grads = random_grads(SHAPES, 5, dtype)
    opt = SphericalMuon(ours, lr=0.03, momentum=0.9, nesterov=nesterov, adjust_lr=adjust_lr, project_update=False)
    base = torch.optim.Muon(
        [{"params": theirs, "manifold": "sphere"}],
        lr=0.03,
        momentum=0.9,
        nesterov=nesterov,
        weight_decay=0.0,
        adjust_lr_fn=adjust_lr,
    )
    run(opt, ours, grads)
    run(Riemannian(base), theirs, grads)
    for p, q in zip(ours, theirs):
        assert torch.equal(p.detach(), q.detach())
        assert torch.equal(opt.state[p]["momentum_buffer"], base.state[q]["momentum_buffer"])


def test_update_projection_changes_the_step_unless_the_update_is_tangent():
    """With the update projected, the two agree when Newton-Schulz's output is already tangent
    (one row: it is a multiple of the tangent momentum), and differ otherwise."""
    for shape, agree in [((1, 9), True), ((6, 9), False)]:
        ours = unit_rows(*shape)
        theirs = nn.Parameter(ours.detach().clone())
        grads = random_grads([shape], 4, torch.float32)
        opt = SphericalMuon([ours], lr=0.03)
        run(opt, [ours], grads)
        run(
            Riemannian(
                torch.optim.Muon(
                    [{"params": [theirs], "manifold": "sphere"}],
                    lr=0.03,
                    weight_decay=0.0,
                    adjust_lr_fn="match_rms_adamw",
                )
            ),
            [theirs],
            grads,
        )
        diff = float((ours.detach() - theirs.detach()).abs().max())
        assert (diff < 1e-6) if agree else (diff > 1e-4), (shape, diff)


# ---------------------------------------------------------------------------------------------
# state, arguments


def test_state_dict_round_trip_continues_exactly():
    def make():
        params = [unit_rows(*s, seed=i) for i, s in enumerate(SHAPES)]
        return params, SphericalMuon(params, lr=0.02, momentum=0.9)

    grads = random_grads(SHAPES, 6, torch.float32)
    straight, opt = make()
    run(opt, straight, grads)

    split, opt = make()
    run(opt, split, grads[:3])
    buffer = io.BytesIO()
    torch.save({"params": [p.detach() for p in split], "opt": opt.state_dict()}, buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)
    resumed = [nn.Parameter(t.clone()) for t in saved["params"]]
    opt2 = SphericalMuon(resumed, lr=0.5, momentum=0.1)  # hyperparameters come from the state dict
    opt2.load_state_dict(saved["opt"])
    assert opt2.param_groups[0]["lr"] == 0.02 and opt2.param_groups[0]["momentum"] == 0.9
    run(opt2, resumed, grads[3:])
    for p, q in zip(straight, resumed):
        assert torch.equal(p.detach(), q.detach())


@pytest.mark.parametrize("kwargs,match", [
    (dict(lr=-1.0), "lr must be >= 0"),
    (dict(momentum=1.0), "momentum must be in \\[0, 1\\)"),
    (dict(momentum=-0.1), "momentum must be in \\[0, 1\\)"),
    (dict(nesterov="yes"), "nesterov must be True or False"),
    (dict(adjust_lr="spectral"), "adjust_lr must be one of"),
    (dict(ns_steps=0), "ns_steps must be an int in \\[1, 100\\]"),
    (dict(ns_coefficients=(1.0, 2.0)), "ns_coefficients must be three numbers"),
    (dict(ns_dtype="float16"), "ns_dtype must be one of"),
    (dict(eps=0.0), "eps must be > 0"),
    (dict(off_sphere="ignore"), "off_sphere must be one of"),
])  # fmt: skip  # one case per line
def test_bad_arguments_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SphericalMuon([unit_rows(3, 4)], **kwargs)


def test_bad_params_are_refused():
    with pytest.raises(ValueError, match="shape \\(2, 3, 4\\); Muon orthogonalizes 2-D matrices"):
        SphericalMuon([nn.Parameter(torch.randn(2, 3, 4))])
    with pytest.raises(ValueError, match="shape \\(5,\\)"):
        SphericalMuon([nn.Parameter(torch.randn(5))])
    with pytest.raises(ValueError, match="manifold 'euclidean'.*torch.optim.Muon"):
        SphericalMuon([{"params": [unit_rows(3, 4)], "manifold": "euclidean"}])
    with pytest.raises(ValueError, match="weight_decay=0.1"):
        SphericalMuon([{"params": [unit_rows(3, 4)], "weight_decay": 0.1}])
    with pytest.raises(TypeError, match="not a module.*build_optimizer"):
        SphericalMuon(nn.Linear(3, 4))
    off = nn.Parameter(torch.randn(3, 4) * 3)
    off.grad = torch.randn(3, 4)
    with pytest.raises(ValueError, match="not unit"):
        SphericalMuon([off], off_sphere="error").step()


# ---------------------------------------------------------------------------------------------
# CombinedOptimizer


def test_combined_optimizer_shares_groups_and_state_and_refuses_misuse():
    a, b = unit_rows(4, 5), nn.Parameter(torch.randn(3))
    muon, adam = SphericalMuon([a], lr=0.1), torch.optim.Adam([b], lr=0.2)
    both = CombinedOptimizer([muon, adam])
    assert both.param_groups[0] is muon.param_groups[0] and both.param_groups[1] is adam.param_groups[0]
    sched = torch.optim.lr_scheduler.LambdaLR(both, lambda s: 0.5)
    assert muon.param_groups[0]["lr"] == 0.05 and adam.param_groups[0]["lr"] == 0.1
    a.grad, b.grad = torch.randn(4, 5), torch.randn(3)
    both.step()
    sched.step()
    assert set(both.state) == {a, b} and muon.state is both.state and adam.state is both.state
    with pytest.raises(ValueError, match="held by two optimizers"):
        CombinedOptimizer([muon, torch.optim.SGD([a], lr=0.1)])
    with pytest.raises(RuntimeError, match="add the group to one of its optimizers"):
        both.add_param_group({"params": [nn.Parameter(torch.randn(2))]})
    with pytest.raises(ValueError, match="2 param groups, these optimizers have 3"):
        CombinedOptimizer(
            [
                SphericalMuon([unit_rows(4, 5)]),
                torch.optim.Adam(
                    [{"params": [nn.Parameter(torch.randn(3))]}, {"params": [nn.Parameter(torch.randn(2))]}]
                ),
            ]
        ).load_state_dict(both.state_dict())
    with pytest.raises(ValueError, match="at least one optimizer"):
        CombinedOptimizer([])
