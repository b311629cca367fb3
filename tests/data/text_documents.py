"""Documents, token files and tokenizers for the data tests (tests/data/test_data*.py)."""

from __future__ import annotations

import hashlib
import sysconfig
from pathlib import Path

import numpy as np

from spherenet.data import Tokenizer


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
