"""Declaring your own geometry: the hyperplane of tensors whose entries sum to a fixed value.

A geometry is one small class and one ``register_geometry`` call; RiemannianAdam, SphericalMuon
and the Riemannian wrapper then keep every tensor declared on it there, with nothing in
spherenet changed. Run it: ``python examples/own_geometry.py`` (the tests run it too).
"""

from __future__ import annotations

import torch
from torch import nn

from spherenet.manifolds import declare_manifold, register_geometry
from spherenet.optim import Riemannian, RiemannianAdam, SphericalMuon, param_groups


class FixedSum:
    """``{X : sum(X) = c}``, an affine hyperplane; ``c`` is the sum when the optimizer starts.

    Its tangent space is ``{U : sum(U) = 0}``; moving along a tangent vector stays on the
    plane, so the retraction only removes rounding. Under FSDP2 the sums would need an
    all-reduce over ``like``'s mesh (see ``spherenet/manifolds/matrix_sphere.py``); this
    example is for unsharded tensors.
    """

    name = "fixed_sum"

    def init_state(self, x: torch.Tensor, like=None) -> dict:
        return {"total": float(x.double().sum())}

    def proju(self, x: torch.Tensor, u: torch.Tensor, like=None) -> torch.Tensor:
        return u - u.mean()

    def step_(self, x: torch.Tensor, direction: torch.Tensor, lr: float, state: dict, like=None) -> None:
        x.sub_(self.proju(x, direction), alpha=lr)  # a step in the tangent space
        x.add_((state["total"] - float(x.double().sum())) / x.numel())  # the retraction: back onto the plane


register_geometry(FixedSum())


def train(make_optimizer, steps: int = 50) -> tuple[float, float, float]:
    """Fit a small regression with ``layer.weight`` on the plane; returns the weight's sum at
    the start and at the end, and how far the weight moved (the norm of the change)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))
    declare_manifold(model[0], "weight", FixedSum())
    before = model[0].weight.detach().clone()
    start = float(before.double().sum())
    optimizer = make_optimizer(model)
    x, y = torch.randn(64, 8), torch.randn(64, 4)
    for _ in range(steps):
        loss = (model(x) - y).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    after = model[0].weight.detach()
    return start, float(after.double().sum()), float((after - before).norm())


OPTIMIZERS = {
    "RiemannianAdam": lambda model: RiemannianAdam(model, lr=1e-2),
    "Riemannian(SGD)": lambda model: Riemannian(torch.optim.SGD(param_groups(model), lr=1e-2, momentum=0.9), model),
    "SphericalMuon": lambda model: SphericalMuon(
        [{"params": [model[0].weight], "manifold": FixedSum.name}], lr=1e-2, ns_dtype="float32"
    ),
}

if __name__ == "__main__":
    for label, make in OPTIMIZERS.items():
        start, end, moved = train(make)
        print(f"{label:>16}: sum of the weight {start:+.6f} -> {end:+.6f}, the weight moved by {moved:.3f}")
