"""The Normalized-Nemotron layout (spherenet.io.nemotron_*, spherenet.models.from_normalized_nemotron): tiny synthetic checkpoints written
here in that layout, loaded as NGPT and compared with a float64 forward of the layout's
equations, written back, and refused when they are bad."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from spherenet.io import INDEX_NAME, nemotron_config_of, read_header, read_into, to_normalized_nemotron
from spherenet.layers import KVCache
from spherenet.models import GPT, NGPT, GPTConfig, NGPTConfig, PretrainedFileError, ScaleSpec, from_normalized_nemotron

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


# ---------------------------------------------------------------------------------------------
# Logits


@pytest.mark.parametrize(
    "changes",
    [
        {},  # grouped-query attention, head_dim != hidden_size / heads
        {"rope_theta": 1e6},
        {"num_key_value_heads": 1},  # multi-query
        {"num_key_value_heads": 4, "head_dim": None},  # multi-head, head_dim from hidden_size / heads
    ],
    ids=["gqa", "rope-1e6", "mqa", "mha"],
)
def test_logits_equal_the_float64_forward_of_the_layout(tmp_path, changes):
    config = {**CONFIG, **changes}
    tensors = random_layout_tensors(config, seed=3)
    model = from_normalized_nemotron(write_checkpoint(tmp_path, config, tensors))
    assert isinstance(model, NGPT) and not model.training and model.embed_in.weight.dtype == torch.float32
    c = model.config
    hd = config["head_dim"] or 8
    assert (c.n_heads, c.n_kv_heads, c.head_dim, c.mlp) == (4, config["num_key_value_heads"], hd, "relu2")
    assert c.rope_base == config["rope_theta"] and c.max_seq_len == 64 and c.d_mlp == 48
    ids = token_ids(config)
    expected = reference_logits(tensors, config, ids)
    with torch.no_grad():
        logits = model(ids)
    assert logits.dtype == torch.float32
    assert torch.allclose(logits.to(F64), expected, rtol=0, atol=1e-5), float((logits - expected).abs().max())
    assert float(expected.std()) > 0.5  # the scalings matter: not a trivially small comparison


def test_incremental_decoding_with_a_kv_cache_equals_the_forward(checkpoint):
    directory, tensors = checkpoint
    model = from_normalized_nemotron(directory)
    ids = token_ids(CONFIG, batch=2, length=8)
    expected = reference_logits(tensors, CONFIG, ids)
    caches = [KVCache() for _ in model.blocks]
    with torch.no_grad():
        steps = [model(ids[:, :3], kv_caches=caches)]
        steps += [model(ids[:, t : t + 1], kv_caches=caches) for t in range(3, 8)]
    logits = torch.cat(steps, dim=1)
    assert caches[0].keys.shape == (2, CONFIG["num_key_value_heads"], 8, 12)  # only the key/value heads
    assert torch.allclose(logits.to(F64), expected, rtol=0, atol=1e-5), float((logits - expected).abs().max())


def test_bfloat16_and_device_arguments(checkpoint):
    directory, tensors = checkpoint
    model = from_normalized_nemotron(directory, dtype=torch.bfloat16, device="cpu")
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    by_name = from_normalized_nemotron(directory, dtype="bfloat16", device=torch.device("cpu"))
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), by_name.parameters()))
    with pytest.raises(ValueError, match="int8"):
        from_normalized_nemotron(directory, dtype="int8")
    assert {p.device for p in model.parameters()} == {torch.device("cpu")}
    for name, parameter in model.named_parameters():  # each value is the stored one, rounded once
        assert torch.isfinite(parameter).all(), name
    assert torch.equal(model.embed_in.weight, tensors["model.embed_tokens.weight"].to(torch.bfloat16))
    assert torch.equal(model.blocks[1].mlp.w_o.weight, tensors["model.layers.1.mlp.down_proj.weight"].T.bfloat16())
    ids = token_ids(CONFIG)
    with torch.no_grad():
        logits = model(ids).to(F64)
    expected = reference_logits(tensors, CONFIG, ids)
    assert float((logits - expected).abs().max()) < 0.1 * float(expected.abs().max())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_loads_onto_a_cuda_device(checkpoint):
    directory, tensors = checkpoint
    model = from_normalized_nemotron(directory, device="cuda")
    assert {p.device.type for p in model.parameters()} == {"cuda"}
    ids = token_ids(CONFIG)
    with torch.no_grad():
        logits = model(ids.cuda()).cpu().to(F64)
    assert torch.allclose(logits, reference_logits(tensors, CONFIG, ids), rtol=0, atol=1e-4)


def test_stored_dtype_is_kept_and_mixed_dtypes_load_as_the_widest(tmp_path):
    bf16 = random_layout_tensors(CONFIG, dtype=torch.bfloat16)
    model = from_normalized_nemotron(write_checkpoint(tmp_path / "a", CONFIG, bf16))
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    mixed = {**bf16, "sz.weight": bf16["sz.weight"].float()}
    model = from_normalized_nemotron(write_checkpoint(tmp_path / "b", CONFIG, mixed))
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert torch.equal(model.s_z.param, mixed["sz.weight"][:, 0])


# ---------------------------------------------------------------------------------------------
# Writing back


@pytest.mark.parametrize("shards", [1, 3])
def test_round_trip_writes_back_the_same_names_and_values(tmp_path, shards):
    tensors = random_layout_tensors(CONFIG, seed=5)
    source = write_checkpoint(tmp_path / "source", CONFIG, tensors, shards=shards)
    model = from_normalized_nemotron(source)
    out = tmp_path / "out"
    to_normalized_nemotron(model, out, max_shard_size=4000 if shards > 1 else "5GB")
    written = read_checkpoint(out)
    assert sorted(written) == sorted(tensors)
    for name, tensor in tensors.items():
        assert written[name].dtype == tensor.dtype and torch.equal(written[name], tensor), name
    files = sorted(p.name for p in out.iterdir())
    if shards > 1:
        index = json.loads((out / INDEX_NAME).read_text())
        assert set(index["weight_map"]) == set(tensors) and len(set(index["weight_map"].values())) > 1
        assert "model.safetensors" not in files
        assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in tensors.values())
        for name, file in index["weight_map"].items():
            assert name in read_header(out / file)
    else:
        assert files == ["config.json", "model.safetensors", "sha256sums.json"]
    config = json.loads((out / "config.json").read_text())
    for field, value in CONFIG.items():
        if field not in ("bos_token_id", "eos_token_id", "pad_token_id"):  # not part of the model
            assert config.get(field) == value, field  # rope_scaling null is left out: the same model
    assert "rope_scaling" not in config
    reloaded = from_normalized_nemotron(out)
    assert reloaded.config == model.config
    ids = token_ids(CONFIG)
    with torch.no_grad():
        assert torch.equal(reloaded(ids), model(ids))


def test_rewriting_a_directory_removes_its_old_weight_files(tmp_path, checkpoint):
    directory, tensors = checkpoint
    model = from_normalized_nemotron(directory)
    to_normalized_nemotron(model, directory, max_shard_size=4000)
    assert not (directory / "model.safetensors").exists() and (directory / INDEX_NAME).exists()
    to_normalized_nemotron(model, directory)
    assert sorted(p.name for p in directory.iterdir()) == ["config.json", "model.safetensors", "sha256sums.json"]


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


def test_a_new_model_written_in_the_layout_loads_with_its_logits(tmp_path):
    model = layout_ngpt().eval()
    to_normalized_nemotron(model, tmp_path)
    loaded = from_normalized_nemotron(tmp_path)
    assert loaded.config == model.config
    ids = torch.randint(0, 40, (2, 5))
    tensors, config = read_checkpoint(tmp_path), json.loads((tmp_path / "config.json").read_text())
    with torch.no_grad():
        assert torch.equal(loaded(ids), model(ids))
        assert torch.allclose(model(ids).to(F64), reference_logits(tensors, config, ids), rtol=0, atol=1e-5)


@pytest.mark.parametrize(
    "changes, named",
    [
        ({"mlp": "swiglu"}, "mlp='swiglu'"),
        ({"update": "slerp"}, "update='slerp'"),
        ({"qk_norm": False}, "qk_norm=False"),
        ({"s_z": ScaleSpec(init=1.0, scale=0.02, mode="scalar")}, "s_z.mode='scalar'"),
        ({"s_uv": ScaleSpec(init=1.0, mode="fixed")}, "s_uv.mode='fixed'"),
        ({"alpha_mlp": ScaleSpec(init=0.05, scale=0.02)}, "alpha_mlp.absolute=False"),
        ({"s_qk": ScaleSpec(init=1.0)}, "stored scales"),
    ],
)
def test_writing_refuses_what_the_layout_cannot_express(tmp_path, changes, named):
    with pytest.raises(ValueError, match=re.escape(named)):
        to_normalized_nemotron(layout_ngpt(**changes), tmp_path)
    assert not any(tmp_path.iterdir())


def test_writing_refuses_a_gpt(tmp_path):
    with pytest.raises(ValueError, match="not a GPT"):
        to_normalized_nemotron(GPT(GPTConfig(40, 1, 16, 4)), tmp_path)


# ---------------------------------------------------------------------------------------------
# Refusals


@pytest.mark.parametrize(
    "changes, named",
    [
        ({"model_type": "llama"}, "model_type is 'llama'"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_scaling of rope_type 'yarn'"),
        ({"rope_parameters": {"rope_type": "linear", "factor": 2.0}}, "rope_parameters of rope_type 'linear'"),
        ({"attention_bias": True}, "attention_bias=True"),
        ({"mlp_bias": True}, "mlp_bias=True"),
        ({"partial_rotary_factor": 0.5}, "partial_rotary_factor=0.5"),
        ({"hidden_act": "silu"}, "hidden_act='silu'"),
        ({"tie_word_embeddings": True}, "tie_word_embeddings=True"),
        ({"attention_dropout": 0.1}, "attention_dropout=0.1"),
        ({"head_dim": 7}, "head_dim=7 is odd"),
        ({"num_key_value_heads": 3}, "not divisible by num_key_value_heads=3"),
        ({"sliding_window": 128}, "'sliding_window'"),
        ({"initializer_range": 0}, "initializer_range must be"),
        ({"rope_theta": None, "rope_parameters": {"rope_type": "default"}}, "rope_theta is missing"),
    ],
)
def test_unsupported_config_fields_are_refused_by_name(tmp_path, changes, named):
    config = {**CONFIG, **changes}
    write_checkpoint(tmp_path, config, random_layout_tensors(CONFIG))
    with pytest.raises(PretrainedFileError, match=re.escape(named)) as caught:
        from_normalized_nemotron(tmp_path)
    assert "\n" not in str(caught.value)


def test_default_rope_scaling_and_rope_parameters_load(tmp_path):
    config = {**CONFIG, "rope_scaling": {"rope_type": "default"}, "rope_theta": None}
    config["rope_parameters"] = {"rope_type": "default", "rope_theta": 5e5}
    write_checkpoint(tmp_path, config, random_layout_tensors(CONFIG))
    assert from_normalized_nemotron(tmp_path).config.rope_base == 5e5


def test_a_missing_required_field_is_named(tmp_path):
    config = {k: v for k, v in CONFIG.items() if k != "sz_init_value"}
    write_checkpoint(tmp_path, config, random_layout_tensors(CONFIG))
    with pytest.raises(PretrainedFileError, match="'sz_init_value'"):
        from_normalized_nemotron(tmp_path)


def test_a_missing_directory_or_config_names_the_path(tmp_path):
    with pytest.raises(PretrainedFileError, match=re.escape(str(tmp_path / "nowhere"))):
        from_normalized_nemotron(tmp_path / "nowhere")
    with pytest.raises(PretrainedFileError, match=f"{re.escape(str(tmp_path))} has no config.json"):
        from_normalized_nemotron(tmp_path)


Q0 = "model.layers.0.self_attn.q_proj.weight"
O1 = "model.layers.1.self_attn.o_proj.weight"


def _scaled_row(t):
    t = t.clone()
    t[3] *= 1.1
    return t


def _scaled_column(t):
    t = t.clone()
    t[:, 5] *= 0.9
    return t


def _with_nan(t):
    t = t.clone()
    t[2, 1] = float("nan")
    return t


@pytest.mark.parametrize(
    "mutate, named",
    [
        (lambda t: {k: v for k, v in t.items() if k != O1}, f"missing tensor {O1!r}"),
        (lambda t: t.update({"model.norm.weight": torch.ones(32)}) or t, "unexpected tensor 'model.norm.weight'"),
        (lambda t: t.update({Q0: t[Q0][:-1].clone()}) or t, f"tensor {Q0!r} has shape (47, 32), expected (48, 32)"),
        (lambda t: t.update({"sz.weight": t["sz.weight"][:, 0].clone()}) or t, "tensor 'sz.weight' has shape (53,)"),
        (lambda t: t.update({Q0: _with_nan(t[Q0])}) or t, f"tensor {Q0!r} holds non-finite values"),
        (lambda t: t.update({O1: _with_nan(t[O1])}) or t, f"tensor {O1!r} holds non-finite values"),
        (lambda t: t.update({"sz.weight": t["sz.weight"] * math.inf}) or t, "tensor 'sz.weight' holds non-finite"),
        (lambda t: t.update({"lm_head.weight": _scaled_row(t["lm_head.weight"])}) or t, "'lm_head.weight': its rows"),
        (lambda t: t.update({O1: _scaled_column(t[O1])}) or t, f"{O1!r}: its columns (unit along axis 0)"),
        (lambda t: t.update({O1: t[O1] * 1.02}) or t, f"{O1!r}: its columns"),
        (lambda t: t.update({Q0: t[Q0].to(torch.int32)}) or t, f"{Q0!r} has dtype I32"),
    ],
    ids=[
        "missing",
        "unexpected",
        "shape",
        "vector-shape",
        "nan",
        "nan-column",
        "inf-scaling",
        "row",
        "column",
        "column-scaled",
        "int",
    ],
)
@pytest.mark.parametrize("shards", [1, 2])
def test_bad_tensors_are_refused_in_one_line_naming_the_tensor(tmp_path, mutate, named, shards):
    tensors = mutate(random_layout_tensors(CONFIG))
    write_checkpoint(tmp_path, CONFIG, tensors, shards=shards)
    with pytest.raises(PretrainedFileError, match=re.escape(named)) as caught:
        from_normalized_nemotron(tmp_path)
    assert "\n" not in str(caught.value)


def test_an_index_naming_an_absent_tensor_or_shard_is_refused(tmp_path, checkpoint):
    directory = write_checkpoint(tmp_path / "sharded", CONFIG, random_layout_tensors(CONFIG), shards=2)
    index = json.loads((directory / INDEX_NAME).read_text())
    index["weight_map"]["model.extra"] = index["weight_map"]["sz.weight"]
    (directory / INDEX_NAME).write_text(json.dumps(index))
    with pytest.raises(PretrainedFileError, match="missing tensor 'model.extra'"):
        from_normalized_nemotron(directory)
    index["weight_map"]["model.extra"] = "other.safetensors"
    (directory / INDEX_NAME).write_text(json.dumps(index))
    with pytest.raises(PretrainedFileError, match="shard 'other.safetensors'"):
        from_normalized_nemotron(directory)


def test_a_truncated_file_is_refused(checkpoint):
    directory, _ = checkpoint
    weights = directory / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    with pytest.raises(PretrainedFileError, match="runs past the end of the file"):
        from_normalized_nemotron(directory)


# ---------------------------------------------------------------------------------------------
# Streaming


def test_loading_never_reads_a_whole_file_at_once(checkpoint, monkeypatch):
    import safetensors

    def refuse(*args, **kwargs):
        raise AssertionError("a whole-file or memory-mapped safetensors reader was called")

    for module, name in [(safetensors_torch, "load_file"), (safetensors_torch, "load"), (safetensors, "safe_open")]:
        monkeypatch.setattr(module, name, refuse)
    monkeypatch.setattr(torch, "load", refuse)
    directory, tensors = checkpoint
    model = from_normalized_nemotron(directory, dtype=torch.float64)
    assert torch.equal(model.blocks[0].attn.w_o.weight, tensors["model.layers.0.self_attn.o_proj.weight"].T.double())


@pytest.mark.parametrize("target_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("transposed", [False, True])
def test_read_into_stages_at_most_its_budget(tmp_path, target_dtype, transposed):
    stored = torch.randn(37, 11, dtype=torch.float32)
    safetensors_torch.save_file({"w": stored, "other": torch.ones(3)}, str(tmp_path / "t.safetensors"))
    entry = read_header(tmp_path / "t.safetensors")["w"]
    destination = torch.empty(11, 37, dtype=target_dtype) if transposed else torch.empty(37, 11, dtype=target_dtype)
    seen = []
    read_into(entry, destination.t() if transposed else destination, check=seen.append, staging_bytes=100)
    assert torch.equal(destination.t() if transposed else destination, stored.to(target_dtype))
    assert len(seen) == 19 and max(chunk.numel() * 4 for chunk in seen) <= 100  # two rows of 44 bytes per read


@pytest.mark.slow
def test_the_load_benchmark_reports_the_peak_against_the_file(tmp_path):
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root), "CUDA_VISIBLE_DEVICES": ""}
    out = tmp_path / "load.md"
    command = [sys.executable, str(root / "benchmarks" / "nemotron_load.py"), "--quick", "--markdown", str(out)]
    done = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    row = next(line for line in out.read_text().splitlines() if line.startswith("| fp32 | fp32 |"))
    cells = [cell.strip().replace(",", "") for cell in row.strip("|").split("|")]
    file_mib, model_mib, peak_mib, per_file = float(cells[2]), float(cells[3]), float(cells[4]), float(cells[5])
    assert (
        file_mib == model_mib > 10 and 0 < peak_mib and per_file == pytest.approx(peak_mib / file_mib, abs=0.1)
    )  # MiB rounded


# ---------------------------------------------------------------------------------------------
# The layout whole: its tokenizer, its manifest, transformers' classes


def flip_byte(file: Path, offset: int = -3) -> None:
    data = bytearray(file.read_bytes())
    data[offset] ^= 0x01
    file.write_bytes(bytes(data))


@pytest.mark.parametrize("shards", [1, 3])
def test_the_written_layout_carries_a_manifest_and_a_flipped_byte_is_refused_naming_the_file(tmp_path, shards):
    from spherenet.io import read_normalized_nemotron_into

    model = layout_ngpt().eval()
    to_normalized_nemotron(model, tmp_path, max_shard_size=3000 if shards > 1 else "5GB")
    listed = set(json.loads((tmp_path / "sha256sums.json").read_text())["files"])
    assert listed == {p.name for p in tmp_path.iterdir()} - {"sha256sums.json"}
    weights = sorted(tmp_path.glob("*.safetensors"))
    assert (len(weights) == 1) == (shards == 1)
    from_normalized_nemotron(tmp_path)  # sound: loads
    flip_byte(weights[-1])  # in the last tensor's data: no tensor check would see it
    for load in (lambda: from_normalized_nemotron(tmp_path), lambda: read_normalized_nemotron_into(model, tmp_path)):
        with pytest.raises(PretrainedFileError, match=rf"{re.escape(weights[-1].name)} has sha256 .*contents altered"):
            load()
    flip_byte(weights[-1])  # back: loads again
    from_normalized_nemotron(tmp_path)
    flip_byte(tmp_path / "config.json", offset=-2)
    with pytest.raises(PretrainedFileError, match=r"config\.json has sha256"):
        from_normalized_nemotron(tmp_path)


def test_a_directory_without_a_manifest_loads_as_nvidia_publishes_it(checkpoint):
    directory, _ = checkpoint
    assert not (directory / "sha256sums.json").exists()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # not even a warning: NVIDIA's directories carry none
        from_normalized_nemotron(directory)


@pytest.mark.parametrize("extra_eos, eos_token, eos_id", [(False, "<0xFF>", 255), (True, "<|endoftext|>", 256)])
def test_the_layout_holds_the_models_tokenizer_with_its_end_of_text_token(tmp_path, extra_eos, eos_token, eos_id):
    from transformers import AutoTokenizer

    from spherenet.data.tokenizer import ByteTokenizer, load_tokenizer

    byte = ByteTokenizer(extra_eos=extra_eos)
    model = layout_ngpt(vocab_size=byte.vocab_size)
    (tmp_path / "tokenizer_config.json").write_text('{"eos_token": "</s>"}')  # an old one: replaced
    to_normalized_nemotron(model, tmp_path, tokenizer=byte)
    names = {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"}
    assert set(json.loads((tmp_path / "sha256sums.json").read_text())["files"]) == names
    assert json.loads((tmp_path / "tokenizer_config.json").read_text())["eos_token"] == eos_token
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # reading the written config.json warns of nothing deprecated
        theirs = AutoTokenizer.from_pretrained(tmp_path)
    assert (theirs.eos_token, theirs.eos_token_id) == (eos_token, eos_id)
    ours = load_tokenizer(tmp_path)  # a tokenizer.json alone, as the recipes read it
    assert ours.eos_id == eos_id and ours.encode("héllo ☃") == byte.encode("héllo ☃")
    assert ours.decode(byte.encode("ab") + [eos_id]) == "ab"
    assert theirs("héllo ☃")["input_ids"] == byte.encode("héllo ☃")
    alone = tmp_path / "alone"  # tokenizer.json copied by hand, without tokenizer_config.json: recognised
    alone.mkdir()
    (alone / "tokenizer.json").write_bytes((tmp_path / "tokenizer.json").read_bytes())
    assert load_tokenizer(alone).eos_id == eos_id
    flip_byte(tmp_path / "tokenizer.json", offset=-10)
    with pytest.raises(PretrainedFileError, match=r"tokenizer\.json has sha256"):
        from_normalized_nemotron(tmp_path)


def test_a_tokenizer_larger_than_the_model_is_refused(tmp_path):
    from spherenet.data.tokenizer import ByteTokenizer

    with pytest.raises(ValueError, match=r"the tokenizer has 257 ids, more than vocab_size=40"):
        to_normalized_nemotron(layout_ngpt(), tmp_path, tokenizer=ByteTokenizer(extra_eos=True))
    assert not any(tmp_path.iterdir())


def test_transformers_configs_read_a_layout_directory_as_the_converter_does(checkpoint, capfd):
    """nGPT's transformers config of a layout directory is the converter's config, without
    transformers' "model of type ngpt" complaint; GPT's config refuses it in one line."""
    hf = pytest.importorskip("spherenet.hf")
    directory, _ = checkpoint
    config = hf.SpherenetNGPTConfig.from_pretrained(directory)
    assert config.spherenet_config() == nemotron_config_of(directory)
    assert config.name_or_path == str(directory) and config.model_type == "spherenet-ngpt"
    config, unused = hf.SpherenetNGPTConfig.from_pretrained(
        directory, return_unused_kwargs=True, use_cache=False, not_a_field=1, revision="main"
    )
    assert (config.use_cache, unused) == (False, {"not_a_field": 1})
    with pytest.raises(PretrainedFileError, match=r"in the Normalized-Nemotron layout, not a GPT") as info:
        hf.SpherenetGPTConfig.from_pretrained(directory)
    assert "\n" not in str(info.value)
    assert "model of type" not in capfd.readouterr().err


def test_transformers_classes_load_a_layout_directory_or_name_the_converter(tmp_path, checkpoint):
    hf = pytest.importorskip("spherenet.hf")
    directory, _ = checkpoint
    model = hf.SpherenetNGPTForCausalLM.from_pretrained(directory, dtype="float64")
    assert model.name_or_path == str(directory)
    ids = token_ids(CONFIG)
    with torch.no_grad():
        expected = from_normalized_nemotron(directory, dtype=torch.float64)(ids)
        assert torch.equal(model(input_ids=ids).logits, expected)
    with pytest.raises(PretrainedFileError, match=r"load it with spherenet\.hf\.from_normalized_nemotron$") as info:
        hf.SpherenetGPTForCausalLM.from_pretrained(directory)
    assert "\n" not in str(info.value)
    to_normalized_nemotron(from_normalized_nemotron(directory), tmp_path / "written")
    flip_byte(tmp_path / "written" / "model.safetensors")
    with pytest.raises(PretrainedFileError, match=r"model\.safetensors has sha256"):
        hf.SpherenetNGPTForCausalLM.from_pretrained(tmp_path / "written")
