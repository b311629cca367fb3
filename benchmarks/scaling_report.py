"""The scaling study's tables and plots (``scaling.md``, ``speedup_context.png``,
``speedup_params.png``), written from its ledger: per point and arm, the speedup over GPT
(GPT's steps / the arm's steps to the common target) and the final losses, over the seeds."""

from __future__ import annotations

import argparse
import math
import os
import statistics

from _machine import cpu_name
from scaling_ledger import BASELINE, TIE_MARGIN, Ledger, Point, arms_at, chosen, final_loss

from recipes import compare


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
    """One row per (point, arm) with a chosen rate: the command's arms, then any other the
    ledger holds at the point (run by a start of the study with other ``--arms``)."""
    out = []
    for point in args.points:
        margin = getattr(args, "tie_margin", TIE_MARGIN)
        base_lr, _ = chosen(ledger, str(point), BASELINE, args.sweep_seed, margin)
        arms = arms_at(args, point)
        arms += [a for a in dict.fromkeys(a for (p, a, _, _) in ledger.rows if p == str(point)) if a not in arms]
        for arm in arms:
            lr, bracketed = chosen(ledger, str(point), arm, args.sweep_seed, margin)
            if lr is None:
                continue
            tried = sorted(lr_ for (p, a, lr_, s) in ledger.rows if (p, a, s) == (str(point), arm, args.sweep_seed))
            res = paired(ledger, str(point), arm, lr, base_lr, args.seeds) if base_lr is not None else None
            out.append({"point": point, "arm": arm, "lr": lr, "bracketed": bracketed, "tried": tried, "paired": res})
    return out


def fmt_values(values: list[float], digits: int = 2) -> str:
    """Mean ± std of the finite values; a single value alone, without a spread it cannot have;
    "-" when none is finite."""
    finite = [v for v in values if math.isfinite(v)]
    if len(finite) < 2:
        return f"{finite[0]:.{digits}f}" if finite else "-"
    mean, std = mean_std(finite)
    return f"{mean:.{digits}f} ± {std:.{digits}f}"


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
            f"{'yes' if r['bracketed'] else 'no'} | {len(p['ratios'])} | {bound}{fmt_values(p['ratios'])} ({per_seed}) | "
            f"{fmt_values(p['finals'], 4)} | {fmt_values(p['base_finals'], 4)} |"
        )
    (args.results / "scaling.md").write_text(
        "# Scaling study: nGPT's speedup over GPT against context, size and optimizer\n\n"
        + head
        + "Speedup: per seed, the lowest validation loss both GPT and the arm reach (the common target); "
        "GPT's steps to it / the arm's steps to it (> 1: the arm is faster); mean ± std over the seeds, "
        "per seed in parentheses; ≥: the arm was at the target by its first evaluation (step "
        f"{args.eval_every}), so the ratio is a lower bound and {args.steps // args.eval_every}x is the most "
        "this budget can measure. Every arm at its own best rate (bold) of the sweep (seed "
        f"{args.sweep_seed}); where the runner-up was within {getattr(args, 'tie_margin', TIE_MARGIN):g} nats "
        "of it (`--tie-margin`), both run on every seed and the lower mean is picked. Bracketed: a tried "
        "rate on both sides of it. The Hyperball arms' rate is "
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
        + "".join(f"Later start: `{c}`  \n" for c in getattr(args, "later_commands", []))
        + f"Machine: {os.cpu_count()} CPU cores ({cpu_name()}), torch CPU, {getattr(args, 'study_jobs', args.jobs)} runs at a time x "
        f"{args.threads} thread(s); started {args.date}.  \n"
        f"Data: {args.corpus_label}, byte tokenizer. Points: {points}. Every run: {args.steps} steps of "
        f"{args.tokens_per_step} tokens ({args.steps * args.tokens_per_step / 1e6:.2f}M tokens), cosine to 0 "
        f"(GPT arms: warmup 5%, weight decay 0.1); validation every {args.eval_every} steps on "
        f"{args.eval_batches} batches. Seeds {', '.join(map(str, args.seeds))}.{overrides}\n\n"
    )
