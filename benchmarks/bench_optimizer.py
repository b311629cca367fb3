"""Optimizer step time on an nGPT of >= 50M parameters: spherenet's Riemannian optimizers
against torch's Adam (+ the paper's renormalization) and geoopt's RiemannianAdam.

RiemannianAdam runs three times: with its native CPU kernel (one fused pass per row, built on
first use), with its ``torch.compile``'d kernel (compiled during the warmup steps) and with
its ``_foreach`` kernels. Only ``optimizer.step()`` is timed (plus the renormalization for "Adam + normalize"): the
gradients are fixed random tensors set once, so every contender does the same work on the
same tensors. Contenders run interleaved in a fresh random order in every round; the table
gives the median over rounds and the ratio to ``torch.optim.Adam(fused=True)``.

    nice python benchmarks/bench_optimizer.py --threads 1   # 66.4M-parameter nGPT, 15 rounds
    nice python benchmarks/bench_optimizer.py               # torch's default thread count
    python benchmarks/bench_optimizer.py --rounds 3 --d-model 128 --n-layers 2 --vocab 1000  # smoke
"""

from __future__ import annotations

import argparse
import gc
import platform
import random
import statistics
import sys
import time
import warnings

import torch

from spherenet.manifolds.sphere import geoopt
from spherenet.models import from_preset
from spherenet.optim import Riemannian, RiemannianAdam, normalize_, param_groups, sphere_parameters

BASELINE = "torch Adam fused"


def build_model(args) -> torch.nn.Module:
    torch.manual_seed(0)
    model = from_preset(
        "ngpt-small", vocab_size=args.vocab, d_model=args.d_model, n_layers=args.n_layers, n_heads=args.n_heads
    )
    normalize_(model)
    g = torch.Generator().manual_seed(1)
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=g, dtype=p.dtype) * 1e-3
    return model


def contenders(model, lr: float) -> dict:
    """name -> (setup, step): ``setup()`` builds the optimizer, ``step(opt)`` runs one step."""

    def plain_step(opt):
        opt.step()

    def adam_then_normalize(opt):
        opt.step()
        normalize_(model)

    def geoopt_opt():
        # geoopt sees the ManifoldParameter class of a freshly built model (no re-wrapping here).
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return geoopt.optim.RiemannianAdam(model.parameters(), lr=lr)

    return {
        BASELINE: (lambda: torch.optim.Adam(model.parameters(), lr=lr, fused=True), plain_step),
        "torch Adam fused + normalize": (
            lambda: torch.optim.Adam(model.parameters(), lr=lr, fused=True),
            adam_then_normalize,
        ),
        "torch Adam foreach": (lambda: torch.optim.Adam(model.parameters(), lr=lr, foreach=True), plain_step),
        **{
            f"spherenet RiemannianAdam {moment} {kernel}": (
                lambda moment=moment, kernel=kernel: RiemannianAdam(
                    model, lr=lr, second_moment=moment, sphere_kernel=kernel
                ),
                plain_step,
            )
            for kernel in ("native", "compiled", "foreach")
            for moment in ("element", "row")
        },
        "spherenet Riemannian(Adam fused)": (
            lambda: Riemannian(torch.optim.Adam(param_groups(model), lr=lr, fused=True), model),
            plain_step,
        ),
        "geoopt RiemannianAdam": (geoopt_opt, plain_step),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15, help="timed rounds (each runs every contender once)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per contender first")
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--d-model", type=int, default=512)
    parser.add_argument("--n-layers", type=int, default=8)
    parser.add_argument("--n-heads", type=int, default=8)
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: torch's default)")
    parser.add_argument("--only", nargs="*", default=None, help="names of contenders to run (substring match)")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.warmup < 0:
        parser.error("--rounds must be >= 1 and --warmup >= 0")
    if args.threads:
        torch.set_num_threads(args.threads)
    # All contenders step the same tensors; plain Adam moves rows off the sphere, so the
    # Riemannian optimizers' first step projects them back with a warning. Expected here.
    warnings.filterwarnings("ignore", message=".*projecting sphere parameters onto the sphere")

    model = build_model(args)
    n_params = sum(p.numel() for p in model.parameters())
    n_sphere = sum(p.numel() for p in sphere_parameters(model))
    print(f"torch {torch.__version__}, geoopt {geoopt.__version__}, python {platform.python_version()}, "
          f"{platform.machine()}, {torch.get_num_threads()} threads")  # fmt: skip
    print(f"nGPT d_model={args.d_model} n_layers={args.n_layers} vocab={args.vocab}: {n_params / 1e6:.1f}M parameters "
          f"({n_sphere / 1e6:.1f}M on the sphere, {len(sphere_parameters(model))} tensors), float32, CPU")  # fmt: skip

    table = contenders(model, args.lr)
    if args.only:
        table = {k: v for k, v in table.items() if k == BASELINE or any(s in k for s in args.only)}
    optimizers = {}
    for name, (setup, step) in table.items():
        optimizers[name] = setup()
        for _ in range(args.warmup):
            step(optimizers[name])
    times = {name: [] for name in table}
    order = list(table)
    rng = random.Random(0)
    for _ in range(args.rounds):
        rng.shuffle(order)
        for name in order:
            step = table[name][1]
            gc.collect()
            t0 = time.perf_counter()
            step(optimizers[name])
            times[name].append(time.perf_counter() - t0)

    base = statistics.median(times[BASELINE])
    geo = statistics.median(times["geoopt RiemannianAdam"]) if "geoopt RiemannianAdam" in times else None
    print(f"\n{args.rounds} interleaved rounds, median (min-max) per step")
    print(f"{'contender':42s} {'median ms':>10s} {'min':>8s} {'max':>8s} {'x fused Adam':>13s} {'geoopt / this':>14s}")
    for name in table:
        t = times[name]
        med = statistics.median(t)
        geo_ratio = f"{geo / med:14.2f}" if geo is not None else f"{'':14s}"
        print(f"{name:42s} {med * 1e3:10.1f} {min(t) * 1e3:8.1f} {max(t) * 1e3:8.1f} {med / base:13.2f} {geo_ratio}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
