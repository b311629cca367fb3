"""Several optimizers over disjoint parameters, seen as one ``torch.optim.Optimizer``.

Muon recipes step the hidden matrices with Muon and everything else with Adam. LR schedulers,
gradient clipping, checkpoints (``torch.save`` and ``torch.distributed.checkpoint``) all expect
one optimizer with ``param_groups``, ``state``, ``state_dict()`` and ``load_state_dict()``.
:class:`CombinedOptimizer` shares, not copies: its ``param_groups`` list holds the parts' own
group dicts (a scheduler that sets ``group["lr"]`` sets it for the part), and every part's
``state`` is one mapping, so ``state_dict()`` is the standard format over all parameters.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Iterable

import torch
from torch import nn
from torch.optim import Optimizer

from ._checks import ModelWatch
from .groups import check_groups

__all__ = ["CombinedOptimizer"]


class CombinedOptimizer(Optimizer):
    """One optimizer made of ``optimizers`` (each over its own parameters).

    ``step()`` runs the closure once, then each part's ``step()`` in order. ``state_dict()``
    lists the parts' groups in order; ``load_state_dict()`` hands each part its slice, so
    each part's own loading rules (state casting, ``__setstate__``) apply.

    ``model``: every sphere parameter the model declares must sit in a sphere group of some
    part (``ValueError`` otherwise), and at each step the model is checked for replaced
    parameters (``RuntimeError``), as :class:`RiemannianAdam` does for one optimizer.

    Raises ``ValueError`` for no parts, a part that is not an optimizer, and a parameter held
    by two parts. New groups go to a part (``part.add_param_group``) before combining.
    """

    def __init__(self, optimizers: Iterable[Optimizer], *, model: nn.Module | None = None):
        parts = list(optimizers)
        if not parts:
            raise ValueError("CombinedOptimizer needs at least one optimizer")
        seen: set[int] = set()
        for part in parts:
            if not isinstance(part, Optimizer):
                raise TypeError(f"CombinedOptimizer combines torch.optim.Optimizer objects, got {type(part).__name__}")
            for g in part.param_groups:
                for p in g["params"]:
                    if id(p) in seen:
                        raise ValueError(
                            f"CombinedOptimizer: a parameter of shape {tuple(p.shape)} is held by two optimizers"
                        )
                    seen.add(id(p))
        self.optimizers = parts
        self._ready = False
        super().__init__([torch.empty(0)], {})  # placeholder group, replaced below
        self._ready = True
        self._bind()
        if model is not None:
            check_groups(self.param_groups, model, "CombinedOptimizer")
        self._watch = ModelWatch(model)

    def _bind(self) -> None:
        """Share the parts' groups and one state mapping across the parts and this object."""
        state: defaultdict = defaultdict(dict)
        for part in self.optimizers:
            state.update(part.state)
        for part in self.optimizers:
            part.state = state
        self.state = state
        self.param_groups = [g for part in self.optimizers for g in part.param_groups]

    def add_param_group(self, param_group: dict) -> None:
        if not self._ready:  # Optimizer.__init__'s placeholder
            return super().add_param_group(param_group)
        raise RuntimeError(
            "CombinedOptimizer: add the group to one of its optimizers (combined.optimizers[i]) before combining"
        )

    @torch.compiler.disable
    def step(self, closure=None):
        """Step every part; returns ``closure()``'s loss."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._watch.check(self.param_groups, "CombinedOptimizer")
        for part in self.optimizers:
            part.step()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        for part in self.optimizers:
            part.zero_grad(set_to_none=set_to_none)

    def load_state_dict(self, state_dict) -> None:
        groups, state = state_dict["param_groups"], state_dict["state"]
        counts = [len(part.param_groups) for part in self.optimizers]
        if len(groups) != sum(counts):
            raise ValueError(
                f"CombinedOptimizer: the state dict has {len(groups)} param groups, these optimizers have "
                f"{sum(counts)} ({' + '.join(map(str, counts))})"
            )
        start = 0
        for part, count in zip(self.optimizers, counts):
            mine = groups[start : start + count]
            ids = {i for g in mine for i in g["params"]}
            part.load_state_dict({"state": {k: v for k, v in state.items() if k in ids}, "param_groups": mine})
            start += count
        self._bind()

    def __repr__(self) -> str:
        inner = ",\n".join("  " + repr(part).replace("\n", "\n  ") for part in self.optimizers)
        return f"CombinedOptimizer(\n{inner}\n)"
