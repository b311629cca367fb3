"""A tokenizer directory's files already read (``load_tokenizer(directory, files=...)``) give the
same tokenizer as the directory on the disk: origin, fingerprint, files and encodings, and the
same errors for bad files."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from spherenet.data import (
    ByteTokenizer,
    DataError,
    DataFileNotFoundError,
    HFTokenizer,
    TokenizerError,
    load_pretrained,
    load_tokenizer,
    train_bpe,
)
from spherenet.data.tokenizer import SPEC_FILE, TOKENIZER_JSON

TEXTS = ["", "plain words and more words", "ünïcode 日本 🙂\n\ttabs", "<|endoftext|> inside a document", "\xff"]


def corpus(n: int = 60) -> list[str]:
    words = ["sphere", "norm", "lerp", "token", "alpha", "adam", "ünïcode", "naïve", "日本", "🙂"]
    return [f"doc {i}: " + " ".join(words[(i * 7 + j) % len(words)] for j in range(5 + i % 9)) for i in range(n)]


@pytest.fixture(scope="module")
def text_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "small.txt"
    path.write_text("\n".join(corpus()) + "\n", encoding="utf-8")
    return path


def hf_from_path(tmp_path: Path) -> HFTokenizer:
    src = tmp_path / "pretrained" / TOKENIZER_JSON
    src.parent.mkdir()
    src.write_text(ByteTokenizer(extra_eos=True).tokenizer_json(), encoding="utf-8")
    return load_pretrained(src)


TOKENIZERS = {
    "byte": lambda tmp_path, text_file: ByteTokenizer(),
    "byte:257": lambda tmp_path, text_file: ByteTokenizer(extra_eos=True),
    "bpe from documents": lambda tmp_path, text_file: train_bpe(corpus(), 300),
    "bpe from a file": lambda tmp_path, text_file: train_bpe([text_file], 300),
    "hf from a path": lambda tmp_path, text_file: hf_from_path(tmp_path),
}


def read_all(directory: Path) -> dict[str, bytes]:
    return {f.name: f.read_bytes() for f in sorted(directory.iterdir()) if f.is_file()}


def assert_same_tokenizer(a, b) -> None:
    assert type(a) is type(b)
    assert a.fingerprint == b.fingerprint
    assert a.spec() == b.spec()
    assert getattr(a, "origin", None) == getattr(b, "origin", None)
    assert a.to_files() == b.to_files()
    assert (a.name, a.vocab_size, a.eos_id) == (b.name, b.vocab_size, b.eos_id)
    assert [a.encode(t) for t in TEXTS] == [b.encode(t) for t in TEXTS]


@pytest.mark.parametrize("which", sorted(TOKENIZERS))
def test_a_directory_read_into_bytes_gives_the_tokenizer_of_the_directory(which, tmp_path, text_file):
    saved = tmp_path / "saved"
    TOKENIZERS[which](tmp_path, text_file).save(saved)
    files = read_all(saved)
    from_disk = load_tokenizer(saved)
    assert_same_tokenizer(from_disk, load_tokenizer(saved, files=files))
    shutil.rmtree(saved)  # nothing is read from the disk: the same tokenizer with the directory gone
    assert_same_tokenizer(from_disk, load_tokenizer(saved, files=files))


def test_a_tokenizer_json_without_a_spec_and_its_configured_eos_come_from_the_bytes(tmp_path):
    saved = tmp_path / "exported"
    saved.mkdir()
    (saved / TOKENIZER_JSON).write_text(ByteTokenizer().tokenizer_json(), encoding="utf-8")
    (saved / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<0x00>"}), encoding="utf-8")
    files = read_all(saved)
    from_disk = load_tokenizer(saved)
    assert from_disk.eos_id == 0  # the config's EOS, not the byte tokenizer's 0xFF
    shutil.rmtree(saved)
    from_bytes = load_tokenizer(saved, files=files)
    assert_same_tokenizer(from_disk, from_bytes)
    assert from_bytes.eos_id == 0


def bpe_directory(tmp_path: Path, name: str) -> Path:
    directory = tmp_path / name
    train_bpe(corpus(), 300).save(directory)
    return directory


def error_of(call) -> tuple[type, str]:
    with pytest.raises(DataError) as caught:
        call()
    return type(caught.value), str(caught.value)


def truncate(path: Path, size: int) -> None:
    path.write_bytes(path.read_bytes()[:size])


def remove_both(directory: Path) -> None:
    (directory / SPEC_FILE).unlink()
    (directory / TOKENIZER_JSON).unlink()


DAMAGES = {
    "truncated tokenizer.json": (
        lambda d: truncate(d / TOKENIZER_JSON, 200),
        TokenizerError,
        "is not a valid tokenizer.json: EOF while parsing",
    ),
    "empty tokenizer.json": (lambda d: truncate(d / TOKENIZER_JSON, 0), DataError, "is empty (0 bytes)"),
    "no tokenizer.json": (lambda d: (d / TOKENIZER_JSON).unlink(), DataFileNotFoundError, "tokenizer file not found"),
    "truncated spec": (lambda d: truncate(d / SPEC_FILE, 20), TokenizerError, "cannot read tokenizer spec"),
    "neither file": (remove_both, DataFileNotFoundError, f"no {SPEC_FILE} in"),
}


@pytest.mark.parametrize("which", sorted(DAMAGES))
def test_bad_bytes_give_the_error_of_the_same_bad_file(tmp_path, which):
    damage, error, needle = DAMAGES[which]
    directory = bpe_directory(tmp_path, "tok")
    damage(directory)
    files = read_all(directory)
    kind, message = error_of(lambda: load_tokenizer(directory))
    assert issubclass(kind, error) and needle in message and str(directory) in message, message
    assert error_of(lambda: load_tokenizer(directory, files=files)) == (kind, message)
