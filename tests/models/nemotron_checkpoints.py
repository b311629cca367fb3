"""Synthetic checkpoints in the Normalized-Nemotron layout for the layout's tests
(tests/models/test_nemotron*.py, tests/recipes/test_nemotron_recipes.py): a small config of the
layout, random tensors in it, a writer and reader of its safetensors files, the layout's forward
in float64 from its equations, a ``checkpoint`` fixture, and a small NGPT the layout can hold."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from spherenet.io import INDEX_NAME
from spherenet.models import NGPT, NGPTConfig, ScaleSpec

safetensors_torch = pytest.importorskip("safetensors.torch")
F64 = torch.float64

# a small model of the layout: grouped-query attention (2 key/value heads for 4 query heads), a
# head size (12) other than hidden_size / heads (8), and scalings away from their defaults
CONFIG = {
    "architectures": ["NGPTForCausalLM"],
    "model_type": "ngpt",
    "vocab_size": 53,
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 12,
    "hidden_act": "relu2",
    "max_position_embeddings": 64,
    "initializer_range": 0.02,
    "rope_theta": 10000.0,
    "rope_scaling": None,
    "partial_rotary_factor": 1.0,
    "attention_bias": False,
    "mlp_bias": False,
    "attention_dropout": 0.0,
    "tie_word_embeddings": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": None,
    "sqk_init_value": 1.3,
    "attn_alpha_init_value": 0.3,
    "suv_init_value": 1.0,
    "suv_init_scaling": 2.0,
    "mlp_alpha_init_value": 0.2,
    "sz_init_value": 4.0,
    "torch_dtype": "float32",
}


# ---------------------------------------------------------------------------------------------
# Synthetic checkpoints in the layout


def unit(shape, axis, generator) -> torch.Tensor:
    """Random float64 tensor whose vectors along ``axis`` are unit."""
    x = torch.randn(*shape, dtype=F64, generator=generator)
    return x / x.norm(dim=axis, keepdim=True)


def random_layout_tensors(config: dict, seed: int = 0, dtype=torch.float32) -> dict[str, torch.Tensor]:
    """Every tensor of the layout: unit vectors along the hidden_size-sized dim, stored scalings
    of random size around their initializer scale, alphas of both signs (the layout uses |alpha|)."""
    g = torch.Generator().manual_seed(seed)
    c = config
    d, v, mlp = c["hidden_size"], c["vocab_size"], c["intermediate_size"]
    hd = c.get("head_dim") or d // c["num_attention_heads"]
    q, kv = c["num_attention_heads"] * hd, (c.get("num_key_value_heads") or c["num_attention_heads"]) * hd
    r = c["initializer_range"]

    def around(n, scale, signed=False):
        x = scale * (0.5 + torch.rand(n, dtype=F64, generator=g))
        return x * torch.where(torch.rand(n, generator=g) < 0.3, -1.0, 1.0).to(F64) if signed else x

    t = {"model.embed_tokens.weight": unit((v, d), 1, g)}
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        t[p + "self_attn.q_proj.weight"] = unit((q, d), 1, g)
        t[p + "self_attn.k_proj.weight"] = unit((kv, d), 1, g)
        t[p + "self_attn.v_proj.weight"] = unit((kv, d), 1, g)
        t[p + "self_attn.o_proj.weight"] = unit((d, q), 0, g)
        t[p + "self_attn.sqk.weight"] = around(q, r)[:, None]
        t[p + "attn_alpha"] = around(d, r, signed=True)
        t[p + "mlp.up_proj.weight"] = unit((mlp, d), 1, g)
        t[p + "mlp.down_proj.weight"] = unit((d, mlp), 0, g)
        t[p + "mlp.suv.weight"] = around(mlp, c["suv_init_scaling"])[:, None]
        t[p + "mlp_alpha"] = around(d, r, signed=True)
    t["lm_head.weight"] = unit((v, d), 1, g)
    t["sz.weight"] = around(v, r)[:, None]
    return {name: x.to(dtype).contiguous() for name, x in t.items()}


def write_checkpoint(directory: Path, config: dict, tensors: dict, shards: int = 1) -> Path:
    """config.json and model.safetensors, or ``shards`` files with model.safetensors.index.json."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    if shards == 1:
        safetensors_torch.save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
        return directory
    names = list(tensors)
    weight_map = {}
    for k in range(shards):
        file = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        part = {name: tensors[name] for name in names[k::shards]}
        safetensors_torch.save_file(part, str(directory / file), metadata={"format": "pt"})
        weight_map |= dict.fromkeys(part, file)
    (directory / INDEX_NAME).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return directory


def read_checkpoint(directory: Path) -> dict[str, torch.Tensor]:
    tensors = {}
    for file in sorted(directory.glob("*.safetensors")):
        tensors |= safetensors_torch.load_file(str(file))
    return tensors


# ---------------------------------------------------------------------------------------------
# The layout's forward in float64, from its equations


def norm(x: torch.Tensor, eps: float = 0.0) -> torch.Tensor:
    return x / (x.norm(dim=-1, keepdim=True) + eps)


def rotate(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """RoPE with pairs (i, i + hd/2): x (B, heads, T, hd), positions (B, T)."""
    half = x.shape[-1] // 2
    frequencies = theta ** (-2 * torch.arange(half, dtype=F64) / x.shape[-1])
    angle = (positions.to(F64)[..., None] * frequencies)[:, None]  # (B, 1, T, half)
    first, second = x[..., :half], x[..., half:]
    return torch.cat((first * angle.cos() - second * angle.sin(), first * angle.sin() + second * angle.cos()), -1)


def reference_logits(tensors: dict, config: dict, ids: torch.Tensor) -> torch.Tensor:
    c = config
    w = {name: t.to(F64) for name, t in tensors.items()}
    heads, d = c["num_attention_heads"], c["hidden_size"]
    kv_heads = c.get("num_key_value_heads") or heads
    hd = c.get("head_dim") or d // heads
    r = c["initializer_range"]
    batch, length = ids.shape
    positions = torch.arange(length).expand(batch, length)
    causal = torch.ones(length, length, dtype=torch.bool).tril()

    def split(x, n):  # (B, T, n*hd) -> (B, n, T, hd)
        return x.view(batch, length, n, hd).transpose(1, 2)

    h = w["model.embed_tokens.weight"][ids]
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        q = rotate(split(h @ w[p + "self_attn.q_proj.weight"].T, heads), positions, c["rope_theta"])
        k = rotate(split(h @ w[p + "self_attn.k_proj.weight"].T, kv_heads), positions, c["rope_theta"])
        v = split(h @ w[p + "self_attn.v_proj.weight"].T, kv_heads)
        s_qk = (w[p + "self_attn.sqk.weight"][:, 0] * (c["sqk_init_value"] / r)).view(heads, 1, hd)
        q, k = norm(q) * s_qk**2, norm(k)
        group = heads // kv_heads
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)  # query head j: kv head j // group
        scores = (q @ k.transpose(-1, -2)) * math.sqrt(hd)
        attention = scores.masked_fill(~causal, float("-inf")).softmax(-1) @ v
        a = attention.transpose(1, 2).reshape(batch, length, heads * hd) @ w[p + "self_attn.o_proj.weight"].T
        alpha = (w[p + "attn_alpha"] * (c["attn_alpha_init_value"] / r)).abs()
        h = norm(h + alpha * (norm(a) - h))
        s_uv = w[p + "mlp.suv.weight"][:, 0] * (c["suv_init_value"] / c["suv_init_scaling"]) * math.sqrt(d)
        m = ((h @ w[p + "mlp.up_proj.weight"].T) * s_uv).relu() ** 2 @ w[p + "mlp.down_proj.weight"].T
        alpha = (w[p + "mlp_alpha"] * (c["mlp_alpha_init_value"] / r)).abs()
        h = norm(h + alpha * (norm(m, 1e-6) - h))
    return (h @ w["lm_head.weight"].T) * (w["sz.weight"][:, 0] * (c["sz_init_value"] / r))


def token_ids(config: dict, batch: int = 3, length: int = 9, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, config["vocab_size"], (batch, length), generator=torch.Generator().manual_seed(seed))


@pytest.fixture
def checkpoint(tmp_path):
    tensors = random_layout_tensors(CONFIG)
    return write_checkpoint(tmp_path / "layout", CONFIG, tensors), tensors


def layout_ngpt(**changes) -> NGPT:
    values = dict(
        vocab_size=40,
        n_layers=1,
        d_model=16,
        n_heads=4,
        n_kv_heads=2,
        head_dim=6,
        d_mlp=24,
        mlp="relu2",
        alpha_attn=ScaleSpec(init=0.05, scale=0.02, absolute=True),
        alpha_mlp=ScaleSpec(init=0.05, scale=0.02, absolute=True),
        s_qk=ScaleSpec(init=1.0, scale=0.02),
        s_uv=ScaleSpec(init=1.0, scale=1.0),
        s_z=ScaleSpec(init=1.0, scale=0.02),
    )  # fmt: skip - one config, kept compact
    return NGPT(NGPTConfig(**{**values, **changes}))
