"""Training step time of nGPT against the baseline GPT at the same shape, eager and compiled.

One step = forward, next-token loss, backward, ``optimizer.step()``, ``scheduler.step()``,
``zero_grad``: what recipes/train.py repeats. Both models have the same d_model, layers, heads,
d_MLP (4 d), vocabulary and context; each gets its paper recipe from
``spherenet.optim.build_optimizer`` (nGPT: ``riemannian_adam``; GPT: ``adamw``, Table 3).
"compiled" is ``torch.compile(model)`` (forward and backward graphs; the optimizer step stays
eager, as in training).

The contenders (nGPT/GPT x eager/compiled) run interleaved: in every round each runs ``--steps``
steps in a fresh random order, and the table gives the median over rounds of the time per
step, and the ratio nGPT / GPT (of the medians, and the median of the per-round ratios, which
is less sensitive to load that drifts over the run on a shared machine). Warm-up steps (compilation included) come first and are not
timed. Same fixed random batch for all.

    nice python benchmarks/bench_step.py                      # CPU: d 256, 4 layers, ctx 256, batch 8
    nice python benchmarks/bench_step.py --quick              # a smoke run (tiny shape, no compile)
    python benchmarks/bench_step.py --device cuda --dtype bf16 --d-model 1024 --n-layers 24 --n-heads 16 \\
        --vocab 32000 --ctx 1024 --batch 8                    # the paper's 0.5B shape on a GPU

``--dtype bf16`` is autocast to bfloat16 with fp32 parameters and optimizer states (as
recipes/train.py does on CUDA); both models always run at the same precision.
"""

from __future__ import annotations

import argparse
import datetime
import os
import random
import statistics
import sys
import time
import warnings

import torch
from _machine import cpu_name  # benchmarks/ is on sys.path when a script runs
import torch.nn.functional as F

from spherenet.models import from_preset
from spherenet.optim import build_optimizer

RECIPE = {"nGPT": ("ngpt-small", "riemannian_adam"), "GPT": ("gpt-small", "adamw")}


def machine(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)}, torch {torch.__version__}"
    return f"{cpu_name()}, {os.cpu_count()} CPUs (nproc), torch {torch.__version__}, {torch.get_num_threads()} threads"


def build(family: str, args, device: torch.device):
    preset, method = RECIPE[family]
    torch.manual_seed(0)
    model = from_preset(
        preset, vocab_size=args.vocab, d_model=args.d_model, n_layers=args.n_layers, n_heads=args.n_heads,
        max_seq_len=args.ctx,
    ).to(device)  # fmt: skip
    optimizer, scheduler = build_optimizer(model, method, lr=1e-3, total_steps=10**6)
    return model, optimizer, scheduler


def random_batch(args, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Fixed random token windows (inputs, next-token targets) of ``--batch`` x ``--ctx``."""
    g = torch.Generator().manual_seed(0)
    data = torch.randint(0, args.vocab, (args.batch, args.ctx + 1), generator=g).to(device)
    return data[:, :-1].contiguous(), data[:, 1:].contiguous()


def make_step(model, optimizer, scheduler, x, y, device, dtype):
    def step():
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=dtype == "bf16"):
            logits = model(x)
        loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten())
        loss.backward()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    return step


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--n-layers", type=int, default=4)
    p.add_argument("--n-heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=256, help="default 256: the byte tokenizer of the CPU recipes")
    p.add_argument("--ctx", type=int, default=256)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--steps", type=int, default=3, help="timed steps per contender per round")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps per contender first (compiles)")
    p.add_argument("--no-compile", action="store_true", help="eager only")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch's default)")
    p.add_argument("--quick", action="store_true", help="smoke run: d 64, 2 layers, ctx 64, 3 rounds, eager only")
    args = p.parse_args(argv)
    if args.quick:
        args.d_model, args.n_layers, args.ctx, args.batch, args.rounds, args.steps, args.warmup = 64, 2, 64, 4, 3, 2, 1
        args.no_compile = True
    device = torch.device(args.device)
    warnings.filterwarnings("ignore")
    if args.threads:
        torch.set_num_threads(args.threads)

    x, y = random_batch(args, device)

    modes = ["eager"] if args.no_compile else ["eager", "compiled"]
    contenders = {}
    for family in RECIPE:
        for mode in modes:
            model, opt, sched = build(family, args, device)
            runner = torch.compile(model) if mode == "compiled" else model
            contenders[(family, mode)] = make_step(runner, opt, sched, x, y, device, args.dtype)
    n_params = {f: sum(p.numel() for p in build(f, args, torch.device("cpu"))[0].parameters()) for f in RECIPE}

    for key, step in contenders.items():
        t0 = time.perf_counter()
        for _ in range(args.warmup):
            loss = step()
        sync(device)
        print(f"# warm-up {key[0]} {key[1]}: {time.perf_counter() - t0:.1f} s, loss {float(loss):.3f}", file=sys.stderr)

    times = {key: [] for key in contenders}
    rng = random.Random(0)
    for r in range(args.rounds):
        order = list(contenders)
        rng.shuffle(order)
        for key in order:
            sync(device)
            t0 = time.perf_counter()
            for _ in range(args.steps):
                contenders[key]()
            sync(device)
            times[key].append((time.perf_counter() - t0) / args.steps)
        print(f"# round {r + 1}/{args.rounds} done", file=sys.stderr)

    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    spread = {k: (min(v) * 1e3, max(v) * 1e3) for k, v in times.items()}
    shape = (f"d_model {args.d_model}, {args.n_layers} layers, {args.n_heads} heads, d_MLP {4 * args.d_model}, "
             f"vocab {args.vocab}, context {args.ctx}, batch {args.batch}")  # fmt: skip
    print(f"\n{datetime.date.today()}; {machine(device)}; {args.device} {args.dtype}")
    print(f"shape: {shape}; parameters nGPT {n_params['nGPT'] / 1e6:.2f}M, GPT {n_params['GPT'] / 1e6:.2f}M")
    print(f"median of {args.rounds} interleaved rounds x {args.steps} steps (after {args.warmup} warm-up steps)\n")
    print("| mode | nGPT ms/step (min-max) | GPT ms/step (min-max) | nGPT / GPT (medians) | nGPT / GPT (median of per-round ratios) |")
    print("|---|---|---|---|---|")
    for mode in modes:
        n, b = med[("nGPT", mode)], med[("GPT", mode)]
        (n0, n1), (b0, b1) = spread[("nGPT", mode)], spread[("GPT", mode)]
        paired = statistics.median(a / c for a, c in zip(times[("nGPT", mode)], times[("GPT", mode)]))
        print(f"| {mode} | {n:.1f} ({n0:.1f}-{n1:.1f}) | {b:.1f} ({b0:.1f}-{b1:.1f}) | {n / b:.2f} | {paired:.2f} |")
    if "compiled" in modes:
        print("\n| model | compiled / eager |\n|---|---|")
        for family in RECIPE:
            print(f"| {family} | {med[(family, 'compiled')] / med[(family, 'eager')]:.2f} |")
    tokens = args.batch * args.ctx
    print(f"\ntokens per step: {tokens}; nGPT eager {tokens / med[('nGPT', 'eager')] * 1e3:,.0f} tok/s, "
          f"GPT eager {tokens / med[('GPT', 'eager')] * 1e3:,.0f} tok/s")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
