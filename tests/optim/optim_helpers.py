"""The small model and training helpers of the optimizer tests (tests/optim/test_optim*.py): a
model with every kind of parameter nGPT has, its batches, loss and training loop, and the
distances the tests measure (rows off the unit sphere, parameters between two models)."""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from spherenet.layers import Scale, SphereEmbedding, SphereLinear
from spherenet.optim import normalize_, sphere_parameters

V, D, H = 13, 8, 12
SPHERE_NAMES = {"emb.weight", "q.weight", "o.weight", "out.weight"}


class Tiny(nn.Module):
    """Every kind of parameter nGPT has: a sphere embedding, sphere matrices with the sphere
    on the input side and (stored transposed) on the output side, a Scale, and plain Linear."""

    def __init__(self, vocab: int = V, d: int = D, hidden: int = H):
        super().__init__()
        self.emb = SphereEmbedding(vocab, d)
        self.q = SphereLinear(d, hidden, sphere="in")
        self.o = SphereLinear(hidden, d, sphere="out")
        self.s = Scale(hidden, init=1.0, scale=1 / math.sqrt(d))
        self.mix = nn.Linear(d, d)
        self.out = SphereLinear(d, vocab, sphere="in")

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.emb(ids)
        h = F.normalize(h + self.o(torch.tanh(self.q(h) * self.s())), dim=-1)
        return self.out(h + 0.1 * self.mix(h)) * 5.0


def make_model(dtype=torch.float32, seed=0) -> Tiny:
    torch.manual_seed(seed)
    model = Tiny().to(dtype)
    normalize_(model)  # unit in the working dtype (a float32 unit row is 1e-8 off in float64)
    return model


def batches(n: int, seed: int = 1, vocab: int = V):
    g = torch.Generator().manual_seed(seed)
    draw = lambda: torch.randint(0, vocab, (4, 6), generator=g)  # noqa: E731
    return [(draw(), draw()) for _ in range(n)]


def loss_of(model, ids, tgt):
    logits = model(ids)
    return F.cross_entropy(logits.flatten(0, 1), tgt.flatten())


def train(model, opt, data, after_step=None, scheduler=None) -> list[float]:
    losses = []
    for ids, tgt in data:
        opt.zero_grad(set_to_none=True)
        loss = loss_of(model, ids, tgt)
        loss.backward()
        opt.step()
        if scheduler is not None:
            scheduler.step()
        losses.append(loss.item())
        if after_step is not None:
            after_step()
    return losses


def max_norm_error(model) -> float:
    return max(float((p.detach().double().norm(dim=-1) - 1).abs().max()) for p in sphere_parameters(model))


def max_param_diff(a: nn.Module, b: nn.Module) -> float:
    return max(float((p.detach() - q.detach()).abs().max()) for p, q in zip(a.parameters(), b.parameters()))


def named_params(model):
    return dict(model.named_parameters())
