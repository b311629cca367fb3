"""Two gloo processes on CPU: FSDP2 (fully_shard) checkpoints through DCP, and DDP checkpoints
(rank 0 writes, per-rank RNG states), both resumed exactly; a damaged shard makes both ranks
fall back together."""

from __future__ import annotations

import gc
import json
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from spherenet.checkpoint import CheckpointManager, CheckpointWarning

pytestmark = pytest.mark.distributed

WORLD = 2


def _build(seed: int) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 6))


def _shard(model: nn.Sequential) -> nn.Sequential:
    from torch.distributed.fsdp import fully_shard

    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    return model


def _optim(model):
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
    return opt, sched


def _step(model, opt, sched):
    x = torch.randn(4, 8)  # differs per rank: each rank has its own RNG stream
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    sched.step()


def _full(model) -> dict[str, torch.Tensor]:
    out = {}
    for name, p in model.named_parameters():
        t = p.full_tensor() if hasattr(p, "full_tensor") else p
        out[name] = t.detach().clone()
    return out


def _same(a: dict, b: dict, what: str):
    assert a.keys() == b.keys(), what
    for k in a:
        assert torch.equal(a[k], b[k]), f"{what}: {k} differs"


def _fsdp_phase(rank: int, root: Path):
    mgr = CheckpointManager(root / "fsdp", keep_last=2)
    model = _shard(_build(0))
    opt, sched = _optim(model)
    torch.manual_seed(100 + rank)

    # Saved before the first step: the live optimizer must stay untouched (no zero-lr step).
    mgr.save(0, {"model": model, "optimizer": opt, "scheduler": sched})
    assert not opt.state, "saving initialized the optimizer state"
    initial = _full(model)

    for _ in range(3):
        _step(model, opt, sched)
    mgr.save(3, {"model": model, "optimizer": opt, "scheduler": sched, "data": {"pos": 3}})
    at_save = _full(model)
    if rank == 0:
        torch.save(at_save, root / "fsdp_step3_params.pt")
    for _ in range(2):
        _step(model, opt, sched)
    reference = _full(model)

    path = root / "fsdp" / "step_00000003"
    manifest = json.loads((path / "MANIFEST.json").read_text())
    assert manifest["backend"] == "dcp" and manifest["world_size"] == WORLD
    shard_files = [f for f in manifest["files"] if f.endswith(".distcp")]
    assert len(shard_files) == WORLD, shard_files  # each rank wrote its own shards
    assert "sharded/.metadata" in manifest["files"] and "state.pt" in manifest["files"]
    assert manifest["fingerprint"]["0.weight"] == [[16, 8], "torch.float32"]  # global shape

    # Fresh sharded model + optimizer, other weights, other RNG state.
    model2 = _shard(_build(7))
    opt2, sched2 = _optim(model2)
    params_before = [p for p in model2.parameters()]
    torch.manual_seed(555)
    ck = mgr.load_latest({"model": model2, "optimizer": opt2, "scheduler": sched2})
    assert ck.step == 3 and ck.extra == {"data": {"pos": 3}}
    _same(_full(model2), at_save, "parameters after load")
    assert all(p is q for p, q in zip(params_before, model2.parameters()))
    assert all(type(p).__name__ == "DTensor" for p in model2.parameters())
    assert sched2.last_epoch == 3
    for _ in range(2):
        _step(model2, opt2, sched2)
    _same(_full(model2), reference, "next steps after resume")

    # The step-0 checkpoint (optimizer never stepped) restores an empty optimizer.
    model3 = _shard(_build(9))
    opt3, sched3 = _optim(model3)
    mgr.load(root / "fsdp" / "step_00000000", {"model": model3, "optimizer": opt3, "scheduler": sched3})
    _same(_full(model3), initial, "step-0 parameters")
    assert not opt3.state

    # Damage one rank's shard of the newest checkpoint: both ranks skip it together.
    dist.barrier()
    if rank == 0:
        victim = path / "sharded" / sorted(p.name for p in (path / "sharded").glob("*.distcp"))[-1]
        data = bytearray(victim.read_bytes())
        data[len(data) // 2] ^= 0xFF
        victim.write_bytes(bytes(data))
    dist.barrier()
    model4 = _shard(_build(11))
    opt4, sched4 = _optim(model4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ck = mgr.load_latest({"model": model4, "optimizer": opt4, "scheduler": sched4})
    assert ck.step == 0, ck.step
    if rank == 0:
        assert any(issubclass(w.category, CheckpointWarning) and "step_00000003" in str(w.message) for w in caught)
    _same(_full(model4), initial, "fallback parameters")


class _WithUnused(nn.Module):
    """A model with a layer that never gets a gradient: its optimizer has no state for it."""

    def __init__(self, seed: int):
        super().__init__()
        self.used = _build(seed)
        self.unused = nn.Linear(8, 8)

    def forward(self, x):
        return self.used(x)


def _fsdp_unused_phase(rank: int, root: Path):
    """FSDP2 resume when some parameters have no optimizer state (never had a gradient)."""
    mgr = CheckpointManager(root / "fsdp_unused", keep_last=2)

    def make(seed):
        from torch.distributed.fsdp import fully_shard

        model = _WithUnused(seed)
        _shard(model.used)
        fully_shard(model.unused)
        fully_shard(model)
        return model, *_optim(model)

    model, opt, sched = make(0)
    torch.manual_seed(300 + rank)
    for _ in range(2):
        _step(model, opt, sched)
    assert model.unused.weight not in opt.state  # no gradient, no state
    mgr.save(2, {"model": model, "optimizer": opt, "scheduler": sched})
    for _ in range(2):
        _step(model, opt, sched)
    reference = _full(model)

    model2, opt2, sched2 = make(5)
    torch.manual_seed(999)  # the load restores each rank's RNG state of the save
    mgr.load_latest({"model": model2, "optimizer": opt2, "scheduler": sched2})
    assert model2.unused.weight not in opt2.state and model2.used[0].weight in opt2.state
    for _ in range(2):
        _step(model2, opt2, sched2)
    _same(_full(model2), reference, "FSDP2 resume with a parameter without optimizer state")


def _ddp_phase(rank: int, root: Path):
    from torch.nn.parallel import DistributedDataParallel as DDP

    mgr = CheckpointManager(root / "ddp", keep_last=2)
    model = DDP(_build(0))
    opt, sched = _optim(model)
    torch.manual_seed(200 + rank)
    for _ in range(3):
        _step(model, opt, sched)
    mgr.save(3, {"model": model, "optimizer": opt, "scheduler": sched})
    draws = torch.rand(3)  # this rank's RNG stream right after the save
    for _ in range(2):
        _step(model, opt, sched)
    reference = _full(model.module)

    path = root / "ddp" / "step_00000003"
    manifest = json.loads((path / "MANIFEST.json").read_text())
    assert manifest["backend"] == "torch" and sorted(manifest["files"]) == ["state.pt"]
    assert "0.weight" in manifest["fingerprint"]  # unwrapped names, no "module." prefix

    model2 = DDP(_build(7))
    opt2, sched2 = _optim(model2)
    torch.manual_seed(999)
    mgr.load_latest({"model": model2, "optimizer": opt2, "scheduler": sched2})
    assert torch.equal(torch.rand(3), draws)  # each rank got its own RNG state back
    gathered = [None] * WORLD
    dist.all_gather_object(gathered, draws)
    assert not torch.equal(gathered[0], gathered[1])  # ... and the two differ
    model3 = DDP(_build(8))
    opt3, sched3 = _optim(model3)
    mgr.load_latest({"model": model3, "optimizer": opt3, "scheduler": sched3})
    torch.rand(3)  # the reference run drew these after its save
    for _ in range(2):
        _step(model3, opt3, sched3)
    _same(_full(model3.module), reference, "DDP next steps after resume")


def _worker(rank: int, root: str):
    root = Path(root)
    dist.init_process_group("gloo", init_method=f"file://{root / 'store'}", rank=rank, world_size=WORLD)
    try:
        _fsdp_phase(rank, root)
        _fsdp_unused_phase(rank, root)
        _ddp_phase(rank, root)
        # Teardown: without these, rank 0 could abort ("terminate called without an active
        # exception", ~1 run in 10) when the DDP/FSDP objects still holding the gloo group
        # were destroyed only at interpreter exit, after destroy_process_group().
        gc.collect()
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.skipif(not dist.is_available(), reason="torch.distributed unavailable")
def test_two_process_fsdp2_and_ddp_checkpoints(tmp_path):
    mp.spawn(_worker, args=(str(tmp_path),), nprocs=WORLD, join=True)

    # A sharded checkpoint also loads into a plain model in one process (e.g. for evaluation).
    # (Its step-3 shard was damaged above; restore the byte to test this.)
    assert not dist.is_initialized()
    shard = tmp_path / "fsdp" / "step_00000003" / "sharded"
    victim = shard / sorted(p.name for p in shard.glob("*.distcp"))[-1]
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    plain = _build(3)
    with pytest.warns(CheckpointWarning, match="written by 2 rank"):  # RNG states of 2 ranks, 1 now
        ck = CheckpointManager(tmp_path / "fsdp").load_latest({"model": plain})
    assert ck.step == 3
    _same(dict(plain.named_parameters()), torch.load(tmp_path / "fsdp_step3_params.pt"), "unsharded load")
