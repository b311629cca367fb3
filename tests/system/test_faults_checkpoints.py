"""What a training run survives in its checkpoints and steps, end to end through recipes/train.py
on CPU.

- a damaged newest checkpoint (bytes flipped, truncated, manifest missing) or a half-written
  one left by a crash: ``--resume`` warns, takes the previous sound one, and finishes;
- a non-finite loss or gradient: skipped (weights and optimizer untouched) under
  ``train.nonfinite=skip``, exit code 3 with the last good checkpoint intact under ``stop``;
  NaN weights are never written into a checkpoint.

The runs and helpers: fault_runs.py.
"""

from __future__ import annotations

import re
from pathlib import Path

import fault_runs
import pytest
import torch
from fault_runs import (
    all_finite,
    args,
    assert_same_losses,
    checkpoint_steps,
    last_losses,
    max_step,
    read_log,
    saved_state,
)

import recipes.train
import recipes.trainer
import spherenet.train.step as step_module
from recipes.train import cli
from spherenet.checkpoint import CheckpointWarning

# the fault tests' fixtures: the corpus, its data cache, one intra-op thread (autouse)
text_file, cache, one_thread = fault_runs.text_file, fault_runs.cache, fault_runs.one_thread

# --------------------------------------------------------------------------------------------
# damaged or half-written checkpoints

STEPS, EVERY = 20, 5


@pytest.fixture(scope="module")
def reference(tmp_path_factory, cache, text_file) -> dict[int, float]:
    """Per-step losses of the uninterrupted single-process run the tests below resume."""
    out = tmp_path_factory.mktemp("reference")
    assert cli(args(out, cache, text_file, f"train.steps={STEPS}", f"train.checkpoint_every={EVERY}")) == 0
    return last_losses(out)


def flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


DAMAGE = {
    "bytes_flipped": lambda ck: flip_byte(ck / "state.pt"),
    "truncated": lambda ck: (ck / "state.pt").write_bytes((ck / "state.pt").read_bytes()[:1000]),
    "manifest_missing": lambda ck: (ck / "MANIFEST.json").unlink(),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_damaged_newest_checkpoint_falls_back_to_previous(tmp_path, cache, text_file, reference, capsys, damage):
    out = tmp_path / "run"
    common = [f"train.steps={STEPS}", f"train.checkpoint_every={EVERY}"]
    assert cli(args(out, cache, text_file, *common, "train.halt_after=15")) == 0
    assert checkpoint_steps(out) == [5, 10, 15]
    DAMAGE[damage](out / "checkpoints" / "step_00000015")

    with pytest.warns(CheckpointWarning, match="skipping damaged checkpoint.*step_00000015"):
        assert cli(args(out, cache, text_file, *common, "--resume")) == 0
    assert f"resumed from {out / 'checkpoints' / 'step_00000010'} at step 10" in capsys.readouterr().out
    assert_same_losses(last_losses(out), reference)
    # The damaged step was written again, soundly; the last 3 are kept.
    assert checkpoint_steps(out) == [10, 15, 20]
    for step in (10, 15, 20):
        assert all_finite(saved_state(out, step))


def test_half_written_checkpoint_is_ignored_and_cleaned(tmp_path, cache, text_file, reference):
    """A crash mid-save leaves only a .tmp-* directory: never read, removed by the next save."""
    out = tmp_path / "run"
    common = [f"train.steps={STEPS}", f"train.checkpoint_every={EVERY}"]
    assert cli(args(out, cache, text_file, *common, "train.halt_after=10")) == 0
    tmp = out / "checkpoints" / ".tmp-step_00000015"
    tmp.mkdir()
    (tmp / "state.pt").write_bytes(b"\x80\x02 torn")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", CheckpointWarning)  # nothing damaged is even looked at
        assert cli(args(out, cache, text_file, *common, "--resume")) == 0
    assert_same_losses(last_losses(out), reference)
    assert not tmp.exists()
    assert checkpoint_steps(out) == [10, 15, 20]


# --------------------------------------------------------------------------------------------
# non-finite loss or gradients


class _NaNGrad(torch.autograd.Function):
    """Identity forward, NaN backward: a finite loss whose gradient is not."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return grad * float("nan")


def poison(monkeypatch, steps, kind: str = "loss") -> None:
    """Make the training loss (``kind="loss"``) or its gradient (``"grad"``) NaN at the given
    optimizer steps (counted from 1 in this process; one micro-batch per step)."""
    real, calls = step_module.lm_loss, [0]

    def lm_loss(logits, targets):
        loss = real(logits, targets)
        if torch.is_grad_enabled():  # training, not evaluation
            calls[0] += 1
            if calls[0] in steps:
                return loss * float("nan") if kind == "loss" else _NaNGrad.apply(loss)
        return loss

    monkeypatch.setattr(step_module, "lm_loss", lm_loss)


def same_tensors(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same_tensors(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same_tensors(x, y) for x, y in zip(a, b))
    return a == b


@pytest.mark.parametrize("kind", ["loss", "grad"])
def test_nonfinite_skip_leaves_weights_untouched(tmp_path, cache, text_file, monkeypatch, kind):
    out, bad = tmp_path / "run", {4, 7}
    poison(monkeypatch, bad, kind)
    rc = cli(
        args(
            out,
            cache,
            text_file,
            "train.steps=10",
            "train.checkpoint_every=1",
            "train.keep_last=20",
            "train.nonfinite=skip",
        )
    )
    assert rc == 0
    rows = {r["step"]: r for r in read_log(out) if "loss" in r}
    assert sorted(rows) == list(range(1, 11))
    assert {s for s, r in rows.items() if r["skipped"]} == bad
    for s, r in rows.items():
        assert (r["grad_norm"] is None) == (s in bad)
        assert (r["loss"] is None) == (s in bad and kind == "loss")
    assert read_log(out)[-1]["event"] == "done"

    states = {s: saved_state(out, s) for s in range(1, 11)}  # each verified and loadable
    for s, st in states.items():
        assert all_finite(st["model"]) and all_finite(st["optimizer"]), f"non-finite value saved at step {s}"
    for s in bad:  # a skipped step changes neither the weights nor the optimizer (Adam's step count...)
        assert same_tensors(states[s]["model"], states[s - 1]["model"])
        assert same_tensors(states[s]["optimizer"]["state"], states[s - 1]["optimizer"]["state"])
        assert not same_tensors(states[s + 1]["model"], states[s]["model"])  # and training goes on


def test_nonfinite_stop_exits_3_and_keeps_last_good_checkpoint(
    tmp_path, cache, text_file, reference, monkeypatch, capsys
):
    out = tmp_path / "run"
    common = [f"train.steps={STEPS}", f"train.checkpoint_every={EVERY}", "train.nonfinite=stop"]
    with monkeypatch.context() as m:
        poison(m, {7})
        assert cli(args(out, cache, text_file, *common)) == 3
    err = capsys.readouterr().err
    assert "error: non-finite loss" in err and "train.nonfinite=skip" in err and "Traceback" not in err
    records = read_log(out)
    assert records[-1] == {**records[-1], "event": "stopped", "step": 7}
    assert max_step(out) == 6  # the bad step is not logged as a step
    assert checkpoint_steps(out) == [5]
    assert all_finite(saved_state(out, 5))

    # The kept checkpoint is sound: resuming from it reproduces the clean run.
    assert cli(args(out, cache, text_file, *common, "--resume")) == 0
    assert_same_losses(last_losses(out), reference)


def test_too_many_skips_in_a_row_stop_with_exit_3(tmp_path, cache, text_file, monkeypatch, capsys):
    out = tmp_path / "run"
    poison(monkeypatch, set(range(3, 100)))
    rc = cli(args(out, cache, text_file, "train.steps=20", "train.checkpoint_every=2", "train.max_nonfinite=3"))
    assert rc == 3
    assert "error: 3 non-finite steps in a row (train.max_nonfinite)" in capsys.readouterr().err
    rows = [r for r in read_log(out) if "loss" in r]
    assert [r["step"] for r in rows if r["skipped"]] == [3, 4]  # the third one stops before it is logged
    assert read_log(out)[-1]["event"] == "stopped" and read_log(out)[-1]["step"] == 5
    assert checkpoint_steps(out) == [2, 4] and all_finite(saved_state(out, 4))


def test_nan_weights_are_never_checkpointed(tmp_path, cache, text_file, monkeypatch, capsys):
    """Weights turned NaN behind the loop's back (finite loss and gradient at that step): the
    next checkpoint refuses them, exit code 3, the previous checkpoint stays the newest."""
    out, real = tmp_path / "run", recipes.trainer.train_step
    calls = [0]

    def train_step(model, *a, **kw):
        result = real(model, *a, **kw)
        calls[0] += 1
        if calls[0] == 7:
            with torch.no_grad():
                next(model.parameters()).view(-1)[0] = float("nan")
        return result

    monkeypatch.setattr(recipes.trainer, "train_step", train_step)
    rc = cli(args(out, cache, text_file, f"train.steps={STEPS}", f"train.checkpoint_every={EVERY}"))
    err = capsys.readouterr().err
    assert rc == 3, err
    assert re.search(r"error: refusing to save step 10: non-finite values \(NaN/inf\) in model\.\S+", err), err
    assert checkpoint_steps(out) == [5] and all_finite(saved_state(out, 5))
    assert not list((out / "checkpoints").glob(".tmp-*"))
