"""The fault tests' runs (tests/system/test_faults*.py, test_run_directory.py, test_two_nodes.py):
the tiny training options, the corpus and data cache fixtures, and helpers that read a run's
records and checkpoints and start, watch and clean up subprocesses.

Runs are the tiny nGPT of tests/recipes/test_recipe_train.py (2 layers, context 32, batch 8) on a small
local text file. Subprocesses run in their own session with a timeout and are killed, with
every process they started, whenever a test leaves early.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from corpora import write_paragraphs

from spherenet.checkpoint import CheckpointManager
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


needs_proc = pytest.mark.skipif(not Path("/proc/self/stat").is_file(), reason="finds torchrun's workers in /proc")
