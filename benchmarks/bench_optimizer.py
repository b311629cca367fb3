"""Optimizer step time on an nGPT: spherenet's Riemannian optimizers against torch's Adam
(+ the paper's renormalization) and geoopt's RiemannianAdam.

RiemannianAdam runs with each of its sphere kernels: on CPU the native kernel (one fused pass
per row, built on first use; skipped when it cannot be built or ``SPHERENET_KERNELS=torch``) and the
``_foreach`` kernels; on CUDA the Triton kernel (one fused pass per block of rows; skipped
without Triton) and the ``_foreach`` kernels, and the baseline is
``torch.optim.Adam(fused=True)``'s CUDA kernel. Only
``optimizer.step()`` is timed (plus the renormalization for "Adam + normalize"): the gradients
are fixed random tensors set once, so every contender does the same work on the same tensors.
Contenders run interleaved in a fresh random order in every round; each timed sample is
``--steps`` steps (on CUDA with the device synchronized at both ends); the table gives the
median over rounds, its ratio to ``torch.optim.Adam(fused=True)``'s, and the median and
quartiles of the per-round ratios (each round's time over fused Adam's in that round). The foreach path also
runs with ``wave_bytes`` unlimited (whole tensors in one block of passes instead of its default
4 MiB row blocks, which are sized for a CPU cache and multiply kernel launches on a GPU).

``--dtype bf16`` makes the parameters bfloat16, and with them the gradients and every
contender's optimizer state (torch's Adam keeps its moments in the parameter's dtype); fp32 is
the usual setting (training with bf16 autocast keeps fp32 parameters).

    nice python benchmarks/bench_optimizer.py --threads 1   # 66.4M-parameter nGPT, 15 rounds
    nice python benchmarks/bench_optimizer.py               # torch's default thread count
    nice python benchmarks/bench_optimizer.py --quick       # smoke run: tiny model, 3 rounds
    python benchmarks/bench_optimizer.py --device cuda --size 0.5b --steps 5 [--dtype bf16]  # 0.5B nGPT on a GPU
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import sys
import time
import warnings

import torch
from _machine import (  # benchmarks/ is on sys.path when a script runs
    add_shape_args,
    emit,
    header,
    pick_device,
    shape_overrides,
    shape_text,
    sync,
    threads,
)

from spherenet.kernels import implementation_status, native, sphere_rows
from spherenet.manifolds.sphere import geoopt
from spherenet.models import from_preset
from spherenet.optim import Riemannian, RiemannianAdam, normalize_, param_groups, sphere_parameters

BASELINE = "torch Adam fused"
GEOOPT = "geoopt RiemannianAdam"
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
# RiemannianAdam's gradient options, its default (the paper's method: Adam on the Euclidean
# gradient, then Norm) first
GRADIENTS = ("euclidean", "riemannian")
# Without --size: the 66.4M-parameter nGPT of BENCHMARKS.md's optimizer section.
DEFAULT_SHAPE = dict(d_model=512, n_layers=8, n_heads=8, vocab=32000)


def build_model(args, device: torch.device) -> torch.nn.Module:
    size, overrides = shape_overrides(args, **DEFAULT_SHAPE)
    torch.manual_seed(0)
    with device:
        model = from_preset(f"ngpt-{size}", **overrides)
    model.to(DTYPES[args.dtype])
    normalize_(model)  # rows rounded to bf16 are put back on the sphere
    g = torch.Generator(device=device).manual_seed(1)
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=g, device=device, dtype=p.dtype) * 1e-3
    return model


def one_wave_step(opt: RiemannianAdam) -> None:
    """A step of the foreach path in one block of whole tensors: its default row blocks
    (``sphere_rows.WAVE_BYTES``, 4 MiB) are sized for a CPU cache and cost kernel launches on a GPU."""
    previous, sphere_rows.WAVE_BYTES = sphere_rows.WAVE_BYTES, 1 << 62
    try:
        opt.step()
    finally:
        sphere_rows.WAVE_BYTES = previous


def contenders(model, lr: float, kernels: list[str]) -> dict:
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
        "torch Adam fused + normalize (the paper's method)": (
            lambda: torch.optim.Adam(model.parameters(), lr=lr, fused=True),
            adam_then_normalize,
        ),
        "torch Adam foreach": (lambda: torch.optim.Adam(model.parameters(), lr=lr, foreach=True), plain_step),
        **{
            f"spherenet RiemannianAdam, {moment}, {gradient} gradient, {kernel}": (
                lambda moment=moment, gradient=gradient, kernel=kernel: RiemannianAdam(
                    model, lr=lr, second_moment=moment, gradient=gradient, sphere_kernel=kernel
                ),
                plain_step,
            )
            for kernel in kernels
            for moment in ("element", "row")
            for gradient in GRADIENTS
        },
        **{
            f"spherenet RiemannianAdam, {moment}, {GRADIENTS[0]} gradient, torch, wave_bytes unlimited": (
                lambda moment=moment: RiemannianAdam(model, lr=lr, second_moment=moment, sphere_kernel="torch"),
                one_wave_step,
            )
            for moment in ("element", "row")
        },
        "spherenet Riemannian(Adam fused)": (
            lambda: Riemannian(torch.optim.Adam(param_groups(model), lr=lr, fused=True), model),
            plain_step,
        ),
        GEOOPT: (geoopt_opt, plain_step),
    }


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_shape_args(parser, default_size=None)
    parser.add_argument("--rounds", type=int, default=15, help="timed rounds (each runs every contender once)")
    parser.add_argument("--steps", type=int, default=1, help="optimizer steps per timed sample")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per contender first")
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument(
        "--dtype",
        default="fp32",
        choices=list(DTYPES),
        help="bf16: bfloat16 parameters, gradients and optimizer states",
    )
    parser.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: torch's default)")
    parser.add_argument("--only", nargs="*", default=None, help="names of contenders to run (substring match)")
    parser.add_argument("--no-geoopt", action="store_true", help="leave geoopt out (slow on large models)")
    parser.add_argument("--quick", action="store_true", help="smoke run: size tiny, vocab 1000, 3 rounds, 1 thread")
    parser.add_argument("--markdown", metavar="FILE", help="also append the table to FILE")
    args = parser.parse_args(argv)
    if args.quick:
        args.size, args.vocab, args.rounds, args.warmup = "tiny", args.vocab or 1000, 3, 1
        args.threads = args.threads or 1
    if args.rounds < 1 or args.warmup < 0 or args.steps < 1:
        parser.error("--rounds and --steps must be >= 1 and --warmup >= 0")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    device = pick_device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    # All contenders step the same tensors; plain Adam moves rows off the sphere, so the
    # Riemannian optimizers' first step projects them back with a warning. Expected here.
    warnings.filterwarnings("ignore", message=".*projecting sphere parameters onto the sphere")

    model = build_model(args, device)
    kernels, notes = ["torch"], []
    if device.type == "cuda":  # the Triton kernel (on CPU it runs only in Triton's interpreter)
        available, reason = implementation_status("triton")
        if available:
            kernels.insert(0, "triton")
        else:
            notes.append(f"Triton kernel not run: {reason}")
    if device.type == "cpu":  # the native kernel is CPU-only
        available, reason = native.native_status()
        if available:
            kernels.insert(0, "native")
        else:
            notes.append(f"native kernel not run: {reason}")
    table = contenders(model, args.lr, kernels)
    if args.no_geoopt:
        del table[GEOOPT]
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
    for r in range(args.rounds):
        rng.shuffle(order)
        for name in order:
            step = table[name][1]
            gc.collect()
            sync(device)
            t0 = time.perf_counter()
            for _ in range(args.steps):
                step(optimizers[name])
            sync(device)
            times[name].append((time.perf_counter() - t0) / args.steps)
        print(f"# round {r + 1}/{args.rounds} done", file=sys.stderr)
    emit(report(args, device, model, times, notes, argv), args.markdown)
    return 0


def per_round_ratio(times: list[float], baseline: list[float]) -> str:
    """The contender's time over fused Adam's in the same round, median and quartiles over rounds:
    the machine's drift between rounds, which moves both, cancels out of each ratio."""
    ratios = [t / b for t, b in zip(times, baseline)]
    if len(ratios) < 2:
        return f"{ratios[0]:.2f}"
    q1, _, q3 = statistics.quantiles(ratios, n=4)
    return f"{statistics.median(ratios):.2f} ({q1:.2f}–{q3:.2f})"


def report(args, device, model, times, notes, argv) -> str:
    n_params = sum(p.numel() for p in model.parameters())
    spheres = sphere_parameters(model)
    label = f"{device.type} {args.dtype}" + (f", {threads()}" if device.type == "cpu" else "")
    base = statistics.median(times[BASELINE])
    geo = statistics.median(times[GEOOPT]) if GEOOPT in times else None
    lines = [
        header(f"Optimizer step: {label}", device, argv),
        f"nGPT {shape_text(model.config)}: {n_params / 1e6:.1f}M parameters, {sum(p.numel() for p in spheres) / 1e6:.1f}M "
        f"of them in {len(spheres)} sphere tensors; {args.dtype} parameters, gradients and optimizer states; geoopt "
        f"{geoopt.__version__}. Only `optimizer.step()` is timed, on fixed random gradients; median (min–max) of "
        f"{args.rounds} interleaved rounds of {args.steps} step(s), after {args.warmup} warm-up steps."
        + "".join(f" ({note})" for note in notes),
        "",
        f"| contender | {label}: ms | x fused Adam | x fused Adam, per round: median (quartiles) | geoopt / this |",
        "|---|---|---|---|---|",
    ]
    for name, t in times.items():
        med = statistics.median(t)
        geo_ratio = f"{geo / med:.2f}" if geo is not None else "n/a"
        lines.append(
            f"| {name} | {med * 1e3:.2f} ({min(t) * 1e3:.2f}–{max(t) * 1e3:.2f}) | {med / base:.2f} "
            f"| {per_round_ratio(t, times[BASELINE])} | {geo_ratio} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
