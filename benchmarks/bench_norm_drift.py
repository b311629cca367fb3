"""How far sphere weights leave the unit sphere over long runs, in float32 and bfloat16.

One sphere weight of realistic row size (``--rows`` unit vectors of ``--dim`` = 1024
coordinates, the layout of an nGPT matrix) is updated for ``--steps`` optimizer steps by each
contender; every ``--measure-every`` steps the benchmark records ``max_i |‖w_i‖ - 1|`` over
all rows (norms taken in float64). Contenders, each in float32 and bfloat16 parameters:

- ``riemannian_adam``: :class:`spherenet.optim.RiemannianAdam` (tangent step, then retraction),
  with its native CPU kernel (the default) and, without re-projection, its foreach kernel;
- ``adam_normalize``: torch's AdamW, then :func:`spherenet.optim.normalize_` after every step
  (the paper's method, as ``build_optimizer("adam_normalize")`` sets it up);
- each of them with an extra periodic re-projection every ``--reproject-every`` steps, as
  ``optim.reproject_every`` does in recipes/train.py (``normalize_``);
- bfloat16 only: the same, re-projecting with the division done in float32 and rounded once
  (``w <- bf16(w32 / ‖w32‖)``), the best a bfloat16 weight can hold;
- ``adam (no normalization)``: torch's AdamW alone, the drift nothing corrects.

Gradients (``--grads``): ``random`` draws a fresh Gaussian every step; ``head`` uses the real
gradient of a cross-entropy loss over cosine-similarity logits ``s * (x · w_i)``, the loss
nGPT's output embedding sees, on an online task (a fresh batch of unit inputs every step,
labelled by a fixed random teacher), so that the moments build up consistent directions and the
loss falls.

    python benchmarks/bench_norm_drift.py                 # 10,000 steps, random gradients
    python benchmarks/bench_norm_drift.py --grads head    # 10,000 steps, cross-entropy gradients
    python benchmarks/bench_norm_drift.py --quick         # 1,000 steps, a few seconds per row

Runs on one CPU thread (``--threads``); prints a Markdown table and, with ``--json``, writes
every measurement.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import platform
import sys
import time

import torch
from torch import nn

from spherenet.layers import SphereLinear
from spherenet.optim import build_optimizer, normalize_

MILESTONES = (1, 10, 100, 1_000, 10_000, 100_000)


class SphereMatrix(nn.Module):
    """One declared sphere weight of shape (rows, dim): unit vectors along the last dim."""

    def __init__(self, rows: int, dim: int):
        super().__init__()
        self.layer = SphereLinear(dim, rows, sphere="in")

    @property
    def weight(self) -> torch.Tensor:
        return self.layer.weight


def norm_error(w: torch.Tensor) -> float:
    # in float64, not Sphere.norm_error's float32: the drift measured here is of float32's size
    return float((w.detach().double().norm(dim=-1) - 1).abs().max())


@torch.no_grad()
def reproject_exact(w: torch.Tensor) -> None:
    """Divide in float32, round to the parameter dtype once."""
    w32 = w.float()
    w.copy_(w32 / w32.norm(dim=-1, keepdim=True))


def make_optimizer(model: nn.Module, method: str, lr: float, steps: int):
    if method == "adam":  # no normalization at all: the control
        return torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    if method == "riemannian_adam_foreach":
        return build_optimizer(model, "riemannian_adam", lr=lr, total_steps=steps, sphere_kernel="torch")[0]
    optimizer, _ = build_optimizer(model, method, lr=lr, total_steps=steps)  # constant lr: no scheduler step
    return optimizer


def gradient_source(kind: str, model: SphereMatrix, args, dtype: torch.dtype):
    """A function that sets ``weight.grad`` for step ``t``."""
    w = model.weight
    gen = torch.Generator().manual_seed(args.seed + 1)
    if kind == "random":

        def set_grad(t: int) -> float:
            w.grad = torch.randn(w.shape, generator=gen).to(dtype)
            return float("nan")

        return set_grad
    # "head": an online classification task (a fresh batch every step, labels from a fixed
    # random teacher), cross entropy over scaled cosine logits: what nGPT's output embedding sees.
    teacher = torch.randn(args.rows, args.dim, generator=gen)
    scale = math.sqrt(args.dim)  # logits s * (x . w_i) with s = sqrt(d): in [-32, 32] for d = 1024

    def set_grad(t: int) -> float:
        x = torch.randn(args.batch, args.dim, generator=gen)
        x = x / x.norm(dim=-1, keepdim=True)
        y = (x @ teacher.t()).argmax(dim=-1)
        w.grad = None
        with torch.enable_grad():
            logits = (x.to(dtype) @ w.t()).float() * scale
            loss = nn.functional.cross_entropy(logits, y)
            loss.backward()
        return float(loss.detach())

    return set_grad


def run(method: str, dtype: torch.dtype, reproject: str, args) -> dict:
    torch.manual_seed(args.seed)
    model = SphereMatrix(args.rows, args.dim).to(dtype)
    w = model.weight
    with torch.no_grad():
        reproject_exact(w)  # every contender starts from the same, best-rounded points
    optimizer = make_optimizer(model, method, args.lr, args.steps)
    set_grad = gradient_source(args.grads, model, args, dtype)
    trace, worst, loss = [(0, norm_error(w))], 0.0, float("nan")
    t0 = time.perf_counter()
    for t in range(1, args.steps + 1):
        loss = set_grad(t)
        optimizer.step()
        if reproject != "none" and t % args.reproject_every == 0:
            if reproject == "normalize_":
                normalize_(model)
            else:
                reproject_exact(w)
        if t % args.measure_every == 0 or t in MILESTONES or t == args.steps:
            err = norm_error(w)
            worst = max(worst, err)
            trace.append((t, err))
    seconds = time.perf_counter() - t0
    return {
        "method": method,
        "dtype": str(dtype).replace("torch.", ""),
        "reproject": reproject,
        "trace": trace,
        "max": worst,
        "final": trace[-1][1],
        "final_loss": loss,
        "seconds": seconds,
    }


def contenders(quick_dtypes: list[str]) -> list[tuple[str, torch.dtype, str]]:
    out = []
    for name in quick_dtypes:
        dtype = getattr(torch, name)
        for method in ("riemannian_adam", "adam_normalize"):
            out.append((method, dtype, "none"))
            if method == "riemannian_adam":
                out.append(("riemannian_adam_foreach", dtype, "none"))
            out.append((method, dtype, "normalize_"))
            if dtype != torch.float32:
                out.append((method, dtype, "exact"))
        out.append(("adam", dtype, "none"))
    return out


LABEL = {
    "riemannian_adam": "RiemannianAdam",
    "riemannian_adam_foreach": "RiemannianAdam (foreach kernel)",
    "adam_normalize": "Adam + normalize_ every step",
    "adam": "Adam (no normalization)",
}
REPROJECT_LABEL = {"none": "-", "normalize_": "normalize_", "exact": "fp32 divide, 1 rounding"}


def table(results: list[dict], args) -> str:
    marks = [m for m in MILESTONES if m <= args.steps]
    if args.steps not in marks:
        marks.append(args.steps)
    head = ["optimizer", "dtype", f"re-projection every {args.reproject_every}"] + [f"step {m:,}" for m in marks]
    head += ["max over run", "s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        at = dict(r["trace"])
        cells = [LABEL[r["method"]], r["dtype"], REPROJECT_LABEL[r["reproject"]]]
        cells += [f"{at[m]:.2e}" for m in marks]
        cells += [f"**{r['max']:.2e}**", f"{r['seconds']:.0f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=10_000)
    p.add_argument("--quick", action="store_true", help="1,000 steps")
    p.add_argument("--rows", type=int, default=256, help="unit vectors in the weight")
    p.add_argument("--dim", type=int, default=1024, help="their dimension (d_model)")
    p.add_argument("--lr", type=float, default=3e-3, help="constant learning rate (recipes' default)")
    p.add_argument("--grads", choices=["random", "head"], default="random")
    p.add_argument("--batch", type=int, default=64, help="--grads head: inputs per step")
    p.add_argument("--reproject-every", type=int, default=100)
    p.add_argument("--measure-every", type=int, default=10)
    p.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], choices=["float32", "bfloat16", "float16"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", default=None, help="write every measurement here")
    args = p.parse_args(argv)
    if args.quick:
        args.steps = 1_000
    torch.set_num_threads(args.threads)

    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    print(
        f"# sphere-weight norm drift: {args.steps:,} steps, weight ({args.rows}, {args.dim}), lr {args.lr:g}, "
        f"{args.grads} gradients, seed {args.seed}",
        flush=True,
    )
    print(
        f"# {when}; {platform.processor() or platform.machine()}, {args.threads} thread(s); python "
        f"{platform.python_version()}, torch {torch.__version__}",
        flush=True,
    )
    print(f"# python {' '.join(sys.argv)}", flush=True)
    results = []
    for method, dtype, reproject in contenders(args.dtypes):
        r = run(method, dtype, reproject, args)
        results.append(r)
        extra = "" if math.isnan(r["final_loss"]) else f", final loss {r['final_loss']:.3f}"
        print(
            f"  {LABEL[method]:30s} {r['dtype']:9s} re-projection {REPROJECT_LABEL[reproject]:24s} "
            f"max {r['max']:.2e} final {r['final']:.2e} ({r['seconds']:.0f} s{extra})",
            flush=True,
        )
    print()
    print(table(results, args))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "date": when, "torch": torch.__version__, "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
