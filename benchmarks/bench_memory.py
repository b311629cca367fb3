"""Peak memory of one training step, nGPT against the baseline GPT at the same shape.

One step = forward, next-token loss, backward, ``optimizer.step()``, ``zero_grad`` (as in
bench_step.py, whose models, batch and step this reuses), with each model's paper recipe from
``spherenet.optim.build_optimizer`` (nGPT: ``riemannian_adam``; GPT: ``adamw``). Each
contender runs in a fresh subprocess, after one untimed warm-up step that creates the
optimizer state (and compiles, for "compiled").

What is measured:

- ``params``, ``optim state``: bytes of the distinct storages of the parameters and of the
  tensors in ``optimizer.state`` (persistent across steps).
- ``step peak``: the most bytes of tensor storage alive at once during the step **beyond**
  the persistent ones: gradients, activations saved for backward, temporaries.
  CUDA: ``torch.cuda.max_memory_allocated()`` after ``reset_peak_memory_stats()``, minus what
  was allocated before the step (the caching allocator's own count, which includes kernels'
  workspaces; eager and compiled).
  CPU: counted by a ``TorchDispatchMode`` that sees every tensor created by an aten op (forward,
  backward, optimizer) and follows its storage until it is freed (a weak reference to the
  storage); views share their storage and are not counted twice; scratch buffers a kernel keeps
  to itself are not seen. Eager only: compiled code allocates outside the dispatcher.
- ``total``: persistent + step peak (what the step needs at its worst moment).
- ``saved for backward``: bytes of the distinct storages the forward saves for the backward
  (``torch.autograd.graph.saved_tensors_hooks``), parameters excluded: the activations. Eager
  only (compiled graphs save their own selection), any device.
- last column, CPU: ``VmHWM``, the worker process's peak resident memory (``/proc/self/status``:
  Python, libraries and allocator caches included; a coarse cross-check). CUDA:
  ``torch.cuda.max_memory_reserved()``, the most the caching allocator held from the driver
  over the whole worker (warm-up and compilation included).

nGPT's eager forward uses the fused autograd functions of ``spherenet.kernels`` (``kernels.configure("torch")``) (the
default). ``--variants [plain] [checkpointed]`` adds "eager, plain autograd" (nGPT with ``kernels.configure("reference")``,
compared with GPT's eager step) and "eager, activation checkpointing" (both models,
``set_activation_checkpointing(True)``).

``--dtype bf16`` is autocast to bfloat16 with fp32 parameters and optimizer states, as in
bench_step.py.

    nice python benchmarks/bench_memory.py                 # CPU: d 256, 4 layers, ctx 256, batch 8
    nice python benchmarks/bench_memory.py --quick         # tiny shape
    nice python benchmarks/bench_memory.py --variants      # + plain autograd, activation checkpointing
    python benchmarks/bench_memory.py --device cuda --dtype bf16 --compile --size 0.5b --n-layers 8 --ctx 1024 --batch 8
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import warnings
import weakref

import torch
from _machine import emit, header, pick_device, shape_text  # benchmarks/ is on sys.path
from bench_step import (  # the same models, data and step
    MODE_LABEL,
    RECIPE,
    add_step_args,
    baseline_notes,
    baseline_of,
    build,
    check_triton_variant,
    config_for,
    contenders_of,
    make_step,
    modes_for,
    random_batch,
    selected_variants,
)
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


def saved_for_backward_bytes(step, exclude) -> int:
    """Run ``step`` and return the bytes of the distinct storages its forward saves for the
    backward, except those of the tensors in ``exclude`` (the parameters)."""
    excluded = {t.untyped_storage().data_ptr() for t in exclude}
    saved: dict[int, int] = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in excluded:
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        step()
    return sum(saved.values())


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
    device = pick_device(args.device)
    family, mode = args.worker
    model, optimizer, scheduler = build(family, args, device, mode)
    runner = torch.compile(model) if mode.startswith("compiled") else model
    x, y = random_batch(model.config.vocab_size, args.batch, model.config.max_seq_len, device)
    step = make_step(runner, optimizer, scheduler, x, y, device, args.dtype, mode)
    eager = not mode.startswith("compiled")
    result = {"family": family, "mode": mode, "n_params": sum(p.numel() for p in model.parameters())}
    try:
        step()  # warm-up: optimizer state exists from here on (and the graph is compiled)
        result["params"] = storage_bytes(model.parameters())
        result["state"] = storage_bytes(t for s in optimizer.state.values() for t in s.values())
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
            before = torch.cuda.memory_allocated(device)
            step()
            torch.cuda.synchronize(device)
            result["step_peak"] = torch.cuda.max_memory_allocated(device) - before
        elif eager:
            tracker = LiveStorageBytes()
            with tracker:
                step()
            result["step_peak"] = tracker.peak
        else:
            result["step_peak"] = None  # compiled CPU code allocates outside the dispatcher
        if eager:
            result["saved"] = saved_for_backward_bytes(step, list(model.parameters()))
    except torch.OutOfMemoryError as e:
        result["oom"] = str(e).splitlines()[0]
    if device.type == "cuda":
        result["process"] = torch.cuda.max_memory_reserved(device)
    else:
        result["process"] = vm_hwm_bytes()
    return result


def run_worker(args, family: str, mode: str) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", family, mode]
    for name in ("size", "d_model", "n_layers", "n_heads", "vocab", "ctx", "batch", "device", "dtype", "threads"):
        if getattr(args, name) is not None:
            cmd += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"worker {family} {mode} failed (exit {out.returncode}):\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def mib(v) -> str:
    return "n/a" if v is None else f"{v / MiB:.1f}"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_step_args(p)
    p.add_argument("--compile", action="store_true", help="also measure torch.compile'd models")
    p.add_argument("--quick", action="store_true", help="size tiny, ctx 64, batch 4, 1 thread")
    p.add_argument("--markdown", metavar="FILE", help="also append the tables to FILE")
    p.add_argument("--worker", nargs=2, metavar=("FAMILY", "MODE"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        args.size, args.ctx, args.batch, args.threads = "tiny", args.ctx or 64, 4, args.threads or 1
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    warnings.filterwarnings("ignore")
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.worker:
        print(json.dumps(worker(args)))
        return 0
    device = pick_device(args.device)  # fail here, not in every worker

    variants = selected_variants(args.variants)
    problem = check_triton_variant(variants, device)
    if problem:
        print(f"bench_memory.py: {problem}", file=sys.stderr)
        return 2
    modes = modes_for(variants, args.compile)
    rows = {(f, m): run_worker(args, f, m) for f, m in contenders_of(modes)}
    emit(report(args, device, modes, rows, argv), args.markdown)
    return 0


def report(args, device, modes, rows, argv) -> str:
    config = config_for("nGPT", args)
    cuda = device.type == "cuda"
    last = "CUDA max reserved MiB" if cuda else "VmHWM MiB"
    how = (
        "torch.cuda.max_memory_allocated beyond what was allocated before the step"
        if cuda
        else "live tensor storage (TorchDispatchMode), eager only"
    )
    n_params = {f: rows[(f, "eager")]["n_params"] for f in RECIPE}
    lines = [
        header(
            f"Peak memory of a training step, nGPT vs GPT: {args.device} {args.dtype}, context "
            f"{config.max_seq_len}, batch {args.batch}",
            device,
            argv,
        ),
        f"Shape: {shape_text(config)}, batch {args.batch}; parameters nGPT {n_params['nGPT'] / 1e6:.2f}M, GPT "
        f"{n_params['GPT'] / 1e6:.2f}M. Precision: {args.dtype}"
        f"{' (autocast, fp32 parameters and optimizer states)' if args.dtype == 'bf16' else ''}. Each contender in "
        f"a fresh subprocess after one warm-up step. Step peak: {how}. Saved for backward: distinct storages "
        f"saved by the forward, parameters excluded (eager only). {last}: "
        f"{'the caching allocator peak over the worker' if cuda else 'peak resident memory of the worker'}.",
        "",
        f"| model | mode | params MiB | optim state MiB | step peak MiB | total MiB | saved for backward MiB | {last} |",
        "|---|---|---|---|---|---|---|---|",
    ]

    def total(r):
        return None if r.get("step_peak") is None else r["params"] + r["state"] + r["step_peak"]

    for (family, mode), r in rows.items():
        if "oom" in r:
            lines.append(f"| {family} | {MODE_LABEL[mode]} | out of memory | | | | | {mib(r['process'])} |")
            continue
        lines.append(
            f"| {family} | {MODE_LABEL[mode]} | {mib(r['params'])} | {mib(r['state'])} | {mib(r['step_peak'])} | "
            f"{mib(total(r))} | {mib(r.get('saved'))} | {mib(r['process'])} |"
        )

    def ratio(a, c):
        return "n/a" if a is None or c is None else f"{a / c:.2f}"

    lines += [
        "",
        f"| mode | nGPT / GPT step peak | nGPT / GPT total | nGPT / GPT saved for backward | nGPT / GPT {last[:-4]} |",
        "|---|---|---|---|---|",
    ]
    for mode in modes:
        n, b = rows[("nGPT", mode)], rows[baseline_of(mode)]
        if "oom" in n or "oom" in b:
            lines.append(f"| {MODE_LABEL[mode]} | out of memory | | | |")
            continue
        lines.append(
            f"| {MODE_LABEL[mode]} | {ratio(n['step_peak'], b['step_peak'])} | {ratio(total(n), total(b))} | "
            f"{ratio(n.get('saved'), b.get('saved'))} | {ratio(n['process'], b['process'])} |"
        )
    lines += baseline_notes(modes, device, timed=False)
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
