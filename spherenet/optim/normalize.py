"""The paper's method: a Euclidean optimizer step, then renormalize every sphere weight.

Section 2.6, step 2 ("After each training step, normalize all matrices E_input, E_output,
W_q, W_k, W_v, W_o, W_u, W_nu and W_o_MLP along their embedding dimension"). Which tensors
to normalize is read from the model's declarations
(:func:`spherenet.manifolds.named_sphere_parameters`), so it
stays right after ``fully_shard`` and ``load_state_dict(assign=True)``.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.optim import Optimizer

from ..kernels.sphere_rows import normalize_rows_
from ..manifolds import named_sphere_parameters
from ._checks import check_sphere_layout, local

__all__ = ["normalize_", "add_normalize_hook"]


@torch.compiler.disable
def normalize_(model: nn.Module) -> int:
    """Renormalize, in place, every row of every sphere weight declared in ``model``:
    ``W <- Norm(W)`` along the last (embedding) dimension. Returns the number of tensors.

    Works on FSDP2 shards (rows are whole on each rank; no communication). A zero row stays
    zero (it has no direction). Eager even under ``torch.compile``. The row op is
    :func:`spherenet.kernels.normalize_rows_` (Triton where Triton is chosen, one read and one
    write; ``_foreach`` passes elsewhere).
    """
    named = named_sphere_parameters(model)
    xs = []
    for name, p in named:
        check_sphere_layout(p, name)
        xs.append(local(p))
    with torch.no_grad():
        normalize_rows_(xs)
    return len(xs)


def add_normalize_hook(optimizer: Optimizer, model: nn.Module):
    """Run :func:`normalize_` on ``model`` after every ``optimizer.step()`` ("Euclidean step then
    normalize", Section 2.6 step 2). Returns the hook handle (``handle.remove()`` undoes it).

    Refuses (``ValueError`` now, ``RuntimeError`` at a later step) a declared sphere parameter
    that ``optimizer`` does not hold: the model's parameters were replaced after the optimizer
    was built (``fully_shard``, ``load_state_dict(assign=True)``), so the optimizer would update
    tensors the model no longer uses while the hook renormalizes frozen ones.
    """
    if not isinstance(optimizer, Optimizer):
        raise TypeError(f"add_normalize_hook expects a torch.optim.Optimizer, got {type(optimizer).__name__}")
    if not isinstance(model, nn.Module):
        raise TypeError(f"add_normalize_hook expects an nn.Module, got {type(model).__name__}")

    def held() -> set[int]:
        return {id(p) for g in optimizer.param_groups for p in g["params"]}

    def check(where: str, exc: type[Exception]) -> None:
        ids = held()
        missing = [name for name, p in named_sphere_parameters(model) if id(p) not in ids]
        if missing:
            raise exc(
                f"add_normalize_hook ({where}): the optimizer does not hold the model's sphere parameter(s) "
                f"{missing[:5]}; build the optimizer after fully_shard / load_state_dict(assign=True)."
            )

    check("registration", ValueError)

    def hook(opt, args, kwargs):
        check("after step", RuntimeError)
        normalize_(model)

    return optimizer.register_step_post_hook(hook)
