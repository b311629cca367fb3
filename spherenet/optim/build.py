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
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

from ..manifolds import declare_matrix_sphere, declared_matrix_spheres
from ._checks import check_betas, check_positive_float, is_dtensor
from .combined import CombinedOptimizer
from .groups import EUCLIDEAN, MATRIX_SPHERE, SPHERE, named_sphere_parameters, param_groups, split_fused
from .muon import SphericalMuon, hidden_matrices
from .normalize import add_normalize_hook, normalize_
from .riemannian_adam import RiemannianAdam, SphereAdamOptions, sphere_adam_options

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
    options: SphereAdamOptions | None = None,
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
    ``sphere_kernel`` too (``"auto"``, ``"native"``, ``"triton"``, ``"torch"`` or its old name
    ``"foreach"``, ``"reference"``: see :class:`RiemannianAdam`). The three build one
    :class:`spherenet.kernels.sphere_adam.SphereAdamOptions`, which ``options`` gives instead.

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
    sphere = _refuse_what_method_cannot_hold(model, method)  # before the settings: none would make it fit
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
    if method in HYPERBALL_METHODS:
        matrix_lr = lr if matrix_lr is None else matrix_lr
        check_positive_float("matrix_lr", matrix_lr)
    if method in MUON_METHODS:
        muon_lr = lr if muon_lr is None else muon_lr
        check_positive_float("muon_lr", muon_lr)
        if isinstance(muon_momentum, bool) or not isinstance(muon_momentum, (int, float)) or not 0 <= muon_momentum < 1:
            raise ValueError(f"muon_momentum must be in [0, 1), got {muon_momentum!r}")
    hidden = _hidden_matrices_for(model, method, sphere)  # Muon's and Hyperball's; declared first for Hyperball
    # The one set of groups: sphere, geometry, decayed and plain. Every part takes its share of
    # them, each group with its own weight decay (0 on every manifold).
    groups = param_groups(model, weight_decay)
    hidden_ids = {id(p) for _, p in hidden}
    adam = dict(lr=lr, betas=betas, eps=eps)
    sphere_adam = dict(adam, options=options, off_sphere=off_sphere, fused=fused)

    if method == "riemannian_adam":
        optimizer = RiemannianAdam(groups, **sphere_adam, model=model)
    elif method == "adamh":  # the matrix_sphere group at matrix_lr, AdamW's groups at lr
        for group in groups:
            if group["manifold"] == MATRIX_SPHERE:
                group["lr"] = matrix_lr
        hyperball = SphereAdamOptions(gradient=options.gradient)  # the whole-matrix sphere: element v, "torch"
        optimizer = RiemannianAdam(groups, **adam, options=hyperball, model=model, fused=fused)
    elif method in ("adam_normalize", "adamw"):
        optimizer = torch.optim.AdamW(_split_fused(groups, fused), **adam, fused=fused)
        if method == "adam_normalize":
            with torch.no_grad():
                normalize_(model)  # start on the sphere, as the paper's init does (Section 2.6)
            add_normalize_hook(optimizer, model)
    else:  # the Muon methods: Muon on the hidden matrices, Adam on the groups' rest
        rest = _without(groups, hidden_ids)
        if method == "spherical_muon":
            muon = SphericalMuon([{"params": hidden, "manifold": SPHERE}], lr=muon_lr, momentum=muon_momentum, off_sphere=off_sphere)  # fmt: skip  # one part a line
            rest_options = replace(options, gradient="euclidean")  # the gradient option is riemannian_adam's only
            parts = [muon] + ([RiemannianAdam(rest, **sphere_adam | {"options": rest_options})] if rest else [])
        elif method == "muonh":
            muon = SphericalMuon([{"params": hidden, "manifold": MATRIX_SPHERE}], lr=matrix_lr, momentum=muon_momentum)
            parts = [muon] + ([torch.optim.AdamW(_split_fused(rest, fused), **adam, fused=fused)] if rest else [])
        else:
            muon = torch.optim.Muon(
                [{"params": hidden, "manifold": EUCLIDEAN, "weight_decay": weight_decay}],
                lr=muon_lr,
                momentum=muon_momentum,
                nesterov=True,
                adjust_lr_fn="match_rms_adamw",
            )
            parts = [muon] + ([torch.optim.AdamW(_split_fused(rest, fused), **adam, fused=fused)] if rest else [])
        optimizer = CombinedOptimizer(parts, model=None if method == "muon" else model)
    scheduler = LambdaLR(optimizer, WarmupCosine(total_steps, warmup_steps))
    return optimizer, scheduler


def _refuse_what_method_cannot_hold(model: nn.Module, method: str) -> list[tuple[str, torch.Tensor]]:
    """``ValueError`` when ``method`` cannot keep the model's declared weights where they are
    (a Euclidean method on sphere weights, a row-sphere method on whole-matrix ones) or has none
    to keep (``"adam_normalize"`` without sphere weights). Returns the model's sphere parameters
    (:func:`named_sphere_parameters`), listed here after the whole-matrix check, for the caller's reuse."""
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
    return sphere


def _hidden_matrices_for(
    model: nn.Module, method: str, sphere: list[tuple[str, torch.Tensor]]
) -> list[tuple[str, torch.Tensor]]:
    """The matrices ``method`` steps apart from Adam (none for the Adam methods): the hidden sphere
    matrices (those of ``hidden_matrices`` in ``sphere``, the model's sphere parameters) for
    ``"spherical_muon"``, every hidden matrix for ``"muon"``, and for Hyperball every hidden matrix,
    declared on the sphere of its Frobenius norm here."""
    if method not in MUON_METHODS + HYPERBALL_METHODS:
        return []
    if method in HYPERBALL_METHODS:
        hidden = declare_hidden_matrix_spheres(model)
    elif method == "spherical_muon":
        sphere_ids = {id(p) for _, p in sphere}
        hidden = [(name, p) for name, p in hidden_matrices(model) if id(p) in sphere_ids]
    else:
        hidden = hidden_matrices(model)
    if not hidden:
        kind, owner, instead = {
            "spherical_muon": ("hidden 2-D sphere weights for Muon", "Adam's", "'riemannian_adam'"),
            "muon": ("hidden 2-D weights for Muon", "AdamW's", "'adamw'"),
        }.get(method, ("hidden 2-D weights", "AdamW's", "'adamw'"))
        raise ValueError(
            f"method {method!r}: the model has no {kind} (embeddings and output layers are {owner}; see "
            f"spherenet.optim.hidden_matrices); use {instead}"
        )
    return hidden


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


def _without(groups: list[dict], ids: set[int]) -> list[dict]:
    """``groups`` without the parameters in ``ids``; groups left empty are dropped."""
    out = []
    for g in groups:
        kept = [(name, p) for name, p in g["params"] if id(p) not in ids]
        if kept:
            out.append({**g, "params": kept})
    return out


def _split_fused(groups: list[dict], fused: bool | None) -> list[dict]:
    """``groups`` for torch's AdamW. ``fused=None`` on plain tensors: each group is split into a
    fused-kernel part (the tensors torch has a fused kernel for) and a part for torch's other
    kernels, by :func:`spherenet.optim.groups.split_fused` (torch alone would take a per-tensor loop
    on CPU). torch's AdamW ignores the extra ``"manifold"`` key; it is kept for readers."""
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
