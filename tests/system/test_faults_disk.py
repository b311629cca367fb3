"""What a training run does on a full or read-only disk, beside a second trainer, and on data
edited in place, end to end through recipes/train.py on CPU. The runs and helpers: fault_runs.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import fault_runs
import pytest
from fault_runs import (
    REPO,
    TINY,
    args,
    finish,
    launched,
    max_step,
    read_log,
    wait_until,
)

from recipes.train import cli
from spherenet.checkpoint import CheckpointManager

# the fault tests' fixtures: the corpus, its data cache, one intra-op thread (autouse)
text_file, cache, one_thread = fault_runs.text_file, fault_runs.cache, fault_runs.one_thread

# --------------------------------------------------------------------------------------------
# a full disk, a read-only out_dir, two trainers on one directory, data edited in place


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
