"""Figures of the inspections in :mod:`spherenet.analysis`: several models on one figure (e.g.
nGPT against GPT, as the paper's figures do), each a small PNG (matplotlib's Agg backend, 80 dpi)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from .spectra import CONDITION_KEYS


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.set_dpi(80)
    fig.canvas.draw()
    rgb = np.asarray(fig.canvas.buffer_rgba())[..., :3]
    _pyplot().close(fig)
    from PIL import Image  # matplotlib's own dependency

    # A 128-colour palette PNG: a third of the bytes of full RGB, no visible change for line plots.
    Image.fromarray(rgb).quantize(colors=128).save(path, format="PNG", optimize=True)
    return path


def _thin(values: np.ndarray, limit: int = 2000) -> tuple[np.ndarray, np.ndarray]:
    """Sorted values against their normalized rank in [0, 1], thinned to at most ``limit``
    points (the curves of Fig. 4; keeps the PNGs small)."""
    v = np.sort(np.asarray(values, dtype=np.float64))
    if v.size == 0:
        return v, v
    rank = np.linspace(0.0, 1.0, v.size)
    if v.size > limit:
        keep = np.unique(np.linspace(0, v.size - 1, limit).astype(np.int64))
        v, rank = v[keep], rank[keep]
    return rank, v


def _log_y(ax) -> None:
    """Log y axis labelled in plain numbers at 1, 2, 5 x 10^k (at 10^k only over more than 2.5
    decades), with no crowd of minor labels (which also keeps the PNG small)."""
    from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter

    ax.set_yscale("log")
    lo, hi = ax.get_ylim()  # call after plotting: the data's range
    wide = lo > 0 and hi / lo > 10**2.5  # 1, 2, 5 in every decade would be too many ticks
    locator = LogLocator(base=10, subs=(1.0,) if wide else (1.0, 2.0, 5.0))
    if sum(lo <= t <= hi for t in locator.tick_values(lo, hi)) < 2:  # a narrow range: evenly spaced values
        locator = MaxNLocator(nbins=4)
    ax.yaxis.set_major_locator(locator)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())


def _layer_axis(n: int) -> np.ndarray:
    """Normalized layer index in [0, 1] (Fig. 5, 6 share this axis across model depths)."""
    return np.linspace(0.0, 1.0, n) if n > 1 else np.zeros(1)


def plot_embeddings(stats: Mapping[str, Mapping[str, Any]], path: str | Path, title: str | None = None) -> Path:
    """Fig. 4 for several models: ``stats`` maps a label to :func:`embedding_stats`' result.

    Rows: input, output embeddings. Columns: sorted row norms, eigenvalues of the covariance /
    median (log scale), sorted pairwise dot products; x is the normalized rank.
    """
    plt = _pyplot()
    fig, axes = plt.subplots(2, 3, figsize=(11, 5.8))
    for color, (label, st) in enumerate(stats.items()):
        for row, side in enumerate(("input", "output")):
            s = st[side]
            axes[row, 0].plot(*_thin(s["norms"]), color=f"C{color}", label=label)
            eig = np.asarray(s["eigenvalues"])[::-1]  # ascending, as the rank axis grows
            if np.all(np.isfinite(eig)):
                positive = np.where(eig > 0, eig, np.nan)
                axes[row, 1].plot(np.linspace(0, 1, eig.size), positive, color=f"C{color}", label=label)
            axes[row, 2].plot(*_thin(s["dots"]), color=f"C{color}", label=label)
    for row, side in enumerate(("input", "output")):
        axes[row, 0].set_title(f"norms of {side} embeddings", fontsize=9)
        axes[row, 0].set_ylabel("norm")
        axes[row, 1].set_title(f"eigenvalues / median, {side} embeddings", fontsize=9)
        _log_y(axes[row, 1])
        axes[row, 2].set_title(f"pairwise dot products, {side} embeddings", fontsize=9)
        for ax in axes[row]:
            ax.set_xlabel("normalized rank")
            ax.grid(alpha=0.3)
    axes[0, 0].legend(fontsize=8)
    fig.suptitle(title or "Embeddings (nGPT paper, Fig. 4)", fontsize=10)
    return _save(fig, path)


def plot_condition_numbers(
    conds: Mapping[str, Mapping[str, Any]],
    path: str | Path,
    normalized: Mapping[str, Mapping[str, Any]] | None = None,
    title: str | None = None,
) -> Path:
    """Fig. 5 for several models: ``conds`` maps a label to :func:`condition_numbers`' result;
    one panel per matrix, condition number (log scale) against the normalized layer index.
    ``normalized`` (same labels, ``normalize=True`` results) adds dotted lines, as Fig. 10 does
    for GPT's matrices renormalized after training."""
    plt = _pyplot()
    fig, axes = plt.subplots(2, 4, figsize=(12.5, 5.5))
    flat = axes.ravel()
    for color, (label, c) in enumerate(conds.items()):
        x = _layer_axis(int(c["n_layers"]))
        for ax, key in zip(flat, CONDITION_KEYS):
            ax.plot(x, c[key], "o-", ms=3, color=f"C{color}", label=label)
            if normalized and label in normalized:
                ax.plot(x, normalized[label][key], "o:", ms=2, color=f"C{color}", label=f"{label}, rows renormalized")
    for ax, (key, (_, name)) in zip(flat, CONDITION_KEYS.items()):
        ax.set_title(name, fontsize=9)
        _log_y(ax)
        ax.set_xlabel("normalized layer index")
        ax.grid(alpha=0.3)
    flat[-1].axis("off")
    handles, labels = flat[0].get_legend_handles_labels()
    flat[-1].legend(handles, labels, fontsize=8, loc="center")
    fig.suptitle(title or "Condition numbers (nGPT paper, Fig. 5; dotted: Fig. 10)", fontsize=10)
    return _save(fig, path)


def _band(ax, x, rows: np.ndarray, color: str, label: str, style: str = "o-") -> None:
    """Per-layer mean of ``rows`` (L, n) with its 25-75% band."""
    rows = np.asarray(rows, dtype=np.float64)
    ax.plot(x, rows.mean(axis=1), style, ms=3, color=color, label=label)
    if rows.shape[1] > 1:
        lo, hi = np.percentile(rows, [25, 75], axis=1)
        ax.fill_between(x, lo, hi, color=color, alpha=0.15, linewidth=0)


def plot_scalings(scalings: Mapping[str, Mapping[str, Any]], path: str | Path, title: str | None = None) -> Path:
    """Fig. 6 (and 14) for several models: ``scalings`` maps a label to :func:`scaling_factors`'
    result. Panels: |alpha_A| and |alpha_M| per layer (mean, 25-75% band), s_u and s_v per layer,
    s_qk per layer, the sorted s_z values, and for GPT models the RMSNorm gains per layer."""
    plt = _pyplot()
    fig, axes = plt.subplots(2, 3, figsize=(12, 6))
    (a_attn, a_mlp, uv), (qk, sz, gains) = axes
    has = {"ngpt": False, "gpt": False}
    for color, (label, s) in enumerate(scalings.items()):
        col = f"C{color}"
        if s.get("family") == "ngpt":
            has["ngpt"] = True
            x = _layer_axis(len(s["alpha_A"]))
            _band(a_attn, x, np.abs(s["alpha_A"]), col, label)
            _band(a_mlp, x, np.abs(s["alpha_M"]), col, label)
            for name, style in (("s_u", "o-"), ("s_v", "s--"), ("s_uv", "^-")):
                if name in s:  # s_uv: the squared-ReLU MLP's one scale
                    _band(uv, x, s[name], col, f"{label} {name}", style=style)
            _band(qk, x, s["s_qk"], col, label)
            sz.plot(*_thin(s["s_z"]), color=col, label=label)
        elif s.get("family") == "gpt":
            has["gpt"] = True
            x = _layer_axis(len(s["rmsnorm_attn"]))
            _band(gains, x, s["rmsnorm_attn"], col, f"{label} before attention")
            _band(gains, x, s["rmsnorm_mlp"], col, f"{label} before MLP", style="s--")
    for ax, name in (
        (a_attn, "|alpha_A| per layer (eq. 10)"),
        (a_mlp, "|alpha_M| per layer (eq. 11)"),
        (uv, "s_u, s_v per layer (eq. 20, 21)"),
        (qk, "s_qk per layer (eq. 15, 16)"),
        (gains, "GPT: RMSNorm gains per layer"),
    ):
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("normalized layer index")
    sz.set_title("s_z, sorted (eq. 3)", fontsize=9)
    sz.set_xlabel("normalized rank")
    for ax in axes.ravel():
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    for ax, family in ((a_attn, "ngpt"), (a_mlp, "ngpt"), (uv, "ngpt"), (qk, "ngpt"), (sz, "ngpt"), (gains, "gpt")):
        if not has[family]:
            ax.text(
                0.5,
                0.5,
                f"no {'nGPT' if family == 'ngpt' else 'GPT'} model",
                ha="center",
                va="center",
                transform=ax.transAxes,
                color="gray",
            )
    fig.suptitle(title or "Eigen learning rates and scaling factors (nGPT paper, Fig. 6, 14)", fontsize=10)
    return _save(fig, path)


def plot_extrapolation(results: Mapping[str, Mapping[str, Any]], path: str | Path, title: str | None = None) -> Path:
    """Appendix A.7 for several models: ``results`` maps a label to
    :func:`length_extrapolation`'s result. Left: validation loss against the evaluated context
    (the training context marked). Right: at the longest context, the loss by position segment
    (positions past the training context were never trained on)."""
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    blocks = set()
    for color, (label, r) in enumerate(results.items()):
        col = f"C{color}"
        left.plot(r["contexts"], r["loss"], "o-", color=col, label=label)
        seg = np.asarray(r["loss_by_segment"][int(np.argmax(r["factors"]))])
        b = int(r["block_size"])
        blocks.add(b)
        right.step(np.arange(seg.size + 1) * b, np.r_[seg, seg[-1:]], where="post", color=col, label=label)
    for b in blocks:
        left.axvline(b, color="gray", ls=":", lw=1)
        right.axvline(b, color="gray", ls=":", lw=1)
    left.set_xscale("log", base=2)
    from matplotlib.ticker import FuncFormatter, NullFormatter

    left.set_xticks(sorted({c for r in results.values() for c in r["contexts"]}))
    left.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    left.xaxis.set_minor_formatter(NullFormatter())
    left.set_xlabel("evaluated context (tokens); dotted: training context")
    left.set_ylabel("validation loss")
    right.set_xlabel("position in the window (tokens)")
    right.set_ylabel("mean loss over the segment")
    right.set_title("longest context: loss by position", fontsize=9)
    for ax in (left, right):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title or "Length extrapolation (nGPT paper, Appendix A.7)", fontsize=10)
    return _save(fig, path)
