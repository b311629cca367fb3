"""The optimizer and schedule of a run: the paper's recipes (Table 3 of the nGPT paper) as ``(optimizer, scheduler)``.

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
  optimizer (see :mod:`spherenet.optim.riemannian_adam` for how far it departs);
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
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

from ..manifolds import declare_matrix_sphere, declared_matrix_spheres
from ._checks import check_betas, check_positive_float, is_dtensor
from .combined import CombinedOptimizer
from .groups import EUCLIDEAN, MATRIX_SPHERE, SPHERE, named_sphere_parameters, param_groups, split_fused
from .muon import SphericalMuon, hidden_matrices
from .normalize import add_normalize_hook, normalize_
from .riemannian_adam import GRADIENTS, SECOND_MOMENTS, RiemannianAdam

__all__ = ["METHODS", "MUON_METHODS", "METHOD_DEFAULTS", "build_optimizer", "WarmupCosine"]

METHODS = ("riemannian_adam", "adam_normalize", "adamw", "spherical_muon", "muon", "adamh", "muonh")
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
    muon_lr: float | None = None,
    muon_momentum: float = 0.95,
    matrix_lr: float | None = None,
) -> tuple[torch.optim.Optimizer, LambdaLR]:
    """Build the optimizer and the LR schedule of one of the paper's recipes (Table 3).

    ``weight_decay`` / ``warmup_steps`` of ``None`` take the recipe's value (nGPT: 0 and 0;
    GPT: 0.1 on ``ndim >= 2`` tensors and 2000). Weight decay is decoupled (AdamW) and never
    applies to sphere weights. The schedule is :class:`WarmupCosine` in a ``LambdaLR``: call
    ``scheduler.step()`` after each ``optimizer.step()``. The betas default to the official
    code's ``(0.9, 0.95)`` (docs/paper.md).

    ``second_moment`` applies to ``"riemannian_adam"`` only (``"element"``: learning rates
    transfer from ``"adam_normalize"``; ``"row"``: geoopt's semantics, ``lr`` is then an angle
    per step per row). ``gradient`` too: ``"euclidean"`` (Adam on the raw gradient; with
    ``"element"`` the paper's method) or ``"riemannian"`` (Adam on its tangent projection).
    ``sphere_kernel`` too (``"auto"``, ``"native"``, ``"triton"``, ``"foreach"``: see
    :class:`RiemannianAdam`).

    ``muon_lr`` (``None``: ``lr``) and ``muon_momentum`` apply to the Muon methods only: the
    learning rate and momentum of the Muon part (the hidden matrices: every 2-D weight but the
    embeddings and output layers, see :func:`spherenet.optim.hidden_matrices`); ``lr``, ``betas``
    and ``eps`` are the Adam part's. ``matrix_lr`` (``None``: ``lr``) applies to ``"adamh"`` and
    ``"muonh"``: the hidden matrices' rate (an angle per step); ``muon_momentum`` is MuonH's too.

    Raises ``ValueError`` naming the bad value (unknown method, ``lr <= 0``,
    ``total_steps <= 0``, ``warmup_steps >= total_steps``, negative weight decay, betas outside
    [0, 1), unknown second moment or gradient), and for ``"adamw"`` on a model that declares sphere weights
    (they would leave the sphere: use one of the nGPT methods), ``"muon"`` likewise, and the
    Muon methods on a model without hidden matrices for Muon.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"build_optimizer expects an nn.Module, got {type(model).__name__}")
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; expected one of {METHODS}")
    matrix_declared = declared_matrix_spheres(model)
    if matrix_declared and method not in HYPERBALL_METHODS + ("riemannian_adam",):
        raise ValueError(
            f"method {method!r} on a model with whole-matrix sphere parameters ({matrix_declared[0][0]!r}, ...): "
            "they would leave their sphere. Use 'adamh' or 'muonh'."
        )
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
    if second_moment not in SECOND_MOMENTS:
        raise ValueError(f"second_moment must be one of {SECOND_MOMENTS}, got {second_moment!r}")
    if gradient not in GRADIENTS:
        raise ValueError(f"gradient must be one of {GRADIENTS}, got {gradient!r}")
    betas = (float(betas[0]), float(betas[1]))
    if method in HYPERBALL_METHODS:
        matrix_lr = lr if matrix_lr is None else matrix_lr
        check_positive_float("matrix_lr", matrix_lr)
    if method in MUON_METHODS:
        muon_lr = lr if muon_lr is None else muon_lr
        check_positive_float("muon_lr", muon_lr)
        if isinstance(muon_momentum, bool) or not isinstance(muon_momentum, (int, float)) or not 0 <= muon_momentum < 1:
            raise ValueError(f"muon_momentum must be in [0, 1), got {muon_momentum!r}")
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
    elif method == "spherical_muon":
        optimizer = _spherical_muon(
            model,
            sphere,
            weight_decay,
            lr,
            betas,
            eps,
            second_moment,
            off_sphere,
            fused,
            sphere_kernel,
            muon_lr,
            muon_momentum,
        )
    elif method == "muon":
        optimizer = _muon(model, sphere, weight_decay, lr, betas, eps, fused, muon_lr, muon_momentum)
    elif method in HYPERBALL_METHODS:
        optimizer = _hyperball(
            model, method, sphere, weight_decay, lr, betas, eps, gradient, fused, matrix_lr, muon_momentum
        )
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


def _spherical_muon(
    model, sphere, weight_decay, lr, betas, eps, second_moment, off_sphere, fused, sphere_kernel, muon_lr, momentum
) -> CombinedOptimizer:
    """SphericalMuon on the hidden sphere matrices, RiemannianAdam on everything else."""
    sphere_ids = {id(p) for _, p in sphere}
    hidden = [(name, p) for name, p in hidden_matrices(model) if id(p) in sphere_ids]
    if not hidden:
        raise ValueError(
            "method 'spherical_muon': the model has no hidden 2-D sphere weights for Muon (embeddings and "
            "output layers are Adam's; see spherenet.optim.hidden_matrices); use 'riemannian_adam'"
        )
    muon = SphericalMuon([{"params": hidden, "manifold": SPHERE}], lr=muon_lr, momentum=momentum, off_sphere=off_sphere)
    rest = _without(param_groups(model, weight_decay), {id(p) for _, p in hidden})
    parts: list[torch.optim.Optimizer] = [muon]
    if rest:
        parts.append(
            RiemannianAdam(
                rest,
                lr=lr,
                betas=betas,
                eps=eps,
                second_moment=second_moment,
                off_sphere=off_sphere,
                fused=fused,
                sphere_kernel=sphere_kernel,
            )
        )
    return CombinedOptimizer(parts, model=model)


def _muon(model, sphere, weight_decay, lr, betas, eps, fused, muon_lr, momentum) -> CombinedOptimizer:
    """torch.optim.Muon on the hidden 2-D weights, AdamW on everything else."""
    if sphere:
        raise ValueError(
            f"method 'muon' on a model with sphere parameters ({sphere[0][0]!r}, ...): they would leave the "
            "sphere. Use 'spherical_muon'."
        )
    hidden = hidden_matrices(model)
    if not hidden:
        raise ValueError(
            "method 'muon': the model has no hidden 2-D weights for Muon (embeddings and output layers are "
            "AdamW's; see spherenet.optim.hidden_matrices); use 'adamw'"
        )
    muon = torch.optim.Muon(
        [{"params": hidden, "manifold": EUCLIDEAN}],
        lr=muon_lr,
        weight_decay=weight_decay,
        momentum=momentum,
        nesterov=True,
        adjust_lr_fn="match_rms_adamw",
    )
    rest = _torch_groups(model, weight_decay, fused, exclude={id(p) for _, p in hidden})
    parts: list[torch.optim.Optimizer] = [muon]
    if rest:
        parts.append(torch.optim.AdamW(rest, lr=lr, betas=betas, eps=eps, weight_decay=0.0, fused=fused))
    return CombinedOptimizer(parts)


def declare_hidden_matrix_spheres(model: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """Declare every hidden matrix of ``model`` (:func:`spherenet.optim.muon.hidden_matrices`: the 2-D
    weights but embeddings and output layers) on the sphere of its Frobenius norm, unless it is
    declared already; returns them. A matrix declared on the row sphere is refused."""
    owners = {}
    for mod_name, module in model.named_modules():
        for attr, p in module._parameters.items():
            if p is not None:
                owners.setdefault(id(p), (module, attr))
    declared = {id(p) for _, p, _ in declared_matrix_spheres(model)}
    hidden = hidden_matrices(model)
    for _, p in hidden:
        if id(p) not in declared:
            declare_matrix_sphere(*owners[id(p)])
    return hidden


def _hyperball(model, method, sphere, weight_decay, lr, betas, eps, gradient, fused, matrix_lr, momentum):
    """AdamH / MuonH on the hidden matrices (declared on whole-matrix spheres), AdamW on the rest."""
    if sphere:
        raise ValueError(
            f"method {method!r} on a model with row-sphere parameters ({sphere[0][0]!r}, ...): Hyperball holds "
            "GPT's matrices on whole-matrix spheres; for nGPT use 'riemannian_adam' or 'spherical_muon'"
        )
    hidden = declare_hidden_matrix_spheres(model)
    if not hidden:
        raise ValueError(
            f"method {method!r}: the model has no hidden 2-D weights (embeddings and output layers are AdamW's; "
            "see spherenet.optim.hidden_matrices); use 'adamw'"
        )
    hidden_ids = {id(p) for _, p in hidden}
    if method == "adamh":
        groups = param_groups(model, weight_decay)  # the matrix_sphere group, then AdamW's groups
        for group in groups:
            if group["manifold"] == MATRIX_SPHERE:
                group["lr"] = matrix_lr
        return RiemannianAdam(groups, lr=lr, betas=betas, eps=eps, gradient=gradient, model=model, fused=fused)
    muon = SphericalMuon([{"params": hidden, "manifold": MATRIX_SPHERE}], lr=matrix_lr, momentum=momentum)
    rest = _torch_groups(model, weight_decay, fused, exclude=hidden_ids)
    parts: list[torch.optim.Optimizer] = [muon]
    if rest:
        parts.append(torch.optim.AdamW(rest, lr=lr, betas=betas, eps=eps, weight_decay=0.0, fused=fused))
    return CombinedOptimizer(parts, model=model)


def _without(groups: list[dict], ids: set[int]) -> list[dict]:
    """``groups`` without the parameters in ``ids``; groups left empty are dropped."""
    out = []
    for g in groups:
        kept = [(name, p) for name, p in g["params"] if id(p) not in ids]
        if kept:
            out.append({**g, "params": kept})
    return out


def _torch_groups(
    model: nn.Module, weight_decay: float, fused: bool | None, exclude: set[int] = frozenset()
) -> list[dict]:
    """Param groups for torch's AdamW. ``fused=None`` on plain tensors: each group is split into
    a fused-kernel part (the tensors torch has a fused kernel for) and a part for torch's other kernels, by
    :func:`spherenet.optim.groups.split_fused` (torch alone would take a per-tensor loop on CPU).
    torch's AdamW ignores the extra ``"manifold"`` key; it is kept for readers."""
    groups = _without(param_groups(model, weight_decay), exclude)
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
