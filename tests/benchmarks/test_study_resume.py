"""benchmarks/convergence.py's ``train_one`` (every study's trainer) continues a half-done run of
the same spec from its checkpoints (``recipes.train --resume``) instead of starting it afresh,
and starts afresh when the checkpoint's settings differ; long runs checkpoint every 5%."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest


def run_args(tmp_path: Path, runs: str, overrides: list[str]) -> argparse.Namespace:
    text = tmp_path / "corpus.txt"
    if not text.is_file():
        text.write_text("\n\n".join(f"line {i}: the quick brown fox jumps over the lazy dog" for i in range(300)))
    return argparse.Namespace(data=str(text), out=tmp_path / "out", block=16, batch=4, steps=8, eval_every=2,
                              eval_batches=1, overrides=overrides, size="tiny", runs=tmp_path / runs, reuse=False,
                              nice=0, threads=1, checkpoint_every=2)  # fmt: skip  # the namespace train_one reads


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_checkpoints_every_5_percent_of_a_long_run(convergence):
    ns = argparse.Namespace
    assert convergence.checkpoint_every(ns(steps=10828)) == 541
    assert convergence.checkpoint_every(ns(steps=1600)) == 80
    assert convergence.checkpoint_every(ns(steps=400)) == 400  # minutes: at its end only
    assert convergence.checkpoint_every(ns(steps=400, checkpoint_every=50)) == 50


@pytest.mark.slow
def test_a_halted_run_continues_from_its_checkpoint_and_one_of_other_settings_starts_afresh(convergence, tmp_path):
    spec = "gpt_lr1e-2:model.preset=gpt-tiny,optim.lr=0.01"
    said: list[str] = []
    # interrupted: halted after 4 of 8 steps, checkpointed there
    a = run_args(tmp_path, "runs", ["train.halt_after=4"])
    assert convergence.train_one(a, spec, 0, said.append)[2] == 0
    run_dir = a.runs / "gpt_lr1e-2" / "seed0"
    assert convergence.resume_step(run_dir, 8) == 4
    assert convergence.resume_step(run_dir, 16) is None  # a run of another length is not continued
    # restarted (without the halt): continued from step 4, the curve whole and each step once
    b = run_args(tmp_path, "runs", [])
    assert convergence.train_one(b, spec, 0, said.append)[2] == 0
    assert said[-1] == "  gpt_lr1e-2 seed 0: ok" and "continued from step 4" in said[-2]
    assert "resumed from" in (run_dir / "train.log").read_text()
    curve = convergence.compare.read_curve(run_dir)
    assert curve["steps"] == [2, 4, 6, 8] and convergence.compare.finished(run_dir)
    assert curve["from_step"] == 4  # where the last invocation began
    # the same as a run never interrupted
    whole = run_args(tmp_path, "whole", [])
    convergence.train_one(whole, spec, 0, said.append)
    assert curve["val_loss"] == pytest.approx(
        convergence.compare.read_curve(whole.runs / "gpt_lr1e-2" / "seed0")["val_loss"], abs=1e-5
    )

    # a half-done run of other settings in the directory (another rate, same name): refused, started afresh
    c = run_args(tmp_path, "other", ["train.halt_after=4"])
    convergence.train_one(c, spec, 0, said.append)
    said.clear()
    other = "gpt_lr1e-2:model.preset=gpt-tiny,optim.lr=0.003"
    assert convergence.train_one(run_args(tmp_path, "other", []), other, 0, said.append)[2] == 0
    assert "cannot continue from step 4" in said[0] and said[-1].endswith(": ok")
    rerun = c.runs / "gpt_lr1e-2" / "seed0"
    starts = [r for r in metrics(rerun) if r.get("event") == "start"]
    assert len(starts) == 1 and starts[0]["step"] == 0 and starts[0]["config"]["optim"]["lr"] == 0.003
    assert convergence.compare.read_curve(rerun)["steps"] == [2, 4, 6, 8]
    assert convergence.compare.read_curve(rerun)["from_step"] == 0
