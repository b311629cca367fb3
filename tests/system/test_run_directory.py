"""Whose run a directory holds, end to end: a torchrun restart continues only a run its own job
wrote, a refusal under torchrun is one line from rank 0 on every attempt, a refused run leaves
nothing behind, ``--overwrite`` moves nothing until every input is checked, and sizes that
cannot run are refused before anything is written."""

from __future__ import annotations

from pathlib import Path

import fault_runs
import pytest
import torch
from fault_runs import TINY, args, checkpoint_steps, finish, launched, max_step, torchrun_cmd

from recipes.train import cli

# the fault tests' fixtures: the corpus, its data cache, one intra-op thread (autouse)
text_file, cache, one_thread = fault_runs.text_file, fault_runs.cache, fault_runs.one_thread


def error_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("error:")]


def halted_run(tmp_path: Path, cache: Path, text_file: Path, capsys) -> Path:
    out = tmp_path / "run"
    assert cli(args(out, cache, text_file, "train.steps=20", "train.checkpoint_every=4", "train.halt_after=4")) == 0
    capsys.readouterr()
    assert checkpoint_steps(out) == [4]
    return out


@pytest.mark.slow
@pytest.mark.distributed
def test_a_refusal_under_torchrun_repeats_on_restart_and_trains_nothing(tmp_path, cache, text_file, capsys):
    """A fresh torchrun job (no --resume) aimed at a halted run is refused; with --max-restarts=1
    torchrun starts the workers again, and the restart is refused the same way (it is no restart
    of the job that wrote the run): nothing is trained or appended, and each attempt says it in
    one line from rank 0, no traceback from the other rank."""
    out = halted_run(tmp_path, cache, text_file, capsys)
    before = (out / "metrics.jsonl").read_bytes()
    log = tmp_path / "torchrun.log"
    cmd = torchrun_cmd(2, *args(out, cache, text_file, "train.steps=20", "train.parallel=ddp"), max_restarts=1)
    with launched(cmd, log) as proc:
        text = finish(proc, log)
    assert proc.returncode != 0, text[-3000:]
    errors = error_lines(text)
    assert len(errors) == 2, text[-3000:]  # the first attempt and its restart, one line each
    assert all(f"train.out_dir {out} holds a run (checkpoints up to step_00000004)" in e for e in errors), errors
    # torchrun's own summary of the failed attempts is its one traceback; none from the workers
    assert text.count("Traceback") <= 1 and "recipes/" not in text and "gloo" not in text.lower(), text[-3000:]
    assert "resumed from" not in text and "exitcode  : 2" in text, text[-3000:]
    assert (out / "metrics.jsonl").read_bytes() == before
    assert checkpoint_steps(out) == [4] and not (out / "job.json").exists()


def test_a_single_process_refusal_leaves_no_lock(tmp_path, cache, text_file, capsys):
    """--resume into an empty directory is refused; the lock file it made is gone again, and so is
    the directory it made."""
    out = tmp_path / "empty"
    out.mkdir()
    assert cli(args(out, cache, text_file, "train.steps=4", "--resume")) == 2
    assert "holds no checkpoint" in capsys.readouterr().err
    assert not out.exists()
    bad = tmp_path / "bad"  # refused after the claim, by the data
    assert cli([*args(bad, cache, text_file, "train.steps=4"), f"data.source={tmp_path / 'nope.txt'}"]) == 2
    assert "source file not found" in capsys.readouterr().err
    assert not bad.exists()


def test_overwrite_with_init_from_inside_the_run_moves_nothing(tmp_path, cache, text_file, capsys):
    out = halted_run(tmp_path, cache, text_file, capsys)
    code = cli(args(out, cache, text_file, "train.steps=8", f"train.init_from={out}", "--overwrite"))
    assert code == 2
    err = capsys.readouterr().err
    assert f"train.init_from={out} is inside train.out_dir" in err, err
    assert not list(out.glob("previous-*")) and checkpoint_steps(out) == [4]


def test_overwrite_moves_aside_only_after_the_inputs_are_checked(tmp_path, cache, text_file, capsys):
    out = halted_run(tmp_path, cache, text_file, capsys)
    assert cli(args(out, cache, text_file, "train.steps=8", "optim.warmup_steps=50", "--overwrite")) == 2
    assert "warmup_steps" in capsys.readouterr().err
    assert not list(out.glob("previous-*")) and checkpoint_steps(out) == [4]
    assert cli(args(out, cache, text_file, "train.steps=8", "--overwrite")) == 0
    (aside,) = out.glob("previous-*")
    assert (aside / "checkpoints" / "step_00000004").is_dir() and max_step(out) == 8


def test_overwrite_moves_only_what_the_run_wrote(tmp_path, text_file, capsys):
    """The user's notes and sources, the run's own data.source and a data cache inside the run
    directory stay where they are; the earlier run's checkpoints and metrics move aside, and the
    line that says so names them and where they went; --resume then finds its data."""
    out = tmp_path / "run"
    (out / "src").mkdir(parents=True)
    corpus = out / "corpus.txt"
    corpus.write_bytes(text_file.read_bytes())
    mine = {"notes.md": "what I tried", "src/mine.py": "print('mine')", "train.log": "a log the user keeps"}
    for name, text in mine.items():
        (out / name).write_text(text)
    run = [*TINY, f"data.source={corpus}", f"data.cache_dir={out / 'data_cache'}", f"train.out_dir={out}"]
    run += ["train.steps=12", "train.checkpoint_every=4"]
    assert cli([*run, "train.halt_after=4"]) == 0
    capsys.readouterr()
    assert cli([*run, "train.halt_after=8", "--overwrite"]) == 0
    printed = capsys.readouterr().out
    (aside,) = out.glob("previous-*")
    assert f"moved the earlier run's checkpoints, metrics.jsonl into {aside}" in printed, printed
    assert sorted(p.name for p in aside.iterdir()) == ["checkpoints", "metrics.jsonl"]
    assert all((out / name).read_text() == text for name, text in mine.items())
    assert corpus.is_file() and (out / "data_cache").is_dir()
    assert cli([*run, "--resume"]) == 0
    assert checkpoint_steps(out)[-1] == 12 and max_step(out) == 12


@pytest.mark.parametrize(
    "override, what",
    [("train.batch_size=100000000000", "micro-batch of 100000000000 x 32 tokens"), ("model.d_model=1000000", "")],
    ids=["huge_batch", "huge_width"],
)
def test_a_size_that_cannot_run_is_refused_before_anything_is_written(
    tmp_path, cache, text_file, capsys, override, what
):
    out = tmp_path / "run"
    assert cli(args(out, cache, text_file, "train.steps=3", override)) == 2
    err = capsys.readouterr().err
    (line,) = err.splitlines()
    assert line.startswith("error: this run needs at least an estimated ") and what in line, line
    assert "but this machine has" in line and "GiB (" in line, line
    assert not out.exists()  # no metrics.jsonl, no checkpoint, no lock, not even the directory


def test_memory_estimate_counts_states_and_activations():
    from spherenet.models import model_from_config
    from spherenet.train.config import load_config, model_config, resolved
    from spherenet.train.memory import available_memory, estimate_training_memory

    config = model_config(resolved(load_config(None, ["model.preset=ngpt-tiny"])), 256)
    model = model_from_config(config)
    params = sum(p.numel() for p in model.parameters())
    est = estimate_training_memory(config, micro_batch=2, block_size=32)
    assert est.parameters == params and est.state_bytes == params * 4 * 4  # weight, grad, two moments
    c = model.config  # d_mlp, n_kv_heads, head_dim resolved
    layer = 6 * c.d_model + (2 * c.n_heads + 2 * c.n_kv_heads) * c.head_dim + c.n_heads + 3 * c.d_mlp
    assert est.activation_bytes == 2 * 32 * (c.n_layers * layer + 2 * 256) * 4
    longer = estimate_training_memory(config, micro_batch=2, block_size=64)
    assert longer.activation_bytes == 2 * est.activation_bytes  # linear in the context: no T x T scores
    bf16 = estimate_training_memory(config, micro_batch=2, block_size=32, activation_bytes_per_value=2)
    assert (bf16.activation_bytes, bf16.state_bytes) == (est.activation_bytes // 2, est.state_bytes)
    sharded = estimate_training_memory(config, micro_batch=2, block_size=32, shards=4)
    assert sharded.state_bytes == est.state_bytes // 4
    checkpointed = estimate_training_memory(config, micro_batch=2, block_size=32, activation_checkpointing=True)
    assert checkpointed.activation_bytes < est.activation_bytes
    have, source = available_memory(torch.device("cpu"))
    assert have is None or have > 0, source


def _saved_for_backward_bytes(model, tokens: torch.Tensor, autocast: bool) -> int:
    """Bytes of the distinct storages autograd keeps for the backward pass of the training loss
    (parameters excluded; their bf16 casts under autocast count), plus the logits' gradient the
    backward pass creates. Autocast as recipes.train applies it (``autocast_context``)."""
    from spherenet.train.step import autocast_context, lm_loss

    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    storages = {}

    def keep(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in params and storage.nbytes() > 0:
            storages[storage.data_ptr()] = storage.nbytes()
        return t

    context = autocast_context("bf16" if autocast else "off", torch.device("cpu"))
    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t), context:
        logits = model(tokens[:, :-1])
        lm_loss(logits, tokens[:, 1:])
    logits_grad = logits.numel() * 4  # lm_loss computes in float32
    return sum(storages.values()) + logits_grad


@pytest.mark.parametrize("preset", ["ngpt-tiny", "gpt-tiny"])
@pytest.mark.parametrize(
    "overrides",
    [[], ["model.n_kv_heads=1"], ["model.mlp=relu2"], ["model.d_model=128", "model.n_heads=2"]],
    ids=["mha", "mqa", "relu2", "wide"],
)
def test_memory_estimate_stays_below_what_autograd_saves(preset, overrides):
    """The estimate is a floor (a run is refused only when it cannot fit): below what autograd
    really keeps, in float32 and under bf16 autocast, and not far below (above 0.7x in float32),
    also at a context where full T x T scores would have dominated."""
    from spherenet.models import model_from_config
    from spherenet.train.config import load_config, model_config, resolved
    from spherenet.train.memory import estimate_training_memory

    block = 512
    config = model_config(
        resolved(load_config(None, [f"model.preset={preset}", f"model.max_seq_len={block}", *overrides])), 256
    )
    torch.manual_seed(0)
    model = model_from_config(config)
    tokens = torch.randint(0, 256, (2, block + 1))
    saved = _saved_for_backward_bytes(model, tokens, autocast=False)
    est = estimate_training_memory(config, micro_batch=2, block_size=block).activation_bytes
    assert 0.7 * saved < est <= saved, (est, saved)
    saved_bf16 = _saved_for_backward_bytes(model, tokens, autocast=True)
    est_bf16 = estimate_training_memory(
        config, micro_batch=2, block_size=block, activation_bytes_per_value=2
    ).activation_bytes
    assert est_bf16 <= saved_bf16, (est_bf16, saved_bf16)


def test_a_disk_full_while_a_checkpoint_is_written_names_the_checkpoint(
    tmp_path, cache, text_file, capsys, monkeypatch
):
    """An ENOSPC whose OSError names no file (as from ``write`` on an open file): the line names
    the checkpoint being written."""
    import spherenet.checkpoint.manager as manager

    def disk_full(obj, path):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(manager, "_torch_save_synced", disk_full)
    out = tmp_path / "run"
    assert cli(args(out, cache, text_file, "train.steps=2")) == 2
    (line,) = capsys.readouterr().err.splitlines()
    tmp = out / "checkpoints" / ".tmp-step_00000002"
    assert f"(rank 0: cannot write {tmp}: no space left on device (ENOSPC))" in line, line
