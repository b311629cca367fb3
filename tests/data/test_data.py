"""Tests for spherenet.data: tokenizers, dataset preparation, token windows, and error messages."""

from __future__ import annotations

import hashlib
import json
import os
import sysconfig
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spherenet.data import (
    ByteTokenizer,
    DataError,
    DataFileNotFoundError,
    HFTokenizer,
    Tokenizer,
    TokenizerError,
    TokenWindows,
    build_tokenizer,
    default_corpus,
    load_prepared,
    load_pretrained,
    load_tokenizer,
    prepare_dataset,
    resolve_source,
    stdlib_files,
    token_dtype,
    train_bpe,
)
from spherenet.data._hub import hub_unreachable

REPO = Path(__file__).resolve().parents[2]
SHAKESPEARE = REPO.parent / "shared" / "data" / "tinyshakespeare" / "input.txt"
HYPO = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


# ---------------------------------------------------------------------------------------------- helpers


def paragraphs(n: int = 40) -> list[str]:
    """Distinct multi-line paragraphs (documents for the 'text' kind)."""
    words = ["sphere", "norm", "lerp", "token", "alpha", "adam", "ünïcode", "naïve", "日本", "🙂"]
    return [
        f"Doc {i}: " + " ".join(words[(i * 7 + j) % len(words)] for j in range(5 + i % 9)) + f"\nline two of {i}."
        for i in range(n)
    ]


def write_text(path: Path, docs: list[str]) -> Path:
    path.write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    return path


def split_docs(tokens: np.ndarray, tok: Tokenizer) -> list[str]:
    """Decode a token file into its documents (each ends with EOS)."""
    ids = np.asarray(tokens, dtype=np.int64)
    assert ids.size == 0 or ids[-1] == tok.eos_id, "every document must end with EOS"
    cuts = np.flatnonzero(ids == tok.eos_id)
    out, start = [], 0
    for c in cuts:
        out.append(tok.decode(ids[start:c].tolist()))
        start = c + 1
    return out


def sha256_file(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def stdlib_sample(limit: int = 120_000) -> str:
    root = Path(sysconfig.get_paths()["stdlib"])
    text = ""
    for name in ("textwrap.py", "string.py", "shlex.py", "fractions.py", "heapq.py", "bisect.py"):
        text += (root / name).read_text(encoding="utf-8") + "\n\n"
    return text[:limit]


@pytest.fixture(scope="module")
def bpe_tok(tmp_path_factory) -> HFTokenizer:
    path = tmp_path_factory.mktemp("bpe") / "corpus.txt"
    path.write_text(stdlib_sample(), encoding="utf-8")
    return train_bpe([path], 600)


class ShiftedBytes(Tokenizer):
    """Bytes shifted up by ``shift``: vocab 256 + shift + 1 (EOS last). For uint32 and bad-id tests."""

    def __init__(self, shift: int, vocab: int | None = None) -> None:
        self.shift = shift
        self._vocab = vocab if vocab is not None else 256 + shift + 1

    name = property(lambda self: f"shift{self.shift}")
    vocab_size = property(lambda self: self._vocab)
    eos_id = property(lambda self: self._vocab - 1)
    fingerprint = property(lambda self: f"shift-{self.shift}-{self._vocab}")

    def encode(self, text):
        return [b + self.shift for b in text.encode("utf-8")]

    def decode(self, ids):
        return bytes(i - self.shift for i in ids if i != self.eos_id).decode("utf-8", "replace")

    def spec(self):
        return {"kind": "byte", "vocab_size": 256}  # saved spec is not used by these tests


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


@pytest.fixture
def online_mode(monkeypatch):
    """Offline mode off, whatever the environment says (the tests then exercise the network path)."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    return constants


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


# ---------------------------------------------------------------------------------------------- preparation


def test_a_killed_preparations_leftovers_are_removed(tmp_path):
    """``.tmp-*`` directories of preparations whose process is gone (on this host), or that
    never named an owner and are an hour old, are removed by the next preparation; those of a
    live process or of another host sharing the cache are left alone."""
    import socket
    import subprocess
    import sys

    out = tmp_path / "prepared"
    out.mkdir()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    child.kill()
    child.wait()  # a process that is gone: its pid is free

    def leftover(name, owner=None, age_s=0.0):
        d = out / f".tmp-{name}"
        (d / "hf").mkdir(parents=True)
        (d / "train.bin").write_bytes(b"\0" * 1000)
        if owner is not None:
            (d / "owner.json").write_text(json.dumps(owner))
        if age_s:
            old = time.time() - age_s
            os.utime(d, (old, old))
        return d

    host = socket.gethostname()
    killed = leftover("killed", {"host": host, "pid": child.pid})
    running = leftover("running", {"host": host, "pid": os.getpid()})
    elsewhere = leftover("elsewhere", {"host": host + "-other", "pid": child.pid})
    unowned_old = leftover("unowned-old", age_s=7200)
    unowned_new = leftover("unowned-new")
    data = prepare_dataset(write_text(tmp_path / "corpus.txt", paragraphs(10)), "byte", out)
    assert not killed.exists() and not unowned_old.exists()
    assert running.exists() and elsewhere.exists() and unowned_new.exists()
    assert not (data.path / "owner.json").exists()  # the owner file is not part of the prepared data


def test_a_disk_too_full_for_the_staging_directory_is_one_error_and_leaves_nothing(tmp_path, monkeypatch):
    """On a full disk the staging directory's owner file is created but not written (an OSError
    without a file name, as from ``write``): one DataError naming the data cache, no ``.tmp-*``
    directory left; with the space back, the next preparation runs."""
    import errno

    write_text_before = Path.write_text

    def disk_full(path, *args, **kwargs):
        if path.name != "owner.json":
            return write_text_before(path, *args, **kwargs)
        path.touch()
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    out = tmp_path / "prepared"
    src = write_text(tmp_path / "corpus.txt", paragraphs(10))
    monkeypatch.setattr(Path, "write_text", disk_full)
    with pytest.raises(DataError) as refused:
        prepare_dataset(src, "byte", out)
    assert str(refused.value) == (
        f"cannot write the data cache {out}: no space left on device (ENOSPC); nothing was kept of this preparation"
    )
    assert list(out.iterdir()) == []
    monkeypatch.undo()
    assert not prepare_dataset(src, "byte", out).cached


def test_prepare_text_split_by_document_metadata_and_cache(tmp_path):
    docs = paragraphs(40)
    src = write_text(tmp_path / "corpus.txt", docs)
    out = tmp_path / "prepared"
    data = prepare_dataset(src, "byte", out, val_fraction=0.2, seed=1)
    assert not data.cached and data.dtype == np.uint16
    tok = data.tokenizer()
    train, val = split_docs(data.tokens("train"), tok), split_docs(data.tokens("val"), tok)
    assert len(val) == 8 and len(train) == 32
    assert set(train).isdisjoint(val) and sorted(train + val) == sorted(docs)
    assert [d for d in docs if d in set(train)] == train  # source order kept within a split

    meta = json.loads((data.path / "meta.json").read_text())
    assert meta["tokenizer"]["kind"] == "byte" and meta["dtype"] == "uint16" and meta["eos_id"] == 255
    assert meta["tokens"]["train"] + meta["tokens"]["val"] == len(("".join(docs)).encode()) + len(docs)
    assert meta["documents"] == {"train": 32, "val": 8}
    assert meta["sha256"]["train"] == sha256_file(data.path / "train.bin")
    assert meta["source"]["files"] == [str(src.resolve())]
    assert not any(p.name.startswith(".tmp") for p in out.iterdir())  # temp dirs cleaned

    mtime = (data.path / "train.bin").stat().st_mtime_ns
    again = prepare_dataset(src, "byte", out, val_fraction=0.2, seed=1)
    assert again.cached and again.path == data.path
    assert (data.path / "train.bin").stat().st_mtime_ns == mtime

    other = prepare_dataset(src, "byte", out, val_fraction=0.2, seed=2)  # another seed, another split
    assert other.path != data.path and set(split_docs(other.tokens("val"), tok)) != set(val)
    assert load_prepared(data.path).meta == meta
    data.verify()

    rebuilt = prepare_dataset(src, "byte", out, val_fraction=0.2, seed=1, force=True)
    assert not rebuilt.cached and rebuilt.meta["content_sha256"] == meta["content_sha256"]  # deterministic


def edit_in_place_keeping_size_and_mtime(path: Path, old: str, new: str) -> None:
    """Rewrite ``path`` with ``old`` replaced by ``new`` (same length), then put its modification
    time back, as ``touch -d``, ``rsync -t`` or ``tar x`` do: size and mtime tell nothing."""
    before = path.stat()
    text = path.read_text(encoding="utf-8")
    assert old in text and len(old.encode()) == len(new.encode())
    with open(path, "r+b") as f:  # in place: the same inode
        f.write(text.replace(old, new).encode("utf-8"))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = path.stat()
    assert (after.st_size, after.st_mtime_ns, after.st_ino) == (before.st_size, before.st_mtime_ns, before.st_ino)


def test_an_edit_that_keeps_size_and_mtime_is_tokenized_again(tmp_path):
    src = write_text(tmp_path / "corpus.txt", paragraphs(40))
    out = tmp_path / "prepared"
    data = prepare_dataset(src, "byte", out, val_fraction=0.2, seed=1)
    edit_in_place_keeping_size_and_mtime(src, "sphere", "SPHERE")
    again = prepare_dataset(src, "byte", out, val_fraction=0.2, seed=1)
    assert not again.cached and again.path != data.path
    assert again.meta["content_sha256"] != data.meta["content_sha256"]
    tokens = bytes(np.concatenate([again.tokens("train"), again.tokens("val")]).astype(np.uint8))
    assert b"SPHERE" in tokens and b"sphere" not in tokens
    assert prepare_dataset(src, "byte", out, val_fraction=0.2, seed=1).cached  # and that is cached in turn


def test_resume_after_an_edit_that_keeps_size_and_mtime_is_refused(tmp_path, capsys):
    """A real run halted at step 2, its text file edited in place with size and mtime kept:
    ``--resume`` is refused as a data change (one line, exit 2), not trained on stale tokens."""
    from recipes.train import cli

    src = write_text(tmp_path / "corpus.txt", paragraphs(200))
    run = [
        "model.preset=ngpt-tiny",
        "model.max_seq_len=32",
        "train.batch_size=4",
        "train.steps=4",
        "train.eval_batches=1",
        "train.sample_tokens=0",
        "train.progress=false",
        f"data.source={src}",
        f"data.cache_dir={tmp_path / 'cache'}",
        f"train.out_dir={tmp_path / 'run'}",
    ]
    assert cli([*run, "train.halt_after=2"]) == 0
    edit_in_place_keeping_size_and_mtime(src, "sphere", "SPHERE")
    capsys.readouterr()
    assert cli([*run, "--resume"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{src} now gives other tokens" in err[0] and "--accept-data-change" in err[0], err


def test_prepare_jsonl_with_text_field(tmp_path):
    docs = paragraphs(25)
    src = tmp_path / "docs.jsonl"
    with open(src, "w", encoding="utf-8") as f:
        for i, d in enumerate(docs):
            f.write(json.dumps({"id": i, "body": d}) + "\n")
        f.write(json.dumps({"id": 99, "body": "   "}) + "\n")  # whitespace-only: dropped
    data = prepare_dataset(src, "byte", tmp_path / "out", text_field="body", val_fraction=0.1)
    tok = data.tokenizer()
    train, val = split_docs(data.tokens("train"), tok), split_docs(data.tokens("val"), tok)
    assert sorted(train + val) == sorted(docs) and len(val) == 2
    assert data.meta["source"] == {"kind": "json", "files": [str(src.resolve())], "text_field": "body"}


def test_prepare_parquet_uint32_vocab(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    docs = paragraphs(12)
    src = tmp_path / "docs.parquet"
    pq.write_table(pa.table({"content": docs, "n": list(range(12))}), src)
    tok = ShiftedBytes(70_000)  # vocab 70257 > 65536: stored as uint32
    data = prepare_dataset(src, tok, tmp_path / "out", text_field="content", val_fraction=0.25)
    assert data.dtype == np.uint32 and data.meta["dtype"] == "uint32"
    train, val = data.tokens("train"), data.tokens("val")
    assert train.dtype == np.uint32 and int(train.max()) == tok.eos_id and int(train.min()) >= 70_000
    got = split_docs(train, tok) + split_docs(val, tok)
    assert sorted(got) == sorted(docs) and len(split_docs(val, tok)) == 3


def test_prepare_trains_bpe_on_train_split(tmp_path):
    docs = [p for p in stdlib_sample(60_000).split("\n\n") if p.strip()]
    src = write_text(tmp_path / "code.txt", docs)
    data = prepare_dataset(src, "bpe:512", tmp_path / "out", val_fraction=0.1)
    assert data.vocab_size == 512 and data.meta["tokenizer"]["kind"] == "bpe"
    assert (data.path / "tokenizer.json").is_file()
    tok = data.tokenizer()
    assert tok.vocab_size == 512 and tok.eos_id == data.eos_id
    val = split_docs(data.tokens("val"), tok)
    text = src.read_text()
    assert val and all(d in text for d in val)
    assert data.num_tokens("train") < 0.7 * len(text.encode())  # compressed vs bytes
    assert prepare_dataset(src, "bpe:512", tmp_path / "out", val_fraction=0.1).cached


def test_prepare_num_proc_matches_single_process(tmp_path, bpe_tok):
    bpe_tok.save(tmp_path / "tok")
    src = write_text(tmp_path / "c.txt", paragraphs(60))
    one = prepare_dataset(src, tmp_path / "tok", tmp_path / "a", num_proc=1, batch_size=8)
    two = prepare_dataset(src, tmp_path / "tok", tmp_path / "b", num_proc=2, batch_size=8)
    assert one.meta["sha256"] == two.meta["sha256"] and one.num_tokens("train") > 0


def test_stdlib_default_corpus(tmp_path):
    data = default_corpus(tmp_path)
    files = stdlib_files()
    assert data.meta["source"]["kind"] == "stdlib" and data.meta["source"]["num_files"] == len(files)
    total = data.num_tokens("train") + data.num_tokens("val")
    assert total > 1_000_000 and data.num_tokens("val") > 0
    assert total == sum(len(f.read_bytes()) for f in files) + len(files)  # bytes + one EOS per file
    tok = data.tokenizer()
    train = data.tokens("train")
    head = tok.decode(train[:400_000].tolist())
    assert any(f.read_text(encoding="utf-8") in head for f in files[:50])  # real files, verbatim
    text = tok.decode(train[:200_000].tolist())
    assert "def " in text and "import " in text


@pytest.mark.skipif(not SHAKESPEARE.is_file(), reason="../shared/data/tinyshakespeare is not present")
def test_tinyshakespeare_prepares(tmp_path):
    data = prepare_dataset(SHAKESPEARE, "byte", tmp_path, val_fraction=0.05)
    raw = SHAKESPEARE.read_text(encoding="utf-8")
    tok = data.tokenizer()
    val = split_docs(data.tokens("val"), tok)
    assert len(val) > 100 and all(d in raw for d in val)
    assert 0.9 * len(raw) < data.num_tokens("train") + data.num_tokens("val") < 1.05 * len(raw)
    x, y = data.windows("train", block_size=128, batch_size=4).next_batch()
    assert x.shape == (4, 128) and torch.equal(x[:, 1:], y[:, :-1])


# ---------------------------------------------------------------------------------------------- windows


def ramp(n: int = 10_000, vocab: int = 50_000) -> np.ndarray:
    return (np.arange(n) % vocab).astype(np.uint16)


def test_windows_shapes_shift_and_determinism():
    w = TokenWindows(ramp(), block_size=32, batch_size=8, seed=3)
    x, y = w.next_batch()
    assert x.shape == y.shape == (8, 32) and x.dtype == y.dtype == torch.int64
    assert torch.equal(y, x + 1)  # on a ramp, the target is the next token
    assert torch.equal(x[:, 1:], y[:, :-1])
    same = TokenWindows(ramp(), block_size=32, batch_size=8, seed=3)
    assert torch.equal(same.next_batch()[0], x)
    other = TokenWindows(ramp(), block_size=32, batch_size=8, seed=4)
    assert not torch.equal(other.next_batch()[0], x)
    assert not torch.equal(w.next_batch()[0], x)  # the stream moves on
    starts = torch.cat([w.next_batch()[0][:, 0] for _ in range(200)])
    assert starts.min() >= 0 and starts.max() <= 10_000 - 33  # every window fits


def test_windows_state_dict_resume_is_exact():
    a = TokenWindows(ramp(), block_size=16, batch_size=4, seed=7)
    for _ in range(5):
        a.next_batch()
    state = a.state_dict()
    expected = [a.next_batch() for _ in range(3)]
    b = TokenWindows(ramp(), block_size=16, batch_size=4, seed=7)
    b.load_state_dict(json.loads(json.dumps(state)))  # survives JSON / torch.save
    for ex, ey in expected:
        x, y = b.next_batch()
        assert torch.equal(x, ex) and torch.equal(y, ey)
    c = TokenWindows(ramp(), block_size=16, batch_size=8, seed=7)
    with pytest.raises(DataError, match="batch_size"):
        c.load_state_dict(state)


def test_windows_ranks_train_and_eval():
    r0 = TokenWindows(ramp(), block_size=64, batch_size=8, seed=0, rank=0, world_size=2)
    r1 = TokenWindows(ramp(), block_size=64, batch_size=8, seed=0, rank=1, world_size=2)
    x0, x1 = r0.next_batch()[0], r1.next_batch()[0]
    assert not torch.equal(x0, x1)
    assert r0.state_dict() == r1.state_dict()  # one saved state serves all ranks
    # the two ranks' slices are exactly one rank's global batch of 16: world size changes nothing
    whole = TokenWindows(ramp(), block_size=64, batch_size=16, seed=0).next_batch()[0]
    assert torch.equal(torch.cat([x0, x1]), whole)
    s0, s1 = set(r0.eval_starts().tolist()), set(r1.eval_starts().tolist())
    assert s0.isdisjoint(s1) and len(s0) == len(s1) == (9_999 // 64) // 2
    single = TokenWindows(ramp(), block_size=64, batch_size=8)
    assert s0 | s1 <= set(single.eval_starts().tolist())
    batches = list(r0.eval_batches())
    assert sum(len(x) for x, _ in batches) == len(s0) and all(x.shape[1] == 64 for x, _ in batches)
    assert torch.equal(torch.cat([x for x, _ in batches])[:, 0], torch.as_tensor(sorted(s0)))  # non-overlapping
    assert list(r0.eval_batches()) and torch.equal(next(r0.eval_batches())[0], batches[0][0])  # fixed
    assert len(list(r0.eval_batches(max_batches=2))) == 2


def test_windows_from_prepared_file_path(tmp_path):
    src = write_text(tmp_path / "c.txt", paragraphs(30))
    data = prepare_dataset(src, "byte", tmp_path / "out")
    w = TokenWindows(data.file("train"), block_size=16, batch_size=2)  # dtype read from meta.json
    x, _ = w.next_batch()
    assert w.num_tokens == data.num_tokens("train") and int(x.max()) < 256


# ---------------------------------------------------------------------------------------------- errors


def test_windows_errors():
    with pytest.raises(DataError, match=r"block_size 100 is too large for tiny.*101 tokens.*has 50"):
        TokenWindows(ramp(50), block_size=100, batch_size=1, name="tiny")
    with pytest.raises(DataError, match="rank 2 is out of range"):
        TokenWindows(ramp(), block_size=8, batch_size=1, rank=2, world_size=2)
    with pytest.raises(DataError, match="token id 256 at position 256 but the vocab has 256 ids"):
        TokenWindows(ramp(), block_size=8, batch_size=64, vocab_size=256).eval_batches().__next__()
    with pytest.raises(DataError, match="not enough for one evaluation window"):
        TokenWindows(ramp(20), block_size=8, batch_size=1, world_size=4).eval_starts()
    with pytest.raises(DataFileNotFoundError, match="missing.bin"):
        TokenWindows("/nonexistent/missing.bin", block_size=8, batch_size=1, dtype="uint16")


def test_bad_source_files(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(DataFileNotFoundError, match="absent.txt"):
        prepare_dataset(tmp_path / "absent.txt", "byte", out)
    (tmp_path / "empty.txt").write_bytes(b"")
    with pytest.raises(DataError, match=r"empty.txt is empty"):
        prepare_dataset(tmp_path / "empty.txt", "byte", out)
    (tmp_path / "blank.txt").write_text(" \n\n \t\n")
    with pytest.raises(DataError, match=r"blank.txt contains no text"):
        prepare_dataset(tmp_path / "blank.txt", "byte", out)
    (tmp_path / "nul.txt").write_bytes(b"hello\x00\x01\x02world")
    with pytest.raises(DataError, match=r"nul.txt contains a NUL byte at offset 5"):
        prepare_dataset(tmp_path / "nul.txt", "byte", out)
    (tmp_path / "latin1.txt").write_bytes("caf\xe9 au lait\n".encode("latin-1"))
    with pytest.raises(DataError, match=r"latin1.txt is not valid UTF-8 \(bad byte at offset 3\)"):
        prepare_dataset(tmp_path / "latin1.txt", "byte", out)
    (tmp_path / "data.csv").write_text("a,b\n")
    with pytest.raises(DataError, match=r"cannot tell the format of .*data.csv.*'.csv'"):
        prepare_dataset(tmp_path / "data.csv", "byte", out)
    with pytest.raises(DataError, match="unknown source kind 'csv'"):
        prepare_dataset(tmp_path / "data.csv", "byte", out, kind="csv")
    (tmp_path / "fake.parquet").write_text("not parquet at all")
    with pytest.raises(DataError, match=r"fake.parquet is not a Parquet file"):
        prepare_dataset(tmp_path / "fake.parquet", "byte", out)
    assert not out.exists() or not any(out.iterdir())  # nothing half-written left behind


def test_bad_fields_and_documents(tmp_path):
    out = tmp_path / "out"
    src = tmp_path / "d.jsonl"
    src.write_text("".join(json.dumps({"body": f"doc {i}", "n": i}) + "\n" for i in range(5)))
    with pytest.raises(DataError, match=r"has no column 'text' \(columns: body, n\)"):
        prepare_dataset(src, "byte", out)
    with pytest.raises(DataError, match=r"column 'n' .* not text"):
        prepare_dataset(src, "byte", out, text_field="n")
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"text": "ok"}\n{"text": unquoted}\n')
    with pytest.raises(DataError, match=r"could not read json source .*broken.jsonl"):
        prepare_dataset(broken, "byte", out)
    one = write_text(tmp_path / "one.txt", ["a single document"])
    with pytest.raises(DataError, match=r"only 1 non-empty document.*at least 2"):
        prepare_dataset(one, "byte", out)
    with pytest.raises(DataError, match="val_fraction"):
        prepare_dataset(one, "byte", out, val_fraction=1.5)


# ---------------------------------------------------------------------------------------------- bad records


def records_file(path: Path, n: int = 300, bad_every: int = 3) -> Path:
    """JSON Lines after one blank line: every ``bad_every``-th record (from the second; 0: none)
    has no usable text, in turn without the field, null, a number; the others are distinct documents."""
    bad = [{"body": "no text field"}, {"text": None}, {"text": 7}]
    lines = [""]
    for i in range(n):
        lines.append(
            json.dumps(
                bad[(i // bad_every) % 3] if bad_every and i % bad_every == 1 else {"text": f"document {i} here"}
            )
        )
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_records_without_text_are_refused_naming_the_file_the_count_and_the_first_line(tmp_path):
    src = records_file(tmp_path / "docs.jsonl")  # line 1 blank: the first bad record is on line 3
    with pytest.raises(DataError) as err:
        prepare_dataset(src, "byte", tmp_path / "out")
    assert str(err.value).startswith(
        f"{src}: 100 of 300 records have no usable text in field 'text' (missing, null or not a string), the first "
        "at line 3 (field missing); fix or remove them, or skip them with skip_bad_records=True"
    )
    assert not any((tmp_path / "out").iterdir())  # nothing kept of the preparation


def test_skipped_records_are_counted_in_the_metadata_and_the_cache_key(tmp_path):
    src = records_file(tmp_path / "docs.jsonl")
    data = prepare_dataset(src, "byte", tmp_path / "out", skip_bad_records=True)
    first = "line 3 (field missing)"
    assert data.meta["bad_records"] == {
        "skip": True,
        "skipped": 100,
        "files": {str(src): {"count": 100, "first": first}},
    }
    tok = data.tokenizer()
    docs = split_docs(data.tokens("train"), tok) + split_docs(data.tokens("val"), tok)
    assert sorted(docs) == sorted(f"document {i} here" for i in range(300) if i % 3 != 1)
    clean = records_file(tmp_path / "clean.jsonl", n=20, bad_every=0)
    refused, skipped = (prepare_dataset(clean, "byte", tmp_path / "out", skip_bad_records=s) for s in (False, True))
    assert refused.path != skipped.path  # the option is part of the key: a cache of one is not the other's
    assert refused.meta["bad_records"] == {"skip": False, "skipped": 0, "files": {}}


def test_a_number_deep_in_a_large_jsonl_file_is_a_bad_record_not_text(tmp_path):
    """datasets reads JSON in 10 MB blocks: a number past the first block became the text "7"."""
    src = tmp_path / "large.jsonl"
    lines = [json.dumps({"text": "x" * 200 + str(i)}) for i in range(60_000)]
    lines[55_000] = '{"text": 7}'
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"large.jsonl: 1 of 60000 records .* the first at line 55001 \(a number\)"):
        prepare_dataset(src, "byte", tmp_path / "out")


def test_parquet_nulls_json_arrays_and_hub_rows_are_records_too(tmp_path, monkeypatch):
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    import spherenet.data.sources as sources

    texts = [f"parquet document {i}" for i in range(6)]
    pq.write_table(pa.table({"text": texts[:2] + [None] + texts[2:]}), tmp_path / "a.parquet")
    with pytest.raises(DataError, match=r"a.parquet: 1 of 7 records .* the first at record index 2 \(null\)"):
        prepare_dataset(tmp_path / "a.parquet", "byte", tmp_path / "out")
    data = prepare_dataset(tmp_path / "a.parquet", "byte", tmp_path / "out", skip_bad_records=True)
    assert data.meta["bad_records"]["skipped"] == 1 and sum(data.meta["documents"].values()) == 6
    pq.write_table(pa.table({"text": [1, 2]}), tmp_path / "numbers.parquet")  # datasets cast these to "1", "2"
    with pytest.raises(DataError, match=r"column 'text' of .*numbers.parquet holds int64, not text"):
        prepare_dataset([tmp_path / "a.parquet", tmp_path / "numbers.parquet"], "byte", tmp_path / "out")
    (tmp_path / "a.json").write_text(json.dumps([{"text": "one doc"}, {"text": ["a list"]}, {"text": "two"}]))
    with pytest.raises(DataError, match=r"a.json: 1 of 3 records .* the first at record index 1 \(a list\)"):
        prepare_dataset(tmp_path / "a.json", "byte", tmp_path / "out")
    rows = datasets.Dataset.from_dict({"text": ["hub row one", None, "hub row two", "three"]})
    monkeypatch.setattr(sources, "_load_hub", lambda src, cache, timeout: rows)
    with pytest.raises(DataError, match=r"Hub dataset owner/rows, split train: 1 of 4 records .* record index 1"):
        prepare_dataset("hf:owner/rows", "byte", tmp_path / "out")
    data = prepare_dataset("hf:owner/rows", "byte", tmp_path / "out", skip_bad_records=True)
    assert data.meta["bad_records"]["skipped"] == 1 and sum(data.meta["documents"].values()) == 3


def test_token_ids_and_vocab_dtype_errors(tmp_path):
    assert token_dtype(256) == np.uint16 and token_dtype(65_536) == np.uint16 and token_dtype(65_537) == np.uint32
    with pytest.raises(DataError, match=r"vocab of 70000 ids is too large for uint16"):
        token_dtype(70_000, "uint16")
    src = write_text(tmp_path / "c.txt", paragraphs(10))
    with pytest.raises(DataError, match="too large for uint16"):
        prepare_dataset(src, ShiftedBytes(70_000), tmp_path / "out", dtype="uint16")
    liar = ShiftedBytes(10, vocab=200)  # claims vocab 200 but emits ids up to 265
    for num_proc in (1, 2):  # the error also crosses from a worker process intact
        with pytest.raises(DataError, match=r"tokenizer shift10 produced token id \d+, outside its vocab of 200"):
            prepare_dataset(src, liar, tmp_path / "out", num_proc=num_proc, batch_size=4)


def test_prepared_files_checked_on_load(tmp_path):
    src = write_text(tmp_path / "c.txt", paragraphs(20))
    data = prepare_dataset(src, "byte", tmp_path / "out")
    with pytest.raises(DataError, match="vocab of 256 ids but the model's vocab_size is 100"):
        data.windows("train", block_size=8, batch_size=2, vocab_size=100)
    raw = bytearray((data.path / "train.bin").read_bytes())
    raw[0] ^= 1
    (data.path / "train.bin").write_bytes(bytes(raw))
    with pytest.raises(DataError, match="does not match the SHA-256"):
        load_prepared(data.path).verify()
    (data.path / "val.bin").write_bytes(b"\x00")
    with pytest.raises(DataError, match=r"val.bin has 1 bytes .* truncated"):
        load_prepared(data.path)
    with pytest.raises(DataFileNotFoundError, match="no-such-dir"):
        load_prepared(tmp_path / "no-such-dir")
    # A damaged cache entry is rebuilt instead of being trusted.
    again = prepare_dataset(src, "byte", tmp_path / "out")
    assert not again.cached and again.path == data.path
    again.verify()


def test_hub_dataset_without_network_fails_fast(tmp_path, monkeypatch, online_mode):
    monkeypatch.setattr(online_mode, "ENDPOINT", "http://127.0.0.1:9")
    t0 = time.monotonic()
    with pytest.raises(DataError) as err:
        prepare_dataset("openwebtext", "byte", tmp_path, timeout=2)
    assert time.monotonic() - t0 < 5
    assert "Skylion007/openwebtext" in str(err.value) and "no network" in str(err.value)
    with pytest.raises(DataError, match=r"owner/corpus \(read as a Hub dataset id because no local file"):
        prepare_dataset("owner/corpus", "byte", tmp_path, timeout=2)
    assert not os.listdir(tmp_path) or all(not p.startswith(".tmp") for p in os.listdir(tmp_path))


def test_resolve_source_kinds(tmp_path):
    (tmp_path / "a.jsonl").write_text('{"text": "x"}\n')
    assert resolve_source(tmp_path / "a.jsonl").kind == "json"
    assert resolve_source(str(tmp_path / "a.jsonl"), kind="text").kind == "text"  # explicit kind wins
    owt = resolve_source("openwebtext")
    assert (owt.kind, owt.name, owt.split) == ("hub", "Skylion007/openwebtext", "train")
    fw = resolve_source("hf:HuggingFaceFW/fineweb-edu", hub_config="sample-10BT", hub_split="train[:1000]")
    assert (fw.kind, fw.config, fw.split) == ("hub", "sample-10BT", "train[:1000]")
    assert resolve_source("Skylion007/openwebtext").kind == "hub"  # bare owner/name, no such local path
    with pytest.raises(DataFileNotFoundError, match="nothere/train.jsonl"):
        resolve_source("nothere/train.jsonl")
    with pytest.raises(DataError, match="unknown text_unit 'sentence'"):
        resolve_source(tmp_path / "a.jsonl", text_unit="sentence")
