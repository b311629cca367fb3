"""Tests for spherenet.data: tokenizers (bytes, BPE trained here, tokenizer.json files, the Hub)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from text_documents import stdlib_sample

from spherenet.data import (
    ByteTokenizer,
    DataFileNotFoundError,
    HFTokenizer,
    TokenizerError,
    build_tokenizer,
    load_pretrained,
    load_tokenizer,
    train_bpe,
)
from spherenet.data._hub import hub_unreachable

HYPO = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


# ---------------------------------------------------------------------------------------------- tokenizers


@HYPO
@given(st.text())
def test_byte_tokenizer_round_trip(text):
    for tok in (ByteTokenizer(), ByteTokenizer(extra_eos=True)):
        ids = tok.encode(text)
        assert ids == list(text.encode("utf-8"))
        assert tok.eos_id not in ids  # 0xFF never occurs in UTF-8, so EOS 255 is unambiguous
        assert tok.decode(ids) == text
        assert tok.decode(ids + [tok.eos_id]) == text  # EOS is dropped on decode


def test_byte_tokenizer_spec_save_load(tmp_path):
    tok = build_tokenizer("byte")
    assert (tok.vocab_size, tok.eos_id, tok.name) == (256, 255, "byte")
    t257 = build_tokenizer("byte:257")
    assert (t257.vocab_size, t257.eos_id) == (257, 256)
    assert build_tokenizer(t257.spec()) == t257
    t257.save(tmp_path / "tok")
    loaded = load_tokenizer(tmp_path / "tok")
    assert loaded == t257 and loaded.fingerprint == t257.fingerprint
    assert json.loads((tmp_path / "tok" / "tokenizer_spec.json").read_text())["vocab_size"] == 257
    with pytest.raises(TokenizerError, match="out of range"):
        tok.decode([300])


def test_bpe_trained_locally_has_vocab_and_round_trips(bpe_tok, tmp_path):
    assert bpe_tok.vocab_size == 600 and bpe_tok.name == "bpe600"
    assert bpe_tok.backend.id_to_token(bpe_tok.eos_id) == "<|endoftext|>"
    text = stdlib_sample(3000)
    ids = bpe_tok.encode(text)
    assert len(ids) < 0.6 * len(text.encode())  # merges were learned: fewer tokens than bytes
    assert bpe_tok.decode(ids) == text
    assert bpe_tok.eos_id not in bpe_tok.encode("a <|endoftext|> b")  # special strings in text are text
    bpe_tok.save(tmp_path / "saved")
    again = load_tokenizer(tmp_path / "saved")
    assert again.fingerprint == bpe_tok.fingerprint and again.encode(text) == ids
    from_path = build_tokenizer(f"bpe:{tmp_path / 'saved' / 'tokenizer.json'}")
    assert from_path.vocab_size == 600 and from_path.encode(text) == ids


@HYPO
@given(st.text(max_size=200))
def test_bpe_round_trip_any_text(bpe_tok, text):
    ids = bpe_tok.encode(text)
    assert all(0 <= i < bpe_tok.vocab_size for i in ids)
    assert bpe_tok.decode(ids) == text


def test_bpe_from_iterator_and_too_small():
    tok = train_bpe([stdlib_sample(40_000)] * 2, 300)
    assert tok.vocab_size == 300
    with pytest.raises(TokenizerError, match="too small"):
        train_bpe(["abc"], 100)
    with pytest.raises(TokenizerError, match="needs text"):
        build_tokenizer("bpe:4096")


def make_llama_like_tokenizer_json(path: Path) -> Path:
    """A small pretrained-style tokenizer.json with <s>/</s> specials and a BOS post-processor."""
    from tokenizers import Tokenizer as HF
    from tokenizers import decoders, models, pre_tokenizers, processors, trainers

    hf = HF(models.BPE(unk_token=None))
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<unk>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    hf.train_from_iterator([stdlib_sample(30_000)], trainer)
    hf.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    hf.save(str(path))
    return path


def test_hf_tokenizer_from_local_tokenizer_json(tmp_path):
    path = make_llama_like_tokenizer_json(tmp_path / "tokenizer.json")
    tok = build_tokenizer(f"hf:{path}")
    assert isinstance(tok, HFTokenizer) and tok.eos_id == 2 and tok.eos_token == "</s>"
    ids = tok.encode("def f(x):\n    return x")
    assert ids[0] != 1  # the BOS post-processor is not applied: documents are plain text
    assert tok.decode(ids) == "def f(x):\n    return x"
    assert build_tokenizer(f"hf:{tmp_path}").fingerprint == tok.fingerprint  # a directory works too
    rebuilt = build_tokenizer(tok.spec())
    assert rebuilt.encode("return x") == tok.encode("return x")
    bad = dict(tok.spec(), fingerprint="0" * 64)
    with pytest.raises(TokenizerError, match="differs from the one recorded"):
        build_tokenizer(bad)


def test_hf_tokenizer_bad_inputs(tmp_path):
    with pytest.raises(DataFileNotFoundError, match="nope.json"):
        build_tokenizer(f"hf:{tmp_path / 'nope.json'}")
    junk = tmp_path / "junk.json"
    junk.write_text("{not json")
    with pytest.raises(TokenizerError, match="junk.json is not a valid tokenizer.json"):
        build_tokenizer(f"hf:{junk}")
    with pytest.raises(TokenizerError, match="unknown tokenizer spec 'gpt9'"):
        build_tokenizer("gpt9")
    with pytest.raises(TokenizerError, match="byte:300"):
        build_tokenizer("byte:300")


def test_hub_tokenizer_without_network_fails_fast(tmp_path, monkeypatch, online_mode):
    constants = online_mode
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    t0 = time.monotonic()
    with pytest.raises(TokenizerError) as err:
        load_pretrained("meta-llama/Llama-2-7b-hf", cache_dir=tmp_path, timeout=2)
    assert time.monotonic() - t0 < 5
    msg = str(err.value)
    assert "meta-llama/Llama-2-7b-hf" in msg and "no network" in msg and "tokenizer.json" in msg

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(TokenizerError, match="offline mode"):
        load_pretrained("meta-llama/Llama-2-7b-hf", cache_dir=tmp_path)


def test_hub_tokenizer_real_endpoint_offline_here(tmp_path, online_mode):
    if hub_unreachable(2) is None:
        pytest.skip("this machine reaches the Hugging Face Hub")
    t0 = time.monotonic()
    with pytest.raises(TokenizerError, match="no network"):
        load_pretrained("meta-llama/Llama-2-7b-hf", cache_dir=tmp_path, timeout=2)
    assert time.monotonic() - t0 < 5
