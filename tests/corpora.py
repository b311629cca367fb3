"""Small text corpora the recipe and system tests train on (importable from any test, as
``model_references`` is): paragraphs of words drawn from one sentence, blank lines between
them, so that each paragraph is a document."""

from __future__ import annotations

import random
from pathlib import Path


def write_paragraphs(path: Path, sentence: str, paragraphs: int, seed: int) -> Path:
    """``paragraphs`` paragraphs of 20 to 60 words of ``sentence``, drawn with ``seed``, at ``path``."""
    rng = random.Random(seed)
    words = sentence.split()
    text = [" ".join(rng.choice(words) for _ in range(rng.randint(20, 60))) + "." for _ in range(paragraphs)]
    path.write_text("\n\n".join(text), encoding="utf-8")
    return path
