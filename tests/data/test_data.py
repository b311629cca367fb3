"""Tests for spherenet.data: token windows, error messages and bad records. Tokenizers:
test_data_tokenizers.py; dataset preparation: test_data_prepare.py."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from text_documents import ShiftedBytes, paragraphs, split_docs, write_text

from spherenet.data import (
    DataError,
    DataFileNotFoundError,
    TokenWindows,
    load_prepared,
    prepare_dataset,
    resolve_source,
    token_dtype,
)

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
