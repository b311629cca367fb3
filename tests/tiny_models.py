"""Tiny nGPT and GPT models for tests: one shape, fast on a CPU, built the same way everywhere.

``tiny_model("ngpt")`` seeds torch (``seed``, 0 unless given) and builds the model; keyword
arguments override any config field (``update="slerp"``, ``n_layers=3``). A test whose point is a
particular shape passes that shape, or keeps its own config.
"""

from __future__ import annotations

import torch

from spherenet.models import GPT, NGPT, GPTConfig, NGPTConfig

TINY_SHAPE = dict(vocab_size=32, n_layers=2, d_model=16, n_heads=2, d_mlp=24, max_seq_len=16)
_CLASSES = {"ngpt": (NGPT, NGPTConfig), "gpt": (GPT, GPTConfig)}


def tiny_config(kind: str = "ngpt", **overrides) -> NGPTConfig | GPTConfig:
    """The config of a tiny ``kind`` (``"ngpt"`` or ``"gpt"``) model: TINY_SHAPE, then ``overrides``."""
    return _CLASSES[kind][1](**{**TINY_SHAPE, **overrides})


def tiny_model(kind: str = "ngpt", seed: int = 0, **overrides) -> NGPT | GPT:
    """A tiny ``kind`` model, its weights drawn after ``torch.manual_seed(seed)``."""
    torch.manual_seed(seed)
    return _CLASSES[kind][0](tiny_config(kind, **overrides))


def tiny_ngpt(seed: int = 0, **overrides) -> NGPT:
    return tiny_model("ngpt", seed, **overrides)


def tiny_gpt(seed: int = 0, **overrides) -> GPT:
    return tiny_model("gpt", seed, **overrides)


def layer_config(d_model: int = 16, n_heads: int = 2, d_mlp: int = 32, **fields) -> NGPTConfig:
    """An nGPT config for a test of one layer or block alone: a vocabulary of 8, one layer."""
    return NGPTConfig(vocab_size=8, n_layers=1, d_model=d_model, n_heads=n_heads, d_mlp=d_mlp, **fields)
