"""The budget study's tables and plots (``budget.md``, ``multiplier.png``, ``loss_budget.png``),
written from its ledgers (one per budget, ``RESULTS/stepsNNNN/runs.jsonl``): per point, budget
and arm, the final losses, the gap to GPT and the compute multiplier; and the study's cost, as
estimated before its first run and as spent."""

from __future__ import annotations

import argparse
import json
import math
import os
from pathlib import Path

from _machine import cpu_name
from budget_pairs import close_gaps_section, paired_section
from scaling_ledger import BASELINE, TIE_MARGIN, Ledger, Point, chosen, decide, final_loss, sweep_finals
from scaling_report import fmt_values, mean_std

# What the estimate assumes per arm and budget: the first grid of three rates, one growth past
# its edge, and the other seeds at the chosen rate.
RUNS_PER_SWEEP = 4
EVAL_BATCH_COST = 1 / 3  # a validation batch (forward only) in training steps


# ---------------------------------------------------------------- the compute multiplier


def budget_for_loss(loss: float, curve: list[tuple[float, float]]) -> tuple[float, bool]:
    """The budget at which GPT's final-loss-against-budget ``curve`` ([(budget, final loss)])
    reaches ``loss``, and whether that is an extrapolation.

    Between measured budgets the loss is linear in log budget: the first pair of neighbouring
    budgets (in budget order) whose losses bracket ``loss`` gives it. Below every measured loss
    the line through the two largest budgets is followed up, above every one the line through
    the two smallest down (both marked True). inf: below every loss while the curve's last
    segment does not fall (the trend never gets there); nan: fewer than two finite points, or
    above every loss while the first segment does not fall."""
    points = sorted((b, v) for b, v in curve if math.isfinite(v))
    if len(points) < 2 or not math.isfinite(loss):
        return math.nan, False
    xs = [math.log(b) for b, _ in points]
    ys = [v for _, v in points]
    for i in range(len(points) - 1):
        lo, hi = sorted((ys[i], ys[i + 1]))
        if lo <= loss <= hi:
            if ys[i] == ys[i + 1]:
                return points[i][0], False
            t = (loss - ys[i]) / (ys[i + 1] - ys[i])
            return math.exp(xs[i] + t * (xs[i + 1] - xs[i])), False
    i = len(points) - 2 if loss < min(ys) else 0
    slope = (ys[i + 1] - ys[i]) / (xs[i + 1] - xs[i])
    if slope >= 0:
        return (math.inf if loss < min(ys) else math.nan), True
    end = i + 1 if loss < min(ys) else i
    return math.exp(xs[end] + (loss - ys[end]) / slope), True


def multiplier(loss: float, budget: int, curve: list[tuple[float, float]]) -> tuple[float, bool]:
    """The compute multiplier of a run that ends at ``loss`` after ``budget`` steps: GPT's budget
    for that loss (:func:`budget_for_loss`) over ``budget``; > 1: the arm is worth that many
    times its tokens of GPT training. Every run takes the same tokens per step, so steps stand
    for tokens."""
    needed, extrapolated = budget_for_loss(loss, curve)
    return needed / budget, extrapolated


def fmt_multiplier(value: float, extrapolated: bool) -> str:
    if math.isnan(value):
        return "-"
    text = "∞" if math.isinf(value) else f"{value:.2f}"
    return text + ("*" if extrapolated else "")


def budget_dir(results: Path, budget: int) -> Path:
    return results / f"steps{budget:04d}"


def scaled_budgets(budgets: list[int], params: int, reference: int) -> list[int]:
    """``--scale-budgets``: a point of ``params`` parameters trains as many tokens per parameter
    as the first point (``reference`` parameters) does at ``budgets`` (the same tokens per step)."""
    return [round(b * params / reference) for b in budgets]


def in_plan(args: argparse.Namespace, point: Point | str, budget: int, arm: str) -> bool:
    """Whether the study plans (or has run) ``arm`` at ``point`` and ``budget``: the whole grid of
    the command's points, budgets and arms unless ``args.plan`` (every start's, as the reports
    read it) says otherwise."""
    plan = getattr(args, "plan", None)
    return plan is None or (str(point), budget, arm) in plan


def budgets_of(args: argparse.Namespace, point: Point) -> list[int]:
    """The point's budgets: ``args.budgets``, unless ``--scale-budgets`` gave each point its own
    (``args.point_budgets``)."""
    return getattr(args, "point_budgets", {}).get(str(point), args.budgets)


def seeds_of(args: argparse.Namespace, point, budget: int, arm: str) -> list[int]:
    """The seeds the study runs ``arm`` on at ``point`` and ``budget``: ``--seeds``, or more where
    a later start asked for more there (``budget.reported``'s ``plan_seeds``)."""
    return getattr(args, "plan_seeds", {}).get((str(point), budget, arm), args.seeds)


def seeds_text(args: argparse.Namespace) -> str:
    """The header's seeds: "Seeds 0, 1, 2", and where a later start asked for more, which runs
    got them ("; seeds 0-7 at tiny@1024 (100, 400 steps): gpt, ngpt")."""
    plan = getattr(args, "plan_seeds", {})
    counts: dict[tuple[int, ...], int] = {}
    for seeds in plan.values():
        counts[tuple(seeds)] = counts.get(tuple(seeds), 0) + 1
    base = list(max(counts, key=counts.get)) if counts else list(args.seeds)
    text = f"Seeds {', '.join(map(str, base))}"
    more: dict[tuple, list[str]] = {}
    for (point, budget, arm), seeds in sorted(plan.items()):
        if list(seeds) != base:
            more.setdefault((tuple(seeds), point), []).append((budget, arm))
    for (seeds, point), runs in more.items():
        budgets = ", ".join(str(b) for b in sorted({b for b, _ in runs}))
        arms = ", ".join(dict.fromkeys(a for _, a in runs))
        text += f"; seeds {seeds[0]}-{seeds[-1]} at {point} ({budgets} steps): {arms}"
    return text


def budget_of(ledger: Ledger) -> int:
    """The budget whose ledger this is (``RESULTS/stepsNNNN/runs.jsonl``)."""
    return int(ledger.path.parent.name.removeprefix("steps"))


def ledgers(args: argparse.Namespace) -> dict[int, Ledger]:
    return {b: Ledger(budget_dir(args.results, b) / "runs.jsonl") for b in args.budgets}


def final(ledger: Ledger, point: str, arm: str, lr: float, seed: int) -> float:
    row = ledger.rows.get((point, arm, float(lr), seed))
    return final_loss(row) if row is not None else math.nan


def summary(args: argparse.Namespace) -> list[dict]:
    """One row per (point, budget, arm) with a chosen rate: its final losses per seed, and per
    seed the gap to GPT and the compute multiplier."""
    books = ledgers(args)
    rates = {
        (str(pt), b, arm): chosen(books[b], str(pt), arm, args.sweep_seed, getattr(args, "tie_margin", TIE_MARGIN))
        for pt in args.points
        for b in budgets_of(args, pt)
        for arm in args.arms
    }
    rows = []
    for pt in args.points:
        point = str(pt)
        base_curve = {}  # seed -> [(budget, GPT's final loss)]
        for b in budgets_of(args, pt):
            lr, _ = rates[point, b, BASELINE]
            for seed in seeds_of(args, point, b, BASELINE):
                loss = final(books[b], point, BASELINE, lr, seed) if lr is not None else math.nan
                base_curve.setdefault(seed, []).append((b, loss))
        for b in budgets_of(args, pt):
            base_lr, _ = rates[point, b, BASELINE]
            for arm in args.arms:
                lr, bracketed = rates[point, b, arm]
                if lr is None:
                    continue
                tried = sorted(lr_ for (p, a, lr_, s) in books[b].rows if (p, a, s) == (point, arm, args.sweep_seed))
                seeds, finals, gaps, mults = [], [], [], []
                for seed in seeds_of(args, point, b, arm):
                    if (point, arm, float(lr), seed) not in books[b].rows:
                        continue
                    loss = final(books[b], point, arm, lr, seed)
                    seeds.append(seed)
                    finals.append(loss)
                    base = final(books[b], point, BASELINE, base_lr, seed) if base_lr is not None else math.nan
                    gaps.append(loss - base)
                    mults.append(multiplier(loss, b, base_curve.get(seed, [])))
                rows.append(
                    {
                        "point": pt,
                        "budget": b,
                        "arm": arm,
                        "lr": lr,
                        "bracketed": bracketed,
                        "tried": tried,
                        "tie": tie_note(books[b], point, arm),
                        "pending": pending_note(args, books[b], point, arm),
                        "seeds": seeds,
                        "finals": finals,
                        "gaps": gaps,
                        "multipliers": mults,
                    }
                )
    return rows


def tie_note(ledger: Ledger, point: str, arm: str) -> str:
    """How a tie was decided (``scaling_ledger.decide``), e.g. "; tie: mean 0.03 2.1000, 0.01 2.0900
    over 3 seeds"; "" when the sweep's best stood alone or nothing is decided yet."""
    pick = ledger.picks.get((point, arm))
    if pick is None or len(pick["candidates"]) < 2:
        return ""
    means = ", ".join(f"{c['lr']:g} {c['mean']:.4f}" for c in pick["candidates"])
    return f"; tie: mean {means} over {len(pick['seeds'])} seeds"


def pending_note(args: argparse.Namespace, ledger: Ledger, point: str, arm: str) -> str:
    """The runs the rate rule still needs before the shown rate is its pick, e.g. "; pending: 0.01 on
    seeds 1, 2" (a tie's runner-up still to run); "" once the rule has decided."""
    seeds = seeds_of(args, point, budget_of(ledger), arm)
    pick, missing = decide(ledger, point, arm, seeds, args.sweep_seed, getattr(args, "tie_margin", TIE_MARGIN))
    if pick is not None or not missing:
        return ""
    by_rate: dict[float, list[int]] = {}
    for lr, seed in missing:
        by_rate.setdefault(float(lr), []).append(seed)
    runs = "; ".join(
        f"{lr:g} on seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, sorted(seeds)))}"
        for lr, seeds in sorted(by_rate.items())
    )
    return f"; pending: {runs}"


def spent_core_hours(args: argparse.Namespace) -> tuple[float, int]:
    """Core-hours the ledgers' runs took (wall time x threads per run) and how many runs. A row
    holds its last invocation's wall time only: a run resumed at step k (the row's ``from_step``)
    is counted at that invocation's time per step over all its steps."""
    rows = [(budget, row) for budget, book in ledgers(args).items() for row in book.rows.values()]
    ran = [(row.get("wall_s", 0.0), budget, budget - row.get("from_step", 0)) for budget, row in rows]
    seconds = sum(wall * budget / steps if 0 < steps < budget else wall for wall, budget, steps in ran)
    return seconds * args.threads / 3600, len(rows)


def estimate_text(args: argparse.Namespace) -> str:
    """The cost paragraph: the estimate made before the first run, beside the time the ledgers'
    runs took, and what is left at that measured time."""
    path = args.results / "estimate.json"
    if not path.is_file():
        return "No estimate yet (`--estimate-only` writes one).\n\n"
    est = json.loads(path.read_text())
    books = ledgers(args)
    planned = RUNS_PER_SWEEP + len(args.seeds) - 1
    lines = [
        "| point | arm | s / step | start-up s | measured s / step (runs) |",
        "|---|---|---|---|---|",
    ]
    total = left = 0.0
    for pt in args.points:
        for arm in args.arms:
            m = est["timings"].get(f"{pt}|{arm}")
            if m is None:
                continue
            done = {b: [r for (p, a, _, _), r in books[b].rows.items() if (p, a) == (str(pt), arm)] for b in books}
            steps = sum(b - r.get("from_step", 0) for b, rows in done.items() for r in rows)  # this invocation's
            measured = sum(r.get("wall_s", 0.0) for rows in done.values() for r in rows) / steps if steps else None
            shown = f"{measured:.3f} ({sum(map(len, done.values()))})" if measured is not None else "-"
            lines.append(f"| {pt} | {arm} | {m['s_per_step']:.3f} | {m['startup_s']:.1f} | {shown} |")
            budgets = [b for b in budgets_of(args, pt) if in_plan(args, pt, b, arm)]
            total += run_seconds(args, m, budgets)
            for b in budgets:
                runs_left = runs_to_go(args, books.get(b), str(pt), arm, len(done.get(b, [])), planned)
                one = b * measured if measured is not None else run_seconds(args, m, [b]) / planned
                left += runs_left * one
    core_h = total * args.threads / 3600
    spent, runs = spent_core_hours(args)
    # the recorded commands' runs at a time (budget.remember_start), not this command's
    est_jobs, jobs = getattr(args, "estimate_jobs", args.jobs), getattr(args, "study_jobs", args.jobs)
    return (
        f"**Cost.** Estimated before the first run ({est['date']}, `{est['command']}`): "
        f"{core_h:.1f} core-hours, {total / est_jobs / 3600:.1f} h wall at {est_jobs} runs at a time, "
        f"assuming {RUNS_PER_SWEEP} sweep runs per arm and budget (the grid of three and one growth) plus "
        f"{len(args.seeds) - 1} more seeds, each run its start-up plus its steps and validation batches "
        f"(one validation batch counted as {EVAL_BATCH_COST:.2g} of a step) at the time per step measured "
        f"with {est_jobs} runs at a time. Measured: the ledgers' runs, wall time over steps (start-up, "
        "validation and whatever else loaded the machine included):\n\n"
        + "\n".join(lines)
        + f"\n\nSpent so far: {spent:.1f} core-hours in {runs} runs (a resumed run at its last invocation's time "
        "per step; rows written before the ledger recorded where an invocation began count that invocation "
        "only). Left, at the measured time per step "
        f"(the estimate where an arm has no run yet), {planned} runs per arm and budget less those run, more "
        "where a tie already asks for them, none once a rate is picked: "
        f"{left * args.threads / 3600:.1f} core-hours, {left / jobs / 3600:.1f} h wall at {jobs} runs "
        "at a time.\n\n"
    )


def runs_to_go(args: argparse.Namespace, book: Ledger | None, point: str, arm: str, done: int, planned: int) -> int:
    """The runs an arm still needs at one budget: none once the rate rule has a bracketed pick;
    else the plan's ``planned`` less the ``done`` ones, or more where the ledger already asks for
    more (a tie's seed runs for two rates, besides the sweep's own runs still to come)."""
    if book is None:
        return planned
    pick, missing = decide(
        book, point, arm, seeds_of(args, point, budget_of(book), arm), args.sweep_seed, args.tie_margin
    )
    finals = sweep_finals(book, point, arm, args.sweep_seed)
    if pick is not None and min(finals) < float(pick["picked"]) < max(finals):  # as the table's "bracketed"
        return len(missing)  # seeds a later start added at the pick
    growth = sum(1 for _, seed in missing if seed == args.sweep_seed)  # the sweep grown past a tie's pick
    sweep_to_come = max(growth, RUNS_PER_SWEEP - len(finals))
    return max(planned - done, len(missing) - growth + sweep_to_come)


def run_seconds(args: argparse.Namespace, timing: dict, budgets: list[int]) -> float:
    """The estimated wall seconds of one arm's runs at one point over its budgets."""
    per_budget = [
        timing["startup_s"] + (b + args.evals * args.eval_batches * EVAL_BATCH_COST) * timing["s_per_step"]
        for b in budgets
    ]
    return (RUNS_PER_SWEEP + len(args.seeds) - 1) * sum(per_budget)


def write_results(args: argparse.Namespace, plots: bool = True) -> None:
    rows = summary(args)
    lines = [
        "| point | budget (steps) | tokens / param | arm | lr (tried) | bracketed | seeds | final val loss | "
        "gap to GPT | compute multiplier (per seed) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        per_seed = ", ".join(fmt_multiplier(m, x) for m, x in r["multipliers"])
        finite = [m for m, _ in r["multipliers"] if math.isfinite(m)]
        mark = "*" if any(x for _, x in r["multipliers"]) else ""
        mean = fmt_values(finite) + mark if finite else "-"
        lines.append(
            f"| {r['point']} | {r['budget']} | {tokens_per_param(args, r['point'], r['budget']):.1f} | {r['arm']} | "
            f"**{r['lr']:g}** ({', '.join(f'{x:g}' for x in r['tried'])}{r['tie']}{r['pending']}) | {'yes' if r['bracketed'] else 'no'} | "
            f"{len(r['seeds'])} | {fmt_values(r['finals'], 4)} | "
            f"{fmt_values(r['gaps'], 4)} | {mean} ({per_seed}) |"
        )
    points = ", ".join(
        f"{p} (batch {max(1, args.tokens_per_step // p.context)} x {p.context}, "
        f"{args.params[str(p)] / 1e6:.2f}M params)"
        for p in args.points
    )
    overrides = f" Overrides for every run: `{' '.join(args.overrides)}`." if args.overrides else ""
    budgets = ", ".join(map(str, args.budgets))
    margin = getattr(args, "tie_margin", TIE_MARGIN)
    if len({tuple(budgets_of(args, pt)) for pt in args.points}) > 1:  # each point its own (--scale-budgets)
        budgets = "; ".join(f"{pt}: {', '.join(map(str, budgets_of(args, pt)))}" for pt in args.points)
    (args.results / "budget.md").write_text(
        "# Budget study: nGPT's compute multiplier over GPT against training length\n\n"
        f"Command: `{args.command}`  \n"
        + "".join(f"Later start: `{c}`  \n" for c in getattr(args, "later_commands", []))
        + f"Machine: {os.cpu_count()} CPU cores ({cpu_name()}), torch CPU, {getattr(args, 'study_jobs', args.jobs)} runs at a time x "
        f"{args.threads} thread(s); started {args.date}.  \n"
        f"Data: {args.corpus_label}, byte tokenizer. Points: {points}. Budgets: "
        f"{budgets} steps of {args.tokens_per_step} tokens, each its own run, cosine "
        f"to 0 (GPT arms: warmup 5%, weight decay 0.1), validation {args.evals} times per run on "
        f"{args.eval_batches} batches. {seeds_text(args)}.{overrides}\n\n"
        + estimate_text(args)
        + "Compute multiplier: per seed, the budget GPT needs to reach the arm's final validation loss "
        "(read off GPT's final loss against budget, same seed, linear in log tokens) over the arm's budget; "
        "> 1: the arm is worth that many times its tokens of GPT training. *: extrapolated beyond the "
        f"GPT budgets measured ({min(args.budgets)} to {max(args.budgets)} steps); ∞: below every GPT loss "
        "while GPT's curve no longer falls. Mean ± std over the finite per-seed values. Gap to GPT: the "
        "arm's final loss minus GPT's at the same budget and seed (< 0: the arm is ahead at equal tokens). "
        f"Every arm at its own best rate (bold) of the sweep (seed {args.sweep_seed}) at that budget; "
        "bracketed: a tried rate on both sides of it. The Hyperball arms' rate is `optim.matrix_lr` (the "
        "angle a step turns a hidden matrix by), their AdamW part at GPT's bold rate at that budget. "
        "Tokens / param: the nGPT model's parameter count. "
        + (
            f"Tie: the runner-up's final loss on seed {args.sweep_seed} was within {margin:g} nats of the best's "
            "(`--tie-margin`), so both rates ran on every seed and the lower mean (shown) was picked. "
            if any(r["tie"] for r in rows)
            else ""
        )
        + (
            "Pending: the runs the rate rule still needs before the bold rate is its pick (a tie's runner-up "
            "not yet run on every seed): the row may still change. "
            if any(r["pending"] for r in rows)
            else ""
        )
        + "This file is rewritten after every run.\n\n"
        + "\n".join(lines)
        + "\n\n"
        + cannot_show(
            [
                {
                    "params": args.params[str(r["point"])],
                    "tokens_per_param": tokens_per_param(args, r["point"], r["budget"]),
                    "row": r,
                }
                for r in rows
                if r["seeds"]
            ],
            corpus=args.corpus_label,
        )
        + "\n"
        + paired_section(rows, args.corpus_label, lambda point, budget: tokens_per_param(args, point, budget))
        + close_gaps_section(rows, args.corpus_label, lambda point, budget: tokens_per_param(args, point, budget))
    )
    if plots:
        plot(args, rows)


def cannot_show(ran: list[dict], corpus: str | None = None) -> str:
    """What the rows that ran cannot show, from what they span: sizes, tokens per parameter, the
    corpus where there is one, and whether a multiplier rests on GPT's loss continued past its
    longest run. ``ran``: one dict per row, with ``params``, ``tokens_per_param`` and ``row`` (its
    :func:`summary` row)."""
    if not ran:
        return "Nothing has run yet."
    sizes = sorted({e["params"] for e in ran})
    names = " and ".join(f"{n / 1e6:.2f}M" for n in sizes) if len(sizes) < 3 else ""
    if len(sizes) == 1:
        size = f"any change with size (one size, {names} parameters)"
    elif len(sizes) == 2:
        size = f"a trend in size (two sizes, {names} parameters, make a line of any slope), or sizes outside them"
    else:
        size = f"sizes outside the {len(sizes)} measured ({sizes[0] / 1e6:.2f}M to {sizes[-1] / 1e6:.2f}M parameters)"
    text = (
        f"What these results cannot show: {size}; budgets past "
        f"{max(e['tokens_per_param'] for e in ran):.1f} tokens per parameter"
        + (f"; another corpus. Every row ran on one: {corpus}" if corpus else "")
    )
    if any(x for e in ran for _, x in e["row"]["multipliers"]):
        text += (
            ". A multiplier marked * rests on GPT's final loss continued past its longest run (linear in "
            "log tokens), not on a GPT run that reached it"
        )
    return text + "."


def tokens_per_param(args: argparse.Namespace, point: Point, budget: int) -> float:
    return budget * args.tokens_per_step / args.params[str(point)]


def multiplier_axes(ax, xs: list[float]) -> None:
    """The multiplier plots' axes: tokens per parameter on a log scale, ticked at the points
    plotted, in plain numbers; the multiplier, with a dashed line at 1 (GPT's own)."""
    from matplotlib.ticker import NullFormatter, ScalarFormatter  # matplotlib: only where a plot is drawn

    ax.axhline(1.0, color="black", lw=0.8, ls="--")
    ax.set_xscale("log")
    ax.set_xticks(sorted({round(x, 1) for x in xs}))
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("tokens per parameter")
    ax.set_ylabel("compute multiplier over GPT")


def plot(args: argparse.Namespace, rows: list[dict]) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    lines: dict[tuple[int, str], list] = {}
    for r in rows:
        finite = [m for m, _ in r["multipliers"] if math.isfinite(m)]
        if r["arm"] != BASELINE and finite:
            m, s = mean_std(finite)
            extrapolated = any(x for _, x in r["multipliers"])
            x = tokens_per_param(args, r["point"], r["budget"])
            lines.setdefault((r["point"].context, r["arm"]), []).append((x, m, s, extrapolated))
    for (context, arm), pts in sorted(lines.items()):
        pts.sort()
        line = ax.errorbar([p[0] for p in pts], [p[1] for p in pts], yerr=[p[2] for p in pts], marker="o",
                           capsize=3, label=f"{arm} @ {context}")  # fmt: skip  # one call, its style beside it
        ext = [p for p in pts if p[3]]
        if ext:
            color = line.lines[0].get_color()
            ax.scatter([p[0] for p in ext], [p[1] for p in ext], s=110, facecolors="none", edgecolors=color, zorder=3)
    multiplier_axes(ax, [p[0] for pts in lines.values() for p in pts])
    ax.set_title(f"{args.corpus_label}\nopen circle: extrapolated beyond GPT's budgets", fontsize=9)
    if lines:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.results / "multiplier.png", dpi=110)
    plt.close(fig)

    contexts = sorted({p.context for p in args.points})
    fig, axes = plt.subplots(1, len(contexts), figsize=(5.2 * len(contexts), 4.0), squeeze=False)
    for ax, context in zip(axes[0], contexts):
        for arm in args.arms:
            pts = sorted(
                (r["budget"] * args.tokens_per_step, *mean_std(r["finals"]))
                for r in rows
                if r["arm"] == arm and r["point"].context == context
            )
            pts = [p for p in pts if math.isfinite(p[1])]
            if pts:
                ax.errorbar([p[0] for p in pts], [p[1] for p in pts], yerr=[p[2] for p in pts], marker="o",
                            capsize=3, label=arm)  # fmt: skip  # one call, its style beside it
        ax.set_xscale("log")
        ax.set_xlabel("tokens (budget)")
        ax.set_ylabel("final validation loss")
        ax.set_title(f"context {context}", fontsize=9)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.results / "loss_budget.png", dpi=110)
    plt.close(fig)
