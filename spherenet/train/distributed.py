"""torch.distributed set-up for the recipes: process group from torchrun's environment, and the
two ways of spreading a model over ranks, DDP and FSDP2 (``fully_shard``).

Sphere weights are stored with their unit-vector dimension last and FSDP2 shards dim 0, so
every unit vector stays whole on one rank and the optimizer's retraction stays local.
"""

from __future__ import annotations

import datetime
import gc
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

__all__ = [
    "DistInfo",
    "init_distributed",
    "wrap_model",
    "unwrap_model",
    "all_reduce_mean",
    "all_reduce_max",
    "barrier",
    "shutdown",
]


@dataclass(frozen=True)
class DistInfo:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def init_distributed(device: str | None = None, timeout_s: float = 300.0) -> DistInfo:
    """Join the process group torchrun describes (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR...).

    A single process without torchrun gets world size 1 and no process group. The backend is
    NCCL on CUDA, gloo on CPU. ``device``: "cpu", "cuda" or None (CUDA when available).
    """
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("device 'cuda' requested but torch.cuda.is_available() is False")
        torch.cuda.set_device(local_rank)
        dev = torch.device("cuda", local_rank)
    else:
        dev = torch.device("cpu")
    if world_size > 1 and not dist.is_initialized():
        timeout = datetime.timedelta(seconds=timeout_s)
        store = _restart_store(world_size, timeout)
        dist.init_process_group(
            backend="nccl" if dev.type == "cuda" else "gloo",
            timeout=timeout,
            device_id=dev if dev.type == "cuda" else None,
            **({} if store is None else {"store": store, "rank": rank, "world_size": world_size}),
        )
    return DistInfo(rank, world_size, local_rank, dev)


def _restart_store(world_size: int, timeout: datetime.timedelta):
    """A fresh key space in torchrun's store for a restarted worker group, or None.

    torchrun (c10d rendezvous) lends its own TCPStore to the workers and keeps it across
    ``--max-restarts`` restarts, so a restarted group finds the keys of the group before it
    (peer addresses) and a rank may read a dead peer's address: ``Gloo connectFullMesh failed
    ... Connection refused`` (pytorch/pytorch#135712). Under one agent (one node) every worker
    sees the same TORCHELASTIC_RESTART_COUNT, so prefixing the keys with it keeps generations
    apart. With several agents the counts can differ; there, launch torchrun with
    ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` (a new store per rendezvous round).
    """
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    shared = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    one_agent = os.environ.get("GROUP_WORLD_SIZE", "1") == "1"
    if restart == 0 or not shared or not one_agent:
        return None
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size, is_master=False, timeout=timeout
    )
    return dist.PrefixStore(f"spherenet/restart_{restart}", store)


def wrap_model(model: nn.Module, parallel: str, info: DistInfo) -> nn.Module:
    """``parallel``: "none", "ddp" (DistributedDataParallel) or "fsdp" (FSDP2: each block of
    ``model.blocks`` sharded, then the root). Returns the module to call in the train loop."""
    if parallel == "none" or not info.enabled:
        return model  # one process: nothing to spread, the same loop runs
    if parallel == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model, device_ids=[info.local_rank] if info.device.type == "cuda" else None)
    if parallel == "fsdp":
        from torch.distributed.fsdp import fully_shard

        blocks = getattr(model, "blocks", None)
        if blocks is None:
            raise ValueError(
                f"--parallel fsdp needs a model with a .blocks ModuleList; {type(model).__name__} has none"
            )
        for block in blocks:
            fully_shard(block)
        fully_shard(model)
        return model
    raise ValueError(f"parallel must be 'none', 'ddp' or 'fsdp', got {parallel!r}")


def unwrap_model(model: nn.Module) -> nn.Module:
    """The user's module under a DDP wrapper (FSDP2 shards in place: nothing to unwrap)."""
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model


def all_reduce_mean(value: torch.Tensor) -> torch.Tensor:
    """Mean over ranks (identity with one process)."""
    if dist.is_initialized() and dist.get_world_size() > 1:
        value = value.clone()
        dist.all_reduce(value, op=dist.ReduceOp.SUM)
        value /= dist.get_world_size()
    return value


def all_reduce_max(value: torch.Tensor) -> torch.Tensor:
    """Max over ranks (identity with one process); gloo and NCCL both reduce on the tensor's device."""
    if dist.is_initialized() and dist.get_world_size() > 1:
        value = value.clone()
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return value


def barrier() -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def shutdown() -> None:
    """Leave the process group. Wrappers (DDP, FSDP) still referencing the gloo group are
    collected first: destroying it under them has aborted processes at exit."""
    if dist.is_initialized():
        gc.collect()
        dist.destroy_process_group()
