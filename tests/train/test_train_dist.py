"""spherenet.train.train_step with 2 gloo ranks (DDP and FSDP2): a non-finite gradient seen by
one rank only (a rank-local corruption after the gradient reduction) skips the update on every
rank, so the replicas (DDP) and the shards (FSDP2) never diverge."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from gloo import WORLD, spawn

pytestmark = pytest.mark.distributed

BAD_STEP = 2  # the step whose gradient rank 1 sees as NaN


def _full_params(model) -> list[torch.Tensor]:
    inner = model.module if hasattr(model, "module") else model
    return [(p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone() for p in inner.parameters()]


def _run(rank: int, parallel: str) -> None:
    from spherenet.models import from_preset
    from spherenet.optim import RiemannianAdam
    from spherenet.train import step as step_module
    from spherenet.train.distributed import DistInfo, wrap_model

    torch.manual_seed(0)
    model = from_preset("ngpt-tiny", vocab_size=32, d_model=32, n_layers=2, n_heads=2, max_seq_len=16)
    model = wrap_model(model, parallel, DistInfo(rank, WORLD, rank, torch.device("cpu")))
    optimizer = RiemannianAdam(model.module if parallel == "ddp" else model, lr=1e-2)

    step = {"n": 0}
    original = step_module._local_grads

    def local_grads_rank1_corrupt(m):
        grads = original(m)
        if rank == 1 and step["n"] == BAD_STEP:
            grads[0].view(-1)[0] = float("nan")  # only this rank's copy / shard
        return grads

    step_module._local_grads = local_grads_rank1_corrupt
    try:
        gen = torch.Generator().manual_seed(100 + rank)  # each rank its own batch
        history = []
        for n in range(1, 5):
            step["n"] = n
            x = torch.randint(0, 32, (2, 16), generator=gen)
            result = step_module.train_step(model, [(x, x.roll(-1, dims=1))], optimizer, sharded=parallel == "fsdp")
            history.append((result.skipped, _full_params(model)))
    finally:
        step_module._local_grads = original

    skipped = [s for s, _ in history]
    assert skipped == [n == BAD_STEP for n in range(1, 5)], (rank, parallel, skipped)
    # The skipped step left every parameter as it was, on both ranks.
    before, after = history[BAD_STEP - 2][1], history[BAD_STEP - 1][1]
    assert all(torch.equal(a, b) for a, b in zip(before, after)), (rank, parallel)
    # The replicas agree at the end (for FSDP2: the gathered full tensors).
    final = history[-1][1]
    gathered = [None] * WORLD
    dist.all_gather_object(gathered, final)
    assert all(torch.equal(a, b) for a, b in zip(gathered[0], gathered[1])), parallel
    assert not torch.equal(final[0], history[0][1][0])  # training did move the weights


def _worker(rank: int) -> None:
    for parallel in ("ddp", "fsdp"):
        _run(rank, parallel)


@pytest.mark.slow
@pytest.mark.skipif(not dist.is_available(), reason="torch.distributed unavailable")
def test_nonfinite_on_one_rank_skips_the_step_on_every_rank():
    spawn(_worker)
