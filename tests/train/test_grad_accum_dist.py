"""Gradient accumulation under DDP and FSDP2 with 2 gloo ranks: ``train_step`` reduces the
gradients once per optimizer step (after the last micro-batch), not once per micro-batch, and
the step equals the one that reduces after every micro-batch (float64, to rounding)."""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch
import torch.distributed as dist
from gloo import WORLD, spawn

pytestmark = [pytest.mark.distributed, pytest.mark.slow]  # ~25 s on 2 shared cores

MICRO = 3  # micro-batches per step


def _full_params(model) -> list[torch.Tensor]:
    inner = model.module if hasattr(model, "module") else model
    return [(p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone() for p in inner.parameters()]


def _micro_batches(rank: int, step: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(1000 * step + rank)  # each rank its own data
    xs = [torch.randint(0, 32, (2, 16), generator=gen) for _ in range(MICRO)]
    return [(x, x.roll(-1, dims=1)) for x in xs]


def _reference_step(model, batches, optimizer) -> None:
    """Accumulation that reduces after every micro-batch (the gradient of the same mean loss)."""
    from spherenet.train.step import lm_loss

    for x, y in batches:
        (lm_loss(model(x), y) / len(batches)).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def _count_ddp_reductions(model, counter: dict) -> None:
    """DDP runs its communication hook once per gradient bucket it all-reduces."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    def counting_hook(state, bucket):
        counter["n"] += 1
        return allreduce_hook(state, bucket)

    model.register_comm_hook(None, counting_hook)


@contextlib.contextmanager
def _count_fsdp_reductions(counter: dict):
    """FSDP2 reduce-scatters its gradients through ``torch.distributed.reduce_scatter_single``."""
    original = dist.reduce_scatter_single

    def counting_reduce_scatter(*args, **kwargs):
        counter["n"] += 1
        return original(*args, **kwargs)

    dist.reduce_scatter_single = counting_reduce_scatter
    try:
        yield
    finally:
        dist.reduce_scatter_single = original


def _run(rank: int, parallel: str) -> None:
    from spherenet.models import from_preset
    from spherenet.optim import RiemannianAdam
    from spherenet.train.distributed import DistInfo, wrap_model
    from spherenet.train.step import train_step

    info = DistInfo(rank, WORLD, rank, torch.device("cpu"))
    torch.manual_seed(0)
    base = from_preset("ngpt-tiny", vocab_size=32, d_model=32, n_layers=2, n_heads=2, max_seq_len=16).double()
    model = wrap_model(copy.deepcopy(base), parallel, info)
    reference = wrap_model(copy.deepcopy(base), parallel, info)
    opt = RiemannianAdam(model.module if parallel == "ddp" else model, lr=1e-2)
    ref_opt = RiemannianAdam(reference.module if parallel == "ddp" else reference, lr=1e-2)

    counter = {"n": 0}
    if parallel == "ddp":
        _count_ddp_reductions(model, counter)
    counting = _count_fsdp_reductions if parallel == "fsdp" else lambda c: contextlib.nullcontext()
    per_step = []
    for step in range(2):
        batches = _micro_batches(rank, step)
        before = counter["n"]
        with counting(counter):
            train_step(model, batches, opt, sharded=parallel == "fsdp")
        per_step.append(counter["n"] - before)
        _reference_step(reference, batches, ref_opt)

    # One reduction per step: DDP one bucket (a tiny model), FSDP2 one reduce-scatter per
    # fully_shard group (2 blocks + the root); reducing every micro-batch would be MICRO times as many.
    groups = 1 if parallel == "ddp" else 3
    assert per_step == [groups, groups], (parallel, per_step)
    params, expected = _full_params(model), _full_params(reference)
    for a, b in zip(params, expected):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    assert not torch.equal(params[0], next(base.parameters()))  # the steps did move the weights


def _worker(rank: int) -> None:
    for parallel in ("ddp", "fsdp"):
        _run(rank, parallel)


@pytest.mark.skipif(not dist.is_available(), reason="torch.distributed unavailable")
def test_accumulation_reduces_once_per_step_and_matches_reducing_every_micro_batch():
    spawn(_worker)
