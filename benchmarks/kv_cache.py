"""KV-cache bytes per sequence at a model shape, grouped-query attention against full multi-head.

The bytes are read from the caches the model itself fills (``KVCache.keys`` / ``.values`` after a
forward pass over the whole context), not from a formula:

- ``meta``: the whole model (every layer) is built on the meta device and run over the full
  context, so nothing is allocated; the caches' tensors still have their real shapes and dtype.
- ``real``: ``--real-layers`` attention layers of the same shape, built on the CPU with real
  weights, run over ``--real-context`` tokens, their caches' storage bytes scaled to every layer
  and the full context (a cache grows linearly with both): a check that the meta count is what
  real tensors take.

The default shape is Normalized-Nemotron-8B's: d_model 4096, 32 layers, 32 query heads of 128,
8 key/value heads, context 8192, bfloat16; the MHA row is the same model with 32 key/value heads.

    nice python benchmarks/kv_cache.py
    nice python benchmarks/kv_cache.py --d-model 1024 --layers 24 --heads 16 --kv-heads 4 --context 4096
"""

from __future__ import annotations

import argparse

import torch

from spherenet.layers import KVCache
from spherenet.models import NGPT, NGPTAttention, NGPTConfig

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
GIB = 1024**3


def _config(args, n_kv_heads: int) -> NGPTConfig:
    return NGPTConfig(
        vocab_size=args.vocab,
        n_layers=args.layers,
        d_model=args.d_model,
        n_heads=args.heads,
        n_kv_heads=n_kv_heads,
        head_dim=args.head_dim,
        d_mlp=args.d_mlp,
        mlp="relu2",
        max_seq_len=args.context,
        rope_base=1e6,
    )


def _cache_bytes(caches: list[KVCache]) -> int:
    return sum(t.numel() * t.element_size() for cache in caches for t in (cache.keys, cache.values))


def _storage_bytes(caches: list[KVCache]) -> int:
    return sum(t.untyped_storage().nbytes() for cache in caches for t in (cache.keys, cache.values))


@torch.no_grad()
def meta_bytes(config: NGPTConfig, dtype: torch.dtype) -> tuple[int, tuple[int, ...]]:
    """Bytes of every layer's cache after the whole model ran over the full context, on meta."""
    with torch.device("meta"):
        model = NGPT(config).to(dtype)
        ids = torch.zeros(1, config.max_seq_len, dtype=torch.long)
    caches = [KVCache() for _ in model.blocks]
    model(ids, kv_caches=caches)
    return _cache_bytes(caches), tuple(caches[0].keys.shape)


@torch.no_grad()
def real_bytes(config: NGPTConfig, dtype: torch.dtype, layers: int, context: int) -> int:
    """Storage bytes of ``layers`` real attention layers' caches over ``context`` tokens, scaled to
    the config's layers and context."""
    torch.manual_seed(0)
    c = config
    h = torch.nn.functional.normalize(torch.randn(1, context, c.d_model), dim=-1).to(dtype)
    caches = [KVCache() for _ in range(layers)]
    for cache in caches:
        attn = NGPTAttention(c.d_model, c.n_heads, n_kv_heads=c.n_kv_heads, head_dim=c.head_dim, rope_base=c.rope_base)
        h = torch.nn.functional.normalize(attn.to(dtype)(h, cache=cache), dim=-1)
    return _storage_bytes(caches) * c.n_layers * c.max_seq_len // (layers * context)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--d-model", type=int, default=4096)
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--d-mlp", type=int, default=21504)
    p.add_argument("--vocab", type=int, default=131072)
    p.add_argument("--context", type=int, default=8192)
    p.add_argument("--dtype", choices=DTYPES, default="bf16")
    p.add_argument("--real-layers", type=int, default=1, help="real blocks for the check (0: none)")
    p.add_argument("--real-context", type=int, default=64, help="tokens of the real check")
    args = p.parse_args(argv)
    dtype = DTYPES[args.dtype]
    print(
        f"shape: d_model {args.d_model}, {args.layers} layers, {args.heads} heads of {args.head_dim}, "
        f"context {args.context}, {args.dtype}; bytes per sequence (batch 1)"
    )
    print("| attention | key/value heads | cache per layer (K, V) | meta: all layers | real: scaled |")
    print("|---|---:|---|---:|---:|")
    rows = {}
    for name, kv in (("GQA", args.kv_heads), ("MHA", args.heads)):
        config = _config(args, kv)
        total, shape = meta_bytes(config, dtype)
        real = real_bytes(config, dtype, args.real_layers, args.real_context) if args.real_layers else None
        rows[name] = total
        real_text = f"{real / GIB:.3f} GiB ({real:,} B)" if real is not None else "-"
        print(f"| {name} | {kv} | 2 x {shape} | {total / GIB:.3f} GiB ({total:,} B) | {real_text} |")
    print(f"MHA / GQA: {rows['MHA'] / rows['GQA']:.2f}x")


if __name__ == "__main__":
    main()
