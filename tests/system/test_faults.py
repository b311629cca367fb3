"""What a training run survives, end to end through recipes/train.py on CPU.

- a worker SIGKILLed under ``torchrun --max-restarts``: the job restarts from the last
  checkpoint, finishes, and its per-step losses are those of an uninterrupted run;
- SIGTERM (preemption), to one process or to torchrun: the run finishes its step, checkpoints,
  its workers exit 0; ``--resume`` goes on exactly where it stopped;
- a damaged newest checkpoint (bytes flipped, truncated, manifest missing) or a half-written
  one left by a crash: ``--resume`` warns, takes the previous sound one, and finishes;
- a non-finite loss or gradient: skipped (weights and optimizer untouched) under
  ``train.nonfinite=skip``, exit code 3 with the last good checkpoint intact under ``stop``;
  NaN weights are never written into a checkpoint.

Runs are the tiny nGPT of tests/recipes/test_recipe_train.py (2 layers, context 32, batch 8) on a small
local text file. Subprocesses run in their own session with a timeout and are killed, with
every process they started, whenever a test leaves early.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from corpora import write_paragraphs
from signals import send_while_alive, wait_until_taken

import recipes.train
import recipes.trainer
import spherenet.train.step as step_module
from recipes.train import cli
from spherenet.checkpoint import CheckpointManager, CheckpointWarning
from spherenet.models import from_preset

REPO = Path(__file__).resolve().parents[2]

TINY = [
    "model.preset=ngpt-tiny",
    "model.max_seq_len=32",
    "train.batch_size=8",
    "train.log_every=1",
    "train.eval_every=1000",
    "train.eval_batches=2",
    "train.sample_tokens=0",
    "train.progress=false",
]
TOL = 1e-6  # per-step loss, resumed vs uninterrupted (they agree bitwise on one machine)
# Seconds a subprocess gets to reach a point or to finish before the test calls it hung. Only a
# guard: the jobs take seconds alone, but CI runs them beside the rest of the suite on 2 cores,
# where starting torchrun and its workers alone has taken over a minute.
HANG_GUARD = 300


# --------------------------------------------------------------------------------------------
# fixtures and helpers


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One intra-op thread: these models are tiny, and on a shared, busy CPU two spinning OpenMP
    threads make a step up to 50x slower. Subprocesses get OMP_NUM_THREADS=1 to match."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def text_file(tmp_path_factory) -> Path:
    return write_paragraphs(
        tmp_path_factory.mktemp("corpus") / "faults.txt",
        "a run that is killed comes back from its last checkpoint and loses nothing at all",
        300,
        seed=7,
    )


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("data_cache")


def args(out_dir: Path, cache: Path, text_file: Path, *extra: str) -> list[str]:
    return [*TINY, f"data.source={text_file}", f"data.cache_dir={cache}", f"train.out_dir={out_dir}", *extra]


def read_log(out_dir: Path, partial_ok: bool = False) -> list[dict]:
    """metrics.jsonl; with ``partial_ok`` a line still being written is ignored (polling)."""
    path = out_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:
            if not partial_ok:
                raise
    return records


def last_losses(out_dir: Path) -> dict[int, float | None]:
    """Per step, the loss of its LAST record (a restarted run logs the redone steps again)."""
    return {r["step"]: r["loss"] for r in read_log(out_dir) if "loss" in r}


def max_step(out_dir: Path) -> int:
    return max((r["step"] for r in read_log(out_dir, partial_ok=True) if "loss" in r), default=0)


def checkpoint_steps(out_dir: Path) -> list[int]:
    return [s for s, _ in CheckpointManager(out_dir / "checkpoints").checkpoints()]


def assert_same_losses(got: dict, want: dict) -> None:
    assert sorted(got) == sorted(want)
    for step in sorted(want):
        assert got[step] is not None and abs(got[step] - want[step]) <= TOL, (step, got[step], want[step])


def fresh_state():
    """A model + optimizer like the recipe's (same shapes), to load a checkpoint into."""
    from spherenet.optim import build_optimizer

    model = from_preset("ngpt-tiny", max_seq_len=32, vocab_size=256)
    optimizer, _ = build_optimizer(model, "riemannian_adam", lr=1e-3, total_steps=10)
    return {"model": model, "optimizer": optimizer}


def all_finite(tree) -> bool:
    if isinstance(tree, torch.Tensor):
        return not tree.is_floating_point() or bool(torch.isfinite(tree).all())
    if isinstance(tree, dict):
        return all(all_finite(v) for v in tree.values())
    if isinstance(tree, (list, tuple)):
        return all(all_finite(v) for v in tree)
    return not isinstance(tree, float) or math.isfinite(tree)


def saved_state(out_dir: Path, step: int) -> dict:
    """The raw state.pt of a checkpoint (its manifest and hashes checked first)."""
    mgr = CheckpointManager(out_dir / "checkpoints")
    path = mgr.path_for(step)
    mgr.load(path, fresh_state(), restore_rng=False)  # raises if damaged or not loadable
    return torch.load(path / "state.pt", map_location="cpu", weights_only=True)


def children(pid: int) -> list[int]:
    """Child PIDs of ``pid``, from /proc/<pid>/task/*/children, or (kernels without that
    file) from the parent field of every /proc/<n>/stat."""
    tasks = list(Path(f"/proc/{pid}/task").glob("*/children"))
    if tasks:
        kids = []
        for f in tasks:
            with contextlib.suppress(OSError):
                kids += [int(k) for k in f.read_text().split()]
        return kids
    kids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:  # field 4: ppid
                kids.append(int(stat.parent.name))
    return kids


def descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        for kid in children(todo.pop()):
            out.append(kid)
            todo.append(kid)
    return out


def environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(e.decode(errors="replace").split("=", 1) for e in raw if b"=" in e)


@contextlib.contextmanager
def launched(cmd: list[str], log: Path):
    """Start ``cmd`` in its own session, output to ``log``. Whatever happens in the block, a
    process still running at its end is killed, with all its descendants (torchrun starts
    its workers in sessions of their own, so killing the group would not reach them).
    OMP_NUM_THREADS is this process's thread count, so that numbers match in-process runs."""
    env = dict(os.environ, OMP_NUM_THREADS=str(torch.get_num_threads()), PYTHONUNBUFFERED="1")
    with log.open("w") as f:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            for pid in [proc.pid, *descendants(proc.pid)]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            proc.wait(timeout=30)


def wait_until(condition, proc: subprocess.Popen, log: Path, what: str, timeout: float = HANG_GUARD) -> None:
    """Poll ``condition`` every 10 ms; fail when ``proc`` ends first or time runs out."""
    deadline = time.monotonic() + timeout
    while not condition():
        if proc.poll() is not None:
            pytest.fail(f"process ended (rc {proc.returncode}) before {what}:\n{log.read_text()[-3000:]}")
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} within {timeout} s:\n{log.read_text()[-3000:]}")
        time.sleep(0.01)


def finish(proc: subprocess.Popen, log: Path, timeout: float = HANG_GUARD) -> str:
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"did not finish within {timeout} s:\n{log.read_text()[-3000:]}")
    return log.read_text()


def torchrun_cmd(nproc: int, *train_args: str, max_restarts: int = 0) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={nproc}",
        f"--max-restarts={max_restarts}",
        "-m",
        "recipes.train",
        *train_args,
    ]


# --------------------------------------------------------------------------------------------
# SIGKILL of one worker under torchrun --max-restarts

KILL_STEPS, KILL_EVERY = 100, 10
needs_proc = pytest.mark.skipif(not Path("/proc/self/stat").is_file(), reason="finds torchrun's workers in /proc")


def ddp_args(out_dir, cache, text_file):
    return args(
        out_dir,
        cache,
        text_file,
        f"train.steps={KILL_STEPS}",
        f"train.checkpoint_every={KILL_EVERY}",
        "train.parallel=ddp",
    )


@pytest.fixture(scope="module")
def ddp_reference(tmp_path_factory, cache, text_file) -> dict[int, float]:
    """Per-step losses of the same 2-process DDP job, uninterrupted."""
    out = tmp_path_factory.mktemp("ddp_reference")
    log = out / "torchrun.log"
    with launched(torchrun_cmd(2, *ddp_args(out / "run", cache, text_file)), log) as proc:
        text = finish(proc, log)
    assert proc.returncode == 0, text[-3000:]
    losses = last_losses(out / "run")
    assert sorted(losses) == list(range(1, KILL_STEPS + 1))
    return losses


@pytest.mark.slow
@pytest.mark.distributed
@needs_proc
@pytest.mark.parametrize("victim", [0, 1], ids=["rank0", "rank1"])
def test_sigkill_one_worker_torchrun_restarts_and_losses_match(tmp_path, cache, text_file, ddp_reference, victim):
    """SIGKILL one worker (found among torchrun's children by its RANK) a few steps after the
    first checkpoint: torchrun restarts the group, which resumes from the newest checkpoint and
    finishes with exactly the losses of the uninterrupted job (rank 0 writes the checkpoints and
    metrics, rank 1 does not: both are killed in turn)."""
    out, log = tmp_path / "run", tmp_path / "torchrun.log"
    with launched(torchrun_cmd(2, *ddp_args(out, cache, text_file), max_restarts=1), log) as proc:
        # Past the first checkpoint by a few steps, so the restart has steps to redo.
        wait_until(lambda: checkpoint_steps(out) and max_step(out) >= KILL_EVERY + 3, proc, log, "step 13")
        workers = {env["RANK"]: pid for pid in children(proc.pid) if "RANK" in (env := environ(pid))}
        assert set(workers) == {"0", "1"}, workers
        assert all(environ(pid)["TORCHELASTIC_RESTART_COUNT"] == "0" for pid in workers.values())
        os.kill(workers[str(victim)], signal.SIGKILL)
        step_at_kill = max_step(out)
        text = finish(proc, log)
    assert proc.returncode == 0, text[-3000:]
    assert step_at_kill < KILL_STEPS, "the kill must land mid-run"

    records = read_log(out)
    starts = [i for i, r in enumerate(records) if r.get("event") == "start"]
    assert len(starts) == 2, "exactly one restart"
    resumed_at = records[starts[1]]["step"]
    before = [r["step"] for r in records[: starts[1]] if "loss" in r]
    assert resumed_at % KILL_EVERY == 0 and KILL_EVERY <= resumed_at <= max(before) < KILL_STEPS
    assert f"resumed from {out / 'checkpoints' / f'step_{resumed_at:08d}'} at step {resumed_at}" in text
    assert records[-1]["event"] == "done" and records[-1]["step"] == KILL_STEPS
    assert_same_losses(last_losses(out), ddp_reference)
    # Nothing left behind: the newest keep_last (3) checkpoints, no half-written directories.
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == [f"step_{s:08d}" for s in (80, 90, 100)]


@pytest.mark.slow
@pytest.mark.distributed
def test_sigterm_to_torchrun_checkpoints_and_resume_is_exact(tmp_path, cache, text_file, ddp_reference):
    """Preemption of a torchrun job: torchrun passes SIGTERM to its workers, which finish the
    step together, checkpoint it and exit; ``--resume`` later continues exactly."""
    out, log = tmp_path / "run", tmp_path / "torchrun.log"
    with launched(torchrun_cmd(2, *ddp_args(out, cache, text_file)), log) as proc:
        wait_until(lambda: max_step(out) >= 3, proc, log, "step 3")
        proc.send_signal(signal.SIGTERM)
        text = finish(proc, log)
    # (torchrun itself exits non-zero after a signal, whatever its workers did)
    m = re.search(r"stop requested \(SIGTERM\): checkpoint saved at step (\d+)", text)
    assert m, text[-3000:]
    stop = int(m.group(1))
    assert 3 <= stop < KILL_STEPS
    assert read_log(out)[-1] == {**read_log(out)[-1], "event": "halted", "step": stop}
    assert checkpoint_steps(out)[-1] == stop

    log2 = tmp_path / "resume.log"
    with launched(torchrun_cmd(2, *ddp_args(out, cache, text_file), "--resume"), log2) as proc:
        text = finish(proc, log2)
    assert proc.returncode == 0, text[-3000:]
    assert f"at step {stop}" in text
    assert_same_losses(last_losses(out), ddp_reference)


# --------------------------------------------------------------------------------------------
# SIGTERM to a single process: finish the step, checkpoint, exit 0; --resume continues exactly

TERM_STEPS = 60


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_checkpoints_at_the_stop_step_and_resume_is_exact(sig, tmp_path, cache, text_file, capsys):
    """SIGTERM (preemption) and Ctrl-C (SIGINT) both finish the step, checkpoint and exit 0."""
    common = [f"train.steps={TERM_STEPS}", "train.checkpoint_every=25"]
    assert cli(args(tmp_path / "straight", cache, text_file, *common)) == 0
    straight = last_losses(tmp_path / "straight")

    out, log = tmp_path / "run", tmp_path / "run.log"
    with launched([sys.executable, "-m", "recipes.train", *args(out, cache, text_file, *common)], log) as proc:
        wait_until(lambda: max_step(out) >= 3, proc, log, "step 3")
        proc.send_signal(sig)
        text = finish(proc, log)
    assert proc.returncode == 0, text[-3000:]
    m = re.search(rf"stop requested \({sig.name}\): checkpoint saved at step (\d+)", text)
    assert m, text[-3000:]
    stop = int(m.group(1))
    assert 3 <= stop < TERM_STEPS
    assert "Traceback" not in text
    records = read_log(out)
    assert records[-1]["event"] == "halted" and records[-1]["step"] == stop
    assert max_step(out) == stop  # the step in flight was finished, nothing after it
    assert stop in checkpoint_steps(out)
    assert all_finite(saved_state(out, stop)["model"])

    assert cli(args(out, cache, text_file, *common, "--resume")) == 0
    assert f"resumed from {out / 'checkpoints' / f'step_{stop:08d}'} at step {stop}" in capsys.readouterr().out
    assert_same_losses(last_losses(out), straight)
    assert read_log(out)[-1]["event"] == "done"


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


# --------------------------------------------------------------------------------------------
# real faults: a process killed inside a checkpoint write, two Ctrl-Cs, FSDP workers killed,
# a full disk, a read-only out_dir, two trainers on one directory, data edited in place

# A model whose checkpoint (about 200 MB with Adam's moments) takes about a second to write, so
# that a kill or a second signal lands inside the write or the step, not between them.
SLOW_SAVE = ["model.d_model=512", "model.n_layers=4"]


def _signal_during_save(tmp_path, cache, text_file, action) -> tuple[subprocess.Popen, str, Path]:
    """Train the slow-saving model in a subprocess; once the checkpoint of step 2 is in place
    and the next one is being written or the step in flight, call ``action(proc)``."""
    out, log = tmp_path / "run", tmp_path / "train.log"
    cmd = [
        sys.executable,
        "-m",
        "recipes.train",
        *args(out, cache, text_file, *SLOW_SAVE, "train.steps=40", "train.checkpoint_every=2"),
    ]
    with launched(cmd, log) as proc:
        wait_until(lambda: (out / "checkpoints" / "step_00000002").is_dir(), proc, log, "checkpoint 2")
        action(proc, out)
        text = finish(proc, log)
    return proc, text, out


@pytest.mark.slow
@needs_proc
def test_kill_9_while_a_checkpoint_is_written_keeps_the_previous_one(tmp_path, cache, text_file):
    def kill_inside_the_write(proc, out):
        tmp = out / "checkpoints" / ".tmp-step_00000004"
        wait_until(lambda: (tmp / "state.pt").is_file(), proc, out / "../train.log", "the write of step 4")
        proc.send_signal(signal.SIGKILL)

    proc, _, out = _signal_during_save(tmp_path, cache, text_file, kill_inside_the_write)
    assert proc.returncode == -signal.SIGKILL
    assert (out / "checkpoints" / ".tmp-step_00000004").is_dir(), "the kill landed inside the write"
    assert not (out / "checkpoints" / "step_00000004").exists()
    assert CheckpointManager(out / "checkpoints").latest_verified().step == 2
    resumed = args(out, cache, text_file, *SLOW_SAVE, "train.steps=6", "train.checkpoint_every=2", "--resume")
    assert cli(resumed) == 0
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == [
        "step_00000002",
        "step_00000004",
        "step_00000006",
    ]


@pytest.mark.slow
@needs_proc
def test_a_second_ctrl_c_aborts_at_once_and_the_last_checkpoint_stays(tmp_path, cache, text_file):
    def two_ctrl_cs(proc, out):
        proc.send_signal(signal.SIGINT)
        time.sleep(0.05)  # the step in flight, or the stop checkpoint's write, takes longer than this
        wait_until_taken(proc.pid)  # else the kernel merges the two
        assert send_while_alive(proc, signal.SIGINT), "the run ended before the second Ctrl-C"

    proc, text, out = _signal_during_save(tmp_path, cache, text_file, two_ctrl_cs)
    assert proc.returncode == 130, text[-3000:]
    assert "error: aborted by a second Ctrl-C" in text and "Traceback" not in text
    newest = CheckpointManager(out / "checkpoints").latest_verified()
    assert newest is not None and newest.step in (2, 4)  # 4: its regular write was over before the Ctrl-Cs
    assert "stop requested" not in text  # the stop checkpoint was never completed


@pytest.fixture(scope="module")
def fsdp_reference(tmp_path_factory, cache, text_file) -> dict[int, float]:
    """Per-step losses of a 2-process FSDP2 job, uninterrupted."""
    out = tmp_path_factory.mktemp("fsdp_reference")
    log = out / "torchrun.log"
    fsdp = ddp_args(out / "run", cache, text_file)[:-1] + ["train.parallel=fsdp", "train.steps=30"]
    with launched(torchrun_cmd(2, *fsdp), log) as proc:
        text = finish(proc, log)
    assert proc.returncode == 0, text[-3000:]
    return last_losses(out / "run")


@pytest.mark.slow
@pytest.mark.distributed
@needs_proc
def test_sigkill_one_fsdp_worker_restarts_from_the_sharded_checkpoint(tmp_path, cache, text_file, fsdp_reference):
    """The same under FSDP2 (sharded DCP checkpoints): the restarted group loads the shards and
    finishes with the uninterrupted job's losses."""
    out, log = tmp_path / "run", tmp_path / "torchrun.log"
    fsdp = ddp_args(out, cache, text_file)[:-1] + ["train.parallel=fsdp", "train.steps=30"]
    with launched(torchrun_cmd(2, *fsdp, max_restarts=1), log) as proc:
        wait_until(lambda: checkpoint_steps(out) and max_step(out) >= KILL_EVERY + 3, proc, log, "step 13")
        workers = {env["RANK"]: pid for pid in children(proc.pid) if "RANK" in (env := environ(pid))}
        os.kill(workers["1"], signal.SIGKILL)
        step_at_kill = max_step(out)
        text = finish(proc, log)
    assert proc.returncode == 0, text[-3000:]
    assert step_at_kill < 30
    starts = [r for r in read_log(out) if r.get("event") == "start"]
    assert len(starts) == 2 and starts[1]["step"] % KILL_EVERY == 0 and starts[1]["step"] >= KILL_EVERY
    assert_same_losses(last_losses(out), fsdp_reference)


def _can_mount_tmpfs() -> bool:
    try:
        return (
            subprocess.run(
                ["unshare", "-rm", "sh", "-c", "mount -t tmpfs tmpfs /mnt"], capture_output=True, timeout=30
            ).returncode
            == 0
        )
    except (OSError, subprocess.SubprocessError):
        return False


needs_tmpfs = pytest.mark.skipif(
    not Path("/proc/self/stat").is_file() or not _can_mount_tmpfs(),
    reason="needs `unshare -rm` to mount a private tmpfs (a user namespace, or root)",
)


def _train_on_tmpfs(tmp_path, cache, text_file, options: str, *extra: str, cache_there: bool = False):
    """Run the trainer with ``train.out_dir`` (or, with ``cache_there``, ``data.cache_dir``) on a
    private tmpfs mounted with ``options`` (in a mount namespace of its own, so nothing outside
    sees it); what the run left there is copied to ``tmp_path/left`` before the namespace goes.
    Returns (exit code, stderr, the copy of the run directory)."""
    mnt, left = tmp_path / "mnt", tmp_path / "left"
    mnt.mkdir()
    left.mkdir()
    where = (tmp_path / "run", mnt / "cache") if cache_there else (mnt / "run", cache)
    cmd = " ".join([sys.executable, "-m", "recipes.train", *args(where[0], where[1], text_file, *extra)])
    script = f"mount -t tmpfs -o {options} tmpfs {mnt} && {{ {cmd}; rc=$?; cp -a {mnt}/. {left}/; exit $rc; }}"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run(
        ["unshare", "-rm", "sh", "-c", script], cwd=REPO, env=env, capture_output=True, text=True, timeout=240
    )
    return done.returncode, done.stderr, left / ("cache" if cache_there else "run")


@pytest.mark.slow
@needs_tmpfs
def test_a_disk_that_fills_mid_save_keeps_the_previous_checkpoint_and_says_no_space(tmp_path, cache, text_file):
    """A real ENOSPC: a 3 MB tmpfs holds one checkpoint of the tiny model (2 MB) but not a second
    beside it (keep_last=1 deletes the old one only after the new one is in place)."""
    rc, err, run = _train_on_tmpfs(
        tmp_path, cache, text_file, "size=3000k", "train.steps=6", "train.checkpoint_every=2", "train.keep_last=1"
    )
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1, err
    assert "saving checkpoint" in lines[0] and "no space left on device (ENOSPC)" in lines[0]
    assert "unexpected pos" not in err
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_00000002"]
    assert CheckpointManager(run / "checkpoints").latest_verified().step == 2
    assert all(isinstance(r, dict) for r in read_log(run))  # every line whole


def _start_on_a_full_disk_then_retry(tmp_path, cache, text_file, fill: str, free: str, cache_there: bool = False):
    """On a private 4 KiB tmpfs: ``fill`` (shell), a run that fails to start, a listing of what it
    left in the mount, ``free`` (shell), the same run again. The mount holds ``train.out_dir``, or
    with ``cache_there`` ``data.cache_dir``. Returns (first exit code, its stderr, the listing, the
    retry's exit code, the retry's metrics records)."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    out, cache = (tmp_path / "run", mnt / "cache") if cache_there else (mnt / "run", cache)
    cmd = " ".join([sys.executable, "-m", "recipes.train", *args(out, cache, text_file, "train.steps=2")])
    script = (
        f"mount -t tmpfs -o size=4k tmpfs {mnt} && {fill} && {{ {cmd} 2>{tmp_path}/err.txt; echo $? >{tmp_path}/rc1; }}"
        f" ; (cd {mnt} && find . | sort) >{tmp_path}/left.txt ; {free} && {cmd} >{tmp_path}/retry.txt 2>&1 ;"
        f" echo $? >{tmp_path}/rc2 ; cp {out}/metrics.jsonl {tmp_path}/retry_metrics.jsonl"
    )
    env = dict(os.environ, OMP_NUM_THREADS="1")
    subprocess.run(["unshare", "-rm", "sh", "-c", script], cwd=REPO, env=env, timeout=240)
    retry_log = tmp_path / "retry_metrics.jsonl"
    return (
        int((tmp_path / "rc1").read_text()),
        (tmp_path / "err.txt").read_text(),
        (tmp_path / "left.txt").read_text().split(),
        int((tmp_path / "rc2").read_text()),
        [json.loads(x) for x in retry_log.read_text().splitlines()] if retry_log.is_file() else [],
    )


@pytest.mark.slow
@needs_tmpfs
def test_a_disk_full_at_start_is_one_error_line(tmp_path, cache, text_file):
    """One 4 KiB page: the lock file takes it, the first metrics record does not fit. The start
    fails naming the file, leaves the mount as it found it (no lock, no empty metrics.jsonl, no
    directory), and a retry with the space freed starts as a new run."""
    rc, err, left, rc2, records = _start_on_a_full_disk_then_retry(
        tmp_path, cache, text_file, fill="true", free=f"mount -o remount,size=16m {tmp_path / 'mnt'}"
    )
    assert rc == 2 and err.strip().splitlines() == [
        f"error: cannot write {tmp_path / 'mnt' / 'run' / 'metrics.jsonl'}: no space left on device (ENOSPC)"
    ], err
    assert left == ["."], left
    assert rc2 == 0 and [r["event"] for r in records if "event" in r] == ["start", "done"]


@pytest.mark.slow
@needs_tmpfs
def test_a_disk_too_full_for_the_lock_names_it_and_leaves_nothing(tmp_path, cache, text_file):
    """The disk is full before the run starts: the lock file's write fails. One line naming
    train.lock (not a second error from closing the file), no 0-byte lock left behind; a retry
    after space is freed starts normally."""
    mnt = tmp_path / "mnt"
    rc, err, left, rc2, records = _start_on_a_full_disk_then_retry(
        tmp_path,
        cache,
        text_file,
        fill=f"dd if=/dev/zero of={mnt}/filler bs=4k count=1 2>/dev/null; true",
        free=f"rm {mnt}/filler && mount -o remount,size=16m {mnt}",
    )
    assert rc == 2 and err.strip().splitlines() == [
        f"error: cannot write {mnt / 'run' / 'train.lock'}: no space left on device (ENOSPC)"
    ], err
    assert left == [".", "./filler"], left  # no run directory, no lock
    assert rc2 == 0 and [r["event"] for r in records if "event" in r] == ["start", "done"]


@pytest.mark.slow
@needs_tmpfs
def test_a_data_cache_too_full_for_the_staging_directory_names_it_and_leaves_nothing(tmp_path, cache, text_file):
    """The disk holding the data cache is full before the preparation starts: its staging
    directory's owner file cannot be written. One line naming the data cache, no ``.tmp-*``
    directory left behind; a retry after space is freed prepares the data and trains."""
    mnt = tmp_path / "mnt"
    rc, err, left, rc2, records = _start_on_a_full_disk_then_retry(
        tmp_path,
        cache,
        text_file,
        fill=f"dd if=/dev/zero of={mnt}/filler bs=4k count=1 2>/dev/null; true",
        free=f"rm {mnt}/filler && mount -o remount,size=16m {mnt}",
        cache_there=True,
    )
    assert rc == 2 and err.strip().splitlines() == [
        f"error: cannot write the data cache {mnt / 'cache'}: no space left on device (ENOSPC); nothing was kept "
        "of this preparation"
    ], err
    assert left == [".", "./cache", "./filler"], left  # no staging directory
    assert rc2 == 0 and [r["event"] for r in records if "event" in r] == ["start", "done"]


@pytest.mark.slow
@needs_tmpfs
@pytest.mark.parametrize("size", ["60k", "200k"], ids=["datasets_arrow_files", "token_files"])
def test_a_full_data_cache_is_one_error_line_and_keeps_nothing(tmp_path, cache, text_file, size):
    """The disk fills while the data is prepared: while datasets writes its Arrow files (60 KiB),
    or while the token files are written (200 KiB)."""
    rc, err, left = _train_on_tmpfs(tmp_path, cache, text_file, f"size={size}", "train.steps=2", cache_there=True)
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1, err
    assert lines[0].startswith(f"error: cannot write the data cache {tmp_path / 'mnt' / 'cache'}")
    assert lines[0].split(": ", 2)[-1].startswith("no space left on device (ENOSPC)"), lines[0]
    assert list(left.iterdir()) == []  # the temporary directory is gone


@pytest.mark.slow
@needs_tmpfs
def test_an_unwritable_out_dir_is_one_error_line(tmp_path, cache, text_file):
    rc, err, _ = _train_on_tmpfs(tmp_path, cache, text_file, "ro", "train.steps=2")
    assert rc == 2 and err.strip().splitlines() == [
        f"error: cannot write {tmp_path / 'mnt' / 'run'}: read-only file system (EROFS)"
    ], err


@pytest.mark.slow
def test_a_second_trainer_on_a_running_directory_is_refused_and_the_first_runs_on(tmp_path, cache, text_file, capsys):
    out, log = tmp_path / "run", tmp_path / "first.log"
    first = [sys.executable, "-m", "recipes.train", *args(out, cache, text_file, "train.steps=200")]
    with launched(first, log) as proc:
        wait_until(lambda: max_step(out) >= 2, proc, log, "step 2 of the first trainer")
        assert cli(args(out, cache, text_file, "train.steps=200", "optim.lr=0.5", "--resume")) == 2
        text = finish(proc, log)
    err = capsys.readouterr().err
    assert f"is in use by another trainer (pid {proc.pid} on " in err
    assert proc.returncode == 0 and "done: step 200" in text
    records = read_log(out)
    assert [r["event"] for r in records if "event" in r] == ["start", "done"]  # one run's records only
    assert [r["step"] for r in records if "loss" in r] == list(range(1, 201))


def test_data_edited_in_place_is_refused_unless_the_change_is_named(tmp_path, cache, text_file, capsys):
    """The same number of tokens (a byte tokenizer, the same length), other content."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(text_file.read_text(encoding="utf-8"), encoding="utf-8")
    run = [
        *TINY,
        f"data.source={corpus}",
        f"data.cache_dir={tmp_path / 'cache'}",
        f"train.out_dir={tmp_path / 'run'}",
        "train.steps=8",
    ]
    assert cli([*run, "train.halt_after=4"]) == 0
    text = corpus.read_text(encoding="utf-8")
    corpus.write_text(text.replace("killed", "KILLED"), encoding="utf-8")  # in place, same length
    capsys.readouterr()
    assert cli([*run, "--resume"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{corpus} now gives other tokens" in err[0] and "--accept-data-change" in err[0]
    assert cli([*run, "--resume", "--accept-data-change"]) == 0
    out = capsys.readouterr().out
    assert f"resume: the data changed: {corpus}" in out
    changes = [r for r in read_log(tmp_path / "run") if r.get("event") == "resume_changes"]
    assert len(changes) == 1 and any(c.startswith(f"the data changed: {corpus}") for c in changes[0]["changes"])


@contextlib.contextmanager
def cpu_load(processes: int = 2):
    """Busy-looping processes beside the test, as on a loaded machine; killed on the way out."""
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(processes)]
    try:
        yield
    finally:
        for proc in burners:
            proc.kill()
            proc.wait(timeout=30)


@pytest.mark.slow
@needs_proc
def test_two_ctrl_cs_up_to_50_ms_apart_always_exit_130_under_load(tmp_path, cache, text_file):
    """Two SIGINTs into a running tiny model, 0 to 50 ms apart, while two busy processes load the
    machine: wherever the second lands (one step, the stop checkpoint, the last records, the
    process's end, both inside one C call), the exit code is 130 and the newest checkpoint
    verifies. The second waits until the kernel has handed the first over (else the two merge:
    standard signals are not queued) and is sent while the run is held stopped, so that it
    reaches a live process. A run that had already finished its stop on the first (its stop can
    take less than 50 ms) got one Ctrl-C: it must have exited 0 with its stop checkpoint, and
    another attempt runs, until 4 runs got both (at most 12 attempts)."""
    codes, single = [], 0
    with cpu_load():
        for attempt in range(12):
            out, log = tmp_path / f"run{attempt}", tmp_path / f"train{attempt}.log"
            cmd = [sys.executable, "-m", "recipes.train", *args(out, cache, text_file, "train.steps=100000")]
            with launched(cmd, log) as proc:
                wait_until(lambda: max_step(out) >= 3, proc, log, "step 3")
                proc.send_signal(signal.SIGINT)
                time.sleep((0.0, 0.005, 0.02, 0.05)[attempt % 4])
                wait_until_taken(proc.pid)
                sent = send_while_alive(proc, signal.SIGINT)
                text = finish(proc, log)
            assert "Traceback" not in text, text[-3000:]
            newest = CheckpointManager(out / "checkpoints").latest_verified()
            assert newest is None or newest.step >= 1
            if not sent:  # one Ctrl-C: a clean stop
                assert proc.returncode == 0 and "stop requested (SIGINT)" in text, text[-3000:]
                single += 1
                continue
            codes.append(proc.returncode)
            if len(codes) == 4:
                break
    assert codes == [130] * 4, (codes, f"{single} runs ended before the second Ctrl-C")


@pytest.mark.slow
@needs_proc
def test_export_of_a_live_run_that_prunes_to_one_checkpoint(tmp_path, cache, text_file):
    """``train.keep_last=1`` with a checkpoint every step: each checkpoint is deleted as soon as
    the next is in place, while the export reads it. Three exports of the live run all succeed."""
    from recipes import export

    out, log = tmp_path / "run", tmp_path / "train.log"
    cmd = [
        sys.executable,
        "-m",
        "recipes.train",
        *args(out, cache, text_file, "train.steps=100000", "train.checkpoint_every=1", "train.keep_last=1"),
    ]
    with launched(cmd, log) as proc:
        wait_until(lambda: checkpoint_steps(out) and max_step(out) >= 2, proc, log, "checkpoint 1")
        codes = [export.main([str(out), str(tmp_path / f"export{i}")]) for i in range(3)]
        assert proc.poll() is None, "the run ended before the exports"
    assert codes == [0, 0, 0]
    for i in range(3):
        assert (tmp_path / f"export{i}" / "model.safetensors").is_file()
