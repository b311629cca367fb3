"""The Normalized-Nemotron layout's refusals: unsupported or missing config fields, a missing
directory, bad tensors (off the sphere, non-finite), an index naming what is not there and a
truncated file, each named in one line. The checkpoints: nemotron_checkpoints.py."""

from __future__ import annotations

import json
import math
import re

import nemotron_checkpoints
import pytest
import torch
from nemotron_checkpoints import CONFIG, random_layout_tensors, write_checkpoint

from spherenet.io import INDEX_NAME
from spherenet.models import PretrainedFileError, from_normalized_nemotron

# the layout's fixture: a synthetic checkpoint and its tensors
checkpoint = nemotron_checkpoints.checkpoint


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
        # past NGPTConfig's bounds: refused by the map, before a table of 2**40 layers is built
        ({"num_hidden_layers": 2**40}, "num_hidden_layers=1099511627776 is larger than any model built here"),
        ({"max_position_embeddings": 2**25}, "max_position_embeddings=33554432 is larger than any model"),
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
