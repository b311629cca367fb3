"""The Normalized-Nemotron layout whole: loading streams its files within a memory budget, the
written layout carries a manifest (a flipped byte is refused naming the file), it holds the
model's tokenizer, and transformers' classes read it. The checkpoints: nemotron_checkpoints.py."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import nemotron_checkpoints
import pytest
import torch
from nemotron_checkpoints import CONFIG, layout_ngpt, safetensors_torch, token_ids

from spherenet.io import read_header, read_into, to_normalized_nemotron
from spherenet.models import PretrainedFileError, from_normalized_nemotron, nemotron_config_of

# the layout's fixture: a synthetic checkpoint and its tensors
checkpoint = nemotron_checkpoints.checkpoint


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


def test_reading_into_a_model_of_another_config_names_the_fields_that_differ(tmp_path):
    from spherenet.io import read_normalized_nemotron_into

    to_normalized_nemotron(layout_ngpt(), tmp_path)
    read_normalized_nemotron_into(layout_ngpt(), tmp_path)  # the directory's config: reads
    other = layout_ngpt(d_mlp=32)
    before = {name: p.detach().clone() for name, p in other.named_parameters()}
    with pytest.raises(ValueError, match=r"the model's config is not the directory's, which has \{'d_mlp': 24\}"):
        read_normalized_nemotron_into(other, tmp_path)
    assert all(torch.equal(p, before[name]) for name, p in other.named_parameters()), "nothing was read"
