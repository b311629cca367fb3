"""The step of a training loop: one optimizer step over micro-batches (gradient accumulation,
the non-finite policy, global gradient clipping), its loss, and evaluation.

The recipe (``recipes.trainer.Trainer``) owns the loop itself; these functions are what it
repeats, and ``spherenet.train.metrics.MetricsLog`` what it writes. Every rank calls them in
lockstep: decisions that must agree across ranks (skipping a step for a non-finite loss) are
all-reduced first.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterable, Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

__all__ = [
    "StepResult",
    "NonFiniteError",
    "lm_loss",
    "gradient_sync",
    "train_step",
    "evaluate",
    "autocast_context",
    "autocast_dtype",
]


class NonFiniteError(RuntimeError):
    """A NaN/inf loss or gradient under the policy "stop" (or too many skips in a row)."""


@dataclass
class StepResult:
    loss: float  # mean over the global batch (all ranks, all micro-batches)
    grad_norm: float  # global L2 norm of the gradient before clipping (nan when skipped)
    skipped: bool  # True when the loss or a gradient was non-finite and no update was made


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Next-token cross entropy, mean over all positions, computed in float32 (eq. 2)."""
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(0, 1))


def autocast_dtype(mode: str, device: torch.device) -> torch.dtype | None:
    """The dtype autocast computes in for ``mode`` on ``device`` ("bf16": bfloat16, "off":
    None, "auto": bfloat16 on CUDA, None on CPU)."""
    if mode == "auto":
        mode = "bf16" if device.type == "cuda" else "off"
    return torch.bfloat16 if mode == "bf16" else None


def autocast_context(mode: str, device: torch.device):
    """Autocast to :func:`autocast_dtype`'s dtype, or nothing when it is None."""
    dtype = autocast_dtype(mode, device)
    if dtype is not None:
        return torch.autocast(device_type=device.type, dtype=dtype)
    return contextlib.nullcontext()


def _any_across_ranks(flag: bool, device: torch.device) -> bool:
    if dist.is_initialized() and dist.get_world_size() > 1:
        t = torch.tensor([1.0 if flag else 0.0], device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return bool(t.item() > 0)
    return flag


def _local_grads(model: nn.Module) -> list[torch.Tensor]:
    grads = []
    for p in model.parameters():
        if p.grad is not None:
            g = p.grad
            grads.append(g.to_local() if hasattr(g, "to_local") else g)
    return grads


def _global_grad_norm(grads: list[torch.Tensor], sharded: bool, device: torch.device) -> torch.Tensor:
    """L2 norm of the whole gradient; under FSDP each rank holds a shard, so squares are summed."""
    if not grads:
        return torch.zeros((), device=device)
    sq = torch.stack([n.float() ** 2 for n in torch._foreach_norm(grads)]).sum()
    if sharded and dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(sq, op=dist.ReduceOp.SUM)
    return sq.sqrt()


@contextlib.contextmanager
def gradient_sync(model: nn.Module, enabled: bool):
    """Backward passes inside reduce gradients over ranks only when ``enabled``.

    Gradient accumulation needs the reduction once, after the last micro-batch: DDP's
    ``no_sync()`` and FSDP2's ``set_requires_gradient_sync(False)`` keep the gradients local
    (FSDP2: unsharded, accumulated) until a backward with the sync on reduces their sum.
    FSDP2 still reshards the parameters after each backward, so the next micro-batch's forward
    gathers them again: memory stays at the sharded level, and only the gradient
    reduce-scatters are saved. A model without either (one process) is left alone.
    """
    if enabled:
        yield
    elif hasattr(model, "no_sync"):  # DistributedDataParallel (torch.compile forwards the attribute)
        with model.no_sync():
            yield
    elif hasattr(model, "set_requires_gradient_sync"):  # FSDP2 (fully_shard)
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)
    else:
        yield


def train_step(
    model: nn.Module,
    micro_batches: Sequence[tuple[torch.Tensor, torch.Tensor]],
    optimizer: torch.optim.Optimizer,
    *,
    autocast: str = "off",
    grad_clip: float = 0.0,
    nonfinite: str = "skip",
    sharded: bool = False,
) -> StepResult:
    """Forward/backward over ``micro_batches`` (gradient accumulation), then one optimizer step.

    The loss of each micro-batch is divided by their number, so the gradient is that of the
    mean loss over the rank's batch; DDP/FSDP average over ranks, once per step (after the last
    micro-batch, see :func:`gradient_sync`). A non-finite loss or gradient
    on any rank skips the update on all ranks (``nonfinite="skip"``) or raises
    :class:`NonFiniteError` (``"stop"``); gradients are cleared either way.
    """
    if nonfinite not in ("skip", "stop"):
        raise ValueError(f"nonfinite must be 'skip' or 'stop', got {nonfinite!r}")
    device = micro_batches[0][0].device
    n = len(micro_batches)
    total = torch.zeros((), device=device)
    for i, (x, y) in enumerate(micro_batches):
        with gradient_sync(model, enabled=i == n - 1):
            with autocast_context(autocast, device):
                logits = model(x)
            loss = lm_loss(logits, y) / n
            loss.backward()
        total += loss.detach()
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
        total /= dist.get_world_size()
    grads = _local_grads(model)
    grad_norm = _global_grad_norm(grads, sharded, device)
    bad = _any_across_ranks(not (torch.isfinite(total) and torch.isfinite(grad_norm)), device)
    if bad:
        optimizer.zero_grad(set_to_none=True)
        if nonfinite == "stop":
            raise NonFiniteError(
                f"non-finite loss ({total.item()}) or gradient norm ({grad_norm.item()}); stopping with the "
                "last good checkpoint kept (set train.nonfinite=skip to skip such steps instead)"
            )
        return StepResult(float(total), float("nan"), True)
    if grad_clip > 0:
        # A global norm, so every rank scales by the same factor (FSDP: shards summed above).
        scale = torch.clamp(grad_clip / (grad_norm + 1e-6), max=1.0)
        torch._foreach_mul_(grads, scale)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return StepResult(float(total), float(grad_norm), False)


@torch.no_grad()
def evaluate(model: nn.Module, batches: Iterable[tuple[torch.Tensor, torch.Tensor]], autocast: str = "off") -> float:
    """Mean loss over ``batches`` (each rank its own share), averaged over ranks."""
    was_training = model.training
    model.eval()
    total, count, device = 0.0, 0, None
    for x, y in batches:
        device = x.device
        with autocast_context(autocast, device):
            logits = model(x)
        total += float(lm_loss(logits, y))
        count += 1
    model.train(was_training)
    if count == 0:
        raise ValueError("evaluate: no batches (is the validation split smaller than one window?)")
    mean = torch.tensor([total / count], device=device, dtype=torch.float64)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(mean, op=dist.ReduceOp.SUM)
        mean /= dist.get_world_size()
    return float(mean)
