"""Your own spherical language model from spherenet's parts, trained for a few steps.

    python examples/own_model.py

Three parts make an nGPT-style model: a :class:`~spherenet.layers.SphereEmbedding` (unit rows),
nGPT blocks (:class:`~spherenet.models.NGPTBlock`: the hidden state moves along the sphere by
eq. 10, 11) and a :class:`~spherenet.layers.SphereClassifier` (cosine logits scaled per token,
eq. 1, 3). Every sphere weight is declared by the part that owns it, so
:class:`~spherenet.optim.RiemannianAdam` finds them with no registration step and keeps them
unit; every other parameter (the eigen learning rates, the scalings) gets AdamW.

The corpus is a few modules of this Python's standard library, byte by byte: no download.
"""

from __future__ import annotations

import json.decoder
import string
import textwrap
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from spherenet.layers import SphereClassifier, SphereEmbedding
from spherenet.manifolds import named_sphere_parameters
from spherenet.models import NGPTBlock, NGPTConfig
from spherenet.optim import RiemannianAdam

CONTEXT = 64


class SphereLM(nn.Module):
    def __init__(self, vocab: int = 256, d_model: int = 64, n_heads: int = 4, n_layers: int = 2):
        super().__init__()
        config = NGPTConfig(vocab_size=vocab, n_layers=n_layers, d_model=d_model, n_heads=n_heads, max_seq_len=CONTEXT)
        self.embed = SphereEmbedding(vocab, d_model)
        self.blocks = nn.ModuleList(NGPTBlock(config) for _ in range(n_layers))
        self.head = SphereClassifier(d_model, vocab, normalize_input=False)  # h is unit already

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)  # (batch, time, d_model), unit rows
        for block in self.blocks:  # causal by default (NGPTConfig.causal)
            h = block(h)
        return self.head(h)  # (batch, time, vocab)


def corpus() -> torch.Tensor:
    modules = (textwrap, string, json.decoder)
    return torch.tensor(list(b"".join(Path(m.__file__).read_bytes() for m in modules)))


def batches(tokens: torch.Tensor, size: int, generator: torch.Generator):
    while True:
        start = torch.randint(0, len(tokens) - CONTEXT - 1, (size,), generator=generator)
        window = torch.stack([tokens[s : s + CONTEXT + 1] for s in start.tolist()])
        yield window[:, :-1], window[:, 1:]


def main(steps: int = 60, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    model = SphereLM()
    print("sphere weights:", ", ".join(name for name, _ in named_sphere_parameters(model)))
    optimizer = RiemannianAdam(model, lr=1e-2)  # Adam on the sphere (then retract), AdamW elsewhere
    data = batches(corpus(), 8, torch.Generator().manual_seed(seed))
    losses = []
    for step in range(steps):
        x, y = next(data)
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        if step % 20 == 0 or step == steps - 1:
            print(f"step {step:3d}  loss {loss.item():.3f} nats per byte")
    drift = max((p.norm(dim=-1) - 1).abs().max().item() for _, p in named_sphere_parameters(model))
    print(f"largest |row norm - 1| over the sphere weights: {drift:.1e}")
    return {"first_loss": losses[0], "last_loss": losses[-1], "drift": drift}


if __name__ == "__main__":
    main()
