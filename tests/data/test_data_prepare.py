"""Tests for spherenet.data: dataset preparation (text, JSONL, Parquet; the cache and its key)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from text_documents import ShiftedBytes, paragraphs, sha256_file, split_docs, stdlib_sample, write_text

from spherenet.data import (
    DataError,
    default_corpus,
    load_prepared,
    prepare_dataset,
    stdlib_files,
)

REPO = Path(__file__).resolve().parents[2]
SHAKESPEARE = REPO.parent / "shared" / "data" / "tinyshakespeare" / "input.txt"


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
