"""Scaling study: where does nGPT pay off? Speedup over GPT against context length, model size
and optimizer.

    nice python benchmarks/scaling.py                       # the map on tinyshakespeare (hours on 2 CPU cores)
    nice python benchmarks/scaling.py --data stdlib         # the same on the default corpus
    python benchmarks/scaling.py --quick                    # a smoke run of the pipeline (minutes)
    python benchmarks/scaling.py --points tiny@256 --arms gpt ngpt train.steps=200   # a part, overrides

The map is a list of points ``SIZE@CONTEXT`` (model presets ``gpt-SIZE`` / ``ngpt-SIZE``; the
default: context 64, 256 and 1024 at ``tiny``, and ``cpu`` at 256, so two sizes at one context).
Every point trains every arm with the same tokens per step (``--tokens-per-step``, the batch is
that over the context) and the same number of steps, so the arms and the points see equal tokens.

For each arm at each point:

1. learning-rate sweep, seed ``--sweep-seed``: a grid of 3 rates a factor 3 apart around the
   arm's start (``--gpt-lr`` for the GPT arms, ``--ngpt-lr`` for nGPT's); while the lowest final
   validation loss sits at an edge of the grid, the grid grows by a factor 3 past that edge (at
   most ``--max-extend`` times), so that the chosen rate is bracketed;
2. the chosen rate for every ``--seeds``.

The metrics are ``benchmarks/convergence.py``'s: per seed, the common target (the lowest
validation loss both GPT and the arm reach), and the ratio GPT's steps to it / the arm's steps
to it (> 1: the arm is faster), mean ± std over the seeds; and the final validation loss at equal
tokens.

Arms: ``gpt`` (AdamW), ``ngpt-adam_normalize`` (the paper's Adam then renormalize),
``ngpt`` (the default RiemannianAdam), ``gpt-muon`` (torch.optim.Muon on the hidden matrices),
``ngpt-muon`` (SphericalMuon), ``gpt-adamh`` and ``gpt-muonh`` (Hyperball: the hidden matrices
on whole-matrix spheres); and at ``--update-point`` the residual updates ``ngpt`` (LERP),
``ngpt-slerp`` and ``ngpt-riemannian``. A Muon arm's sweep moves ``optim.lr``, which sets the
AdamW / RiemannianAdam rate and the Muon rate together (``optim.muon_lr = -1``: with the
RMS-matching step the rates transfer). A Hyperball arm's sweep moves ``optim.matrix_lr`` (an
angle per step, a scale of its own), with its AdamW part at GPT's best rate at the point, so
GPT's sweep runs first.

Resumable: every finished run is appended as one JSON line (its validation curve) to
``RESULTS/runs.jsonl``, and a run found there is not trained again, so a study committed to the
repository resumes on a fresh machine. ``RESULTS`` defaults to
``benchmarks/results/scaling/<corpus>/`` (``--quick``: ``OUT/results``); the tables
(``scaling.md``) and the plots (``speedup_context.png``, ``speedup_params.png``) are rewritten
after every run, so they always show what is done. Run directories are scratch in ``--out``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import shlex
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import convergence  # noqa: E402  (benchmarks/ is on sys.path)
from _machine import cpu_name  # noqa: E402

from recipes import compare, subprocesses  # noqa: E402
from recipes.train import DEFAULT_CONFIG  # noqa: E402

#: Arms whose sweep moves ``optim.matrix_lr`` (the hidden matrices' angle per step), with
#: ``optim.lr`` (the AdamW part: embeddings, head, gains) at the best rate of the named arm at the
#: same point and budget; that arm's sweep runs first.
MATRIX_RATE_ARMS = {"gpt-adamh": "gpt", "gpt-muonh": "gpt"}
#: Where a matrix-rate sweep starts: an AdamW step of lr on a matrix of init std 0.02 turns it by
#: about lr / 0.02, so GPT's rates (0.003-0.01) correspond to angles of about 0.15-0.5.
MATRIX_START_LR = 0.1
OPTIMIZER_ARMS = ["gpt", "ngpt-adam_normalize", "ngpt", "gpt-muon", "ngpt-muon", "gpt-adamh", "gpt-muonh"]
UPDATE_ARMS = ["ngpt", "ngpt-slerp", "ngpt-riemannian"]
DEFAULT_POINTS = ["tiny@64", "tiny@256", "tiny@1024", "cpu@256"]
BASELINE = "gpt"


@dataclass(frozen=True)
class Point:
    size: str
    context: int

    @classmethod
    def parse(cls, text: str) -> Point:
        size, sep, context = text.partition("@")
        if not sep or not size or not context.isdigit() or int(context) < 2:
            raise SystemExit(f"error: point {text!r} must be SIZE@CONTEXT, e.g. tiny@256")
        return cls(size, int(context))

    def __str__(self) -> str:
        return f"{self.size}@{self.context}"


def parameters(point: Point) -> int:
    """The nGPT model's parameter count at this point (built on the meta device)."""
    import torch

    from spherenet.models import from_preset

    with torch.device("meta"):
        model = from_preset(f"ngpt-{point.size}", max_seq_len=point.context)
    return sum(p.numel() for p in model.parameters())


def ladder(lr: float, direction: int) -> float:
    """The next rate on the 1-3-10 ladder up (+1) or down (-1): 1e-2 -> 3e-2 -> 1e-1."""
    exponent = math.floor(math.log10(lr) + 1e-9)
    mantissa = round(lr / 10**exponent)
    steps = [(1, 0), (3, 0), (1, 1)] if mantissa == 1 else [(3, 0), (1, 1), (3, 1)]
    if direction < 0:
        steps = [(1, 0), (3, -1), (1, -1)] if mantissa == 1 else [(3, 0), (1, 0), (3, -1)]
    m, shift = steps[1]
    return float(f"{m}e{exponent + shift}")


def lr_grid(start: float) -> list[float]:
    return [ladder(start, -1), start, ladder(start, +1)]


def next_lr(finals: dict[float, float], extensions: int, max_extend: int) -> float | None:
    """The rate to try next so that the best one is bracketed, or None when it is (or when the
    grid may not grow any more). ``finals``: final validation loss by rate (inf: diverged)."""
    if extensions >= max_extend or len(finals) < 2:
        return None
    lrs = sorted(finals)
    best = min(lrs, key=lambda lr: (finals[lr], lr))
    if not math.isfinite(finals[best]) or best == lrs[0]:
        return ladder(lrs[0], -1)  # every rate diverged, or the smallest is best: go down
    if best == lrs[-1]:
        return ladder(lrs[-1], +1)
    return None


class Ledger:
    """``runs.jsonl``: one line per finished run, the study's memory across restarts."""

    def __init__(self, path: Path):
        self.path = path
        self.rows: dict[tuple[str, str, float, int], dict] = {}
        if path.is_file():
            for line in path.read_text().splitlines():
                if line.strip():
                    r = json.loads(line)
                    self.rows[(r["point"], r["arm"], float(r["lr"]), int(r["seed"]))] = r

    def get(self, point: Point, arm: str, lr: float, seed: int) -> dict | None:
        return self.rows.get((str(point), arm, float(lr), seed))

    def add(self, row: dict) -> None:
        self.rows[(row["point"], row["arm"], float(row["lr"]), int(row["seed"]))] = row
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")


def final_loss(row: dict) -> float:
    """The last validation loss of a run that finished (inf: diverged or stopped early)."""
    vals = row["val_loss"]
    if not row.get("finished", True):
        return math.inf
    return vals[-1] if vals and vals[-1] is not None and math.isfinite(vals[-1]) else math.inf


class Study:
    """The sweeps and seeds of every point, run through ``convergence.train_one`` and recorded
    in the ledger. ``bar``: a progress bar to count on (a study of several ledgers shares one);
    by default the study makes its own."""

    def __init__(self, args: argparse.Namespace, bar=None):
        self.args = args
        self.ledger = Ledger(args.results / "runs.jsonl")
        self.started = time.monotonic()
        self.done_now = 0
        self.lock = threading.Lock()
        # runs done / planned, with an ETA (a sweep that grows past its edge adds to the plan)
        seeds = len([sd for sd in args.seeds if sd != args.sweep_seed])
        planned = sum(len(args.grid or [0, 0, 0]) + seeds for pt in args.points for _ in arms_at(args, pt))
        done = sum(1 for key in self.ledger.rows if key[0] in {str(pt) for pt in args.points})
        if bar is None:
            bar = compare.progress_bar(max(planned, done), "scaling study", enabled=args.progress, initial=done)
        self.bar = bar

    def point_args(self, point: Point) -> argparse.Namespace:
        """The namespace ``convergence.train_one`` reads, for one point."""
        a = self.args
        return argparse.Namespace(
            data=a.data,
            out=a.out,
            block=point.context,
            batch=max(1, a.tokens_per_step // point.context),
            steps=a.steps,
            eval_every=a.eval_every,
            eval_batches=a.eval_batches,
            overrides=[f"model.max_seq_len={point.context}", *a.overrides],
            size=point.size,
            runs=a.out / "runs" / str(point),
            reuse=False,
            nice=a.nice,
            threads=a.threads,
        )

    def base_lr(self, point: Point, arm: str) -> float | None:
        """For a :data:`MATRIX_RATE_ARMS` arm, the AdamW part's rate: the best rate of the arm it
        names at this point (its sweep ran first); None for the other arms."""
        if arm not in MATRIX_RATE_ARMS:
            return None
        lr, _ = chosen(self.ledger, str(point), MATRIX_RATE_ARMS[arm], self.args.sweep_seed)
        if lr is None:
            raise SystemExit(
                f"error: {arm} at {point} takes {MATRIX_RATE_ARMS[arm]}'s best rate for its AdamW part, and "
                f"{MATRIX_RATE_ARMS[arm]} has no sweep there: add {MATRIX_RATE_ARMS[arm]} to --arms"
            )
        return lr

    def spec(self, point: Point, arm: str, lr: float, base: float | None = None) -> str:
        """The run's variant spec; ``base``: the AdamW part's rate of a matrix-rate arm (default:
        :meth:`base_lr`)."""
        _, items = compare.variant_overrides(arm, point.size)
        base = self.base_lr(point, arm) if base is None and arm in MATRIX_RATE_ARMS else base
        items = (
            [*items, f"optim.lr={lr:g}"] if base is None else [*items, f"optim.lr={base:g}", f"optim.matrix_lr={lr:g}"]
        )
        if arm.startswith("gpt"):
            items.append(f"optim.warmup_steps={max(1, round(0.05 * self.args.steps))}")
        return f"{arm}_lr{convergence.lr_tag(lr)}:{','.join(items)}"

    def run(self, point: Point, arm: str, lr: float, seed: int) -> dict:
        """One training (or its ledger line when it already ran)."""
        row = self.ledger.get(point, arm, lr, seed)
        if row is not None:
            return row
        pargs = self.point_args(point)
        spec = self.spec(point, arm, lr)
        say = self.bar.write if self.bar is not None else lambda line: print(line, flush=True)
        began = time.monotonic()
        name, _, rc = convergence.train_one(pargs, spec, seed, say)
        wall_s = time.monotonic() - began
        run_dir = pargs.runs / name / f"seed{seed}"
        curve = compare.read_curve(run_dir) if (run_dir / "metrics.jsonl").is_file() else {}
        row = {
            "point": str(point),
            "arm": arm,
            "lr": lr,
            "seed": seed,
            "finished": compare.finished(run_dir),
            "exit": rc,
            "steps": curve.get("steps", []),
            "val_loss": curve.get("val_loss", []),
            "tokens": curve.get("tokens", []),
            **({"adamw_lr": self.base_lr(point, arm)} if arm in MATRIX_RATE_ARMS else {}),
            "wall_s": round(wall_s, 1),
            "date": datetime.date.today().isoformat(),
        }
        if rc not in (0, None) and not row["val_loss"]:
            # a crash, not a divergence: keep it out of the ledger so that a rerun retries it
            raise SystemExit(f"error: {name} seed {seed} at {point} failed (exit {rc}); see {run_dir / 'train.log'}")
        with self.lock:  # runs finish on several threads
            self.ledger.add(row)
            self.done_now += 1
            if self.bar is not None:
                self.bar.total = max(self.bar.total, self.bar.n + 1)
                self.bar.update(1)
            self.report()
        return row

    def sweep_finals(self, point: Point, arm: str) -> dict[float, float]:
        """Final validation loss by rate of the arm's sweep runs so far (the ledger's)."""
        return {
            lr: final_loss(row)
            for (p, a, lr, s), row in self.ledger.rows.items()
            if (p, a, s) == (str(point), arm, self.args.sweep_seed)
        }

    def run_point(self, point: Point, arms: list[str]) -> None:
        """Stage 1 (sweeps, grown until bracketed) and stage 2 (seeds) for every arm at the
        point, ``--jobs`` runs at a time across the arms."""
        print(f"== {point}: {', '.join(arms)}", flush=True)
        seed0 = self.args.sweep_seed
        default = {
            arm: MATRIX_START_LR
            if arm in MATRIX_RATE_ARMS
            else self.args.gpt_lr
            if arm.startswith("gpt")
            else self.args.ngpt_lr
            for arm in arms
        }
        start = {**default, **getattr(self.args, "start_lr", {})}  # a study may centre each arm's grid
        grid = {arm: (self.args.grid if arm not in MATRIX_RATE_ARMS else None) or lr_grid(start[arm]) for arm in arms}
        with ThreadPoolExecutor(max_workers=self.args.jobs) as pool:

            def run_all(jobs: list[tuple[str, float, int]]) -> None:
                list(pool.map(lambda job: self.run(point, *job), jobs))

            def sweep(group: list[str]) -> None:
                run_all([(arm, lr, seed0) for arm in group for lr in grid[arm]])
                while True:
                    more = []
                    for arm in group:
                        finals = self.sweep_finals(point, arm)
                        extensions = sum(lr not in grid[arm] for lr in finals)
                        lr = next_lr(finals, extensions, self.args.max_extend)
                        if lr is not None:
                            more.append((arm, lr, seed0))
                    if not more:
                        break
                    if self.bar is not None:
                        self.bar.total += len(more)
                    run_all(more)

            sweep([arm for arm in arms if arm not in MATRIX_RATE_ARMS])
            sweep([arm for arm in arms if arm in MATRIX_RATE_ARMS])  # their AdamW part: the rate just found
            best = {}
            for arm in arms:
                finals = self.sweep_finals(point, arm)
                best[arm] = min(finals, key=lambda lr: (finals[lr], lr))
                print(f"  {point} {arm}: lr {best[arm]:g} (tried {', '.join(f'{x:g}' for x in sorted(finals))})")
            run_all([(arm, best[arm], s) for arm in arms for s in self.args.seeds if s != seed0])
        write_results(self.args, self.ledger)

    def report(self) -> None:
        elapsed = time.monotonic() - self.started
        print(
            f"  [{len(self.ledger.rows)} runs in the ledger, {self.done_now} this session, {elapsed / 60:.1f} min]",
            flush=True,
        )
        write_results(self.args, self.ledger, plots=False)  # the plots: once a point is done


# ---------------------------------------------------------------- tables and plots


def chosen(ledger: Ledger, point: str, arm: str, sweep_seed: int) -> tuple[float | None, bool]:
    """The arm's best rate at the point (lowest final loss over the sweep) and whether the
    rates tried bracket it (a tried rate on either side)."""
    finals = {lr: final_loss(r) for (p, a, lr, s), r in ledger.rows.items() if (p, a, s) == (point, arm, sweep_seed)}
    if not finals or not any(math.isfinite(v) for v in finals.values()):
        return None, False
    best = min(finals, key=lambda lr: (finals[lr], lr))
    return best, min(finals) < best < max(finals)


def paired(ledger: Ledger, point: str, arm: str, lr: float, base_lr: float, seeds: list[int]) -> dict:
    """Per seed present for both the arm and GPT: the ratio GPT steps / arm steps to the common
    target, whether that ratio is only a lower bound (the arm was at the target by its first
    evaluation, so it may have got there sooner), and the final losses."""
    ratios, censored, finals, base_finals = [], [], [], []
    for seed in seeds:
        row, base = ledger.rows.get((point, arm, lr, seed)), ledger.rows.get((point, BASELINE, base_lr, seed))
        if row is None or base is None:
            continue
        finals.append(final_loss(row))
        base_finals.append(final_loss(base))
        b_vals = [v for v in base["val_loss"] if v is not None and math.isfinite(v)]
        a_vals = [v for v in row["val_loss"] if v is not None and math.isfinite(v)]
        if not b_vals or not a_vals:
            ratios.append(math.nan)
            censored.append(False)
            continue
        target = max(min(b_vals), min(a_vals))
        sb = compare.steps_to_reach(base, target)
        sa = compare.steps_to_reach(row, target)
        ratios.append(sb / sa if math.isfinite(sb) and math.isfinite(sa) and sa > 0 else math.nan)
        censored.append(bool(row["steps"]) and sa == row["steps"][0] and sb > sa)
    return {"ratios": ratios, "censored": censored, "finals": finals, "base_finals": base_finals}


def mean_std(values: list[float]) -> tuple[float, float]:
    values = [v for v in values if math.isfinite(v)]
    if not values:
        return math.nan, math.nan
    return statistics.mean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def summary(args: argparse.Namespace, ledger: Ledger) -> list[dict]:
    """One row per (point, arm) with a chosen rate."""
    out = []
    for point in args.points:
        base_lr, _ = chosen(ledger, str(point), BASELINE, args.sweep_seed)
        for arm in arms_at(args, point):
            lr, bracketed = chosen(ledger, str(point), arm, args.sweep_seed)
            if lr is None:
                continue
            tried = sorted(lr_ for (p, a, lr_, s) in ledger.rows if (p, a, s) == (str(point), arm, args.sweep_seed))
            res = paired(ledger, str(point), arm, lr, base_lr, args.seeds) if base_lr is not None else None
            out.append({"point": point, "arm": arm, "lr": lr, "bracketed": bracketed, "tried": tried, "paired": res})
    return out


def arms_at(args: argparse.Namespace, point: Point) -> list[str]:
    arms = list(args.arms)
    if args.update_point is not None and point == args.update_point:
        arms += [a for a in UPDATE_ARMS if a not in arms]
    return arms


def fmt(mean: float, std: float, digits: int = 2) -> str:
    return "-" if math.isnan(mean) else f"{mean:.{digits}f} ± {std:.{digits}f}"


def write_results(args: argparse.Namespace, ledger: Ledger, plots: bool = True) -> None:
    rows = summary(args, ledger)
    head = header(args)
    lines = [
        "| point | params | arm | lr (tried) | bracketed | seeds | speedup GPT steps / arm steps | final val loss | GPT final |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        p = r["paired"] or {"ratios": [], "censored": [], "finals": [], "base_finals": []}
        tried = ", ".join(f"{lr:g}" for lr in r["tried"])
        per_seed = ", ".join(
            "-" if math.isnan(x) else f"{'≥' if low else ''}{x:.2f}" for x, low in zip(p["ratios"], p["censored"])
        )
        bound = "≥ " if any(p["censored"]) else ""
        lines.append(
            f"| {r['point']} | {args.params[str(r['point'])] / 1e6:.2f}M | {r['arm']} | **{r['lr']:g}** ({tried}) | "
            f"{'yes' if r['bracketed'] else 'no'} | {len(p['ratios'])} | {bound}{fmt(*mean_std(p['ratios']))} ({per_seed}) | "
            f"{fmt(*mean_std(p['finals']), 4)} | {fmt(*mean_std(p['base_finals']), 4)} |"
        )
    (args.results / "scaling.md").write_text(
        "# Scaling study: nGPT's speedup over GPT against context, size and optimizer\n\n"
        + head
        + "Speedup: per seed, the lowest validation loss both GPT and the arm reach (the common target); "
        "GPT's steps to it / the arm's steps to it (> 1: the arm is faster); mean ± std over the seeds, "
        "per seed in parentheses; ≥: the arm was at the target by its first evaluation (step "
        f"{args.eval_every}), so the ratio is a lower bound and {args.steps // args.eval_every}x is the most "
        "this budget can measure. Every arm at its own best rate (bold) of the sweep (seed "
        f"{args.sweep_seed}); bracketed: a tried rate on both sides of it. The Hyperball arms' rate is "
        "`optim.matrix_lr` (the angle a step turns a hidden matrix by), their AdamW part at GPT's bold rate "
        "at the point. Final val loss: at equal tokens, "
        "mean ± std over the seeds. This file is rewritten after every run; rows appear as arms finish.\n\n"
        + "\n".join(lines)
        + "\n"
    )
    if plots:
        plot(args, rows)


def plot(args: argparse.Namespace, rows: list[dict]) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    by_arm: dict[str, list[tuple[Point, float, float]]] = {}
    for r in rows:
        if r["arm"] != BASELINE and r["paired"]:
            m, s = mean_std(r["paired"]["ratios"])
            if not math.isnan(m):
                by_arm.setdefault(r["arm"], []).append((r["point"], m, s, any(r["paired"]["censored"])))
    axes = {
        "speedup_context.png": ("context length (tokens)", lambda p: p.context, args.context_size),
        "speedup_params.png": ("parameters (nGPT)", lambda p: args.params[str(p)], None),
    }
    for filename, (xlabel, x_of, size) in axes.items():
        fig, ax = plt.subplots(figsize=(6.4, 4.2))
        lower_bounds = False
        for arm, pts in sorted(by_arm.items()):
            if size is not None:  # the context axis: one model size
                pts = [t for t in pts if t[0].size == size]
            else:  # the size axis: the context shared by the most sizes
                pts = [t for t in pts if t[0].context == args.size_context]
            if not pts:
                continue
            pts.sort(key=lambda t: x_of(t[0]))
            line = ax.errorbar(
                [x_of(t[0]) for t in pts],
                [t[1] for t in pts],
                yerr=[t[2] for t in pts],
                marker="o",
                capsize=3,
                label=arm,
            )
            low = [t for t in pts if t[3]]  # a lower bound: some seed was at the target by its first evaluation
            if low:
                color = line.lines[0].get_color()
                ax.scatter([x_of(t[0]) for t in low], [t[1] for t in low], marker="^", s=90, color=color, zorder=3)
                lower_bounds = True
        ax.axhline(1.0, color="black", lw=0.8, ls="--")
        ax.set_xscale("log", base=2 if size is not None else 10)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("speedup over GPT (GPT steps / arm steps)")
        where = f"{size} model" if size is not None else f"context {args.size_context}"
        bound_note = (
            f"\n^: a lower bound (at most {args.steps // args.eval_every}x is measurable)" if lower_bounds else ""
        )
        ax.set_title(f"{args.corpus_label}, {where}{bound_note}", fontsize=9)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(args.results / filename, dpi=110)
        plt.close(fig)


def header(args: argparse.Namespace) -> str:
    overrides = f" Overrides for every run: `{' '.join(args.overrides)}`." if args.overrides else ""
    points = ", ".join(
        f"{p} (batch {max(1, args.tokens_per_step // p.context)} x {p.context}, {args.params[str(p)] / 1e6:.2f}M params)"
        for p in args.points
    )
    return (
        f"Command: `{args.command}`  \n"
        f"Machine: {os.cpu_count()} CPU cores ({cpu_name()}), torch CPU, {args.jobs} runs at a time x "
        f"{args.threads} thread(s); started {args.date}.  \n"
        f"Data: {args.corpus_label}, byte tokenizer. Points: {points}. Every run: {args.steps} steps of "
        f"{args.tokens_per_step} tokens ({args.steps * args.tokens_per_step / 1e6:.2f}M tokens), cosine to 0 "
        f"(GPT arms: warmup 5%, weight decay 0.1); validation every {args.eval_every} steps on "
        f"{args.eval_batches} batches. Seeds {', '.join(map(str, args.seeds))}.{overrides}\n\n"
    )


def study_paths(args: argparse.Namespace, name: str) -> None:
    """``args.data`` as a ``data.source``, its label, and the study's directories: scratch runs in
    ``--out`` (default ``/tmp/<name>[_quick]/<corpus>``) and results in ``--results`` (default
    ``benchmarks/results/<name>/<corpus>``; ``--quick``: under the scratch directory)."""
    args.data = convergence.data_source(args.data)
    args.corpus_label = convergence.corpus_label(args.data)
    slug = "default_corpus" if args.data == "stdlib" else args.corpus_label.split(" ")[0]
    slug = "".join(c if c.isalnum() or c in "-_" else "_" for c in slug.removesuffix(".txt"))
    args.out = (args.out or Path(f"/tmp/{name}_quick" if args.quick else f"/tmp/{name}") / slug).resolve()
    args.results = (
        args.results or (args.out / "results" if args.quick else ROOT / "benchmarks/results" / name / slug)
    ).resolve()
    args.results.mkdir(parents=True, exist_ok=True)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="smoke run: 2 points, 2 arms, 20 steps, 2 seeds")
    p.add_argument("--points", nargs="+", default=DEFAULT_POINTS, help="SIZE@CONTEXT, e.g. tiny@256")
    p.add_argument("--arms", nargs="+", default=OPTIMIZER_ARMS, choices=sorted({*OPTIMIZER_ARMS, *UPDATE_ARMS}))
    p.add_argument(
        "--update-point", default="tiny@256", help="where LERP, SLERP and Riemannian are compared ('' = none)"
    )
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--sweep-seed", type=int, default=0)
    p.add_argument("--gpt-lr", type=float, default=1e-2, help="the GPT arms' sweep centre")
    p.add_argument("--ngpt-lr", type=float, default=3e-2, help="the nGPT arms' sweep centre")
    p.add_argument("--grid", nargs="+", type=float, default=None, help="a fixed starting grid for every arm")
    p.add_argument("--max-extend", type=int, default=3, help="how often a sweep may grow past its edge")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--tokens-per-step", type=int, default=4096)
    p.add_argument("--eval-every", type=int, default=10)
    p.add_argument("--eval-batches", type=int, default=4)
    p.add_argument("--data", default=None, help="data.source (default: tinyshakespeare when present, else stdlib)")
    p.add_argument("--out", type=Path, default=None, help="scratch run directories (default /tmp/scaling[_quick])")
    p.add_argument("--results", type=Path, default=None, help="ledger, tables and plots")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--nice", type=int, default=10)
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar (none off a terminal)")
    compare.add_override_argument(p, "recipes.train overrides for every run, after the study's own")
    if compare.parse_args_with_overrides(p, argv).quick:
        p.set_defaults(
            points=["tiny@32", "tiny@128"],
            arms=["gpt", "ngpt"],
            update_point="",
            steps=20,
            tokens_per_step=1024,
            eval_every=5,
            eval_batches=2,
            seeds=[0, 1],
            max_extend=1,
        )
    args = compare.parse_args_with_overrides(p, argv)
    args.command = "python benchmarks/scaling.py" + ("" if not argv else " " + shlex.join(argv))
    args.points = [Point.parse(t) for t in args.points]
    args.update_point = Point.parse(args.update_point) if args.update_point else None
    if BASELINE not in args.arms:
        raise SystemExit("error: the study needs the gpt baseline among --arms")
    if args.sweep_seed not in args.seeds:
        args.seeds = [args.sweep_seed, *args.seeds]
    if args.data is None:
        args.data = str(convergence.TINYSHAKESPEARE) if convergence.TINYSHAKESPEARE.is_file() else "stdlib"
    study_paths(args, "scaling")
    args.params = {
        str(pt): parameters(pt) for pt in {*args.points, *([args.update_point] if args.update_point else [])}
    }
    sizes = {}
    for pt in args.points:
        sizes.setdefault(pt.size, []).append(pt.context)
    args.context_size = max(sizes, key=lambda s: len(sizes[s]))  # the size with the most contexts
    contexts = {}
    for pt in args.points:
        contexts.setdefault(pt.context, []).append(pt.size)
    args.size_context = max(contexts, key=lambda c: len(contexts[c]))
    meta = args.results / "study.json"  # the first start's date stays, so the header does not churn
    args.date = json.loads(meta.read_text())["started"] if meta.is_file() else datetime.date.today().isoformat()
    meta.write_text(json.dumps({"started": args.date, "command": args.command}, indent=1) + "\n")
    # every run's overrides, checked as recipes.train will read them, before the first run
    study = Study(args)
    compare.check_overrides(
        DEFAULT_CONFIG,
        *(
            [
                *convergence.shared_overrides(study.point_args(pt)),
                *compare.variant_overrides(study.spec(pt, a, 1e-3, 1e-3 if a in MATRIX_RATE_ARMS else None), pt.size)[
                    1
                ],
            ]
            for pt in args.points
            for a in arms_at(args, pt)
        ),
    )
    print(f"data: {args.corpus_label}; results in {args.results}", flush=True)
    with subprocesses.stop_children_on_signals():
        for pt in args.points:
            study.run_point(pt, arms_at(args, pt))
    if study.bar is not None:
        study.bar.close()
    write_results(args, study.ledger)
    print(f"wrote {args.results / 'scaling.md'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
