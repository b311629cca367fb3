"""Inspect trained checkpoints as Section 3.2 of the nGPT paper does: ``python -m recipes.analyze``.

    python -m recipes.analyze runs/ngpt runs/gpt --out runs/analysis
    python -m recipes.analyze runs/ngpt runs/gpt --out runs/analysis --extrapolate
    python -m recipes.analyze runs/ngpt --out runs/a --extrapolate --data my_text.txt --factors 1 2 4 8

Each RUN_DIR is a run's ``train.out_dir``, its ``checkpoints/`` directory or one ``step_*``
checkpoint (the newest sound checkpoint is used). All runs are drawn on the same figures, in
``--out``:

    fig4_embeddings.png   norms, covariance eigenvalues / median, pairwise dot products (Fig. 4)
    fig5_condition.png    condition numbers per layer; dotted: GPT rows renormalized (Fig. 5, 10)
    fig6_scalings.png     alpha_A, alpha_M, s_u, s_v, s_qk, s_z; GPT's RMSNorm gains (Fig. 6, 14)
    extrapolation.png     validation loss at 1x, 2x, 4x the training context (A.7; --extrapolate)
    stats.json            the numbers behind the figures (per-layer values, summaries)
    summary.md            one table row per run

``--extrapolate`` evaluates on the validation split of ``--data`` (default: the run's own
training source, prepared again with the run's tokenizer and split settings, so the split is
the one held out in training). The training context is the run's ``train.block_size`` (or the
model's ``max_seq_len``). Errors (no checkpoint, unreadable data, too little validation data)
print one line and exit with code 2. On a terminal a bar counts the runs analyzed (and
extrapolated); ``--no-progress`` turns it off.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

from recipes.checkpoints import Trained, load_weights
from recipes.cli import prog
from recipes.progress import progress_bar
from spherenet import analysis
from spherenet.checkpoint import RUN_CHECKPOINTS, CheckpointError
from spherenet.data import DataError, prepare_dataset

FIGURES = {
    "embeddings": "fig4_embeddings.png",
    "condition": "fig5_condition.png",
    "scalings": "fig6_scalings.png",
    "extrapolation": "extrapolation.png",
}


def _labels(runs: list[str], trained: list[Trained], given: list[str] | None) -> list[str]:
    if given:
        if len(given) != len(runs):
            raise ValueError(f"--labels gives {len(given)} labels for {len(runs)} runs")
        labels = list(given)
    else:
        labels = []
        for run, t in zip(runs, trained):
            name = Path(run).resolve().name
            if name.startswith("step_") or name == RUN_CHECKPOINTS:
                name = t.path.parent.parent.name
            labels.append(f"{type(t.model).__name__} {name}")
    seen: dict[str, int] = {}
    unique = []
    for label in labels:  # the figures' legends and the JSON keys need distinct names
        seen[label] = seen.get(label, 0) + 1
        unique.append(label if seen[label] == 1 else f"{label} ({seen[label]})")
    return unique


def _per_layer(rows: np.ndarray) -> list[float]:
    return [float(v) for v in np.asarray(rows, dtype=np.float64).mean(axis=1)]


def _finite(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def _json_stats(t: Trained, emb: dict, cond: dict, cond_norm: dict, scal: dict, ext: dict | None) -> dict[str, Any]:
    """The numbers behind the figures, small enough to read: summaries and per-layer values."""
    layers = lambda c: {  # noqa: E731  # a matrix no block has (NaN throughout) is left out
        k: [_finite(v) for v in c[k]] for k in analysis.CONDITION_KEYS if not np.isnan(c[k]).all()
    }
    out: dict[str, Any] = {
        "checkpoint": str(t.path),
        "step": t.step,
        "model": type(t.model).__name__,
        "parameters": sum(p.numel() for p in t.model.parameters()),
        "model_config": dataclasses.asdict(t.model.config),
        "embeddings": {side: {k: _finite(v) for k, v in emb[side]["summary"].items()} for side in ("input", "output")},
        "condition_numbers": layers(cond),
        "condition_numbers_renormalized": layers(cond_norm),
    }
    if scal["family"] == "ngpt":
        out["scalings"] = {
            "alpha_A_mean_abs": _per_layer(np.abs(scal["alpha_A"])),
            "alpha_M_mean_abs": _per_layer(np.abs(scal["alpha_M"])),
            "s_qk_mean": _per_layer(scal["s_qk"]),
            **{f"{k}_mean": _per_layer(scal[k]) for k in ("s_u", "s_v", "s_uv") if k in scal},
            "s_z_quantiles": {str(q): float(np.quantile(scal["s_z"], q)) for q in (0.05, 0.25, 0.5, 0.75, 0.95)},
        }
    else:
        out["rmsnorm_gains"] = {
            "attn_mean": _per_layer(scal["rmsnorm_attn"]),
            "mlp_mean": _per_layer(scal["rmsnorm_mlp"]),
            "out_mean": float(np.mean(scal["rmsnorm_out"])),
        }
    if ext is not None:
        out["extrapolation"] = {
            "block_size": ext["block_size"],
            "contexts": ext["contexts"],
            "tokens_scored": ext["tokens"],
            "loss": [float(v) for v in ext["loss"]],
            "loss_by_segment": [[float(v) for v in seg] for seg in ext["loss_by_segment"]],
        }
    return out


def _markdown(stats: dict[str, dict], factors: list[int] | None) -> str:
    head = [
        "run",
        "model",
        "step",
        "E_in norm mean ± std",
        "E_out norm mean ± std",
        "E_in eig cond",
        "median cond W_q/W_k/W_v",
        "median cond MLP W_u/W_v/W_o",
        "mean |alpha_A| / |alpha_M|",
    ]
    if factors:
        head += [f"val loss {f}x" for f in factors]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, s in stats.items():
        e_in, e_out, c = s["embeddings"]["input"], s["embeddings"]["output"], s["condition_numbers"]

        def med(*keys):
            vals = [
                "-" if k not in c else "inf" if any(v is None for v in c[k]) else f"{float(np.median(c[k])):.3g}"
                for k in keys
            ]
            return " / ".join(vals)

        def num(v, fmt=".3g"):
            return "-" if v is None else format(v, fmt)

        if "scalings" in s:
            sc = s["scalings"]
            alpha = f"{np.mean(sc['alpha_A_mean_abs']):.3f} / {np.mean(sc['alpha_M_mean_abs']):.3f}"
        else:
            alpha = "- (GPT)"
        row = [
            label,
            s["model"],
            str(s["step"]),
            f"{e_in['norm_mean']:.3f} ± {e_in['norm_std']:.3f}",
            f"{e_out['norm_mean']:.3f} ± {e_out['norm_std']:.3f}",
            num(e_in["eig_condition"]),
            med("attn_q", "attn_k", "attn_v"),
            med("mlp_u", "mlp_v", "mlp_o"),
            alpha,
        ]
        if factors:
            ext = s.get("extrapolation")
            row += [f"{v:.4f}" for v in ext["loss"]] if ext else ["-"] * len(factors)
        lines.append("| " + " | ".join(row) + " |")
    notes = [
        "",
        "Condition numbers: sigma_max / sigma_min (float64 SVD), per head then the median for attention "
        "(nGPT paper Fig. 5). Eigenvalue condition: largest / smallest non-zero eigenvalue of the "
        "embeddings' covariance (Fig. 4).",
    ]
    if factors:
        notes.append(
            "Extrapolation: the same validation tokens scored with windows of f x the training context (Appendix A.7)."
        )
    return "\n".join(lines + notes) + "\n"


def _validation_tokens(t: Trained, source: str | None, cache_dir: str | None, out: Path) -> np.ndarray:
    data_cfg = dict(t.config.get("data", {}))
    own = source is None or source == data_cfg.get("source")
    src = data_cfg.get("source", "stdlib") if source is None else source
    cache = Path(cache_dir or data_cfg.get("cache_dir") or out / "data_cache")
    kwargs: dict[str, Any] = {}
    if own:  # the run's own split settings: the validation documents it held out
        kwargs = dict(
            text_field=data_cfg.get("text_field", "text"),
            hub_config=data_cfg.get("subset") or None,
            hub_split=data_cfg.get("split", "train"),
            max_documents=data_cfg.get("max_docs") or None,
            val_fraction=data_cfg.get("val_fraction", 0.01),
            seed=data_cfg.get("seed", 0),
        )
    data = prepare_dataset(src, t.tokenizer, cache, **kwargs)
    return np.asarray(data.tokens("val"))


def _block_size(t: Trained) -> int:
    return int(t.config.get("train", {}).get("block_size") or 0) or int(t.model.config.max_seq_len)


def analyze(args: argparse.Namespace) -> int:
    out = Path(args.out)
    trained = [load_weights(run, args.device) for run in args.runs]
    if args.extrapolate and args.data is None:
        exported = [str(t.path) for t in trained if t.exported]
        if exported:
            raise ValueError(
                f"--extrapolate scores each run's own validation data, and an exported model records none "
                f"({', '.join(exported)}): name the data with --data"
            )
    labels = _labels(args.runs, trained, args.labels)
    out.mkdir(parents=True, exist_ok=True)

    emb, cond, cond_norm, scal, ext = {}, {}, {}, {}, {}
    stages = 2 if args.extrapolate else 1  # statistics, then the longer contexts
    bar = progress_bar(len(trained) * stages, "analyze", args.progress, unit="stage")
    say = bar.write if bar is not None else lambda line: print(line, file=sys.stderr, flush=True)
    try:
        for label, t in zip(labels, trained):
            say(f"# {label}: {t.describe()}")
            if bar is not None:
                bar.set_postfix_str(f"{label}: statistics")
            emb[label] = analysis.embedding_stats(t.model, max_pairs=args.max_pairs)
            cond[label] = analysis.condition_numbers(t.model)
            cond_norm[label] = analysis.condition_numbers(t.model, normalize=True)
            scal[label] = analysis.scaling_factors(t.model)
            if bar is not None:
                bar.update(1)
            if args.extrapolate:
                if bar is not None:
                    bar.set_postfix_str(f"{label}: extrapolation x{', x'.join(map(str, args.factors))}")
                tokens = _validation_tokens(t, args.data, args.cache_dir, out)
                ext[label] = analysis.length_extrapolation(
                    t.model, tokens, _block_size(t), args.factors, batches=args.eval_batches, batch_size=args.batch_size
                )
                if bar is not None:
                    bar.update(1)
    finally:
        if bar is not None:
            bar.close()

    written = [
        analysis.plot_embeddings(emb, out / FIGURES["embeddings"]),
        # dotted lines only where renormalizing changes something: GPT (nGPT is unit already)
        analysis.plot_condition_numbers(
            cond,
            out / FIGURES["condition"],
            normalized={k: v for k, v in cond_norm.items() if scal[k]["family"] == "gpt"},
        ),
        analysis.plot_scalings(scal, out / FIGURES["scalings"]),
    ]
    if args.extrapolate:
        written.append(analysis.plot_extrapolation(ext, out / FIGURES["extrapolation"]))

    stats = {
        label: _json_stats(t, emb[label], cond[label], cond_norm[label], scal[label], ext.get(label))
        for label, t in zip(labels, trained)
    }
    (out / "stats.json").write_text(json.dumps(stats, indent=1, default=str))
    table = _markdown(stats, [int(f) for f in args.factors] if args.extrapolate else None)
    (out / "summary.md").write_text(table)
    print(table)
    print("wrote " + ", ".join(str(p) for p in [*written, out / "stats.json", out / "summary.md"]))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=prog("recipes.analyze"), description=__doc__.split("\n\n")[0])
    p.add_argument(
        "runs",
        nargs="+",
        metavar="RUN_DIR",
        help="run directory, checkpoints/ directory, step_* checkpoint, exported directory or Hub id",
    )
    p.add_argument("--out", required=True, help="directory for the figures, stats.json and summary.md")
    p.add_argument("--labels", nargs="+", help="legend names, one per RUN_DIR (default: model class + directory name)")
    p.add_argument("--extrapolate", action="store_true", help="also measure validation loss at longer contexts (A.7)")
    p.add_argument("--data", default=None, help="data source for --extrapolate (default: each run's training source)")
    p.add_argument(
        "--cache-dir", default=None, help="where prepared data is cached (default: the run's data.cache_dir)"
    )
    p.add_argument("--factors", nargs="+", type=int, default=[1, 2, 4], help="context multiples (default 1 2 4)")
    p.add_argument("--eval-batches", type=int, default=4, help="token budget = batches x batch size x context")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--max-pairs", type=int, default=100_000, help="pairwise dot products sampled per embedding")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    args = p.parse_args(argv)
    try:
        if any(f < 1 for f in args.factors) or args.eval_batches < 1 or args.batch_size < 1 or args.max_pairs < 1:
            raise ValueError("--factors, --eval-batches, --batch-size and --max-pairs must be >= 1")
        return analyze(args)
    except (CheckpointError, DataError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
