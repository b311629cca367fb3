"""Whole-matrix spheres (Hyperball): spherenet.manifolds.MatrixSphere, its declaration, and the
AdamH / MuonH steps of RiemannianAdam, SphericalMuon and the Riemannian wrapper.

The published rule, written out here on its own (float64, no spherenet code in the reference):

    W <- R Normalize(W - lr R Normalize(u)),   R = ||W_0||_F,   Normalize(A) = A / ||A||_F

with ``u`` Adam's ``m_hat / (sqrt(v_hat) + eps)`` (AdamH) or Muon's orthogonalized Nesterov
momentum (MuonH).
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
from gloo import WORLD, spawn
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from spherenet.manifolds import (
    MATRIX_SPHERE,
    MatrixSphere,
    declare_matrix_sphere,
    declare_sphere,
    declared_matrix_spheres,
)
from spherenet.models import from_preset
from spherenet.optim import Riemannian, RiemannianAdam, SphericalMuon, build_optimizer, param_groups

# ---------------------------------------------------------------------------------------------
# the reference, written out


def frob(a: torch.Tensor) -> torch.Tensor:
    return a.pow(2).sum().sqrt()


def hyperball(w: torch.Tensor, u: torch.Tensor, lr: float, radius: torch.Tensor) -> torch.Tensor:
    step = w - lr * radius * u / frob(u)
    return radius * step / frob(step)


def reference_adamh(w0, grads, lr, betas=(0.9, 0.95), eps=1e-8):
    w, m, v, radius = w0.clone(), torch.zeros_like(w0), torch.zeros_like(w0), frob(w0)
    b1, b2 = betas
    out = []
    for k, g in enumerate(grads, start=1):
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        u = (m / (1 - b1**k)) / ((v / (1 - b2**k)).sqrt() + eps)
        w = hyperball(w, u, lr, radius)
        out.append(w.clone())
    return out


def newton_schulz(g: torch.Tensor, steps: int = 5) -> torch.Tensor:
    """Jordan et al.'s quintic iteration (a, b, c) = (3.4445, -4.7750, 2.0315), in float64."""
    a, b, c = 3.4445, -4.7750, 2.0315
    x = g / frob(g).clamp_min(1e-7)
    tall = x.shape[0] > x.shape[1]
    if tall:
        x = x.T
    for _ in range(steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.T if tall else x


def reference_muonh(w0, grads, lr, momentum=0.95):
    w, m, radius = w0.clone(), torch.zeros_like(w0), frob(w0)
    out = []
    for g in grads:
        m = momentum * m + (1 - momentum) * g
        nesterov = (1 - momentum) * g + momentum * m
        w = hyperball(w, newton_schulz(nesterov), lr, radius)
        out.append(w.clone())
    return out


def _module(shape=(12, 8), seed=0, dtype=torch.float64) -> nn.Linear:
    torch.manual_seed(seed)
    return nn.Linear(shape[1], shape[0], bias=False, dtype=dtype)


def _grads(shape, n, seed=1, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=g, dtype=dtype) for _ in range(n)]


def _run(opt, p, grads):
    seen = []
    for g in grads:
        p.grad = g.clone()
        opt.step()
        seen.append(p.detach().clone())
    return seen


# ---------------------------------------------------------------------------------------------
# the geometry


@settings(max_examples=40, deadline=None)
@given(
    rows=st.integers(1, 6),
    cols=st.integers(2, 6),
    radius=st.floats(0.1, 10.0),
    seed=st.integers(0, 2**16),
)
def test_matrix_sphere_operations(rows, cols, radius, seed):
    g = torch.Generator().manual_seed(seed)
    sphere = MatrixSphere()
    x = sphere.projx(torch.randn(rows, cols, generator=g, dtype=torch.float64), radius)
    u = torch.randn(rows, cols, generator=g, dtype=torch.float64)
    assert float(sphere.norm(x)) == pytest.approx(radius, rel=1e-12)
    tangent = sphere.proju(x, u)
    assert abs(float(sphere.inner(x, tangent))) <= 1e-10 * radius * float(sphere.norm(u))
    assert torch.allclose(sphere.proju(x, tangent), tangent, atol=1e-12)  # a projection
    assert float(sphere.norm(sphere.normalize_update(u, radius))) == pytest.approx(radius, rel=1e-12)
    assert float(sphere.norm(sphere.retr(x, u, radius))) == pytest.approx(radius, rel=1e-12)
    assert torch.equal(sphere.normalize_update(torch.zeros_like(u), radius), torch.zeros_like(u))  # zero stays zero


def test_declaration_keeps_or_sets_the_radius_and_refuses_a_second_manifold():
    layer = _module()
    before = layer.weight.detach().clone()
    manifold = declare_matrix_sphere(layer)
    assert manifold.radius is None and torch.equal(layer.weight, before)  # the norm it has
    other = _module(seed=3)
    declare_matrix_sphere(other, radius=2.5)
    assert float(frob(other.weight.detach())) == pytest.approx(2.5, rel=1e-12)
    rows = _module()
    declare_sphere(rows)
    with pytest.raises(ValueError, match="declared on .* already; a tensor lies on one manifold"):
        declare_matrix_sphere(rows)
    with pytest.raises(ValueError, match="radius must be a positive finite number"):
        MatrixSphere(radius=0.0)
    model = nn.Sequential(layer, other, nn.Linear(3, 3))
    assert [name for name, _, _ in declared_matrix_spheres(model)] == ["0.weight", "1.weight"]
    groups = param_groups(model, weight_decay=0.1)
    assert [(g["manifold"], g["weight_decay"], len(g["params"])) for g in groups] == [
        (MATRIX_SPHERE, 0.0, 2),
        ("euclidean", 0.1, 1),
        ("euclidean", 0.0, 1),
    ]


# ---------------------------------------------------------------------------------------------
# the three optimizers against the reference (float64)


@pytest.mark.parametrize("shape", [(12, 8), (5, 16)])
def test_adamh_matches_the_published_rule(shape):
    layer = _module(shape)
    declare_matrix_sphere(layer)
    w0 = layer.weight.detach().clone()
    grads = _grads(shape, 40)
    opt = RiemannianAdam(layer, lr=0.02, betas=(0.9, 0.95))
    got = _run(opt, layer.weight, grads)
    want = reference_adamh(w0, grads, 0.02)
    for k, (a, b) in enumerate(zip(got, want)):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12, msg=f"step {k + 1}")


@pytest.mark.parametrize("shape", [(12, 8), (5, 16)])
def test_muonh_matches_the_published_rule(shape):
    layer = _module(shape)
    declare_matrix_sphere(layer)
    w0 = layer.weight.detach().clone()
    grads = _grads(shape, 30)
    opt = SphericalMuon(
        [{"params": [layer.weight], "manifold": MATRIX_SPHERE}], lr=0.05, momentum=0.95, ns_dtype="float64"
    )
    got = _run(opt, layer.weight, grads)
    want = reference_muonh(w0, grads, 0.05)
    for k, (a, b) in enumerate(zip(got, want)):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10, msg=f"step {k + 1}")


def test_the_wrapper_makes_any_optimizer_hyperball():
    """Riemannian(SGD with momentum): u is SGD's own update direction (its momentum buffer)."""
    layer = _module()
    declare_matrix_sphere(layer)
    w, radius, buf = layer.weight.detach().clone(), frob(layer.weight.detach()), None
    grads = _grads((12, 8), 20)
    opt = Riemannian(torch.optim.SGD(param_groups(layer), lr=0.03, momentum=0.9), layer)
    got = _run(opt, layer.weight, grads)
    for k, g in enumerate(grads):
        buf = g.clone() if buf is None else 0.9 * buf + g
        w = hyperball(w, buf, 0.03, radius)
        torch.testing.assert_close(got[k], w, rtol=0, atol=1e-12, msg=f"step {k + 1}")


def test_the_largest_one_step_move_is_bounded_by_lr_whatever_the_gradient():
    """The update has norm lr R whatever the gradient's scale: W turns by at most atan(lr)
    radians (exactly that when u is tangent) and moves by at most lr R."""
    moves = []
    for scale in (1e-6, 1.0, 1e6):
        layer = _module()
        declare_matrix_sphere(layer)
        w0 = layer.weight.detach().clone()
        radius = frob(w0)
        opt = RiemannianAdam(layer, lr=0.01)
        layer.weight.grad = scale * _grads((12, 8), 1)[0]
        opt.step()
        w1 = layer.weight.detach()
        cos = float((w0 * w1).sum() / (radius * frob(w1)))
        angle = float(torch.arccos(torch.tensor(min(1.0, cos), dtype=torch.float64)))
        assert angle <= float(torch.atan(torch.tensor(0.01, dtype=torch.float64))) + 1e-12, scale
        assert float(frob(w1 - w0)) <= 0.01 * float(radius) * (1 + 1e-12), scale
        assert angle > 0.005, scale  # and it does move
        moves.append(w1 - w0)
    torch.testing.assert_close(moves[1], moves[2], rtol=0, atol=1e-6)  # scale-free up to eps


# ---------------------------------------------------------------------------------------------
# the norm over many steps, refusals, checkpoints


@pytest.mark.parametrize("method", ["adamh", "muonh"])
def test_build_optimizer_trains_gpt_with_every_block_matrix_norm_unchanged(method, one_thread):
    torch.manual_seed(0)
    model = from_preset("gpt-tiny", max_seq_len=32)
    optimizer, scheduler = build_optimizer(model, method, lr=3e-3, total_steps=100, warmup_steps=10)
    matrices = declared_matrix_spheres(model)
    assert len(matrices) == 14 and all(name.startswith("blocks.") for name, _, _ in matrices)
    assert {n for n, _ in model.named_parameters()} - {n for n, _, _ in matrices} >= {"embed_in.weight"}
    radius = {name: float(frob(p.detach())) for name, p, _ in matrices}
    g = torch.Generator().manual_seed(0)
    data = torch.randint(0, 256, (8, 33), generator=g)
    first = None
    for _ in range(100):
        loss = nn.functional.cross_entropy(model(data[:, :-1]).flatten(0, 1), data[:, 1:].flatten())
        first = float(loss.detach()) if first is None else first
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
    assert float(loss.detach()) < first - 1.0  # it learns
    worst = max(abs(float(frob(p.detach())) / radius[name] - 1) for name, p, _ in matrices)
    assert worst <= 1e-5, worst


@pytest.mark.parametrize("method", ["adamh", "muonh"])
def test_matrix_lr_is_the_matrices_angle_per_step_and_lr_stays_adamws(method):
    torch.manual_seed(0)
    model = from_preset("gpt-tiny", max_seq_len=32)
    optimizer, _ = build_optimizer(model, method, lr=1e-3, matrix_lr=0.05, total_steps=10, warmup_steps=0)
    matrix_ids = {id(p) for _, p, _ in declared_matrix_spheres(model)}
    rates = {id(p): g["lr"] for g in optimizer.param_groups for p in g["params"]}
    assert {rates[i] for i in matrix_ids} == {0.05}
    assert {lr for i, lr in rates.items() if i not in matrix_ids} == {1e-3}
    before = {i: p.detach().clone() for i, p in ((id(p), p) for p in model.parameters()) if i in matrix_ids}
    data = torch.randint(0, 256, (4, 33), generator=torch.Generator().manual_seed(1))
    nn.functional.cross_entropy(model(data[:, :-1]).flatten(0, 1), data[:, 1:].flatten()).backward()
    optimizer.step()
    for p in model.parameters():
        if id(p) in matrix_ids:  # W <- R Normalize(W - lr R Normalize(u)): a move of norm lr R
            w0, w1 = before[id(p)].double().flatten(), p.detach().double().flatten()
            angle = float(torch.arccos((w0 @ w1 / (w0.norm() * w1.norm())).clamp(-1, 1)))
            assert 0.5 * math.atan(0.05) < angle <= math.asin(0.05) + 1e-9, angle  # asin(lr): the largest turn
    with pytest.raises(ValueError, match="matrix_lr must be > 0"):
        build_optimizer(from_preset("gpt-tiny"), method, lr=1e-3, matrix_lr=0.0, total_steps=10, warmup_steps=0)


def test_weight_decay_is_refused_on_matrix_sphere_groups():
    layer = _module()
    declare_matrix_sphere(layer)
    with pytest.raises(ValueError, match="weight_decay=0.1 in a matrix_sphere param group"):
        RiemannianAdam([{"params": [layer.weight], "manifold": MATRIX_SPHERE, "weight_decay": 0.1}])
    with pytest.raises(ValueError, match="weight_decay=0.1. Weight decay has no meaning on a sphere"):
        SphericalMuon([{"params": [layer.weight], "manifold": MATRIX_SPHERE, "weight_decay": 0.1}])
    with pytest.raises(ValueError, match="weight_decay=0.1. Weight decay has no meaning on the sphere"):
        Riemannian(torch.optim.AdamW([layer.weight], weight_decay=0.1), layer)
    with pytest.raises(ValueError, match="declared on 'matrix_sphere' but is in a 'euclidean' param group"):
        RiemannianAdam([{"params": [layer.weight], "manifold": "euclidean"}], model=layer)
    model = from_preset("gpt-tiny")
    build_optimizer(model, "adamh", lr=1e-3, total_steps=10, warmup_steps=0)
    with pytest.raises(ValueError, match="method 'adamw' on a model with whole-matrix sphere parameters"):
        build_optimizer(model, "adamw", lr=1e-3, total_steps=10, warmup_steps=0)
    with pytest.raises(ValueError, match="Hyperball holds GPT's matrices"):
        build_optimizer(from_preset("ngpt-tiny"), "adamh", lr=1e-3, total_steps=10, warmup_steps=0)


@pytest.mark.parametrize("method", ["adamh", "muonh"])
def test_a_checkpoint_resumes_exactly(method, tmp_path):
    def fresh():
        torch.manual_seed(0)
        model = from_preset("gpt-tiny", max_seq_len=16)
        return model, build_optimizer(model, method, lr=3e-3, total_steps=20, warmup_steps=2)

    g = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, 256, (4, 17), generator=g) for _ in range(10)]

    def train(model, optimizer, scheduler, steps):
        for data in steps:
            loss = nn.functional.cross_entropy(model(data[:, :-1]).flatten(0, 1), data[:, 1:].flatten())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            scheduler.step()

    model, (optimizer, scheduler) = fresh()
    train(model, optimizer, scheduler, batches)
    straight = copy.deepcopy(model.state_dict())

    model, (optimizer, scheduler) = fresh()
    train(model, optimizer, scheduler, batches[:5])
    torch.save(
        {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()},
        tmp_path / "state.pt",
    )
    saved = torch.load(tmp_path / "state.pt", weights_only=True)
    assert any("radius" in s for s in saved["optimizer"]["state"].values())
    model, (optimizer, scheduler) = fresh()
    model.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    scheduler.load_state_dict(saved["scheduler"])
    train(model, optimizer, scheduler, batches[5:])
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, straight[name]), name


# ---------------------------------------------------------------------------------------------
# FSDP2: the norm of a sharded matrix needs every rank's rows


def _fsdp_worker(rank: int, method: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (WORLD,))
    torch.manual_seed(0)
    reference = from_preset("gpt-tiny", max_seq_len=16).double()
    sharded = copy.deepcopy(reference)
    for block in sharded.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(sharded, mesh=mesh)
    options = dict(lr=1e-2, total_steps=20, warmup_steps=0, fused=False)
    ref_opt, _ = build_optimizer(reference, method, **options)
    opt, _ = build_optimizer(sharded, method, **options)
    g = torch.Generator().manual_seed(1)
    for _ in range(6):
        data = torch.randint(0, 256, (WORLD * 2, 17), generator=g)
        mine = data[rank * 2 : rank * 2 + 2]
        for model, batch, optimizer in ((reference, data, ref_opt), (sharded, mine, opt)):
            loss = nn.functional.cross_entropy(model(batch[:, :-1]).flatten(0, 1), batch[:, 1:].flatten())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    want = dict(reference.named_parameters())
    for name, p, _ in declared_matrix_spheres(sharded):
        full = p.full_tensor()
        torch.testing.assert_close(full, want[name].detach(), rtol=0, atol=1e-10, msg=name)


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("method", ["adamh", "muonh"])
def test_fsdp2_sharded_hyperball_matches_the_unsharded_step(method):
    """Each rank holds half the rows of every matrix; the step's norms are summed over both
    ranks, so the sharded run follows the unsharded one (float64)."""
    spawn(_fsdp_worker, method)


# ---------------------------------------------------------------------------------------------
# a third geometry, declared outside spherenet (examples/own_geometry.py)


def test_a_geometry_declared_outside_spherenet_is_kept_by_every_optimizer():
    import runpy
    from pathlib import Path

    example = runpy.run_path(str(Path(__file__).resolve().parents[2] / "examples" / "own_geometry.py"))
    for label, make in example["OPTIMIZERS"].items():
        start, end, moved = example["train"](make)
        assert abs(end - start) <= 1e-5 * max(1.0, abs(start)), label
        assert moved > 0.05, label  # it trained: not a frozen tensor
    assert "fixed_sum" in [g["manifold"] for g in param_groups(_declared_fixed_sum(example))]


def _declared_fixed_sum(example):
    from spherenet.manifolds import declare_manifold

    model = nn.Sequential(nn.Linear(3, 3))
    declare_manifold(model[0], "weight", example["FixedSum"]())
    return model


def test_the_wrapper_steps_a_whole_matrix_group_added_later_by_its_geometry():
    """``Riemannian.add_param_group`` with ``manifold="matrix_sphere"``: the group is stepped by
    the geometry (its norm held), as one given at construction is; weight decay there is refused."""
    layer, other = _module(), _module()
    declare_matrix_sphere(layer)
    opt = Riemannian(torch.optim.Adam(other.parameters(), lr=1e-2))
    with pytest.raises(ValueError, match="weight decay in a matrix_sphere param group"):
        opt.add_param_group({"params": [layer.weight], "manifold": MATRIX_SPHERE, "weight_decay": 0.1})
    opt.add_param_group({"params": [layer.weight], "manifold": MATRIX_SPHERE})
    norm = layer.weight.norm().item()
    for step in range(10):
        layer.weight.grad = torch.randn(
            layer.weight.shape, generator=torch.Generator().manual_seed(step), dtype=torch.float64
        )
        opt.step()
    assert layer.weight.norm().item() == pytest.approx(norm, rel=1e-5)
