"""What a training run survives when its processes are signalled or killed, end to end through
recipes/train.py on CPU.

- a worker SIGKILLed under ``torchrun --max-restarts``: the job restarts from the last
  checkpoint, finishes, and its per-step losses are those of an uninterrupted run;
- SIGTERM (preemption), to one process or to torchrun: the run finishes its step, checkpoints,
  its workers exit 0; ``--resume`` goes on exactly where it stopped;
- a process killed inside a checkpoint write, two Ctrl-Cs, FSDP workers killed, an export of a
  live run.

Damaged checkpoints and non-finite steps: test_faults_checkpoints.py; full disks and shared run
directories: test_faults_disk.py; the runs and helpers: fault_runs.py.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import fault_runs
import pytest
from fault_runs import (
    all_finite,
    args,
    assert_same_losses,
    checkpoint_steps,
    children,
    environ,
    finish,
    last_losses,
    launched,
    max_step,
    needs_proc,
    read_log,
    saved_state,
    torchrun_cmd,
    wait_until,
)
from signals import send_while_alive, wait_until_taken

from recipes.train import cli
from spherenet.checkpoint import CheckpointManager

# the fault tests' fixtures: the corpus, its data cache, one intra-op thread (autouse)
text_file, cache, one_thread = fault_runs.text_file, fault_runs.cache, fault_runs.one_thread

# --------------------------------------------------------------------------------------------
# SIGKILL of one worker under torchrun --max-restarts

KILL_STEPS, KILL_EVERY = 100, 10


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
# a process killed inside a checkpoint write, two Ctrl-Cs, FSDP workers killed

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
