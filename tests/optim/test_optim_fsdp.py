"""spherenet.optim under FSDP2 (``torch.distributed.fsdp.fully_shard``) on CPU: 2 gloo ranks.

Each rank trains a sharded copy of a small model; every rank also trains an unsharded
reference on the union of both ranks' batches with the same optimizer. FSDP2 averages the
gradients over ranks, so the two runs must agree (float64, 1e-10), and the sphere rows of the
local shards must be unit after every step.
"""

from __future__ import annotations

import copy
import importlib.util

import pytest
import torch
import torch.distributed as dist
from gloo import WORLD, spawn, step_beside_reference
from torch import nn

pytestmark = pytest.mark.distributed

STEPS = 8


def _make(kind: str, model):
    from spherenet.optim import Riemannian, RiemannianAdam, build_optimizer, param_groups

    if kind == "element":
        return RiemannianAdam(model, lr=3e-2, second_moment="element")
    if kind == "row":
        return RiemannianAdam(model, lr=3e-2, second_moment="row")
    if kind.startswith("triton-"):  # the Triton kernel on each rank's shard (float32 arithmetic)
        return RiemannianAdam(model, lr=3e-2, second_moment=kind.split("-")[1], sphere_kernel="triton")
    if kind == "wrapped-adam":
        return Riemannian(torch.optim.Adam(param_groups(model), lr=3e-2, foreach=True), model)
    if kind == "adam_normalize":
        return build_optimizer(model, "adam_normalize", lr=3e-2, total_steps=100, fused=False)[0]
    raise AssertionError(kind)


def _checks(rank: int) -> None:
    from optim_helpers import SPHERE_NAMES, Tiny, loss_of
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor

    from spherenet.manifolds.sphere import geoopt
    from spherenet.optim import RiemannianAdam, named_sphere_parameters, normalize_, sphere_parameters

    mesh = init_device_mesh("cpu", (WORLD,))
    g = torch.Generator().manual_seed(7)
    data = [
        (torch.randint(0, 13, (WORLD, 2, 6), generator=g), torch.randint(0, 13, (WORLD, 2, 6), generator=g))
        for _ in range(STEPS)
    ]

    kinds = ["element", "row", "wrapped-adam", "adam_normalize"]
    if importlib.util.find_spec("triton") is not None:
        kinds += ["triton-element", "triton-row"]
    for kind in kinds:
        # the Triton kernel computes in float32: its shards match its own unsharded run to that
        tol_norm, tol_diff = (1e-6, 1e-5) if kind.startswith("triton") else (1e-12, 1e-10)
        torch.manual_seed(0)
        ref = Tiny().double()  # V=13 and H=12 rows: uneven (7/6) and even (6/6) shards
        normalize_(ref)
        initial = copy.deepcopy(ref)
        model = copy.deepcopy(ref)
        for name in ("emb", "q", "o", "out"):
            fully_shard(getattr(model, name), mesh=mesh)
        fully_shard(model, mesh=mesh)
        sharded = dict(model.named_parameters())
        # The premise: after fully_shard no parameter carries geoopt's class any more.
        assert all(isinstance(sharded[n], DTensor) for n in SPHERE_NAMES)
        assert not any(isinstance(p, geoopt.ManifoldParameter) for p in model.parameters())
        assert {n for n, _ in named_sphere_parameters(model)} == SPHERE_NAMES

        opt, ref_opt = _make(kind, model), _make(kind, ref)
        for step, (ids, tgt) in enumerate(data):
            step_beside_reference(rank, loss_of, model, opt, ref, ref_opt, ids, tgt)
            for p in sphere_parameters(model):
                local = p.detach().to_local()
                if local.numel():
                    err = float((local.norm(dim=-1) - 1).abs().max())
                    assert err <= tol_norm, (kind, step, err)
        for (name, p), q in zip(model.named_parameters(), ref.parameters()):
            full = p.full_tensor() if isinstance(p, DTensor) else p
            diff = float((full - q).abs().max())
            assert diff <= tol_diff, (kind, name, diff)
        assert float((ref.q.weight.detach() - initial.q.weight.detach()).abs().max()) > 1e-2  # it trained

    # A sphere tensor sharded along its last dimension would split its unit vectors: refused.
    w = nn.Parameter(distribute_tensor(torch.randn(4, 6, dtype=torch.float64), mesh, [Shard(1)]))
    try:
        RiemannianAdam([{"params": [w], "manifold": "sphere"}], lr=1e-3)
    except ValueError as exc:
        assert "sharded along its last dimension" in str(exc)
    else:
        raise AssertionError("a sphere DTensor sharded along its last dimension was accepted")
    # An optimizer built before fully_shard holds tensors the model no longer uses: refused.
    torch.manual_seed(0)
    late = Tiny().double()
    normalize_(late)
    stale = RiemannianAdam(late, lr=1e-2)
    fully_shard(late, mesh=mesh)
    loss_of(late, data[0][0][rank], data[0][1][rank]).backward()
    try:
        stale.step()
    except RuntimeError as exc:
        assert "were replaced" in str(exc)
    else:
        raise AssertionError("an optimizer built before fully_shard stepped silently")


@pytest.mark.slow
def test_fsdp2_sharded_training_matches_single_process():
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    spawn(_checks)
