"""Fixtures of the data tests: a BPE tokenizer trained here, the Hub's offline mode turned off."""

from __future__ import annotations

import pytest
from text_documents import stdlib_sample

from spherenet.data import HFTokenizer, train_bpe


@pytest.fixture(scope="module")
def bpe_tok(tmp_path_factory) -> HFTokenizer:
    path = tmp_path_factory.mktemp("bpe") / "corpus.txt"
    path.write_text(stdlib_sample(), encoding="utf-8")
    return train_bpe([path], 600)


@pytest.fixture
def online_mode(monkeypatch):
    """Offline mode off, whatever the environment says (the tests then exercise the network path)."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    return constants
