"""``load_trained`` reads a verified checkpoint's tokenizer files once, and builds the tokenizer
from the very bytes it keeps for ``recipes.export`` (``Trained.tokenizer_files``)."""

from __future__ import annotations

import builtins
import io
import json
import os
from collections import Counter
from pathlib import Path

import pytest
import torch

from recipes import checkpoints
from recipes.checkpoints import TOKENIZER_DIR, checkpoint_files, find_checkpoint
from spherenet.checkpoint import CheckpointManager
from spherenet.data import ByteTokenizer, train_bpe
from spherenet.data.tokenizer import SPEC_FILE, TOKENIZER_JSON
from spherenet.models import from_preset

pytestmark = pytest.mark.usefixtures("one_thread")

TOKENIZERS = {
    "byte": lambda: ByteTokenizer(),
    "bpe": lambda: train_bpe([f"document {i}: sphere norm lerp token {i * 7 % 13}" for i in range(60)], 270),
}


@pytest.fixture(params=sorted(TOKENIZERS))
def run(request, tmp_path):
    torch.manual_seed(0)
    tokenizer = TOKENIZERS[request.param]()
    model = from_preset("ngpt-tiny", vocab_size=tokenizer.vocab_size)
    CheckpointManager(tmp_path / "checkpoints").save(2, {"model": model}, files=checkpoint_files(model, tokenizer))
    return tmp_path, tokenizer


def reads_under(directory: Path, monkeypatch) -> Counter:
    """Count every Python open of a file in ``directory`` for reading, and unlink the file as it
    is opened (the open file stays readable): a second read from anywhere, the ``tokenizers``
    library's own file reads included, then finds no file."""
    counts: Counter = Counter()
    real_open = io.open

    def counting_open(file, mode="r", *args, **kwargs):
        handle = real_open(file, mode, *args, **kwargs)
        path = Path(os.path.abspath(file)) if isinstance(file, (str, os.PathLike)) else None
        if path is not None and path.parent == directory.absolute() and not any(c in mode for c in "wax+"):
            counts[path.name] += 1
            path.unlink()
        return handle

    monkeypatch.setattr(io, "open", counting_open)
    monkeypatch.setattr(builtins, "open", counting_open)
    return counts


def test_load_trained_reads_each_tokenizer_file_once_and_builds_the_tokenizer_from_them(run, monkeypatch):
    path, saved = run
    ckpt = find_checkpoint(path)  # verified (its files hashed) and pinned, as load_trained does
    stored = ckpt.path / TOKENIZER_DIR
    on_disk = {f.name: f.read_bytes() for f in sorted(stored.iterdir())}
    assert set(on_disk) == ({SPEC_FILE} if isinstance(saved, ByteTokenizer) else {SPEC_FILE, TOKENIZER_JSON})

    counts = reads_under(stored, monkeypatch)
    try:
        trained = checkpoints._load_trained(ckpt, "cpu")
    finally:
        ckpt.release()
        monkeypatch.undo()

    assert dict(counts) == dict.fromkeys(on_disk, 1)
    assert trained.tokenizer_files == on_disk
    tokenizer = trained.tokenizer
    assert tokenizer.fingerprint == saved.fingerprint
    spec = json.loads(on_disk[SPEC_FILE])
    if TOKENIZER_JSON in on_disk:  # built from the kept bytes: the recorded fingerprint and the same file
        assert tokenizer.fingerprint == spec["fingerprint"]
        assert tokenizer.tokenizer_json() == on_disk[TOKENIZER_JSON].decode("utf-8")
    else:
        assert tokenizer.spec() == spec
    text = "document 3: sphere norm ünïcode"
    assert tokenizer.encode(text) == saved.encode(text)
