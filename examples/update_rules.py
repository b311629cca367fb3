"""LERP, SLERP and the Riemannian update side by side: one tiny nGPT each, same data and seed.

    python examples/update_rules.py

An nGPT block moves its hidden state ``h`` towards each sublayer's output ``h_A`` by an eigen
learning rate ``alpha`` and stays on the unit sphere. ``NGPTConfig.update`` picks how:

- ``"lerp"``: ``Norm(h + alpha (h_A - h))``, the paper's (eq. 10, 11);
- ``"slerp"``: along the great circle through ``h`` and ``h_A`` (eq. 6);
- ``"riemannian"``: ``Norm(h - alpha (h (h . h_A) - h_A))``, the step along the tangent
  projection of ``h_A`` (eq. 24-26).

Each model trains a few dozen steps on a few modules of this Python's standard library (byte
level, no download) with the paper's optimizer, and is scored on held-out windows. A run this
short cannot rank the rules: the studies in the documentation's results pages do that, with
bracketed learning rates and several seeds.
"""

from __future__ import annotations

import json.decoder
import string
import textwrap
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from spherenet.models import from_preset
from spherenet.optim import build_optimizer

CONTEXT, BATCH = 64, 8


def corpus() -> torch.Tensor:
    modules = (textwrap, string, json.decoder)
    return torch.tensor(list(b"".join(Path(m.__file__).read_bytes() for m in modules)))


def windows(tokens: torch.Tensor, count: int, generator: torch.Generator) -> torch.Tensor:
    start = torch.randint(0, len(tokens) - CONTEXT - 1, (count,), generator=generator)
    return torch.stack([tokens[s : s + CONTEXT + 1] for s in start.tolist()])


def loss_of(model, batch: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(model(batch[:, :-1]).flatten(0, 1), batch[:, 1:].flatten())


def train(update: str, tokens: torch.Tensor, steps: int, seed: int) -> dict[str, float]:
    torch.manual_seed(seed)  # the same initial weights for every rule
    model = from_preset("ngpt-tiny", update=update, max_seq_len=CONTEXT)
    optimizer, schedule = build_optimizer(model, "riemannian_adam", lr=1e-2, total_steps=steps)
    split = int(0.9 * len(tokens))
    generator = torch.Generator().manual_seed(seed)  # the same batches for every rule
    start = time.perf_counter()
    for _ in range(steps):
        loss = loss_of(model, windows(tokens[:split], BATCH, generator))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
    seconds = (time.perf_counter() - start) / steps
    with torch.no_grad():
        val = loss_of(model, windows(tokens[split:], 64, torch.Generator().manual_seed(1))).item()
    return {"train_loss": loss.item(), "val_loss": val, "ms_per_step": 1000 * seconds}


def main(steps: int = 60, seed: int = 0) -> dict[str, dict[str, float]]:
    tokens = corpus()
    results = {update: train(update, tokens, steps, seed) for update in ("lerp", "slerp", "riemannian")}
    print(f"{steps} steps of {BATCH} x {CONTEXT} bytes, ngpt-tiny, seed {seed}\n")
    print("| update | last training loss | validation loss | ms / step |")
    print("|---|---|---|---|")
    for update, r in results.items():
        print(f"| {update} | {r['train_loss']:.3f} | {r['val_loss']:.3f} | {r['ms_per_step']:.0f} |")
    return results


if __name__ == "__main__":
    main()
