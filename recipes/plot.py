"""Plot the metrics of training runs on one figure: ``python -m recipes.plot``.

    python -m recipes.plot runs/gpt runs/ngpt --out loss.png
    python -m recipes.plot runs/compare/*/seed0 --metric val_loss lr grad_norm --x tokens

Each RUN is a ``recipes.train`` run directory (its ``train.out_dir``) or its ``metrics.jsonl``.
One panel per ``--metric`` (default: ``loss``, the training loss of every logged step, and
``val_loss``), every run a line in each, labelled by its directory name. A metric is any
number ``metrics.jsonl`` records per step: ``loss``, ``val_loss``, ``lr``, ``grad_norm``,
``tok_per_s``, and for nGPT ``sphere_norm_error`` and the per-layer ``alpha_A_mean_abs`` /
``alpha_M_mean_abs`` (drawn as their mean over layers). A resumed run that logged a step twice
is drawn with the later value. A RUN without ``metrics.jsonl``, or a metric no run logged,
prints one line and exits with code 2.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from recipes.cli import prog

DEFAULT_METRICS = ["loss", "val_loss"]
TITLES = {
    "loss": "training loss",
    "val_loss": "validation loss",
    "lr": "learning rate",
    "grad_norm": "gradient norm (before clipping)",
    "tok_per_s": "tokens / s",
    "sphere_norm_error": "max |row norm - 1| of sphere weights",
    "alpha_A_mean_abs": "mean |alpha_A| (mean over layers)",
    "alpha_M_mean_abs": "mean |alpha_M| (mean over layers)",
}


class PlotError(ValueError):
    """A run or metric that cannot be plotted; the message names it."""


def metrics_file(run: str | Path) -> Path:
    """``run``'s metrics.jsonl: the run directory's, or ``run`` itself when it is the file."""
    path = Path(run)
    if path.is_file() and path.suffix == ".jsonl":
        return path
    if not path.exists():
        raise PlotError(f"{run}: no such run directory")
    metrics = path / "metrics.jsonl"
    if not metrics.is_file():
        raise PlotError(f"{run} has no metrics.jsonl (a recipes.train run directory holds one: its train.out_dir)")
    return metrics


def read_metrics(path: Path) -> list[dict]:
    """The per-step records of a metrics.jsonl (events such as "start" and "done" left out)."""
    records = []
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise PlotError(f"{path}, line {number}: not JSON ({exc})") from None
            if isinstance(record, dict) and "step" in record and "event" not in record:
                records.append(record)
    return records


def series(records: list[dict], metric: str, x: str = "step") -> tuple[list[float], list[float]]:
    """(x values, metric values) in step order; the last record of a step wins, missing and
    non-finite values are left out, a per-layer list is averaged."""
    by_step: dict[int, tuple[float, float]] = {}
    for r in records:
        value = r.get(metric)
        if isinstance(value, list):
            value = sum(value) / len(value) if value and all(v is not None for v in value) else None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            continue
        at = r.get(x)
        if isinstance(at, (int, float)):
            by_step[int(r["step"])] = (float(at), float(value))
    points = [by_step[s] for s in sorted(by_step)]
    return [p[0] for p in points], [p[1] for p in points]


def run_labels(runs: list[str]) -> list[str]:
    """The run directories' names; where two are the same, with their parent (``ngpt/seed0``)."""
    dirs = [Path(r).resolve().parent if Path(r).is_file() else Path(r).resolve() for r in runs]
    names = [d.name for d in dirs]
    labels = [f"{d.parent.name}/{d.name}" if names.count(d.name) > 1 else d.name for d in dirs]
    seen: dict[str, int] = {}
    unique = []
    for label in labels:
        seen[label] = seen.get(label, 0) + 1
        unique.append(label if seen[label] == 1 else f"{label} ({seen[label]})")
    return unique


def plot_runs(runs: list[str], out: str | Path, metrics: list[str] = DEFAULT_METRICS, x: str = "step") -> Path:
    """One figure, one panel per metric, one line per run; written to ``out`` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = [read_metrics(metrics_file(run)) for run in runs]
    labels = run_labels(runs)
    curves = {m: [series(recs, m, x) for recs in records] for m in metrics}
    for metric, per_run in curves.items():
        if not any(values for _, values in per_run):
            logged = sorted({k for recs in records for r in recs for k in r} - {"step", "time_s", "skipped", "tokens"})
            raise PlotError(f"no run logged the metric {metric!r} (metrics these runs logged: {', '.join(logged)})")

    fig, axes = plt.subplots(1, len(metrics), figsize=(5 * len(metrics), 4), dpi=90, squeeze=False)
    for ax, metric in zip(axes[0], metrics):
        for i, (label, (xs, ys)) in enumerate(zip(labels, curves[metric])):
            if ys:
                marker = "o" if len(ys) <= 30 else None  # sparse curves (validation) show their points
                ax.plot(xs, ys, color=f"C{i}", label=label, marker=marker, markersize=3, linewidth=1.2)
        ax.set_title(TITLES.get(metric, metric), fontsize=10)
        ax.set_xlabel("tokens" if x == "tokens" else "step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    out = Path(out)
    if out.parent != Path():
        out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=prog("recipes.plot"), description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", metavar="RUN", help="run directory (train.out_dir) or its metrics.jsonl")
    p.add_argument("--out", default="loss_curves.png", help="the PNG to write (default loss_curves.png)")
    p.add_argument("--metric", nargs="+", default=DEFAULT_METRICS, help="metrics.jsonl keys, one panel each")
    p.add_argument("--x", choices=["step", "tokens"], default="step", help="horizontal axis (default step)")
    args = p.parse_args(argv)
    try:
        out = plot_runs(args.runs, args.out, args.metric, args.x)
    except PlotError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
