"""The Normalized-Nemotron layout (spherenet.io.nemotron_*, spherenet.models.from_normalized_nemotron):
tiny synthetic checkpoints written in that layout, loaded as NGPT and compared with a float64
forward of the layout's equations (with a KV cache, in bfloat16, on CUDA), and written back.
The checkpoints and the reference forward: nemotron_checkpoints.py."""

from __future__ import annotations

import json
import re

import nemotron_checkpoints
import pytest
import torch
from nemotron_checkpoints import (
    CONFIG,
    F64,
    layout_ngpt,
    random_layout_tensors,
    read_checkpoint,
    reference_logits,
    token_ids,
    write_checkpoint,
)

from spherenet.io import INDEX_NAME, read_header, to_normalized_nemotron
from spherenet.layers import KVCache
from spherenet.models import GPT, NGPT, GPTConfig, ScaleSpec, from_normalized_nemotron

# the layout's fixture: a synthetic checkpoint and its tensors
checkpoint = nemotron_checkpoints.checkpoint


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
