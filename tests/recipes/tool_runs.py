"""The tiny training runs of the recipe tools' tests (tests/recipes/test_recipe_tools.py,
test_recipe_compare.py): their fast options and their corpus."""

from __future__ import annotations

import pytest

FAST = [
    "model.max_seq_len=32",
    "train.batch_size=4",
    "train.eval_every=2",
    "train.eval_batches=1",
    "train.sample_tokens=0",
    "train.progress=false",
]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("tools")
    text = "\n\n".join(f"line {i}: the quick brown fox jumps over the lazy dog {i % 7}" for i in range(300))
    (d / "c.txt").write_text(text)
    return d
