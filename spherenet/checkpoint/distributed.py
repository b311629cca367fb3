"""Checkpoints under torch.distributed: the process group's collectives, and agreement across
ranks (every rank raises when any rank failed, so that none is left waiting in a collective).
Everything here is trivial without a process group."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from .errors import CheckpointError, describe_os_error


def _dist_on() -> bool:
    return dist.is_available() and dist.is_initialized()


class _Group:
    def __init__(self, group):
        self.group = group
        self.on = _dist_on()
        self.rank = dist.get_rank(group) if self.on else 0
        self.world = dist.get_world_size(group) if self.on else 1

    def gather(self, obj) -> list:
        """``obj`` from every rank, on every rank (also acts as a barrier)."""
        if not self.on:
            return [obj]
        out: list = [None] * self.world
        dist.all_gather_object(out, obj, group=self.group)
        return out

    def broadcast(self, obj):
        """Rank 0's ``obj`` on every rank."""
        if not self.on:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=dist.get_global_rank(self.group, 0) if self.group else 0, group=self.group)
        return box[0]

    def agree(self, error: BaseException | None, what: str, path=None) -> None:
        """Raise on every rank when ``what`` failed on any rank (keeps ranks out of deadlock);
        ``path``: what was being written, named when an OSError names no file."""
        if error is None:
            text = None
        elif isinstance(error, OSError):
            text = describe_os_error(error, path=path)  # errno named: no space, read-only, permission
        else:
            text = f"{type(error).__name__}: {error}"
        msgs = self.gather(text)
        failed = [(r, m) for r, m in enumerate(msgs) if m is not None]
        if not failed:
            return
        detail = "; ".join(f"rank {r}: {m}" for r, m in failed)
        if error is not None:
            raise CheckpointError(f"{what} failed ({detail})") from error
        raise CheckpointError(f"{what} failed on another rank ({detail})")


def _dtensor_type():
    if not dist.is_available():
        return None
    from torch.distributed.tensor import DTensor

    return DTensor


def _is_sharded(model: nn.Module) -> bool:
    dtensor = _dtensor_type()
    return dtensor is not None and any(isinstance(p, dtensor) for p in model.parameters())


def _local(t: torch.Tensor) -> torch.Tensor:
    dtensor = _dtensor_type()
    return t.to_local() if dtensor is not None and isinstance(t, dtensor) else t
