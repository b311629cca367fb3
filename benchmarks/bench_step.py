"""Training step time of nGPT against the baseline GPT at the same shape, eager and compiled.

One step = forward, next-token loss, backward, ``optimizer.step()``, ``scheduler.step()``,
``zero_grad``: what recipes/train.py repeats. Both models have the same d_model, layers, heads,
d_MLP (4 d), vocabulary and context (the presets ``ngpt-SIZE`` and ``gpt-SIZE`` with the same
overrides); each gets its paper recipe from ``spherenet.optim.build_optimizer`` (nGPT:
``riemannian_adam``; GPT: ``adamw``, Table 3). "torch.compile" is ``torch.compile(model)``
(forward and backward graphs; the optimizer step stays eager, as in training). nGPT's eager
forward uses the fused autograd functions of ``spherenet.kernels`` (``kernels.configure("torch")``) (the default);
``--variants [plain] [checkpointed]`` adds the contenders "eager, plain autograd" (nGPT with ``kernels.configure("reference")``,
compared with GPT's eager time) and "eager, activation checkpointing" (both models,
``set_activation_checkpointing(True)``); ``--variants slerp riemannian tangent`` add nGPT with the
SLERP update (eq. 6), the Riemannian update (eq. 24-26) or RiemannianAdam's moments on the
tangent-projected gradient (``optim.gradient=riemannian``), eager, each compared with GPT's eager
step (the budget study's arms ``ngpt-slerp``, ``ngpt-riemannian``, ``ngpt-tangent``).

The contenders (nGPT/GPT x eager/compiled) run interleaved: in every round each runs ``--steps``
steps in a fresh random order, and the table gives the median over rounds of the time per
step, and the ratio nGPT / GPT (of the medians, and the median of the per-round ratios, which
is less sensitive to load that drifts over the run on a shared machine). Warm-up steps
(compilation included) come first and are not timed. Same fixed random batch for all. On CUDA
the device is synchronized at both ends of every timed region (kernels run asynchronously).

``--dtype bf16`` is autocast to bfloat16 with fp32 parameters, gradients and optimizer states
(as recipes/train.py does on CUDA, ``autocast_context``); both models always run at the same
precision. ``--threads`` sets torch's CPU threads (meaningless for the GPU's kernels).

    nice python benchmarks/bench_step.py                  # CPU: d 256, 4 layers, ctx 256, batch 8
    nice python benchmarks/bench_step.py --quick          # a smoke run (tiny shape, no compile)
    python benchmarks/bench_step.py --device cuda --dtype bf16 --size 0.5b --n-layers 8 --ctx 1024 --batch 8
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
import warnings

import torch
import torch.nn.functional as F
from _machine import (  # benchmarks/ is on sys.path
    add_shape_args,
    emit,
    header,
    pick_device,
    shape_overrides,
    shape_text,
    sync,
)

from spherenet import kernels
from spherenet.models import model_from_config, preset_config
from spherenet.optim import build_optimizer
from spherenet.train.step import autocast_context

RECIPE = {"nGPT": ("ngpt", "riemannian_adam"), "GPT": ("gpt", "adamw")}
MODE_LABEL = {
    "eager": "eager",
    "plain": "eager, plain autograd",
    "checkpointed": "eager, activation checkpointing",
    "triton": "eager, Triton kernels",
    "compiled": "torch.compile",
    "compiled-triton": "torch.compile, Triton kernels",
    "slerp": "eager, SLERP update",
    "riemannian": "eager, Riemannian update",
    "tangent": "eager, tangent-projected optimizer",
}
VARIANTS = ("plain", "checkpointed", "triton", "slerp", "riemannian", "tangent")
NGPT_UPDATE = {"slerp": "slerp", "riemannian": "riemannian"}  # modes that change nGPT's model.update
NGPT_GRADIENT = {"tangent": "riemannian"}  # modes that change nGPT's optim.gradient
# modes that change only nGPT (its element-wise ops, its update or its optimizer)
NGPT_ONLY = ("plain", "triton", "compiled-triton", *NGPT_UPDATE, *NGPT_GRADIENT)
IMPLEMENTATION = {"plain": "reference", "triton": "triton", "compiled-triton": "triton"}  # else "torch"


def contenders_of(modes) -> list[tuple[str, str]]:
    """(family, mode) pairs: every family in every mode, except GPT in the modes that change only
    nGPT's element-wise operations (plain autograd, Triton kernels: GPT has neither)."""
    return [(f, m) for m in modes for f in RECIPE if not (f == "GPT" and m in NGPT_ONLY)]


def modes_for(variants: tuple[str, ...], compile: bool) -> list[str]:
    """The modes to measure: eager, the variants asked for, then compiled (and compiled with the
    Triton kernels when the "triton" variant is asked for)."""
    compiled = ["compiled", *(["compiled-triton"] if "triton" in variants else [])] if compile else []
    return ["eager", *variants, *compiled]


def check_triton_variant(variants, device: torch.device) -> str | None:
    """Why the "triton" variant cannot run here (None: it can)."""
    if "triton" not in variants:
        return None
    from spherenet.kernels import implementation_status

    available, reason = implementation_status("triton")
    if not available:
        return f"--variants triton: {reason}"
    if device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        return "--variants triton on CPU needs TRITON_INTERPRET=1 (Triton's interpreter: it runs the path, its times mean nothing)"
    return None


def selected_variants(asked: list[str] | None) -> tuple[str, ...]:
    """The ``--variants`` asked for, in table order: none without the option, all with it alone."""
    if asked is None:
        return ()
    return tuple(v for v in VARIANTS if not asked or v in asked)


def baseline_of(mode: str) -> tuple[str, str]:
    """The GPT contender an nGPT contender in ``mode`` is compared with: GPT's step of the same
    kind, eager or compiled."""
    return ("GPT", "compiled" if mode.startswith("compiled") else "eager" if mode in NGPT_ONLY else mode)


def config_for(family: str, args, mode: str = "eager"):
    """The model config of ``family`` at the shape that ``args`` asks for (nGPT's update of
    ``mode``)."""
    size, overrides = shape_overrides(args)
    if family == "nGPT" and mode in NGPT_UPDATE:
        overrides["update"] = NGPT_UPDATE[mode]
    return preset_config(f"{RECIPE[family][0]}-{size}", **overrides)


def build(family: str, args, device: torch.device, mode: str = "eager"):
    """The model of ``family`` at the shape of ``args``, built on ``device``, and its recipe;
    with activation checkpointing in ``mode`` "checkpointed", nGPT's update or optimizer
    gradient of the modes that change them."""
    torch.manual_seed(0)
    with device:  # parameters are created on the device (no CPU copy of a large model)
        model = model_from_config(config_for(family, args, mode))
    model.set_activation_checkpointing(mode == "checkpointed")
    method = RECIPE[family][1]
    gradient = {"gradient": NGPT_GRADIENT[mode]} if family == "nGPT" and mode in NGPT_GRADIENT else {}
    optimizer, scheduler = build_optimizer(model, method, lr=1e-3, total_steps=10**6, **gradient)
    return model, optimizer, scheduler


def random_batch(vocab_size: int, batch: int, ctx: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Fixed random token windows (inputs, next-token targets) of ``batch`` x ``ctx``."""
    g = torch.Generator().manual_seed(0)
    data = torch.randint(0, vocab_size, (batch, ctx + 1), generator=g).to(device)
    return data[:, :-1].contiguous(), data[:, 1:].contiguous()


def make_step(model, optimizer, scheduler, x, y, device, dtype, mode: str = "eager"):
    """One training step of ``model``, nGPT's element-wise operations by the implementation of
    ``mode`` (plain autograd, Triton kernels, else the fused torch functions)."""
    autocast = "bf16" if dtype == "bf16" else "off"

    implementation = IMPLEMENTATION.get(mode, "torch")

    def step():
        kernels.configure(implementation)  # the contenders' steps interleave: each sets its own
        with autocast_context(autocast, device):
            logits = model(x)
        loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten())
        loss.backward()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    return step


def add_step_args(p: argparse.ArgumentParser) -> None:
    """The options of the training step both step benchmarks measure (this one and
    bench_memory.py): the shape, the batch, the extra contenders, the device and precision."""
    add_shape_args(p)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument(
        "--variants",
        nargs="*",
        choices=VARIANTS,
        metavar="VARIANT",
        help="also these contenders (alone: all): plain = nGPT with plain autograd, "
        "checkpointed = both models with activation checkpointing, triton = nGPT with the Triton "
        "kernels of its element-wise operations (eager, and compiled unless --no-compile), "
        "slerp / riemannian = nGPT with that update, tangent = nGPT's optimizer on the "
        "tangent-projected gradient",
    )
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument(
        "--dtype",
        default="fp32",
        choices=["fp32", "bf16"],
        help="bf16: autocast to bfloat16, fp32 parameters and optimizer states",
    )
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch's default)")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_step_args(p)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--steps", type=int, default=3, help="timed steps per contender per round")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps per contender first (compiles)")
    p.add_argument("--no-compile", action="store_true", help="eager only")
    p.add_argument(
        "--quick", action="store_true", help="smoke run: size tiny, ctx 64, batch 4, 3 rounds, eager only, 1 thread"
    )
    p.add_argument("--markdown", metavar="FILE", help="also append the tables to FILE")
    args = p.parse_args(argv)
    if args.quick:
        args.size, args.ctx, args.batch = "tiny", args.ctx or 64, 4  # d 64, 2 layers, vocab 256
        args.threads = args.threads or 1  # 2+ threads of a tiny model spin-wait on a busy machine
        args.rounds, args.steps, args.warmup, args.no_compile = 3, 2, 1, True
    if args.rounds < 1 or args.steps < 1 or args.warmup < 1:
        p.error("--rounds, --steps and --warmup must be >= 1")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    device = pick_device(args.device)
    warnings.filterwarnings("ignore")
    if args.threads:
        torch.set_num_threads(args.threads)

    variants = selected_variants(args.variants)
    problem = check_triton_variant(variants, device)
    if problem:
        print(f"bench_step.py: {problem}", file=sys.stderr)
        return 2
    modes = modes_for(variants, not args.no_compile)
    contenders, n_params, config = {}, {}, None
    for family, mode in contenders_of(modes):
        model, opt, sched = build(family, args, device, mode)
        config = model.config
        n_params[family] = sum(p.numel() for p in model.parameters())
        runner = torch.compile(model) if mode.startswith("compiled") else model
        x, y = random_batch(config.vocab_size, args.batch, config.max_seq_len, device)
        contenders[(family, mode)] = make_step(runner, opt, sched, x, y, device, args.dtype, mode)

    warmup_s = {}
    for key, step in contenders.items():
        sync(device)
        t0 = time.perf_counter()
        for _ in range(args.warmup):
            loss = step()
        sync(device)
        warmup_s[key] = time.perf_counter() - t0
        print(f"# warm-up {key[0]} {key[1]}: {warmup_s[key]:.1f} s, loss {float(loss):.3f}", file=sys.stderr)

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

    peak = ""
    if device.type == "cuda":  # all contenders' models and optimizer states stay resident
        peak = f"; peak CUDA memory of the run {torch.cuda.max_memory_allocated(device) / 2**30:.1f} GiB"
    emit(report(args, device, config, n_params, modes, times, warmup_s, peak, argv), args.markdown)
    return 0


def baseline_notes(modes, device: torch.device, timed: bool = True) -> list[str]:
    """What the rows of nGPT-only modes are compared with (and, for times, where a Triton row
    ran under the interpreter)."""
    notes = []
    if timed and "triton" in modes and device.type == "cpu":
        notes.append("The Triton rows ran under Triton's interpreter on CPU: a check of the path, not a time.")
    if "plain" in modes:
        notes.append('GPT has no fused functions: the "plain autograd" row compares with its eager step.')
    if "triton" in modes:
        notes.append(
            "GPT has no Triton kernels: the Triton rows compare with its step of the same kind, eager or compiled."
        )
    return ["", *notes] if notes else []


def report(args, device, config, n_params, modes, times, warmup_s, peak, argv) -> str:
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    spread = {k: (min(v) * 1e3, max(v) * 1e3) for k, v in times.items()}
    tokens = args.batch * config.max_seq_len
    title = (
        f"Training step time, nGPT vs GPT: {args.device} {args.dtype}, context {config.max_seq_len}, batch {args.batch}"
    )
    warm = ", ".join(f"{f} {MODE_LABEL[m]} {s:.0f} s" for (f, m), s in warmup_s.items())
    lines = [
        header(title, device, argv),
        f"Shape: {shape_text(config)}, batch {args.batch} ({tokens} tokens per step); parameters nGPT "
        f"{n_params['nGPT'] / 1e6:.2f}M, GPT {n_params['GPT'] / 1e6:.2f}M. Precision: {args.dtype}"
        f"{' (autocast, fp32 parameters and optimizer states)' if args.dtype == 'bf16' else ''}. Median ms/step, "
        f"min-max in brackets, over {args.rounds} interleaved rounds x {args.steps} steps, after {args.warmup} "
        f"warm-up steps ({warm}){peak}.",
        "",
        "| mode | nGPT ms/step | GPT ms/step | nGPT/GPT (medians) | nGPT/GPT (median of per-round ratios) |",
        "|---|---|---|---|---|",
    ]
    for mode in modes:
        gpt = baseline_of(mode)
        n, b = med[("nGPT", mode)], med[gpt]
        (n0, n1), (b0, b1) = spread[("nGPT", mode)], spread[gpt]
        paired = statistics.median(a / c for a, c in zip(times[("nGPT", mode)], times[gpt]))
        cells = [f"{n:.1f} ({n0:.1f}–{n1:.1f})", f"{b:.1f} ({b0:.1f}–{b1:.1f})", f"{n / b:.2f}", f"{paired:.2f}"]
        lines.append(f"| {MODE_LABEL[mode]} | " + " | ".join(cells) + " |")
    lines += baseline_notes(modes, device)
    lines += [
        "",
        "| model | "
        + " | ".join(f"{MODE_LABEL[m]} tokens/s" for m in modes)
        + (" | compiled / eager |" if "compiled" in modes else " |"),
        "|---|" + "---|" * (len(modes) + ("compiled" in modes)),
    ]
    for family in RECIPE:
        cells = [f"{tokens / med[(family, m)] * 1e3:,.0f}" if (family, m) in med else "-" for m in modes]
        if "compiled" in modes:
            cells.append(f"{med[(family, 'compiled')] / med[(family, 'eager')]:.2f}")
        lines.append(f"| {family} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
