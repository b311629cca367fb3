"""Inference-time folding: values that only change when a parameter does, computed once.

In the forward pass nGPT derives effective values from its stored parameters: every scaling
``s * (init / scale)`` (and ``|.|``; Section 2.5), ``s_v sqrt(d_model)`` (eq. 21), each weight
times its output scaling (``W_u * s_u``, ``E_out * s_z``; eq. 20, 21, 3). A trained model served
for many tokens would recompute them every token. :func:`cached` keeps such a value per module
and hands it back as long as the tensors it came from are unchanged: the same tensor objects,
the same storage, the same version counters (bumped by every in-place change: an optimizer
step, ``load_state_dict``, ``p.mul_(...)`` under ``no_grad``), and no optimizer step anywhere
since (a global step hook, for optimizers that write through ``.data``, which bypasses the
counters). Folding happens only where it cannot change training: in eval mode, with gradients
disabled, outside ``torch.compile`` (:func:`folding`); ``train()`` drops the cached values.

The folded weights are copies (``W_u * s_u``...): in eval mode a model holds its MLP's up
projections and ``E_out`` twice, its attention's ``W_q``, ``W_k``, ``W_v`` (one ``[W_q; W_k;
W_v]``) and, once it decodes a single token, its MLP's ``W_o`` (contiguous) too.
``set_weight_folding(model, False)`` keeps the scalings folded but not the weights.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence

import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook

__all__ = ["folding", "cached", "Folding", "set_weight_folding", "optimizer_steps"]

_steps = [0]  # optimizer steps taken in this process (any optimizer)


def _count_step(optimizer, args, kwargs) -> None:
    _steps[0] += 1


register_optimizer_step_post_hook(_count_step)


def optimizer_steps() -> int:
    """How many ``torch.optim`` optimizer steps this process has taken (a fold key)."""
    return _steps[0]


def folding(module: nn.Module) -> bool:
    """Whether ``module`` may use folded values now: eval mode, gradients disabled, not traced."""
    return not module.training and not torch.is_grad_enabled() and not torch.compiler.is_compiling()


def _stamp(t: torch.Tensor) -> tuple:
    return (t._version, t.data_ptr(), t.dtype, t.device, t.shape)


class _Store:
    """A module's folded values: ``name -> (source refs, source stamps, optimizer steps, value)``.
    Not saved, pickled or copied (a copy recomputes its own)."""

    def __init__(self):
        self.values: dict[str, tuple] = {}

    def __getstate__(self):
        return {"values": {}}

    def __deepcopy__(self, memo):
        return _Store()


def cached(module: nn.Module, name: str, sources: Sequence[torch.Tensor], compute: Callable[[], object]):
    """``compute()``, or the value it returned last time for ``module`` and ``name`` if every
    tensor of ``sources`` is the same, unchanged one and no optimizer stepped since."""
    store = module.__dict__.get("_folded")
    if store is None:
        store = module.__dict__["_folded"] = _Store()
    entry = store.values.get(name)
    stamps = tuple(_stamp(t) for t in sources)
    if (
        entry is not None
        and entry[2] == _steps[0]
        and entry[1] == stamps
        and all(ref() is t for ref, t in zip(entry[0], sources))
    ):
        return entry[3]
    value = compute()
    store.values[name] = (tuple(weakref.ref(t) for t in sources), stamps, _steps[0], value)
    return value


def clear(module: nn.Module) -> None:
    """Drop ``module``'s folded values."""
    store = module.__dict__.get("_folded")
    if store is not None:
        store.values.clear()


class Folding:
    """A mixin for modules that fold: ``train()`` drops their folded values (they are only used in
    eval mode, and training changes the parameters they come from); ``fold_weights`` says whether
    weights may be folded too (see :func:`set_weight_folding`)."""

    fold_weights: bool = True

    def train(self, mode: bool = True):
        if mode:
            clear(self)
        return super().train(mode)


def set_weight_folding(model: nn.Module, enabled: bool) -> None:
    """Whether the modules of ``model`` fold scalings into weight copies in eval mode (the
    default) or scale outputs (no extra weight memory; the scalings themselves stay folded)."""
    for module in model.modules():
        if isinstance(module, Folding):
            module.fold_weights = bool(enabled)
            clear(module)
