"""Fig. 5 and Fig. 10 of the nGPT paper: condition numbers of the attention and MLP matrices."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from torch import nn

from ._model_access import _attr, _family, _matrix, _unwrap

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
    way, by the columns each head writes through; W_k and W_v have ``n_kv_heads`` heads under
    grouped-query attention); ``mlp_u``, ``mlp_v``, ``mlp_o`` are those of the whole matrices
    W_u, W_v (gate), W_o_mlp ("MLP11, MLP12, MLP2" in Fig. 10); NaN for a matrix the block does
    not have (the gate W_v of the squared-ReLU MLP). Also
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
    kv_heads = getattr(c, "n_kv_heads", None) or c.n_heads  # grouped-query attention: fewer k/v heads
    for block in model.blocks:
        for key, (path, _) in CONDITION_KEYS.items():
            owner, _, name = path.rpartition(".")
            if not hasattr(_attr(block, owner), name):  # the squared-ReLU MLP has no gate W_v
                per_key[key].append(math.nan)
                continue
            m = _matrix(_attr(block, path)).detach().to(device="cpu", dtype=torch.float64)
            heads = kv_heads if key in ("attn_k", "attn_v") else c.n_heads
            conds = np.atleast_1d(condition_number(_blocks(key, m, heads, c.d_model, normalize)))
            per_key[key].append(float(np.median(conds)))
            per_head[key].append(conds)
    out: dict[str, Any] = {k: np.asarray(v) for k, v in per_key.items()}
    for k in ("attn_q", "attn_k", "attn_v", "attn_o"):
        out[f"{k}_heads"] = np.stack(per_head[k])
    out.update(n_layers=len(model.blocks), n_heads=c.n_heads, normalize=bool(normalize))
    return out
