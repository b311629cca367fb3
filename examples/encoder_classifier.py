"""A masked encoder classifier built from spherenet's parts.

    python examples/encoder_classifier.py

Sequences of different lengths are padded to one length; the padding is masked out of the
attention (``attn_mask``, SDPA's convention: True attends) and out of the pooling, so what
stands in the padded positions does not change the prediction. The encoder is nGPT's block
without the causal mask; the hidden states stay on the unit sphere, the pooled state is
normalized, and a :class:`~spherenet.layers.SphereClassifier` gives cosine logits with a learned
scale per class. ``RiemannianAdam`` finds the sphere weights (embedding, block matrices, class
vectors) by their declarations and keeps them unit.

The task: does the sequence contain the token 1? The padding is filled with random tokens, 1
included, so a model that looked at it would be misled.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from spherenet import kernels
from spherenet.layers import SphereClassifier, SphereEmbedding
from spherenet.models import NGPTBlock, NGPTConfig
from spherenet.optim import RiemannianAdam

VOCAB, LENGTH, TARGET = 16, 12, 1


class EncoderClassifier(nn.Module):
    def __init__(self, vocab: int, d_model: int = 32, n_heads: int = 4, n_layers: int = 2, n_classes: int = 2):
        super().__init__()
        self.embed = SphereEmbedding(vocab, d_model)
        config = NGPTConfig(vocab_size=vocab, n_layers=n_layers, d_model=d_model, n_heads=n_heads, causal=False)
        self.blocks = nn.ModuleList(NGPTBlock(config) for _ in range(n_layers))
        self.head = SphereClassifier(d_model, n_classes)

    def forward(self, ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        real = torch.arange(ids.shape[1], device=ids.device) < lengths[:, None]  # (B, T): not padding
        h = self.embed(ids)
        for block in self.blocks:
            h = block(h, attn_mask=real[:, None, None, :])  # every query sees the real keys only
        pooled = (h * real[..., None]).sum(1)  # the padded positions do not count
        return self.head(kernels.normalize(pooled))


def batch(size: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Token ids (padding filled with noise), lengths, and labels (1: the token 1 occurs)."""
    lengths = torch.randint(3, LENGTH + 1, (size,), generator=generator)
    ids = torch.randint(2, VOCAB, (size, LENGTH), generator=generator)
    labels = torch.randint(0, 2, (size,), generator=generator)
    where = (torch.rand(size, generator=generator) * lengths).long()
    ids[labels == 1, where[labels == 1]] = TARGET
    padding = torch.arange(LENGTH) >= lengths[:, None]
    ids[padding] = torch.randint(0, VOCAB, (int(padding.sum()),), generator=generator)  # noise, 1 included
    return ids, lengths, labels


def main(steps: int = 150, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    model = EncoderClassifier(VOCAB)
    optimizer = RiemannianAdam(model, lr=0.01)
    for _ in range(steps):
        ids, lengths, labels = batch(64, generator)
        loss = F.cross_entropy(model(ids, lengths), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    ids, lengths, labels = batch(512, generator)
    with torch.no_grad():
        accuracy = (model(ids, lengths).argmax(-1) == labels).float().mean().item()
        noise = ids.clone()
        padding = torch.arange(LENGTH) >= lengths[:, None]
        noise[padding] = (noise[padding] + 1) % VOCAB  # other padding, same sequences
        padding_effect = (model(noise, lengths) - model(ids, lengths)).abs().max().item()
    return {"loss": loss.item(), "accuracy": accuracy, "padding_effect": padding_effect}


if __name__ == "__main__":
    result = main()
    print(f"accuracy {result['accuracy']:.3f}, largest change of a logit when only the padding changes "
          f"{result['padding_effect']:.1e}")  # fmt: skip  # one message
