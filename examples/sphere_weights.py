"""Sphere weights on a model you already have: declare them, then train with a sphere optimizer.

    python examples/sphere_weights.py

Any ``nn.Module`` can hold weights on the unit sphere. :func:`~spherenet.manifolds.declare_sphere`
records, on the module that owns it, that a parameter is made of unit vectors along its last
dimension (for ``nn.Linear.weight``, shaped ``(out, in)``: each output unit's weight vector).
The optimizers read those declarations, so the model's code does not change:

- :class:`~spherenet.optim.RiemannianAdam` steps the declared weights on the sphere and every
  other parameter with AdamW;
- :class:`~spherenet.optim.Riemannian` makes any torch optimizer (here SGD with momentum) do the
  same: gradients projected, parameters retracted, momentum transported.

:func:`~spherenet.optim.normalize_` puts the declared rows on the sphere before the first step
(an optimizer would otherwise project them itself, with a warning).

The task: two interleaved spirals in the plane, a small multilayer perceptron.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from spherenet.manifolds import declare_sphere, named_sphere_parameters
from spherenet.optim import Riemannian, RiemannianAdam, normalize_


def spirals(n: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    labels = torch.randint(0, 2, (n,), generator=generator)
    t = torch.rand(n, generator=generator) * 3 * math.pi
    angle = t + math.pi * labels
    points = torch.stack([t * torch.cos(angle), t * torch.sin(angle)], dim=1) / (3 * math.pi)
    return points + 0.02 * torch.randn(n, 2, generator=generator), labels


def existing_model() -> nn.Module:
    """The model as you had it: plain PyTorch."""
    return nn.Sequential(nn.Linear(2, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 2))


def on_the_sphere(model: nn.Module) -> nn.Module:
    """The hidden layer's weight rows become unit vectors; nothing else changes."""
    declare_sphere(model[2], "weight")
    normalize_(model)  # every declared row to unit norm
    return model


def train(make_optimizer, steps: int, seed: int) -> dict[str, float]:
    torch.manual_seed(seed)
    model = on_the_sphere(existing_model())
    optimizer = make_optimizer(model)
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x, y = spirals(256, generator)
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    x, y = spirals(2000, torch.Generator().manual_seed(seed + 1))
    with torch.no_grad():
        accuracy = (model(x).argmax(-1) == y).float().mean().item()
    drift = max((p.norm(dim=-1) - 1).abs().max().item() for _, p in named_sphere_parameters(model))
    return {"accuracy": accuracy, "drift": drift}


OPTIMIZERS = {
    "RiemannianAdam": lambda model: RiemannianAdam(model, lr=1e-2),
    "Riemannian(SGD, momentum 0.9)": lambda model: Riemannian(
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), model
    ),
}


def main(steps: int = 600, seed: int = 0) -> dict[str, dict[str, float]]:
    print("declared on the sphere:", [name for name, _ in named_sphere_parameters(on_the_sphere(existing_model()))])
    results = {label: train(make, steps, seed) for label, make in OPTIMIZERS.items()}
    print("\n| optimizer | test accuracy | largest abs(row norm - 1) |")
    print("|---|---|---|")
    for label, r in results.items():
        print(f"| {label} | {r['accuracy']:.3f} | {r['drift']:.1e} |")
    return results


if __name__ == "__main__":
    main()
