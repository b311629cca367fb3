"""Fig. 4 of the nGPT paper: the input and output embeddings (norms, eigenvalues, dot products)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from torch import nn

from ._model_access import _f64, _family, _matrix, _unwrap


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
