"""The optimizer and schedule of a run: the paper's recipes (Table 3 of the nGPT paper) as ``(optimizer, scheduler)``.

| | GPT | nGPT |
|---|---|---|
| optimizer | AdamW | Adam (AdamW with weight decay 0) |
| weight decay | 0.1 | 0 |
| warmup steps | 2000 | 0 |
| schedule | cosine annealing to 0 | cosine annealing to 0 |

``method``:

- ``"riemannian_adam"``: nGPT with :class:`RiemannianAdam`. With ``gradient="euclidean"`` (the
  default) and ``second_moment="element"`` this is the paper's optimizer, the same steps as
  ``"adam_normalize"`` to float rounding, in one pass per row; with ``gradient="riemannian"``
  Adam's moments see the tangent projection of the gradient, a different optimizer (see
  :mod:`spherenet.optim.riemannian_adam` for how far it departs);
- ``"adam_normalize"``: nGPT as in the paper: Euclidean Adam, then renormalize every sphere
  weight after each step (Section 2.6, step 2) with :func:`add_normalize_hook`;
- ``"adamw"``: the GPT baseline: AdamW, weight decay on tensors with ``ndim >= 2`` only;
- ``"spherical_muon"``: nGPT with :class:`SphericalMuon` on the hidden 2-D sphere weights
  (:func:`spherenet.optim.hidden_matrices`: every matrix but embeddings and output layers)
  and :class:`RiemannianAdam` (the nGPT recipe: no weight decay) on the rest: the sphere
  embeddings, the output head and the scalings;
- ``"muon"``: GPT with ``torch.optim.Muon`` (Nesterov, ``adjust_lr_fn="match_rms_adamw"``,
  decoupled weight decay) on the hidden 2-D weights and AdamW on the embeddings, the
  output head and the vectors (Table 3's GPT settings otherwise).

- ``"adamh"``: GPT with AdamH (Hyperball, Wen et al. 2026): every hidden 2-D weight is
  declared on the sphere of its Frobenius norm
  (:func:`spherenet.manifolds.declare_matrix_sphere`) and :class:`RiemannianAdam` steps it
  as ``W <- R Normalize(W - lr R Normalize(u))`` with ``u`` Adam's direction; the embeddings,
  the output head and the vectors keep AdamW (Table 3's GPT settings);
- ``"muonh"``: the same with MuonH: :class:`SphericalMuon` on those matrices (``u`` is Muon's
  orthogonalized momentum), AdamW on the rest.

  In both, ``matrix_lr`` (default ``lr``) is the matrices' rate: the angle, in radians, that a
  step turns a matrix by at the schedule's peak, a quantity with its own scale (an AdamW step of
  ``lr`` on a matrix of init std 0.02 turns it by about ``lr / 0.02``); ``lr`` stays the AdamW
  part's.

The Muon recipes return one :class:`CombinedOptimizer`. Their Muon learning rate
(``muon_lr``) defaults to ``lr``: with the RMS-matching step size (Liu et al. 2025) the Muon
update has AdamW's RMS, so the Adam recipes' learning rate transfers.

**Settings.** ``weight_decay`` / ``warmup_steps`` of ``None`` take the recipe's value (nGPT: 0
and 0; GPT: 0.1 on ``ndim >= 2`` tensors and 2000). Weight decay is decoupled (AdamW) and never
applies to sphere weights. The schedule is :class:`WarmupCosine` in a ``LambdaLR``: call
``scheduler.step()`` after each ``optimizer.step()``. The betas default to the official code's
``(0.9, 0.95)`` (docs/paper.md).

``second_moment`` applies to ``"riemannian_adam"`` only (``"element"``: learning rates transfer
from ``"adam_normalize"``; ``"row"``: geoopt's semantics, ``lr`` is then an angle per step per
row). ``gradient`` too: ``"euclidean"`` (Adam on the raw gradient; with ``"element"`` the paper's
method) or ``"riemannian"`` (Adam on its tangent projection). ``sphere_kernel`` too (``"auto"``,
``"native"``, ``"triton"``, ``"torch"``, ``"reference"``: see :class:`RiemannianAdam`). The three
build one :class:`spherenet.kernels.sphere_adam.SphereAdamOptions`, which ``options`` gives
instead (a run config's ``[optim]`` section does so); it reaches the optimizer unchanged.

``muon_lr`` (``None``: ``lr``) and ``muon_momentum`` apply to the Muon methods only: the
learning rate and momentum of the Muon part (the hidden matrices: every 2-D weight but the
embeddings and output layers, see :func:`spherenet.optim.hidden_matrices`); ``lr``, ``betas``
and ``eps`` are the Adam part's. ``matrix_lr`` (``None``: ``lr``) applies to ``"adamh"`` and
``"muonh"``: the hidden matrices' rate (an angle per step); ``muon_momentum`` is MuonH's too.

**Refusals.** ``ValueError`` naming the bad value (unknown method, ``lr <= 0``,
``total_steps <= 0``, ``warmup_steps >= total_steps``, negative weight decay, betas outside
[0, 1), unknown second moment or gradient), and for ``"adamw"`` on a model that declares sphere
weights (they would leave the sphere: use one of the nGPT methods), ``"muon"`` likewise, and the
Muon methods on a model without hidden matrices for Muon.

Each method's optimizer is built by its builder in :mod:`spherenet.optim.builders`
(:data:`~spherenet.optim.builders.BUILDERS`); :func:`build_optimizer` does the common checks,
looks the method up there and adds the schedule.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

from ..manifolds import declared_matrix_spheres
from ._checks import check_betas, check_positive_float
from .builders import BUILDERS, Settings
from .groups import named_sphere_parameters
from .riemannian_adam import SphereAdamOptions, sphere_adam_options

__all__ = ["METHODS", "MUON_METHODS", "METHOD_DEFAULTS", "build_optimizer", "WarmupCosine"]

METHODS = tuple(BUILDERS)
MUON_METHODS = ("spherical_muon", "muon", "muonh")
#: The methods that hold GPT's hidden matrices on whole-matrix spheres (Hyperball).
HYPERBALL_METHODS = ("adamh", "muonh")

#: Table 3 defaults per method: weight decay and warmup steps.
METHOD_DEFAULTS = {
    "riemannian_adam": {"weight_decay": 0.0, "warmup_steps": 0},
    "adam_normalize": {"weight_decay": 0.0, "warmup_steps": 0},
    "adamw": {"weight_decay": 0.1, "warmup_steps": 2000},
    "spherical_muon": {"weight_decay": 0.0, "warmup_steps": 0},
    "muon": {"weight_decay": 0.1, "warmup_steps": 2000},
    "adamh": {"weight_decay": 0.1, "warmup_steps": 2000},  # the decay applies to the AdamW part only
    "muonh": {"weight_decay": 0.1, "warmup_steps": 2000},
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
    gradient: str = "euclidean",
    off_sphere: str = "project",
    fused: bool | None = None,
    sphere_kernel: str = "auto",
    options: SphereAdamOptions | None = None,
    muon_lr: float | None = None,
    muon_momentum: float = 0.95,
    matrix_lr: float | None = None,
) -> tuple[torch.optim.Optimizer, LambdaLR]:
    """Build the optimizer and the LR schedule of one of the paper's recipes (Table 3), or of the
    Muon and Hyperball ones: :mod:`spherenet.optim.build` says what each method and setting is,
    and what is refused (``ValueError`` naming the value)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"build_optimizer expects an nn.Module, got {type(model).__name__}")
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; expected one of {METHODS}")
    _refuse_what_method_cannot_hold(model, method)  # before the settings: none would make it fit
    check_positive_float("lr", lr)
    check_positive_float("eps", eps, allow_zero=True)
    check_betas(betas)
    _check_int("total_steps", total_steps, 1)
    recipe = METHOD_DEFAULTS[method]
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
    options = sphere_adam_options(options, second_moment, gradient, sphere_kernel, "build_optimizer")
    betas = (float(betas[0]), float(betas[1]))
    settings = Settings(lr, betas, eps, weight_decay, options, off_sphere, fused, muon_lr, muon_momentum, matrix_lr)
    optimizer = BUILDERS[method](model, settings)
    scheduler = LambdaLR(optimizer, WarmupCosine(total_steps, warmup_steps))
    return optimizer, scheduler


def _refuse_what_method_cannot_hold(model: nn.Module, method: str) -> None:
    """``ValueError`` when ``method`` cannot keep the model's declared weights where they are
    (a Euclidean method on sphere weights, a row-sphere method on whole-matrix ones) or has none
    to keep (``"adam_normalize"`` without sphere weights)."""
    matrix_declared = declared_matrix_spheres(model)
    if matrix_declared and method not in HYPERBALL_METHODS + ("riemannian_adam",):
        raise ValueError(
            f"method {method!r} on a model with whole-matrix sphere parameters ({matrix_declared[0][0]!r}, ...): "
            "they would leave their sphere. Use 'adamh' or 'muonh'."
        )
    sphere = named_sphere_parameters(model)
    if method in ("adamw", "muon") and sphere:
        instead = "'riemannian_adam' or 'adam_normalize'" if method == "adamw" else "'spherical_muon'"
        raise ValueError(
            f"method {method!r} on a model with sphere parameters ({sphere[0][0]!r}, ...): they would leave the "
            f"sphere. Use {instead}."
        )
    if method == "adam_normalize" and not sphere:
        raise ValueError("method 'adam_normalize': the model declares no sphere parameters (use 'adamw')")
    if method in HYPERBALL_METHODS and sphere:
        raise ValueError(
            f"method {method!r} on a model with row-sphere parameters ({sphere[0][0]!r}, ...): Hyperball holds "
            "GPT's matrices on whole-matrix spheres; for nGPT use 'riemannian_adam' or 'spherical_muon'"
        )
