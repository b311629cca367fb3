"""A sequence-to-sequence model (encoder-decoder) built from spherenet's parts.

    python examples/seq2seq.py

The encoder is a stack of nGPT blocks without the causal mask; the decoder's blocks are
:class:`~spherenet.models.NGPTCrossBlock` s: after its causal self-attention each one attends to the
encoder's output (``context=``), with its own update on the sphere (eq. 10 with ``alpha_C``).
``cross_positions=True`` rotates queries and context keys by their positions (RoPE), so a
decoder position can find the source position it corresponds to. Output logits are cosines
with the target vocabulary's unit vectors, scaled per token (eq. 1, 3) by a
:class:`~spherenet.layers.SphereClassifier`.

Decoding is incremental: one :class:`~spherenet.layers.KVCache` per block for the
self-attention (it grows a token at a time) and one for the cross-attention (the context's keys
and values, computed once).

The task: translate a sequence of tokens into the same sequence with every token moved one
place up the vocabulary (a stand-in for a monotone translation).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from spherenet.layers import KVCache, SphereClassifier, SphereEmbedding
from spherenet.models import NGPTBlock, NGPTConfig, NGPTCrossBlock
from spherenet.optim import RiemannianAdam

VOCAB, LENGTH, BOS = 12, 8, 0  # tokens 1 .. VOCAB-1; 0 starts the decoder


class Seq2Seq(nn.Module):
    def __init__(self, vocab: int, d_model: int = 32, n_heads: int = 4, n_layers: int = 2):
        super().__init__()
        self.source_embed = SphereEmbedding(vocab, d_model)
        self.target_embed = SphereEmbedding(vocab, d_model)
        sizes = dict(vocab_size=vocab, n_layers=n_layers, d_model=d_model, n_heads=n_heads)
        encoder, decoder = NGPTConfig(**sizes, causal=False), NGPTConfig(**sizes)
        self.encoder = nn.ModuleList(NGPTBlock(encoder) for _ in range(n_layers))
        self.decoder = nn.ModuleList(NGPTCrossBlock(decoder, cross_positions=True) for _ in range(n_layers))
        self.logits = SphereClassifier(d_model, vocab, normalize_input=False)  # h is unit already

    def encode(self, source: torch.Tensor) -> torch.Tensor:
        h = self.source_embed(source)
        for block in self.encoder:
            h = block(h)
        return h  # (B, S, d), on the sphere

    def decode(self, target_in: torch.Tensor, context: torch.Tensor, caches=None) -> torch.Tensor:
        h = self.target_embed(target_in)
        for i, block in enumerate(self.decoder):
            cache, cross_cache = caches[i] if caches is not None else (None, None)
            h = block(h, cache=cache, context=context, cross_cache=cross_cache)
        return self.logits(h)

    def forward(self, source: torch.Tensor, target_in: torch.Tensor) -> torch.Tensor:
        return self.decode(target_in, self.encode(source))

    @torch.no_grad()
    def greedy(self, source: torch.Tensor, length: int) -> torch.Tensor:
        """Decode ``length`` tokens, one at a time, with KV caches."""
        context = self.encode(source)
        caches = [(KVCache(), KVCache()) for _ in self.decoder]
        token = torch.full((source.shape[0], 1), BOS, dtype=torch.long)
        out = []
        for _ in range(length):
            token = self.decode(token, context, caches)[:, -1:].argmax(-1)
            out.append(token)
        return torch.cat(out, dim=1)


def batch(size: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    source = torch.randint(1, VOCAB - 1, (size, LENGTH), generator=generator)
    return source, source + 1  # the "translation"


def main(steps: int = 200, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    model = Seq2Seq(VOCAB)
    optimizer = RiemannianAdam(model, lr=0.01)
    for _ in range(steps):
        source, target = batch(64, generator)
        target_in = torch.cat([torch.full_like(target[:, :1], BOS), target[:, :-1]], dim=1)  # teacher forcing
        loss = F.cross_entropy(model(source, target_in).flatten(0, 1), target.flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    source, target = batch(256, generator)
    decoded = model.greedy(source, LENGTH)
    return {
        "loss": loss.item(),
        "token_accuracy": (decoded == target).float().mean().item(),
        "sequence_accuracy": (decoded == target).all(dim=1).float().mean().item(),
    }


if __name__ == "__main__":
    result = main()
    print(f"greedy decoding with KV caches: {result['token_accuracy']:.3f} of tokens, "
          f"{result['sequence_accuracy']:.3f} of sequences right")  # fmt: skip  # one message
