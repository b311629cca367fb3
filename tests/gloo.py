"""Two gloo processes on this machine, for the distributed tests (importable from any test, as
``corpora`` is): ``spawn(body, *args)`` runs ``body(rank, *args)`` on ranks 0 and 1 of a fresh
process group and fails the test when either rank raises; ``step_beside_reference`` steps a
rank's sharded model and the unsharded reference it must agree with."""

from __future__ import annotations

import datetime
import os
import socket
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD = 2


def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, port: int, body: Callable[..., None], args: tuple) -> None:
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.set_num_threads(1)  # two processes on a shared CPU: no oversubscription
    dist.init_process_group("gloo", rank=rank, world_size=WORLD, timeout=datetime.timedelta(seconds=60))
    try:
        body(rank, *args)
        # Both ranks done before either tears down: a rank leaving while its peer still talks to
        # the store can abort the peer ("terminate called without an active exception").
        dist.barrier()
    finally:
        dist.destroy_process_group()


def spawn(body: Callable[..., None], *args) -> None:
    """Run ``body(rank, *args)`` in two processes joined by a gloo group; ``body`` must be a
    module-level function (the processes are spawned, so they import it by name)."""
    mp.spawn(_rank_main, args=(free_port(), body, args), nprocs=WORLD, join=True)


def step_beside_reference(rank: int, loss: Callable[..., torch.Tensor], model, opt, ref, ref_opt, ids, tgt) -> None:
    """One step of this rank's (sharded) ``model`` with ``opt`` on its own batch ``ids[rank]``, and
    one of the unsharded reference ``ref`` with ``ref_opt`` on every rank's batch together (``ids``
    and ``tgt`` are ``(WORLD, batch, ...)``, flattened to one batch for the reference). FSDP
    averages the gradients over ranks, so with ``loss(model, ids, tgt)`` a mean over equal batches
    the two take the same step."""
    opt.zero_grad()
    loss(model, ids[rank], tgt[rank]).backward()
    opt.step()
    ref_opt.zero_grad()
    loss(ref, ids.flatten(0, 1), tgt.flatten(0, 1)).backward()
    ref_opt.step()
