"""The optimizer of each method of :func:`spherenet.optim.build_optimizer`: one small builder per
method in :data:`BUILDERS`, each ``builder(model, settings)`` with the model and the settings
that ``build_optimizer`` checked (:class:`Settings`). A builder checks the settings only it reads
(the Muon and Hyperball rates), finds the matrices it steps apart from Adam, builds the parameter
groups (:func:`spherenet.optim.groups.param_groups`: sphere, geometry, decayed and plain, each
group with its own weight decay, 0 on every manifold) and returns the optimizer. The module
docstring of :mod:`spherenet.optim.build` says what each method is.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import nn

from ..manifolds import declare_matrix_sphere, declared_matrix_spheres
from ._checks import check_positive_float, is_dtensor
from .combined import CombinedOptimizer
from .groups import EUCLIDEAN, MATRIX_SPHERE, SPHERE, named_sphere_parameters, param_groups, split_fused
from .muon import SphericalMuon, hidden_matrices
from .normalize import add_normalize_hook, normalize_
from .riemannian_adam import RiemannianAdam, SphereAdamOptions

__all__ = ["BUILDERS", "Settings", "declare_hidden_matrix_spheres"]


@dataclass(frozen=True)
class Settings:
    """The settings of :func:`spherenet.optim.build_optimizer` once checked, the method's
    defaults filled in (``muon_lr`` and ``matrix_lr`` stay ``None`` for ``lr``: only the
    builders that read them check them). ``options`` is handed to :class:`RiemannianAdam` as it is."""

    lr: float
    betas: tuple[float, float]
    eps: float
    weight_decay: float
    options: SphereAdamOptions
    off_sphere: str
    fused: bool | None
    muon_lr: float | None
    muon_momentum: float
    matrix_lr: float | None

    def adam(self) -> dict:
        """The keywords every Adam part takes."""
        return dict(lr=self.lr, betas=self.betas, eps=self.eps)

    def sphere_adam(self) -> dict:
        """The keywords of a :class:`RiemannianAdam` of these settings."""
        return dict(self.adam(), options=self.options, off_sphere=self.off_sphere, fused=self.fused)

    def rate(self, name: str) -> float:
        """``muon_lr`` or ``matrix_lr``, ``lr`` where unset, checked (``ValueError`` naming it)."""
        value = getattr(self, name)
        value = self.lr if value is None else value
        check_positive_float(name, value)
        return value

    def muon(self) -> tuple[float, float]:
        """The Muon part's learning rate and momentum, checked."""
        muon_lr, momentum = self.rate("muon_lr"), self.muon_momentum
        if isinstance(momentum, bool) or not isinstance(momentum, (int, float)) or not 0 <= momentum < 1:
            raise ValueError(f"muon_momentum must be in [0, 1), got {momentum!r}")
        return muon_lr, momentum


def riemannian_adam(model: nn.Module, s: Settings) -> torch.optim.Optimizer:
    """nGPT: :class:`RiemannianAdam` on every group."""
    return RiemannianAdam(param_groups(model, s.weight_decay), **s.sphere_adam(), model=model)


def adamw(model: nn.Module, s: Settings) -> torch.optim.Optimizer:
    """GPT: torch's AdamW, the decay on the decayed group only."""
    return torch.optim.AdamW(_split_fused(param_groups(model, s.weight_decay), s.fused), **s.adam(), fused=s.fused)


def adam_normalize(model: nn.Module, s: Settings) -> torch.optim.Optimizer:
    """nGPT as in the paper: AdamW (no decay on the sphere), then every sphere weight renormalized."""
    optimizer = adamw(model, s)
    with torch.no_grad():
        normalize_(model)  # start on the sphere, as the paper's init does (Section 2.6)
    add_normalize_hook(optimizer, model)
    return optimizer


def adamh(model: nn.Module, s: Settings) -> torch.optim.Optimizer:
    """AdamH: the matrix_sphere group at ``matrix_lr``, AdamW's groups at ``lr``."""
    matrix_lr = s.rate("matrix_lr")
    _required(declare_hidden_matrix_spheres(model), "adamh", "hidden 2-D weights", "AdamW's", "'adamw'")
    groups = param_groups(model, s.weight_decay)
    for group in groups:
        if group["manifold"] == MATRIX_SPHERE:
            group["lr"] = matrix_lr
    hyperball = SphereAdamOptions(gradient=s.options.gradient)  # the whole-matrix sphere: element v, "torch"
    return RiemannianAdam(groups, **s.adam(), options=hyperball, model=model, fused=s.fused)


def spherical_muon(model: nn.Module, s: Settings) -> torch.optim.Optimizer:
    """:class:`SphericalMuon` on the hidden sphere matrices, :class:`RiemannianAdam` on the rest."""
    muon_lr, momentum = s.muon()
    sphere = {id(p) for _, p in named_sphere_parameters(model)}
    hidden = [(name, p) for name, p in hidden_matrices(model) if id(p) in sphere]
    _required(hidden, "spherical_muon", "hidden 2-D sphere weights for Muon", "Adam's", "'riemannian_adam'")
    rest = _without(param_groups(model, s.weight_decay), hidden)
    part = SphericalMuon([{"params": hidden, "manifold": SPHERE}], lr=muon_lr, momentum=momentum, off_sphere=s.off_sphere)  # fmt: skip  # one part a line
    rest_options = replace(s.options, gradient="euclidean")  # the gradient option is riemannian_adam's only
    parts = [part] + ([RiemannianAdam(rest, **s.sphere_adam() | {"options": rest_options})] if rest else [])
    return CombinedOptimizer(parts, model=model)


def muon(model: nn.Module, s: Settings) -> torch.optim.Optimizer:
    """torch's Muon (Nesterov, RMS matched to AdamW's, decoupled decay) on the hidden matrices, AdamW on the rest."""
    muon_lr, momentum = s.muon()
    hidden = _required(hidden_matrices(model), "muon", "hidden 2-D weights for Muon", "AdamW's", "'adamw'")
    rest = _without(param_groups(model, s.weight_decay), hidden)
    matrices = [{"params": hidden, "manifold": EUCLIDEAN, "weight_decay": s.weight_decay}]
    part = torch.optim.Muon(matrices, lr=muon_lr, momentum=momentum, nesterov=True, adjust_lr_fn="match_rms_adamw")
    return CombinedOptimizer([part] + _adamw_part(rest, s), model=None)


def muonh(model: nn.Module, s: Settings) -> torch.optim.Optimizer:
    """MuonH: :class:`SphericalMuon` on the hidden matrices' Frobenius spheres at ``matrix_lr``, AdamW on the rest."""
    matrix_lr = s.rate("matrix_lr")
    _, momentum = s.muon()  # muon_lr is checked too, as for every Muon method
    hidden = _required(declare_hidden_matrix_spheres(model), "muonh", "hidden 2-D weights", "AdamW's", "'adamw'")
    rest = _without(param_groups(model, s.weight_decay), hidden)
    part = SphericalMuon([{"params": hidden, "manifold": MATRIX_SPHERE}], lr=matrix_lr, momentum=momentum)
    return CombinedOptimizer([part] + _adamw_part(rest, s), model=model)


#: The builder of each method, in the order of :data:`spherenet.optim.METHODS`.
BUILDERS = {
    "riemannian_adam": riemannian_adam,
    "adam_normalize": adam_normalize,
    "adamw": adamw,
    "spherical_muon": spherical_muon,
    "muon": muon,
    "adamh": adamh,
    "muonh": muonh,
}


def _required(hidden: list, method: str, kind: str, owner: str, instead: str) -> list[tuple[str, torch.Tensor]]:
    """``hidden``, the matrices ``method`` steps apart from Adam, or ``ValueError`` where there are none."""
    if not hidden:
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


def _without(groups: list[dict], hidden: list[tuple[str, torch.Tensor]]) -> list[dict]:
    """``groups`` without the parameters in ``hidden``; groups left empty are dropped."""
    ids = {id(p) for _, p in hidden}
    out = []
    for g in groups:
        kept = [(name, p) for name, p in g["params"] if id(p) not in ids]
        if kept:
            out.append({**g, "params": kept})
    return out


def _adamw_part(rest: list[dict], s: Settings) -> list[torch.optim.Optimizer]:
    """The AdamW part of a Muon recipe over ``rest`` (none where nothing is left)."""
    return [torch.optim.AdamW(_split_fused(rest, s.fused), **s.adam(), fused=s.fused)] if rest else []


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
