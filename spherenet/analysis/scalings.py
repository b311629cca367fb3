"""Fig. 6 and Fig. 14 of the nGPT paper: the learned eigen learning rates and scaling factors."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from ._model_access import _f64, _family, _unwrap


@torch.no_grad()
def scaling_factors(model: nn.Module) -> dict[str, Any]:
    """The learned scalings, as used in the forward pass (``s * s_init / s_scale``, Section 2.5).

    nGPT (Fig. 6, 14) -- every array float64, one row per layer:

    - ``alpha_A``, ``alpha_M``: ``(L, d)`` the eigen learning rates of eq. 10, 11 as applied:
      ``|alpha|`` when the spec's ``absolute`` is set (Appendix A.2), else signed
      (``block.residual_attn.alpha()``). Fig. 6 (left) plots the
      per-layer mean of their absolute values.
    - ``s_qk``: ``(L, d)`` (``d_k`` per head, heads concatenated), eq. 15, 16.
    - ``s_u``, ``s_v``: ``(L, d_MLP)``, eq. 20, 21. ``s_v`` is the learned factor alone: the
      forward pass multiplies v by ``s_v * sqrt(d_model)``. The squared-ReLU MLP has one scale
      instead, ``s_uv`` ``(L, d_MLP)``, likewise the learned factor alone.
    - ``s_z``: ``(V,)`` the per-token logit scaling of eq. 3.

    A ``"scalar"`` mode gives width-1 rows, a ``"fixed"`` one its constant. At initialization
    every alpha is at its init (0.05) and every s is 1 (Section 2.6).

    GPT has none of these. Its only per-dimension scalings are the RMSNorm gains, returned
    instead: ``rmsnorm_attn``, ``rmsnorm_mlp`` ``(L, d)`` (before attention / MLP, eq. 4, 5) and
    ``rmsnorm_out`` ``(d,)`` (the final norm); all 1 at initialization.

    The result also holds ``family`` (``"ngpt"`` or ``"gpt"``).
    """
    model = _unwrap(model)
    family = _family(model)
    if family == "ngpt":
        mlp_scales = ("s_uv",) if hasattr(model.blocks[0].mlp, "s_uv") else ("s_u", "s_v")
        rows: dict[str, list] = {k: [] for k in ("alpha_A", "alpha_M", "s_qk", *mlp_scales)}
        for block in model.blocks:
            rows["alpha_A"].append(_f64(block.residual_attn.alpha()))
            rows["alpha_M"].append(_f64(block.residual_mlp.alpha()))
            rows["s_qk"].append(_f64(block.attn.s_qk()))
            for name in mlp_scales:
                rows[name].append(_f64(getattr(block.mlp, name)()))
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
