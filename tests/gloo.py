"""Two gloo processes on this machine, for the distributed tests (importable from any test, as
``corpora`` is): ``spawn(body, *args)`` runs ``body(rank, *args)`` on ranks 0 and 1 of a fresh
process group and fails the test when either rank raises."""

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
