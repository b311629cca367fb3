"""What a run records about itself: the random number generator states its checkpoints save
repeat from run to run of one config, and a refused ``train.init_from`` names its path once."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from recipes.train import cli as train_cli

REPO = Path(__file__).resolve().parents[2]
TINY = [
    "model.preset=ngpt-tiny",
    "model.max_seq_len=32",
    "train.batch_size=4",
    "train.eval_every=2",
    "train.eval_batches=1",
    "train.sample_tokens=0",
    "train.progress=false",
    "train.steps=2",
]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("records")
    (root / "c.txt").write_text("\n\n".join(f"line {i}: a run records what it is {i % 5}" for i in range(200)))
    return root


def saved_rng(run_dir):
    state = torch.load(run_dir / "checkpoints" / "step_00000002" / "state.pt", weights_only=True)
    return state["rng"]


@pytest.mark.slow
def test_two_runs_of_one_config_save_the_same_rng_states(corpus, tmp_path):
    """Two processes (an unseeded generator starts from fresh entropy in each)."""
    for name in ("a", "b"):
        argv = [*TINY, f"data.source={corpus / 'c.txt'}", f"data.cache_dir={corpus / 'cache'}"]
        cmd = [sys.executable, "-m", "recipes.train", *argv, f"train.out_dir={tmp_path / name}"]
        done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
    a, b = saved_rng(tmp_path / "a"), saved_rng(tmp_path / "b")
    assert a[0]["python"] == b[0]["python"]
    assert a[0]["numpy"] == b[0]["numpy"]
    assert torch.equal(a[0]["torch"], b[0]["torch"])


@pytest.mark.parametrize("kind", ["missing", "empty"])
def test_a_refused_init_from_names_its_path_once(corpus, tmp_path, capsys, kind):
    source = tmp_path / "weights"
    if kind == "empty":
        source.mkdir()
    argv = [*TINY, f"data.source={corpus / 'c.txt'}", f"data.cache_dir={corpus / 'cache'}"]
    assert train_cli([*argv, f"train.out_dir={tmp_path / 'run'}", f"train.init_from={source}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: train.init_from"), err
    assert err[0].count(str(source)) == 1, err
