"""Inspect a trained nGPT or GPT the way Section 3.2 of the nGPT paper does, and plot it.

Every function takes a model (:class:`~spherenet.models.NGPT` or :class:`~spherenet.models.GPT`,
also when wrapped by ``torch.compile`` or DDP) and returns plain data: dicts of float64 numpy
arrays and Python floats, ready for JSON or for the ``plot_*`` functions.

- :func:`embedding_stats` (Fig. 4): norms of the rows of the input and output embeddings, the
  eigenvalues of their covariance divided by the median eigenvalue, and pairwise dot products.
- :func:`condition_numbers` (Fig. 5; Fig. 10's dotted lines with ``normalize=True``): per layer,
  the median over heads of the condition numbers of the attention matrices, and the condition
  numbers of the three MLP matrices.
- :func:`scaling_factors` (Fig. 6 and 14): per layer the eigen learning rates alpha_A, alpha_M
  (eq. 10, 11) and the scalings s_qk (eq. 15, 16), s_u, s_v (eq. 20, 21), and s_z (eq. 3).
- :func:`length_extrapolation` (Appendix A.7, Fig. 13): validation loss at 1x, 2x, 4x the
  training context, on the same scored tokens.

The ``plot_*`` functions draw several models on one figure (e.g. nGPT against GPT, as the
paper's figures do) into a small PNG (matplotlib's Agg backend, 80 dpi). Nothing here trains or
modifies the model it is given.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "condition_number",
    "embedding_stats",
    "condition_numbers",
    "scaling_factors",
    "with_max_seq_len",
    "length_extrapolation",
    "plot_embeddings",
    "plot_condition_numbers",
    "plot_scalings",
    "plot_extrapolation",
    "CONDITION_KEYS",
]

#: The matrices of :func:`condition_numbers`, in the order of Fig. 5 (then W_o of attention):
#: key -> (block attribute path, label used on the plots).
CONDITION_KEYS: dict[str, tuple[str, str]] = {
    "attn_q": ("attn.w_q", "W_q (median over heads)"),
    "attn_k": ("attn.w_k", "W_k (median over heads)"),
    "attn_v": ("attn.w_v", "W_v (median over heads)"),
    "attn_o": ("attn.w_o", "W_o attention (median over heads)"),
    "mlp_u": ("mlp.w_u", "W_u (MLP 1)"),
    "mlp_v": ("mlp.w_v", "W_v gate (MLP 1)"),
    "mlp_o": ("mlp.w_o", "W_o MLP (MLP 2)"),
}


# ---------------------------------------------------------------------------------------------
# Helpers


def _unwrap(model: nn.Module) -> nn.Module:
    """The NGPT/GPT inside ``torch.compile`` (``_orig_mod``) and DDP (``module``) wrappers."""
    for _ in range(8):  # nested wrappers, e.g. DDP(torch.compile(model))
        inner = getattr(model, "_orig_mod", None)
        if not isinstance(inner, nn.Module):
            inner = getattr(model, "module", None)
        if not isinstance(inner, nn.Module):
            break
        model = inner
    return model


def _family(model: nn.Module) -> str:
    """``"ngpt"`` or ``"gpt"``; a TypeError for anything else."""
    from ..models import GPT, NGPT

    if isinstance(model, NGPT):
        return "ngpt"
    if isinstance(model, GPT):
        return "gpt"
    raise TypeError(f"expected an NGPT or GPT model, got {type(model).__name__}")


def _matrix(layer: nn.Module) -> torch.Tensor:
    """A linear layer's weight in torch's ``(out_features, in_features)`` convention.

    :class:`~spherenet.layers.SphereLinear` stores its ``sphere="out"`` weights transposed;
    ``matrix()`` undoes that. ``nn.Linear``/``nn.Embedding`` weights are used as they are.
    """
    if hasattr(layer, "matrix"):
        return layer.matrix()
    return layer.weight


def _f64(t: torch.Tensor) -> np.ndarray:
    return t.detach().to(device="cpu", dtype=torch.float64).numpy().copy()


def _attr(module: nn.Module, dotted: str) -> nn.Module:
    for part in dotted.split("."):
        module = getattr(module, part)
    return module


# ---------------------------------------------------------------------------------------------
# Fig. 4: embeddings


def _embedding_tables(model: nn.Module) -> dict[str, torch.Tensor]:
    """``{"input": E_input, "output": E_output}``, each ``(vocab_size, d_model)`` (eq. 1)."""
    return {"input": model.embed_in.weight, "output": _matrix(model.embed_out)}


def _pairwise_dots(rows: np.ndarray, max_pairs: int, seed: int, cosine: bool) -> tuple[np.ndarray, np.ndarray, bool]:
    """Dot products ``rows[i] . rows[j]`` for ``i != j``: all ``V (V-1) / 2`` pairs ``i < j``
    when there are at most ``max_pairs``, else ``max_pairs`` pairs drawn uniformly (with
    replacement) from ``numpy.random.default_rng(seed)``. Returns (dots, pairs (n, 2), exact)."""
    if cosine:
        rows = rows / np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), 1e-300)
    v = rows.shape[0]
    if v < 2:
        return np.zeros(0), np.zeros((0, 2), dtype=np.int64), True
    if v * (v - 1) // 2 <= max_pairs:
        i, j = np.triu_indices(v, k=1)
        gram = rows @ rows.T
        return gram[i, j], np.stack([i, j], axis=1).astype(np.int64), True
    rng = np.random.default_rng(seed)
    i = rng.integers(0, v, size=max_pairs)
    j = (i + rng.integers(1, v, size=max_pairs)) % v  # uniform over j != i
    dots = np.empty(max_pairs)
    chunk = max(1, (1 << 22) // rows.shape[1])  # bounded memory: chunk x d_model values at a time
    for start in range(0, max_pairs, chunk):
        a, b = i[start : start + chunk], j[start : start + chunk]
        dots[start : start + chunk] = np.einsum("nd,nd->n", rows[a], rows[b])
    return dots, np.stack([i, j], axis=1).astype(np.int64), False


def _sorted_eigenvalues(rows: np.ndarray, center: bool) -> np.ndarray:
    """Eigenvalues of the ``(d, d)`` covariance of the rows, descending, clipped at 0."""
    x = rows - rows.mean(axis=0, keepdims=True) if center else rows
    cov = x.T @ x / max(x.shape[0] - 1, 1)
    eig = np.linalg.eigvalsh(cov)[::-1]
    return np.clip(eig, 0.0, None)


def embedding_stats(
    model: nn.Module,
    *,
    max_pairs: int = 100_000,
    seed: int = 0,
    center: bool = True,
    cosine: bool = False,
) -> dict[str, dict[str, Any]]:
    """What Fig. 4 plots, for the input and the output embeddings.

    Returns ``{"input": stats, "output": stats}``, the rows of ``E_input`` and ``E_output``
    (eq. 1; for nGPT the unit vectors of Section 2.1), each ``stats`` holding:

    - ``norms``: ``(V,)`` the L2 norm of every row, in token-id order (Fig. 4, left). nGPT's are
      1 by construction; GPT's spread.
    - ``eigenvalues``: ``(d,)`` the eigenvalues of the covariance of the rows (centred when
      ``center``), descending, **divided by their median** (Fig. 4, middle). A median of 0
      (fewer tokens than half of d_model) leaves them all ``nan``.
    - ``eigenvalues_raw``: the same before the division.
    - ``dots``: pairwise dot products ``E_i . E_j``, ``i != j`` (Fig. 4, right; raw dot
      products as in the paper, cosines with ``cosine=True``). All ``V(V-1)/2`` pairs when that
      is at most ``max_pairs``, otherwise ``max_pairs`` pairs drawn uniformly with a
      ``numpy.random.default_rng(seed)`` generator (so a 32k vocabulary, 5e8 pairs, costs
      ``max_pairs`` dot products and the result is reproducible).
    - ``pairs``: ``(n, 2)`` the token ids of each dot product; ``pairs_exact``: whether all
      pairs were used.
    - ``summary``: floats: norm mean/std/min/max, ``eig_condition`` (largest / smallest
      non-zero eigenvalue, the paper's "condition number" of the embeddings), dot mean/median.
    """
    if not isinstance(max_pairs, int) or max_pairs < 1:
        raise ValueError(f"max_pairs must be a positive int, got {max_pairs!r}")
    model = _unwrap(model)
    _family(model)
    out: dict[str, dict[str, Any]] = {}
    for side, table in _embedding_tables(model).items():
        rows = _f64(table)
        norms = np.linalg.norm(rows, axis=1)
        raw = _sorted_eigenvalues(rows, center)
        median = float(np.median(raw))
        normalized = raw / median if median > 0 else np.full_like(raw, np.nan)
        positive = raw[raw > raw[0] * 1e-12] if raw[0] > 0 else raw[:0]
        dots, pairs, exact = _pairwise_dots(rows, max_pairs, seed, cosine)
        out[side] = {
            "norms": norms,
            "eigenvalues": normalized,
            "eigenvalues_raw": raw,
            "dots": dots,
            "pairs": pairs,
            "pairs_exact": exact,
            "summary": {
                "norm_mean": float(norms.mean()),
                "norm_std": float(norms.std()),
                "norm_min": float(norms.min()),
                "norm_max": float(norms.max()),
                "eig_condition": float(positive[0] / positive[-1]) if positive.size else math.nan,
                "dot_mean": float(dots.mean()) if dots.size else math.nan,
                "dot_median": float(np.median(dots)) if dots.size else math.nan,
            },
        }
    return out


# ---------------------------------------------------------------------------------------------
# Fig. 5 (and Fig. 10): condition numbers


def condition_number(matrix: torch.Tensor | np.ndarray) -> np.ndarray | float:
    """``sigma_max / sigma_min`` of a matrix (or of each matrix of a stack ``(..., m, n)``),
    from float64 singular values. ``inf`` where the smallest singular value is 0."""
    t = torch.as_tensor(matrix).detach().to(device="cpu", dtype=torch.float64)
    if t.ndim < 2:
        raise ValueError(f"condition_number needs a matrix, got shape {tuple(t.shape)}")
    s = torch.linalg.svdvals(t)
    smax, smin = s[..., 0], s[..., -1]
    cond = torch.where(
        smin > 0, smax / torch.where(smin > 0, smin, torch.ones_like(smin)), torch.full_like(smax, math.inf)
    )
    return float(cond) if cond.ndim == 0 else cond.numpy()


def _unit_along(m: torch.Tensor, dim: int) -> torch.Tensor:
    norm = m.norm(dim=dim, keepdim=True)
    return m / torch.where(norm > 0, norm, torch.ones_like(norm))


def _blocks(key: str, m: torch.Tensor, n_heads: int, d_model: int, normalize: bool) -> torch.Tensor:
    """The matrices whose condition numbers are taken for ``key``, a stack ``(k, rows, cols)``.

    Attention: one block per head. ``W_q, W_k, W_v`` (``(d, d)`` as ``(out, in)``) give head
    ``h`` the output rows ``h d_k .. (h+1) d_k``, a ``(d_k, d)`` matrix; ``W_o`` gives it the
    input columns of the same range, ``(d, d_k)``. MLP: the whole matrix.

    ``normalize``: first make every vector along the d_model-sized side a unit vector (the side
    nGPT keeps on the sphere, chosen by role and not by size: rows of W_q, W_k, W_v, W_u, W_v
    gate; columns of both W_o) -- the "renormalized after training" dotted lines of Fig. 10.
    """
    d_side = 1 if key in ("attn_q", "attn_k", "attn_v", "mlp_u", "mlp_v") else 0  # axis of length d_model
    if m.shape[d_side] != d_model:
        raise ValueError(
            f"{key}: expected its d_model side (dim {d_side}) to have {d_model} entries, got {tuple(m.shape)}"
        )
    if normalize:
        m = _unit_along(m, d_side)
    if key in ("attn_q", "attn_k", "attn_v"):
        return m.reshape(n_heads, m.shape[0] // n_heads, m.shape[1])
    if key == "attn_o":
        return m.reshape(m.shape[0], n_heads, m.shape[1] // n_heads).permute(1, 0, 2)
    return m.unsqueeze(0)


@torch.no_grad()
def condition_numbers(model: nn.Module, *, normalize: bool = False) -> dict[str, Any]:
    """Condition numbers of every block's matrices (Fig. 5; ``normalize=True``: Fig. 10's dotted
    lines, where GPT's matrices are renormalized after training).

    Returns ``{key: (L,) array}`` for the keys of :data:`CONDITION_KEYS`: ``attn_q``,
    ``attn_k``, ``attn_v``, ``attn_o`` are the **median over heads** of the per-head condition
    numbers (Fig. 5 uses the median across heads; W_o, which Fig. 5 leaves out, is split the same
    way, by the columns each head writes through); ``mlp_u``, ``mlp_v``, ``mlp_o`` are those of
    the whole matrices W_u, W_v (gate), W_o_mlp ("MLP11, MLP12, MLP2" in Fig. 10). Also
    ``{key}_heads``: ``(L, H)`` the per-head values, ``n_layers``, ``n_heads`` and ``normalize``.

    Computed from float64 singular values (:func:`condition_number`); a singular matrix gives
    ``inf``. nGPT's matrices are already unit along the d_model side, so ``normalize`` changes
    its numbers only by rounding.
    """
    model = _unwrap(model)
    _family(model)
    c = model.config
    per_key: dict[str, list] = {k: [] for k in CONDITION_KEYS}
    per_head: dict[str, list] = {k: [] for k in CONDITION_KEYS}
    for block in model.blocks:
        for key, (path, _) in CONDITION_KEYS.items():
            m = _matrix(_attr(block, path)).detach().to(device="cpu", dtype=torch.float64)
            conds = np.atleast_1d(condition_number(_blocks(key, m, c.n_heads, c.d_model, normalize)))
            per_key[key].append(float(np.median(conds)))
            per_head[key].append(conds)
    out: dict[str, Any] = {k: np.asarray(v) for k, v in per_key.items()}
    for k in ("attn_q", "attn_k", "attn_v", "attn_o"):
        out[f"{k}_heads"] = np.stack(per_head[k])
    out.update(n_layers=len(model.blocks), n_heads=c.n_heads, normalize=bool(normalize))
    return out


# ---------------------------------------------------------------------------------------------
# Fig. 6 and 14: eigen learning rates and scaling factors


@torch.no_grad()
def scaling_factors(model: nn.Module) -> dict[str, Any]:
    """The learned scalings, as used in the forward pass (``s * s_init / s_scale``, Section 2.5).

    nGPT (Fig. 6, 14) -- every array float64, one row per layer:

    - ``alpha_A``, ``alpha_M``: ``(L, d)`` the eigen learning rates of eq. 10, 11 as applied:
      ``|alpha|`` when the model uses ``alpha_abs`` (Appendix A.2), else signed
      (:meth:`~spherenet.layers.SphericalResidual.effective_alpha`). Fig. 6 (left) plots the
      per-layer mean of their absolute values.
    - ``s_qk``: ``(L, d)`` (``d_k`` per head, heads concatenated), eq. 15, 16.
    - ``s_u``, ``s_v``: ``(L, d_MLP)``, eq. 20, 21. ``s_v`` is the learned factor alone: the
      forward pass multiplies v by ``s_v * sqrt(d_model)``.
    - ``s_z``: ``(V,)`` the per-token logit scaling of eq. 3.

    A ``"scalar"`` mode gives width-1 rows, a ``"fixed"`` one its constant. At initialization
    every alpha is ``alpha_init`` (0.05) and every s is 1 (Section 2.6).

    GPT has none of these. Its only per-dimension scalings are the RMSNorm gains, returned
    instead: ``rmsnorm_attn``, ``rmsnorm_mlp`` ``(L, d)`` (before attention / MLP, eq. 4, 5) and
    ``rmsnorm_out`` ``(d,)`` (the final norm); all 1 at initialization.

    The result also holds ``family`` (``"ngpt"`` or ``"gpt"``).
    """
    model = _unwrap(model)
    family = _family(model)
    if family == "ngpt":
        rows: dict[str, list] = {k: [] for k in ("alpha_A", "alpha_M", "s_qk", "s_u", "s_v")}
        for block in model.blocks:
            rows["alpha_A"].append(_f64(block.residual_attn.effective_alpha()))
            rows["alpha_M"].append(_f64(block.residual_mlp.effective_alpha()))
            rows["s_qk"].append(_f64(block.attn.s_qk()))
            rows["s_u"].append(_f64(block.mlp.s_u()))
            rows["s_v"].append(_f64(block.mlp.s_v()))
        out: dict[str, Any] = {k: np.stack(v) for k, v in rows.items()}
        out["s_z"] = _f64(model.s_z())
    else:
        out = {
            "rmsnorm_attn": np.stack([_f64(b.norm_attn.weight) for b in model.blocks]),
            "rmsnorm_mlp": np.stack([_f64(b.norm_mlp.weight) for b in model.blocks]),
            "rmsnorm_out": _f64(model.norm_out.weight),
        }
    out["family"] = family
    return out


# ---------------------------------------------------------------------------------------------
# Appendix A.7: length extrapolation


def with_max_seq_len(model: nn.Module, max_seq_len: int) -> nn.Module:
    """A copy of ``model`` whose config allows sequences of ``max_seq_len`` tokens.

    Neither model has learned positions: RoPE (shared by all blocks) computes its rotation
    angles for any position, and ``max_seq_len`` only bounds the accepted input length. So the
    same state dict loads, unchanged, into a model built from the config with a larger
    ``max_seq_len`` (``strict=True``: an error if any tensor were missing or extra). The copy
    is on the original's device and dtype, in eval mode; the original is not touched.
    """
    from ..models import model_from_config

    model = _unwrap(model)
    _family(model)
    if not isinstance(max_seq_len, int) or max_seq_len < 1:
        raise ValueError(f"max_seq_len must be a positive int, got {max_seq_len!r}")
    config = dataclasses.replace(model.config, max_seq_len=max_seq_len)
    param = next(model.parameters())
    with torch.random.fork_rng(devices=[]):  # the throw-away init must not move the caller's RNG
        copy = model_from_config(config)
    copy.to(device=param.device, dtype=param.dtype)
    copy.load_state_dict(model.state_dict(), strict=True)
    return copy.eval()


def _token_array(tokens: Any) -> np.ndarray:
    """A 1-D integer array from a numpy array, a torch tensor, a TokenWindows, or a
    PreparedData (its validation split)."""
    if hasattr(tokens, "tokens") and callable(tokens.tokens):  # PreparedData
        tokens = tokens.tokens("val")
    elif hasattr(tokens, "tokens") and hasattr(tokens, "eval_batches"):  # TokenWindows
        tokens = tokens.tokens
    if isinstance(tokens, torch.Tensor):
        tokens = tokens.detach().cpu().numpy()
    arr = np.asarray(tokens)
    if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"tokens must be a 1-D integer array of token ids, got dtype {arr.dtype}, shape {arr.shape}")
    return arr


@torch.no_grad()
def length_extrapolation(
    model: nn.Module,
    tokens: Any,
    block_size: int,
    factors: Sequence[int] = (1, 2, 4),
    *,
    batches: int = 4,
    batch_size: int = 8,
    device: str | torch.device | None = None,
) -> dict[str, Any]:
    """Validation loss at contexts ``f * block_size`` for each ``f`` in ``factors`` (Appendix
    A.7, Fig. 13: the paper reports PG19 perplexity from 1k to 32k tokens).

    ``tokens``: the validation token ids (a 1-D array or tensor, a
    :class:`~spherenet.data.TokenWindows`, or a :class:`~spherenet.data.PreparedData`, whose
    ``val`` split is used). ``block_size``: the training context.

    Every factor scores **the same tokens**: the first ``span`` targets of ``tokens``, where
    ``span`` is ``batches * batch_size * block_size`` rounded down to a multiple of
    ``max(factors) * block_size`` (and shortened to what ``tokens`` holds). At factor ``f`` they
    are cut into consecutive windows of ``f * block_size`` tokens, so only the context available
    to each prediction differs. Batches hold ``max(1, batch_size // f)`` windows (constant
    memory per forward).

    The model is evaluated through :func:`with_max_seq_len` when the longest context exceeds its
    ``max_seq_len`` (a copy; the given model's weights, config and mode stay as they were).

    Returns ``block_size``, ``factors``, ``contexts``, ``tokens`` (= ``span``), ``loss`` (mean
    next-token cross entropy per factor, float64 array), ``perplexity`` and ``loss_by_segment``:
    for each factor, the mean loss over positions ``[k b, (k+1) b)`` of the windows, ``k < f``
    (positions past ``block_size`` were never seen in training; with equal token counts per
    segment their mean is ``loss``).
    """
    inner = _unwrap(model)
    _family(inner)
    if not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size must be a positive int, got {block_size!r}")
    factors = [int(f) for f in factors]
    if not factors or any(f < 1 for f in factors):
        raise ValueError(f"factors must be positive ints, got {factors!r}")
    if batches < 1 or batch_size < 1:
        raise ValueError(f"batches and batch_size must be >= 1, got {batches}, {batch_size}")
    arr = _token_array(tokens)
    longest = max(factors) * block_size
    budget = batches * batch_size * block_size
    span = (min(budget, len(arr) - 1) // longest) * longest
    if span == 0:
        span = longest if len(arr) - 1 >= longest else 0
    if span == 0:
        raise ValueError(
            f"length_extrapolation needs at least {longest + 1} tokens (one window of "
            f"{max(factors)} x {block_size}), got {len(arr)}"
        )
    if arr.size and int(arr[: span + 1].max()) >= inner.config.vocab_size:
        raise ValueError(f"tokens hold ids >= the model's vocab_size {inner.config.vocab_size}")

    param = next(inner.parameters())
    device = param.device if device is None else torch.device(device)
    if longest <= inner.config.max_seq_len and device == param.device:
        runner = inner  # evaluated in place (eval mode, restored below)
    else:  # a copy: longer context and/or another device
        runner = with_max_seq_len(inner, max(longest, inner.config.max_seq_len)).to(device)
    was_training = inner.training
    runner.eval()

    data = torch.from_numpy(arr[: span + 1].astype(np.int64))
    losses, segments = [], []
    try:
        for f in factors:
            length = f * block_size
            n_windows = span // length
            starts = torch.arange(n_windows) * length
            per_pos = torch.zeros(length, dtype=torch.float64)
            per_batch = max(1, batch_size // f)
            for i in range(0, n_windows, per_batch):
                idx = starts[i : i + per_batch, None] + torch.arange(length + 1)
                window = data[idx].to(device)
                logits = runner(window[:, :-1])
                loss = F.cross_entropy(logits.float().flatten(0, 1), window[:, 1:].flatten(), reduction="none")
                per_pos += loss.view(-1, length).double().sum(0).cpu()
            per_pos /= n_windows
            losses.append(float(per_pos.mean()))
            segments.append(per_pos.view(f, block_size).mean(1).numpy())
    finally:
        if runner is inner:
            inner.train(was_training)
    loss = np.asarray(losses)
    return {
        "block_size": block_size,
        "factors": factors,
        "contexts": [f * block_size for f in factors],
        "tokens": int(span),
        "loss": loss,
        "perplexity": np.exp(loss),
        "loss_by_segment": segments,
    }


# ---------------------------------------------------------------------------------------------
# Plots


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
            _band(uv, x, s["s_u"], col, f"{label} s_u")
            _band(uv, x, s["s_v"], col, f"{label} s_v", style="s--")
            _band(qk, x, s["s_qk"], col, label)
            sz.plot(*_thin(s["s_z"]), color=col, label=label)
        elif s.get("family") == "gpt":
            has["gpt"] = True
            x = _layer_axis(len(s["rmsnorm_attn"]))
            _band(gains, x, s["rmsnorm_attn"], col, f"{label} before attention")
            _band(gains, x, s["rmsnorm_mlp"], col, f"{label} before MLP", style="s--")
    for ax, name in ((a_attn, "|alpha_A| per layer (eq. 10)"), (a_mlp, "|alpha_M| per layer (eq. 11)"),
                     (uv, "s_u, s_v per layer (eq. 20, 21)"), (qk, "s_qk per layer (eq. 15, 16)"),
                     (gains, "GPT: RMSNorm gains per layer")):  # fmt: skip
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
            ax.text(0.5, 0.5, f"no {'nGPT' if family == 'ngpt' else 'GPT'} model", ha="center", va="center",
                    transform=ax.transAxes, color="gray")  # fmt: skip
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
