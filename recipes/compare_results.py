"""What the runs of ``recipes.compare`` say: each run's validation curve read from its
``metrics.jsonl`` (:func:`read_curve`, :func:`finished`), the variants summarized against the
baseline (:func:`summarize`, :func:`steps_to_reach`), and written as ``compare.md``
(:func:`write_table`) and ``compare.png`` (:func:`plot`), with the runs whose curves have too few
validation points to read flagged (:func:`few_point_runs`). ``recipes.compare`` re-exports them.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

__all__ = [
    "FEW_POINTS",
    "MIN_VALIDATIONS",
    "few_point_runs",
    "few_points_advice",
    "figure",
    "finished",
    "plot",
    "read_curve",
    "steps_to_reach",
    "summarize",
    "validation_points",
    "write_table",
]

MIN_VALIDATIONS = 10  # each run validates at least this often unless train.eval_every is given
FEW_POINTS = 3  # a curve of this many validation points or fewer is flagged


def validation_points(steps: int, every: int) -> int:
    """How many validations ``recipes.train`` runs: every ``every`` steps and at the last one."""
    return steps // every + (steps % every != 0)


def few_points_advice(points: int, steps: int) -> str:
    """Why a curve of ``points`` validations says little, and what draws one."""
    every = max(1, steps // MIN_VALIDATIONS)
    if validation_points(steps, every) > FEW_POINTS:
        todo = f"pass train.eval_every={every} (or leave it out) for {validation_points(steps, every)}"
    else:
        todo = f"train more than {FEW_POINTS} steps (train.steps=)"
    s = "s" if points != 1 else ""
    return f"{points} validation point{s} in {steps} steps: too few to draw a curve or to read a speedup from; {todo}"


def finished(run_dir: Path) -> bool:
    """The run's metrics end with its "done" event."""
    metrics = run_dir / "metrics.jsonl"
    return metrics.is_file() and '"event": "done"' in metrics.read_text()


def read_curve(run_dir: Path) -> dict:
    """A finished run's validation curve, training losses, final sphere-norm error and the step
    its last invocation began at (``from_step``: 0 unless it was resumed)."""
    steps, vals, tokens, train = [], [], [], []
    per_token, from_step = None, 0
    with (run_dir / "metrics.jsonl").open() as f:
        for line in f:
            r = json.loads(line)
            if r.get("event") == "start":
                from_step = int(r.get("step", 0))
            if "val_loss" in r and "step" in r and "tokens" in r:
                steps.append(r["step"])
                vals.append(r["val_loss"])
                tokens.append(r["tokens"])
            if "loss" in r and r.get("loss") is not None:
                train.append((r["step"], r["loss"]))
            if r.get("event") == "done":
                per_token = r.get("sphere_norm_error")
    return {
        "steps": steps,
        "val_loss": vals,
        "tokens": tokens,
        "train": train,
        "sphere_norm_error": per_token,
        "from_step": from_step,
    }


def steps_to_reach(curve: dict, target: float) -> float:
    """First evaluated step whose validation loss is <= ``target`` (inf when never)."""
    for s, v in zip(curve["steps"], curve["val_loss"]):
        if v is not None and v <= target:
            return s
    return math.inf


def summarize(results: dict[str, dict[int, dict]], baseline: str | None) -> tuple[list[dict], float | None]:
    """Per variant: best and final validation loss (mean, std over seeds; std None for one seed)
    and, paired by seed against the baseline, the steps the variant needs to reach that seed's
    baseline best validation loss, and the speedup ``baseline steps / variant steps`` (mean, std
    over the seeds where the variant reaches it); and each seed's number of validation points.
    The returned target is the mean of the per-seed targets, for display."""
    base = results.get(baseline) if baseline else None
    targets = {seed: min(c["val_loss"]) for seed, c in base.items()} if base else {}
    rows = []
    for name, by_seed in results.items():
        best = [min(c["val_loss"]) for c in by_seed.values()]
        final = [c["val_loss"][-1] for c in by_seed.values()]
        row = {
            "variant": name,
            "seeds": len(by_seed),
            "val_points": [len(c["val_loss"]) for c in by_seed.values()],
            "best_val": statistics.mean(best),
            "best_val_std": _std(best),
            "final_val": statistics.mean(final),
            "final_val_std": _std(final),
        }
        paired = [seed for seed in by_seed if seed in targets]
        if paired:
            reach = [steps_to_reach(by_seed[seed], targets[seed]) for seed in paired]
            base_steps = [steps_to_reach(base[seed], targets[seed]) for seed in paired]
            ratios = [b / r for b, r in zip(base_steps, reach) if math.isfinite(r)]
            row["steps_to_target"] = reach
            row["reached"] = f"{len(ratios)}/{len(paired)}"
            if ratios:
                row["speedup_vs_baseline"] = statistics.mean(ratios)
                row["speedup_std"] = _std(ratios)
        rows.append(row)
    return rows, (statistics.mean(targets.values()) if targets else None)


def _std(values: list[float]) -> float | None:
    return statistics.stdev(values) if len(values) > 1 else None


def _mean_std(mean: float, std: float | None, digits: int) -> str:
    """``mean ± std``, or the mean alone where there is no spread to show (one seed)."""
    return f"{mean:.{digits}f}" if std is None else f"{mean:.{digits}f} ± {std:.{digits}f}"


def few_point_runs(results: dict[str, dict[int, dict]]) -> list[str]:
    """One line per run whose curve has :data:`FEW_POINTS` validation points or fewer: which run,
    and what to do."""
    return [
        f"{name} seed {seed}: {few_points_advice(len(c['val_loss']), c['steps'][-1] if c['steps'] else 0)}"
        for name, by_seed in results.items()
        for seed, c in by_seed.items()
        if len(c["val_loss"]) <= FEW_POINTS
    ]


def write_table(
    rows: list[dict], target: float | None, baseline: str | None, path: Path, notes=(), flags=(), remarks=()
) -> str:
    """The table of ``rows`` (:func:`summarize`) as markdown, with the target, the runs flagged
    for too few validation points (``flags``, :func:`few_point_runs`), the learning rates
    (``notes``) and any ``remarks`` (a paragraph each) under it."""
    lines = [
        "| variant | seeds | validation points | best val loss | final val loss | steps to baseline's best (per seed) "
        "| reached | speedup (x) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        reach = r.get("steps_to_target")
        reach_s = ", ".join("never" if math.isinf(x) else str(int(x)) for x in reach) if reach else "-"
        speed = _mean_std(r["speedup_vs_baseline"], r["speedup_std"], 2) if "speedup_vs_baseline" in r else "-"
        points = ", ".join(map(str, sorted(set(r["val_points"]))))
        if min(r["val_points"]) <= FEW_POINTS:
            points += " (too few: see below)"
        lines.append(
            f"| {r['variant']} | {r['seeds']} | {points} | {_mean_std(r['best_val'], r['best_val_std'], 4)} | "
            f"{_mean_std(r['final_val'], r['final_val_std'], 4)} | {reach_s} | {r.get('reached', '-')} | {speed} |"
        )
    if target is not None:
        lines.append(
            f"\nTarget, per seed: that seed's {baseline} best validation loss (mean over seeds {target:.4f}); "
            f"speedup = {baseline}'s steps to it / the variant's, over the seeds that reach it."
        )
    if flags:
        lines.append(f"\n**Too few validation points ({FEW_POINTS} or fewer)**; their curves and speedups say little:")
        lines.extend(f"- {flag}" for flag in flags)
    if notes:
        lines.append("\nLearning rates: " + "; ".join(notes) + ".")
    lines.extend(f"\n{remark}" for remark in remarks)
    text = "\n".join(lines) + "\n"
    path.write_text(text)
    return text


def plot(results: dict[str, dict[int, dict]], path: Path, title: str) -> None:
    """:func:`figure` saved to ``path``."""
    import matplotlib.pyplot as plt

    fig = figure(results, title)
    fig.savefig(path)
    plt.close(fig)


def figure(results: dict[str, dict[int, dict]], title: str):
    """Validation loss against steps and against tokens: a line per run with a marker at each
    validation point (a curve of one point still shows), one colour per variant."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4), dpi=80)
    for i, (name, by_seed) in enumerate(results.items()):
        style = dict(color=f"C{i}", alpha=0.8, marker="o", markersize=3)
        for j, c in enumerate(by_seed.values()):
            label = name if j == 0 else None
            axes[0].plot(c["steps"], c["val_loss"], label=label, **style)
            axes[1].plot([t / 1e6 for t in c["tokens"]], c["val_loss"], label=label, **style)
    axes[0].set_xlabel("step")
    axes[1].set_xlabel("tokens (millions)")
    for ax in axes:
        ax.set_ylabel("validation loss")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig
