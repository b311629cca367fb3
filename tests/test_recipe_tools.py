"""recipes.sample and recipes.compare, end to end on tiny runs."""

from __future__ import annotations

import json
import statistics

import pytest

from recipes import compare, sample
from recipes.train import cli as train_cli

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


@pytest.fixture(scope="module")
def trained_run(corpus):
    out = corpus / "run"
    rc = train_cli(["model.preset=ngpt-tiny", *FAST, "train.steps=4", f"train.out_dir={out}",
                    f"data.source={corpus / 'c.txt'}", f"data.cache_dir={corpus / 'cache'}"])  # fmt: skip
    assert rc == 0
    return out


def test_sample_from_checkpoint(trained_run, capsys):
    assert sample.main([str(trained_run), "--prompt", "line 1", "--tokens", "12", "--temperature", "0"]) == 0
    first = capsys.readouterr().out
    assert first.startswith("line 1") and len(first.rstrip("\n")) > len("line 1")
    # greedy is deterministic; a step directory works as well as the run directory
    step_dir = sorted((trained_run / "checkpoints").glob("step_*"))[-1]
    assert sample.main([str(step_dir), "--prompt", "line 1", "--tokens", "12", "--temperature", "0"]) == 0
    assert capsys.readouterr().out == first


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--tokens", "0"], "--tokens"),
        (["--prompt", "x" * 40], "context is 32"),
    ],
)
def test_sample_bad_arguments(trained_run, capsys, args, needle):
    assert sample.main([str(trained_run), *args]) == 2
    assert needle in capsys.readouterr().err


def test_sample_without_checkpoint(tmp_path, capsys):
    assert sample.main([str(tmp_path)]) == 2
    assert "no checkpoint found" in capsys.readouterr().err


@pytest.mark.slow  # four training processes, ~50 s on 2 shared cores
def test_compare_two_variants(corpus, capsys):
    out = corpus / "cmp"
    rc = compare.main(["--variants", "gpt", "ngpt", "--seeds", "0", "1", "--size", "tiny", "--out", str(out),
                       *FAST, "train.steps=6", "optim.warmup_steps=1",
                       f"data.source={corpus / 'c.txt'}", f"data.cache_dir={corpus / 'cache'}"])  # fmt: skip
    assert rc == 0
    result = json.loads((out / "compare.json").read_text())
    assert [r["variant"] for r in result["rows"]] == ["gpt", "ngpt"]
    assert all(r["seeds"] == 2 for r in result["rows"])
    curves = result["curves"]
    assert curves["gpt"]["0"]["steps"] == [2, 4, 6]
    # seeds differ, variants differ
    assert curves["ngpt"]["0"]["val_loss"] != curves["ngpt"]["1"]["val_loss"]
    assert curves["ngpt"]["0"]["val_loss"] != curves["gpt"]["0"]["val_loss"]
    # the target is the baseline's best validation loss, averaged over seeds
    assert result["target"] == pytest.approx(statistics.mean(min(c["val_loss"]) for c in curves["gpt"].values()))
    gpt_row = result["rows"][0]
    assert gpt_row["reached"] == "2/2" and gpt_row["speedup_vs_baseline"] == 1.0  # paired by seed
    table = (out / "compare.md").read_text()
    assert "| gpt | 2 |" in table and "| ngpt | 2 |" in table
    png = (out / "compare.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"


def test_compare_variant_syntax():
    assert compare.variant_overrides("ngpt-slerp", "tiny") == (
        "ngpt-slerp",
        ["model.preset=ngpt-tiny", "model.update=slerp", "optim.method=riemannian_adam"],
    )
    assert compare.variant_overrides("mine:optim.lr=1e-3,model.n_layers=3", "tiny") == (
        "mine",
        ["optim.lr=1e-3", "model.n_layers=3"],
    )
    with pytest.raises(SystemExit, match="unknown variant"):
        compare.variant_overrides("ngpt-cubic", "tiny")
    with pytest.raises(SystemExit, match="name:section.key=value"):
        compare.variant_overrides("mine:oops", "tiny")


def test_summarize_pairs_seeds():
    def curve(vals):
        return {"steps": [10, 20, 30, 40], "val_loss": vals}

    results = {
        "gpt": {0: curve([3.0, 2.5, 2.2, 2.0]), 1: curve([3.0, 2.4, 2.3, 2.3])},
        "fast": {0: curve([2.6, 2.0, 1.9, 1.8]), 1: curve([2.3, 2.2, 2.2, 2.2])},
        "slow": {0: curve([3.5, 3.0, 2.9, 2.8]), 1: curve([3.0, 2.9, 2.3, 2.3])},
    }
    rows, target = compare.summarize(results, "gpt")
    by = {r["variant"]: r for r in rows}
    assert target == pytest.approx((2.0 + 2.3) / 2)
    assert by["fast"]["steps_to_target"] == [20, 10] and by["fast"]["reached"] == "2/2"
    assert by["fast"]["speedup_vs_baseline"] == pytest.approx((40 / 20 + 30 / 10) / 2)
    assert by["slow"]["steps_to_target"] == [float("inf"), 30] and by["slow"]["reached"] == "1/2"
    assert by["slow"]["speedup_vs_baseline"] == pytest.approx(1.0)


def test_steps_to_reach():
    curve = {"steps": [10, 20, 30], "val_loss": [3.0, 2.5, 2.0]}
    assert compare.steps_to_reach(curve, 2.5) == 20
    assert compare.steps_to_reach(curve, 1.0) == float("inf")
