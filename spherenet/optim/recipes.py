"""The paper's optimizer recipes (Table 3 of the nGPT paper) as ``(optimizer, scheduler)``.

| | GPT | nGPT |
|---|---|---|
| optimizer | AdamW | Adam (AdamW with weight decay 0) |
| weight decay | 0.1 | 0 |
| warmup steps | 2000 | 0 |
| schedule | cosine annealing to 0 | cosine annealing to 0 |

``method``:

- ``"riemannian_adam"``: nGPT with :class:`RiemannianAdam`. With ``gradient="euclidean"``
  (and ``second_moment="element"``) this is the paper's optimizer, the same steps as
  ``"adam_normalize"`` to float rounding, in one pass per row; with ``gradient="riemannian"``
  (the default) Adam's moments see the tangent projection of the gradient, a different
  optimizer (see :mod:`spherenet.optim.radam` for how far it departs);
- ``"adam_normalize"``: nGPT as in the paper: Euclidean Adam, then renormalize every sphere
  weight after each step (Section 2.6, step 2) with :func:`add_normalize_hook`;
- ``"adamw"``: the GPT baseline: AdamW, weight decay on tensors with ``ndim >= 2`` only.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

from ._common import check_betas, check_positive_float
from .groups import named_sphere_parameters, param_groups
from .normalize import add_normalize_hook, normalize_
from ._tensors import is_dtensor
from .radam import GRADIENTS, SECOND_MOMENTS, RiemannianAdam, split_fused

__all__ = ["METHODS", "RECIPES", "build_optimizer", "WarmupCosine"]

METHODS = ("riemannian_adam", "adam_normalize", "adamw")

#: Table 3 defaults per method: weight decay and warmup steps.
RECIPES = {
    "riemannian_adam": {"weight_decay": 0.0, "warmup_steps": 0},
    "adam_normalize": {"weight_decay": 0.0, "warmup_steps": 0},
    "adamw": {"weight_decay": 0.1, "warmup_steps": 2000},
}


class WarmupCosine:
    """LR multiplier: linear warmup over ``warmup_steps``, then cosine annealing to 0 at
    ``total_steps`` (Table 3). ``f(s) = (s + 1) / W`` for ``s < W``, then
    ``0.5 (1 + cos(pi (s - W) / (T - W)))``, clamped to 0 after ``T``.

    A callable object (not a lambda), so ``LambdaLR.state_dict()`` saves it.
    """

    def __init__(self, total_steps: int, warmup_steps: int = 0):
        self.total_steps = int(total_steps)
        self.warmup_steps = int(warmup_steps)

    def __call__(self, step: int) -> float:
        w, t = self.warmup_steps, self.total_steps
        if step < w:
            return (step + 1) / w
        progress = min(1.0, (step - w) / max(1, t - w))
        return 0.5 * (1.0 + math.cos(math.pi * progress))

    def __repr__(self) -> str:
        return f"WarmupCosine(total_steps={self.total_steps}, warmup_steps={self.warmup_steps})"


def _check_int(name: str, value, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")


def build_optimizer(
    model: nn.Module,
    method: str = "riemannian_adam",
    *,
    lr: float,
    total_steps: int,
    weight_decay: float | None = None,
    warmup_steps: int | None = None,
    betas: tuple[float, float] = (0.9, 0.95),
    eps: float = 1e-8,
    second_moment: str = "element",
    gradient: str = "riemannian",
    off_sphere: str = "project",
    fused: bool | None = None,
    sphere_kernel: str = "auto",
) -> tuple[torch.optim.Optimizer, LambdaLR]:
    """Build the optimizer and the LR schedule of one of the paper's recipes (Table 3).

    ``weight_decay`` / ``warmup_steps`` of ``None`` take the recipe's value (nGPT: 0 and 0;
    GPT: 0.1 on ``ndim >= 2`` tensors and 2000). Weight decay is decoupled (AdamW) and never
    applies to sphere weights. The schedule is :class:`WarmupCosine` in a ``LambdaLR``: call
    ``scheduler.step()`` after each ``optimizer.step()``. The paper does not list Adam's betas;
    the default ``(0.9, 0.95)`` is the usual language-model setting.

    ``second_moment`` applies to ``"riemannian_adam"`` only (``"element"``: learning rates
    transfer from ``"adam_normalize"``; ``"row"``: geoopt's semantics, ``lr`` is then an angle
    per step per row). ``gradient`` too: ``"euclidean"`` (Adam on the raw gradient; with
    ``"element"`` the paper's method) or ``"riemannian"`` (Adam on its tangent projection).
    ``sphere_kernel`` too (``"auto"``, ``"native"``, ``"foreach"``, ``"compiled"``: see
    :class:`RiemannianAdam`).

    Raises ``ValueError`` naming the bad value (unknown method, ``lr <= 0``,
    ``total_steps <= 0``, ``warmup_steps >= total_steps``, negative weight decay, betas outside
    [0, 1), unknown second moment or gradient), and for ``"adamw"`` on a model that declares sphere weights
    (they would leave the sphere: use one of the nGPT methods).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"build_optimizer expects an nn.Module, got {type(model).__name__}")
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; expected one of {METHODS}")
    check_positive_float("lr", lr)
    check_positive_float("eps", eps, allow_zero=True)
    check_betas(betas)
    _check_int("total_steps", total_steps, 1)
    recipe = RECIPES[method]
    weight_decay = recipe["weight_decay"] if weight_decay is None else weight_decay
    default_warmup = warmup_steps is None
    warmup_steps = recipe["warmup_steps"] if default_warmup else warmup_steps
    check_positive_float("weight_decay", weight_decay, allow_zero=True)
    _check_int("warmup_steps", warmup_steps, 0)
    if warmup_steps >= total_steps:
        hint = ""
        if default_warmup:
            hint = f" (the {method!r} recipe's default, Table 3; pass warmup_steps= for a run this short)"
        raise ValueError(f"warmup_steps ({warmup_steps}){hint} must be < total_steps ({total_steps})")
    if second_moment not in SECOND_MOMENTS:
        raise ValueError(f"second_moment must be one of {SECOND_MOMENTS}, got {second_moment!r}")
    if gradient not in GRADIENTS:
        raise ValueError(f"gradient must be one of {GRADIENTS}, got {gradient!r}")
    betas = (float(betas[0]), float(betas[1]))
    sphere = named_sphere_parameters(model)

    if method == "riemannian_adam":
        optimizer = RiemannianAdam(
            param_groups(model, weight_decay),
            lr=lr,
            betas=betas,
            eps=eps,
            second_moment=second_moment,
            gradient=gradient,
            model=model,
            off_sphere=off_sphere,
            fused=fused,
            sphere_kernel=sphere_kernel,
        )
    elif method == "adam_normalize":
        if not sphere:
            raise ValueError("method 'adam_normalize': the model declares no sphere parameters (use 'adamw')")
        optimizer = torch.optim.AdamW(
            _torch_groups(model, weight_decay, fused), lr=lr, betas=betas, eps=eps, weight_decay=0.0, fused=fused
        )
        with torch.no_grad():
            normalize_(model)  # start on the sphere, as the paper's init does (Section 2.6)
        add_normalize_hook(optimizer, model)
    else:
        if sphere:
            raise ValueError(
                f"method 'adamw' on a model with sphere parameters ({sphere[0][0]!r}, ...): they would leave the "
                "sphere. Use 'riemannian_adam' or 'adam_normalize'."
            )
        optimizer = torch.optim.AdamW(
            _torch_groups(model, weight_decay, fused), lr=lr, betas=betas, eps=eps, weight_decay=0.0, fused=fused
        )
    scheduler = LambdaLR(optimizer, WarmupCosine(total_steps, warmup_steps))
    return optimizer, scheduler


def _torch_groups(model: nn.Module, weight_decay: float, fused: bool | None) -> list[dict]:
    """Param groups for torch's AdamW. ``fused=None`` on plain tensors: each group is split into
    a fused-kernel part (the tensors torch has a fused kernel for) and a part for torch's other kernels, by
    :func:`spherenet.optim.radam.split_fused` (torch alone would take a per-tensor loop on CPU).
    torch's AdamW ignores the extra ``"manifold"`` key; it is kept for readers."""
    groups = param_groups(model, weight_decay)
    if fused is not None or any(is_dtensor(p) for g in groups for _, p in g["params"]):
        return groups
    out = []
    for g in groups:
        choice = split_fused(None, [p for _, p in g["params"]])
        for flag in (True, False):
            part = [np for np, c in zip(g["params"], choice) if c == flag]
            if part:
                out.append({**g, "params": part, "fused": flag})
    return out
