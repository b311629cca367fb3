"""Peak memory of one training step, nGPT against the baseline GPT at the same shape.

One step = forward, next-token loss, backward, ``optimizer.step()``, ``zero_grad`` (as in
bench_step.py), with each model's paper recipe from ``spherenet.optim.build_optimizer``
(nGPT: ``riemannian_adam``; GPT: ``adamw``). Each contender runs in a fresh subprocess, after
one untimed warm-up step that creates the optimizer state (and compiles, for "compiled").

What is measured:

- ``params``, ``optimizer state``: bytes of the distinct storages of the parameters and of
  the tensors in ``optimizer.state`` (persistent across steps).
- ``step peak``: the most bytes of tensor storage alive at once during the step **beyond**
  the persistent ones: gradients, activations saved for backward, temporaries.
  CPU: counted by a ``TorchDispatchMode`` that sees every tensor created by an aten op (forward,
  backward, optimizer) and follows its storage until it is freed (a weak reference to the
  storage); views share their storage and are not counted twice; scratch buffers a kernel keeps
  to itself are not seen. Eager only: compiled code allocates outside the dispatcher.
  CUDA: ``torch.cuda.max_memory_allocated()`` minus the allocation before the step (the caching
  allocator's own count; eager and compiled).
- ``total``: persistent + step peak (what the step needs at its worst moment).
- ``VmHWM``: the worker process's peak resident memory (from ``/proc/self/status``: Python,
  libraries and allocator caches included; a coarse cross-check, CPU only).

    nice python benchmarks/bench_memory.py                 # CPU: d 256, 4 layers, ctx 256, batch 8
    nice python benchmarks/bench_memory.py --quick         # tiny shape
    python benchmarks/bench_memory.py --device cuda --dtype bf16 --compile --d-model 1024 \\
        --n-layers 24 --n-heads 16 --vocab 32000 --ctx 1024 --batch 8
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import warnings
import weakref

import torch
from _machine import cpu_name  # benchmarks/ is on sys.path when a script runs
from bench_step import RECIPE, build, make_step, random_batch  # the same models, data and step
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
MiB = 2**20


class LiveStorageBytes(TorchDispatchMode):
    """Bytes of tensor storage created under this mode and still alive; ``peak`` is the maximum.

    Storages are keyed by their C++ address; a ``weakref.finalize`` on the storage object fires
    when the storage itself is freed (torch keeps the Python object of a storage alive as long as
    the storage, like it does for tensors), so a tensor dropped while a view of it lives is
    still counted.
    """

    def __init__(self):
        super().__init__()
        self.live: dict[int, int] = {}
        self.current = 0
        self.peak = 0

    def _freed(self, key: int) -> None:
        self.current -= self.live.pop(key, 0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                storage = t.untyped_storage()
                key = storage._cdata
                if key not in self.live:
                    self.live[key] = storage.nbytes()
                    self.current += self.live[key]
                    self.peak = max(self.peak, self.current)
                    weakref.finalize(storage, self._freed, key)
        return out


def storage_bytes(tensors) -> int:
    seen, total = set(), 0
    for t in tensors:
        if isinstance(t, torch.Tensor):
            key = t.untyped_storage()._cdata
            if key not in seen:
                seen.add(key)
                total += t.untyped_storage().nbytes()
    return total


def vm_hwm_bytes() -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def worker(args) -> dict:
    device = torch.device(args.device)
    family, mode = args.worker
    model, optimizer, scheduler = build(family, args, device)
    runner = torch.compile(model) if mode == "compiled" else model
    x, y = random_batch(args, device)
    step = make_step(runner, optimizer, scheduler, x, y, device, args.dtype)

    step()  # warm-up: optimizer state exists from here on (and the graph is compiled)
    params = storage_bytes(model.parameters())
    state = storage_bytes(t for s in optimizer.state.values() for t in s.values())
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        step()
        torch.cuda.synchronize(device)
        step_peak = torch.cuda.max_memory_allocated(device) - before
    elif mode == "eager":
        tracker = LiveStorageBytes()
        with tracker:
            step()
        step_peak = tracker.peak
    else:
        step()
        step_peak = None  # compiled CPU code allocates outside the dispatcher
    return {
        "family": family,
        "mode": mode,
        "params": params,
        "state": state,
        "step_peak": step_peak,
        "n_params": sum(p.numel() for p in model.parameters()),
        "vm_hwm": vm_hwm_bytes() if device.type == "cpu" else None,
    }


def run_worker(args, family: str, mode: str) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", family, mode]
    for name in ("d_model", "n_layers", "n_heads", "vocab", "ctx", "batch", "device", "dtype", "threads"):
        cmd += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"worker {family} {mode} failed (exit {out.returncode}):\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def mib(v) -> str:
    return "n/a" if v is None else f"{v / MiB:.1f}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--n-layers", type=int, default=4)
    p.add_argument("--n-heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--ctx", type=int, default=256)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    p.add_argument("--compile", action="store_true", help="also measure torch.compile'd models")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch's default)")
    p.add_argument("--quick", action="store_true", help="tiny shape: d 64, 2 layers, ctx 64, batch 4")
    p.add_argument("--worker", nargs=2, metavar=("FAMILY", "MODE"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    warnings.filterwarnings("ignore")
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.worker:
        print(json.dumps(worker(args)))
        return 0
    if args.quick:
        args.d_model, args.n_layers, args.ctx, args.batch = 64, 2, 64, 4

    modes = ["eager", "compiled"] if args.compile else ["eager"]
    rows = {(f, m): run_worker(args, f, m) for m in modes for f in RECIPE}
    device = torch.cuda.get_device_name() if args.device == "cuda" else f"{cpu_name()}, {os.cpu_count()} CPUs (nproc)"
    print(f"{datetime.date.today()}; {device}; torch {torch.__version__}; {args.device} {args.dtype}")
    print(f"shape: d_model {args.d_model}, {args.n_layers} layers, {args.n_heads} heads, d_MLP {4 * args.d_model}, "
          f"vocab {args.vocab}, context {args.ctx}, batch {args.batch}")  # fmt: skip
    how = "torch.cuda.max_memory_allocated" if args.device == "cuda" else "live tensor storage (TorchDispatchMode)"
    print(f"step peak: {how}, beyond parameters and optimizer state\n")
    print("| model | mode | params MiB | optimizer state MiB | step peak MiB | total MiB | process VmHWM MiB |")
    print("|---|---|---|---|---|---|---|")
    for (family, mode), r in rows.items():
        total = None if r["step_peak"] is None else r["params"] + r["state"] + r["step_peak"]
        print(f"| {family} ({r['n_params'] / 1e6:.2f}M) | {mode} | {mib(r['params'])} | {mib(r['state'])} | "
              f"{mib(r['step_peak'])} | {mib(total)} | {mib(r['vm_hwm'])} |")  # fmt: skip
    print("\n| mode | nGPT / GPT step peak | nGPT / GPT total | nGPT / GPT VmHWM |\n|---|---|---|---|")
    for mode in modes:
        n, b = rows[("nGPT", mode)], rows[("GPT", mode)]

        def ratio(a, c):
            return "n/a" if a is None or c is None else f"{a / c:.2f}"

        tot = lambda r: None if r["step_peak"] is None else r["params"] + r["state"] + r["step_peak"]  # noqa: E731
        print(f"| {mode} | {ratio(n['step_peak'], b['step_peak'])} | {ratio(tot(n), tot(b))} | "
              f"{ratio(n['vm_hwm'], b['vm_hwm'])} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
