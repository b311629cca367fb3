"""What training logs about an nGPT while it runs: how far its sphere weights are from unit
norm, and the eigen learning rates its residual updates apply (eq. 10, 11).

Both work on any layout of the model: unsharded, DDP, or FSDP2 (whose local shards hold whole
rows, and whose alpha vectors are sharded: sums and counts are reduced over the ranks). Every
rank must call them; the reduction runs on ``device`` (NCCL needs CUDA tensors).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from ..manifolds import Sphere, named_sphere_parameters

__all__ = ["sphere_norm_error", "eigen_learning_rates"]


def _reduce(value: torch.Tensor, op) -> torch.Tensor:
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        value = value.clone()
        dist.all_reduce(value, op=op)
    return value


def _local(t: torch.Tensor) -> torch.Tensor:
    t = t.detach()
    return t.to_local() if hasattr(t, "to_local") else t


def sphere_norm_error(model: nn.Module, device: torch.device | str = "cpu") -> float:
    """max |‖row‖ - 1| over every declared sphere weight and every rank (the manifold's
    :meth:`~spherenet.manifolds.Sphere.norm_error`); 0.0 for a model without sphere weights."""
    worst = torch.zeros((), dtype=torch.float64, device=device)
    for _, p in named_sphere_parameters(model):
        worst = torch.maximum(worst, Sphere.norm_error(_local(p)).to(worst))
    return float(_reduce(worst, dist.ReduceOp.MAX))


def eigen_learning_rates(model: nn.Module, device: torch.device | str = "cpu") -> dict[str, list[float]]:
    """Per layer, the mean |alpha_A| and |alpha_M|: the eigen learning rates of the attention and
    MLP updates (eq. 10, 11) as the forward pass applies them. ``{}`` for a model without them
    (GPT)."""
    blocks = getattr(model, "blocks", None)
    if blocks is None or not all(hasattr(b, "residual_attn") and hasattr(b, "residual_mlp") for b in blocks):
        return {}
    parts = []
    with torch.no_grad():
        for block in blocks:
            for residual in (block.residual_attn, block.residual_mlp):
                alpha = _local(residual.alpha())
                total = alpha.abs().sum(dtype=torch.float64)
                parts.append(torch.stack([total, total.new_tensor(float(alpha.numel()))]).to(device))
    # sums and counts over ranks: their ratio is the mean over every element
    sums, counts = _reduce(torch.stack(parts), dist.ReduceOp.SUM).cpu().unbind(1)
    means = (sums / counts.clamp(min=1)).view(len(blocks), 2).tolist()
    return {"alpha_A_mean_abs": [m[0] for m in means], "alpha_M_mean_abs": [m[1] for m in means]}
