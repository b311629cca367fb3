"""SphericalMuon, CombinedOptimizer and the Muon recipes ("spherical_muon", "muon")."""

from __future__ import annotations

import copy
import io
import math

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from gloo import WORLD, spawn, step_beside_reference
from torch import nn

from spherenet.checkpoint import CheckpointManager
from spherenet.layers import NGPTConfig, SphereClassifier, SphereEmbedding
from spherenet.manifolds import declare_sphere, point_tolerance
from spherenet.models import NGPTBlock
from spherenet.models.presets import from_preset
from spherenet.optim import (
    CombinedOptimizer,
    Riemannian,
    RiemannianAdam,
    SphericalMuon,
    build_optimizer,
    param_groups,
    sphere_parameters,
    zeropower_via_newton_schulz,
)
from spherenet.optim.muon import NS_COEFFICIENTS, hidden_matrices, update_scale
from spherenet.train.config import ConfigError, load_config

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


# ---------------------------------------------------------------------------------------------
# the recipes


def tiny(preset: str, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return from_preset(preset, vocab_size=32, max_seq_len=16, d_model=16, n_heads=2, n_layers=2)


def lm_batches(n: int, seed: int = 3, distinct: int = 2):
    """``n`` batches cycling over ``distinct`` random ones (so that there is something to learn)."""
    g = torch.Generator().manual_seed(seed)
    pool = [torch.randint(0, 32, (4, 17), generator=g) for _ in range(distinct)]
    return [pool[i % distinct] for i in range(n)]


def lm_step(model, opt, sched, ids) -> float:
    loss = F.cross_entropy(model(ids[:, :-1]).flatten(0, 1), ids[:, 1:].flatten())
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    sched.step()
    return loss.item()


def test_spherical_muon_recipe_splits_ngpt_and_trains_on_the_sphere():
    model = tiny("ngpt-tiny")
    opt, sched = build_optimizer(model, "spherical_muon", lr=3e-3, muon_lr=2e-2, total_steps=30)
    muon, adam = opt.optimizers
    assert isinstance(muon, SphericalMuon) and isinstance(adam, RiemannianAdam)
    in_muon = set(muon.param_groups[0]["param_names"])
    blocks_2d = {n for n, p in model.named_parameters() if n.startswith("blocks.") and p.dim() == 2}
    assert in_muon == blocks_2d and len(in_muon) == 2 * 7  # W_q, W_k, W_v, W_o, W_u, W_v, W_o_mlp per block
    in_adam = {n for g in adam.param_groups for n in g["param_names"]}
    assert {"embed_in.weight", "embed_out.weight"} <= in_adam and not in_adam & in_muon
    assert in_adam | in_muon == {n for n, _ in model.named_parameters()}
    assert all(g["weight_decay"] == 0 for g in opt.param_groups)
    assert muon.param_groups[0]["lr"] == 2e-2 and adam.param_groups[0]["lr"] == 3e-3
    losses = [lm_step(model, opt, sched, ids) for ids in lm_batches(25)]
    assert sum(losses[-5:]) < sum(losses[:5]) - 0.5, losses
    assert max(float((p.detach().norm(dim=-1) - 1).abs().max()) for p in sphere_parameters(model)) < 1e-5


def test_muon_recipe_splits_gpt():
    model = tiny("gpt-tiny")
    opt, sched = build_optimizer(model, "muon", lr=3e-3, total_steps=30, warmup_steps=2)
    muon, adamw = opt.optimizers
    assert isinstance(muon, torch.optim.Muon) and isinstance(adamw, torch.optim.AdamW)
    group = muon.param_groups[0]
    assert group["initial_lr"] == 3e-3 and group["weight_decay"] == 0.1 and group["adjust_lr_fn"] == "match_rms_adamw"
    assert set(group["param_names"]) == {
        n for n, p in model.named_parameters() if n.startswith("blocks.") and p.dim() == 2
    }
    decayed = {n for g in adamw.param_groups if g["weight_decay"] > 0 for n in g["param_names"]}
    assert decayed == {"embed_in.weight", "embed_out.weight"}
    losses = [lm_step(model, opt, sched, ids) for ids in lm_batches(25)]
    assert sum(losses[-5:]) < sum(losses[:5]) - 0.5, losses


class _Encoder(nn.Module):
    """A model of spherenet's layers under names of its own (no ``blocks``, no ``embed_out``)."""

    def __init__(self, vocab=32, d=16, classes=3):
        super().__init__()
        self.tokens = SphereEmbedding(vocab, d)
        config = NGPTConfig(vocab_size=vocab, n_layers=2, d_model=d, n_heads=2, d_mlp=32, causal=False)
        self.encoder = nn.ModuleList(NGPTBlock(config) for _ in range(2))
        self.head = SphereClassifier(d, classes)

    def forward(self, ids):
        h = self.tokens(ids)
        for block in self.encoder:
            h = block(h)
        return self.head(h.mean(1))


def test_muon_takes_the_hidden_matrices_by_declaration_and_shape_not_by_name():
    model = _Encoder()
    opt, _ = build_optimizer(model, "spherical_muon", lr=3e-3, total_steps=10)
    muon, adam = opt.optimizers
    in_muon = set(muon.param_groups[0]["param_names"])
    encoder_2d = {n for n, p in model.named_parameters() if n.startswith("encoder.") and p.dim() == 2}
    assert in_muon == encoder_2d and len(in_muon) == 2 * 7
    in_adam = {n for g in adam.param_groups for n in g["param_names"]}
    assert {"tokens.weight", "head.weight.weight"} <= in_adam  # the lookup table and the output layer
    # nGPT and GPT: the same split as their blocks' 2-D weights, found without the name "blocks"
    for preset in ("ngpt-tiny", "gpt-tiny"):
        lm = tiny(preset)
        expected = {n for n, p in lm.named_parameters() if n.startswith("blocks.") and p.dim() == 2}
        assert {n for n, _ in hidden_matrices(lm)} == expected
    # a plain torch model: nn.Embedding is a table; an output layer is named by get_output_embeddings
    plain = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 4), nn.Linear(4, 10))
    plain.get_output_embeddings = lambda: plain[2]
    assert [n for n, _ in hidden_matrices(plain)] == ["1.weight"]


def test_spherical_muon_takes_only_the_hidden_matrices_declared_on_the_sphere():
    """A hidden matrix off the sphere goes to Adam with the tables and the output layer; Muon holds
    only the sphere's, and refusals still name the method before the settings."""
    model = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 10))
    model.get_output_embeddings = lambda: model[3]
    declare_sphere(model[1])
    opt, _ = build_optimizer(model, "spherical_muon", lr=1e-3, total_steps=10)
    muon, adam = opt.optimizers
    assert muon.param_groups[0]["param_names"] == ["1.weight"]
    in_adam = {n for g in adam.param_groups for n in g["param_names"]}
    assert in_adam == {n for n, _ in model.named_parameters()} - {"1.weight"}
    with pytest.raises(ValueError, match="method 'muon' on a model with sphere parameters \\('1.weight'"):
        build_optimizer(model, "muon", lr=-1.0, total_steps=10)


def test_muon_recipes_refuse_the_wrong_model_and_bad_values():
    with pytest.raises(ValueError, match="'muon' on a model with sphere parameters.*spherical_muon"):
        build_optimizer(tiny("ngpt-tiny"), "muon", lr=1e-3, total_steps=10, warmup_steps=0)
    with pytest.raises(ValueError, match="no hidden 2-D sphere weights for Muon"):
        build_optimizer(tiny("gpt-tiny"), "spherical_muon", lr=1e-3, total_steps=10)
    with pytest.raises(ValueError, match="muon_lr must be > 0"):
        build_optimizer(tiny("ngpt-tiny"), "spherical_muon", lr=1e-3, muon_lr=0.0, total_steps=10)
    with pytest.raises(ValueError, match="muon_momentum must be in \\[0, 1\\)"):
        build_optimizer(tiny("ngpt-tiny"), "spherical_muon", lr=1e-3, muon_momentum=1.0, total_steps=10)


@pytest.mark.parametrize("preset,method", [("ngpt-tiny", "spherical_muon"), ("gpt-tiny", "muon")])
def test_checkpoint_resume_equals_continuous_run(tmp_path, preset, method):
    """3 steps, save (CheckpointManager, as recipes/train.py), load into a fresh model and
    optimizer, 3 more steps == 6 steps straight."""

    def make():
        model = tiny(preset)
        opt, sched = build_optimizer(model, method, lr=3e-3, muon_lr=1e-2, total_steps=6, warmup_steps=1)
        return model, opt, sched

    data = lm_batches(6)
    straight = make()
    for ids in data:
        lm_step(*straight, ids)

    first = make()
    for ids in data[:3]:
        lm_step(*first, ids)
    manager = CheckpointManager(tmp_path)
    manager.save(3, {"model": first[0], "optimizer": first[1], "scheduler": first[2]})
    resumed = make()
    assert manager.load_latest({"model": resumed[0], "optimizer": resumed[1], "scheduler": resumed[2]}).step == 3
    for ids in data[3:]:
        lm_step(*resumed, ids)
    for (name, p), q in zip(straight[0].named_parameters(), resumed[0].parameters()):
        assert torch.equal(p, q), name


def test_config_accepts_the_muon_methods_and_checks_their_keys():
    cfg = load_config(None, ["optim.method=spherical_muon", "optim.muon_lr=0.02", "optim.muon_momentum=0.9"])
    assert (cfg.optim.method, cfg.optim.muon_lr, cfg.optim.muon_momentum) == ("spherical_muon", 0.02, 0.9)
    assert load_config(None, ["optim.method=muon"]).optim.muon_lr is None  # unset: optim.lr
    with pytest.raises(ConfigError, match="optim.muon_lr must be > 0"):
        load_config(None, ["optim.muon_lr=0"])
    with pytest.raises(ConfigError, match="optim.muon_momentum must be in \\[0, 1\\), got 1.0"):
        load_config(None, ["optim.muon_momentum=1.0"])
    with pytest.raises(ConfigError, match="optim.method = 'sphere_muon' is not one of"):
        load_config(None, ["optim.method=sphere_muon"])


# ---------------------------------------------------------------------------------------------
# FSDP2: rows sharded over 2 gloo ranks; Newton-Schulz on the gathered matrix


def _make_combined(model):
    hidden = [(n, p) for n, p in param_groups(model)[0]["params"] if n in ("q.weight", "o.weight")]
    rest = [
        dict(g, params=[(n, p) for n, p in g["params"] if n not in ("q.weight", "o.weight")])
        for g in param_groups(model)
    ]
    muon = SphericalMuon([{"params": hidden}], lr=0.05, ns_dtype="float64")
    return CombinedOptimizer([muon, RiemannianAdam([g for g in rest if g["params"]], lr=3e-2)], model=model)


def _fsdp_worker(rank: int) -> None:
    from test_optim import Tiny, loss_of
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    from spherenet.optim import normalize_

    mesh = init_device_mesh("cpu", (WORLD,))
    g = torch.Generator().manual_seed(7)
    data = [
        (torch.randint(0, 13, (WORLD, 2, 6), generator=g), torch.randint(0, 13, (WORLD, 2, 6), generator=g))
        for _ in range(6)
    ]
    torch.manual_seed(0)
    ref = Tiny(hidden=7).double()  # q, o: 7 rows over 2 ranks, uneven (4/3)
    normalize_(ref)
    model = copy.deepcopy(ref)
    for name in ("emb", "q", "o", "out"):
        fully_shard(getattr(model, name), mesh=mesh)
    fully_shard(model, mesh=mesh)
    assert isinstance(model.q.weight, DTensor)
    opt, ref_opt = _make_combined(model), _make_combined(ref)
    for ids, tgt in data:
        step_beside_reference(rank, loss_of, model, opt, ref, ref_opt, ids, tgt)
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        full = p.full_tensor() if isinstance(p, DTensor) else p
        assert float((full - q).abs().max()) <= 1e-10, name
    for p in sphere_parameters(model):
        local = p.detach().to_local()
        assert local.numel() == 0 or float((local.norm(dim=-1) - 1).abs().max()) <= 1e-12


@pytest.mark.slow
@pytest.mark.distributed
def test_fsdp2_sharded_rows_step_like_the_whole_matrix():
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    spawn(_fsdp_worker)


# ---------------------------------------------------------------------------------------------
# recipes/train.py: a run split by a checkpoint equals the straight run


@pytest.mark.parametrize("preset,method", [("ngpt-tiny", "spherical_muon"), ("gpt-tiny", "muon")])
def test_train_cli_resume_continues_exactly(tmp_path, preset, method):
    import json

    from recipes.train import cli

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(f"paragraph {i}: the unit sphere holds every row. " * 4 for i in range(60)))
    common = [
        f"model.preset={preset}",
        "model.max_seq_len=16",
        "model.n_layers=1",
        f"optim.method={method}",
        "optim.warmup_steps=1",
        "optim.muon_lr=0.02",
        "train.batch_size=4",
        "train.steps=6",
        "train.log_every=1",
        "train.eval_every=3",
        "train.eval_batches=1",
        "train.checkpoint_every=3",
        "train.sample_tokens=0",
        "train.progress=false",
        f"data.source={corpus}",
        f"data.cache_dir={tmp_path / 'cache'}",
    ]

    def losses(out):
        records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        return {r["step"]: r["loss"] for r in records if "loss" in r}

    assert cli([*common, f"train.out_dir={tmp_path / 'straight'}"]) == 0
    assert cli([*common, f"train.out_dir={tmp_path / 'split'}", "train.halt_after=3"]) == 0
    assert cli([*common, f"train.out_dir={tmp_path / 'split'}", "--resume"]) == 0
    straight, split = losses(tmp_path / "straight"), losses(tmp_path / "split")
    assert sorted(split) == list(range(1, 7))
    assert all(split[s] == straight[s] for s in range(1, 7)), (straight, split)
