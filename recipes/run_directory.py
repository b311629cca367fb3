"""Whose run directory it is: one writer at a time (an OS lock on ``train.lock``), no fresh
start over a run unless ``--overwrite`` moves the run's own files aside (and nothing else),
``--resume`` only where there is a run,
and which torchrun job wrote the run (its own restarts continue it). A refused or failed start
leaves the directory as it found it. Decided once for the whole job, on rank 0."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from recipes.checkpoints import is_exported
from spherenet.checkpoint import RUN_CHECKPOINTS, CheckpointManager
from spherenet.train.config import ConfigError
from spherenet.train.tracking import TRACKER_FILES

__all__ = [
    "LOCK_FILE",
    "METRICS_FILE",
    "QuietRefusal",
    "RUN_OUTPUTS",
    "RunDirectory",
    "check_resume_target",
    "claim_run_directory",
    "live_trainer",
    "move_run_aside",
    "open_run_directory",
    "release_claims",
    "run_in_directory",
]


def check_resume_target(out_dir: Path, ckpt: CheckpointManager, claimed: bool) -> None:
    """``--resume`` continues a run: refused, naming what is there instead, when ``out_dir``
    holds none. Before the directory is claimed (``claimed=False``): a missing directory and an
    exported model; after (the lock taken, so that a directory another trainer is filling is
    reported as in use): a directory without checkpoints."""
    if ckpt.checkpoints():
        return  # verified (and a damaged one named) when it is loaded
    if not claimed and is_exported(out_dir):
        raise ConfigError(
            f"--resume: train.out_dir {out_dir} is an exported model, not a run; to fine-tune from it, "
            f"train.init_from={out_dir} with another train.out_dir (and no --resume)"
        )
    if not claimed and out_dir.exists():
        return
    if out_dir.exists() and run_in_directory(out_dir):  # a run that stopped before its first checkpoint
        raise ConfigError(
            f"--resume: train.out_dir {out_dir} holds a run's {run_in_directory(out_dir)} but no checkpoint (it "
            "stopped before its first): nothing to continue; start it afresh with --overwrite (its files move aside)"
        )
    what = "does not exist" if not out_dir.exists() else f"holds no checkpoint (no {ckpt.directory.name}/step_*)"
    raise ConfigError(
        f"--resume: train.out_dir {out_dir} {what}: there is no run to continue; drop --resume to start one"
    )


LOCK_FILE = "train.lock"
METRICS_FILE = "metrics.jsonl"
JOB_FILE = "job.json"  # which torchrun job writes the run (see agent_identity)
# Everything a run writes into train.out_dir besides its lock (which the new run holds): what
# --overwrite moves aside. Not the data cache, even where data.cache_dir lies inside the run: it
# is input that the new run has read already and reads on (keyed by source and tokenizer, the
# same for both runs); nor a train.log, which launchers (recipes.compare, the benchmarks) open
# around the new run before it starts.
RUN_OUTPUTS = (RUN_CHECKPOINTS, METRICS_FILE, JOB_FILE, f".{JOB_FILE}.tmp", *TRACKER_FILES)


def live_trainer(directory: Path) -> str | None:
    """The trainer holding ``directory``'s lock (its pid and host, as it wrote them), or None
    when none does (no lock file, or one no process holds)."""
    import fcntl

    try:
        with (directory / LOCK_FILE).open("r") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return lock.read().strip() or "a process that wrote no name"
    except OSError:
        pass
    return None


def run_in_directory(out_dir: Path) -> str | None:
    """What shows that ``out_dir`` holds a run already (its metrics or a checkpoint), or None."""
    folder = out_dir / RUN_CHECKPOINTS
    checkpoints = sorted(p.name for p in folder.glob("step_*")) if folder.is_dir() else []
    if checkpoints:
        return f"checkpoints up to {checkpoints[-1]}"
    metrics = out_dir / METRICS_FILE
    try:  # an empty one holds no record: what a start that failed at its first write left behind
        return METRICS_FILE if metrics.stat().st_size > 0 else None
    except FileNotFoundError:
        return None


def move_run_aside(out_dir: Path) -> tuple[Path, list[str]]:
    """Move what ``out_dir``'s run wrote (:data:`RUN_OUTPUTS`) into ``out_dir/previous-<time>/``;
    returns that directory and the names moved. Everything else there (the user's notes and
    sources, the run's data source, earlier ``previous-*``) stays in place; nothing is deleted."""
    import time

    aside = out_dir / f"previous-{time.strftime('%Y%m%d-%H%M%S')}"
    aside.mkdir()
    moved = [name for name in RUN_OUTPUTS if os.path.lexists(out_dir / name)]
    for name in moved:
        (out_dir / name).rename(aside / name)
    return aside, moved


def claim_run_directory(out_dir: Path, resume: bool, overwrite: bool, is_main: bool = True):
    """Make this process the one writer of ``out_dir`` and return the open lock file, held until
    it is closed or the process ends (the OS releases it even on ``kill -9``). Under torchrun
    rank 0 holds it for the job (``is_main``); the other ranks get None.

    Refused with ConfigError, before any work: a directory locked by another trainer (its PID
    and host named), and a fresh start (no ``--resume``) into a directory that holds a run; a
    lock file this call created is removed again on a refusal. ``overwrite`` lets the fresh start
    through: the caller moves the old run aside (:func:`move_run_aside`) once every other input
    is checked (:meth:`RunDirectory.commit`)."""
    import errno
    import fcntl
    import socket

    if not is_main:
        return None
    made = not out_dir.exists()
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / LOCK_FILE
    while True:
        try:
            fd, created = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644), True
        except FileExistsError:
            try:
                fd, created = os.open(path, os.O_RDWR), False
            except FileNotFoundError:  # its holder removed it in between
                continue
        lock = os.fdopen(fd, "a+")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().strip() or "a process that wrote no name"
            lock.close()
            raise ConfigError(
                f"train.out_dir {out_dir} is in use by another trainer ({holder}); wait for it to end, "
                "or train into another train.out_dir"
            ) from None
        try:  # a holder that removed the file before unlocking it: lock the new file instead
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                break
        except FileNotFoundError:
            pass
        lock.close()
    try:  # unbuffered: a failed write raises here, not again when the file is closed
        os.ftruncate(fd, 0)
        name = f"pid {os.getpid()} on {socket.gethostname()}\n".encode()
        if os.pwrite(fd, name, 0) != len(name):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
    except OSError as exc:  # a full disk: the error of a write names no file
        if created:  # the directory as it was found: no lock file of a start that never began
            path.unlink(missing_ok=True)
        lock.close()
        if made:
            try:
                out_dir.rmdir()
            except OSError:
                pass
        exc.filename = exc.filename or str(path)
        raise
    existing = None if resume else run_in_directory(out_dir)
    if existing and not overwrite:
        if created:
            path.unlink()
        lock.close()
        raise ConfigError(
            f"train.out_dir {out_dir} holds a run ({existing}): continue it with --resume, start afresh with "
            "--overwrite (moves the old run aside into it, nothing is deleted), or train into another train.out_dir"
        )
    return lock


# ---------------------------------------------------------------- which job wrote the run


def agent_identity() -> str | None:
    """This worker's torchrun agent, unique per launch: the rendezvous id (``--rdzv-id``;
    ``--standalone`` draws a fresh one per launch, the default elsewhere is ``none``) with the
    agent's host, process id and start time (a worker is its agent's child). None outside torchrun."""
    import socket

    run_id = os.environ.get("TORCHELASTIC_RUN_ID")
    if run_id is None:
        return None
    agent = os.getppid()
    try:  # the start time tells a reused process id apart
        started = Path(f"/proc/{agent}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        started = "?"
    return f"{run_id}@{socket.gethostname()}:{agent}:{started}"


def _recorded_agents(out_dir: Path) -> set[str]:
    import json

    try:
        return set(json.loads((out_dir / JOB_FILE).read_text())["agents"])
    except (OSError, ValueError, KeyError, TypeError):
        return set()


class QuietRefusal(ConfigError):
    """A refusal already reported (under torchrun by rank 0 alone): exit 2 without another line."""


_CLAIMS: list = []  # the run directories this process holds (see release_claims)


class RunDirectory:
    """The outcome of :func:`open_run_directory`, the same on every rank: whether this job
    continues a run it wrote itself (a torchrun restart), and on rank 0 the held lock."""

    def __init__(self, out_dir: Path, lock, continuing: bool, move_aside: str | None, agents: list[str]):
        self.out_dir, self.lock, self.continuing = out_dir, lock, continuing
        self._move_aside, self._agents = move_aside, agents

    def commit(self) -> None:
        """Every input checked: move an overwritten run aside (``--overwrite``) and record which
        job writes this run, so that its own restarts continue it. Rank 0 only."""
        import json

        if self.lock is None:
            return
        if self._move_aside:
            aside, moved = move_run_aside(self.out_dir)
            print(
                f"--overwrite: moved the earlier run's {', '.join(moved)} into {aside} "
                f"(any other file in {self.out_dir} stays where it is)",
                flush=True,
            )
        if self._agents:
            tmp = self.out_dir / f".{JOB_FILE}.tmp"
            try:
                tmp.write_text(json.dumps({"agents": self._agents}) + "\n")
            except OSError as exc:  # a full disk: the error of a write names no file
                exc.filename = exc.filename or str(tmp)
                raise
            tmp.replace(self.out_dir / JOB_FILE)
        elif (self.out_dir / JOB_FILE).exists():  # a run continued outside torchrun: no job of its own
            (self.out_dir / JOB_FILE).unlink()


def open_run_directory(out_dir: Path, ckpt: CheckpointManager, resume: bool, overwrite: bool, info) -> RunDirectory:
    """Decide, once for the whole job, whether it may write ``out_dir``: rank 0 checks the
    directory (:func:`check_resume_target`, :func:`claim_run_directory`) and tells every rank the
    outcome through one collective, so that a refusal is one line from rank 0 and the other ranks
    leave quietly with the same exit code. A job continues a run without ``--resume`` only when
    the run records this job's agents (a torchrun restart of the job that wrote it, on any node,
    whatever its restart count); any other start is judged by the usual rules."""
    import torch.distributed as dist

    mine = agent_identity()
    agents = [mine]
    if info.enabled:
        agents = [None] * info.world_size
        dist.all_gather_object(agents, mine)
    agents = sorted({a for a in agents if a is not None})
    outcome: tuple[str | None, bool, str | None] = (None, False, None)
    lock = None
    if info.is_main:
        try:
            continuing = bool(agents) and bool(_recorded_agents(out_dir) & set(agents))
            if resume and not continuing:
                check_resume_target(out_dir, ckpt, claimed=False)  # before the directory is made
            lock = claim_run_directory(out_dir, resume or continuing, overwrite)
            _CLAIMS.append((out_dir, lock))
            if resume and not continuing:
                check_resume_target(out_dir, ckpt, claimed=True)  # another trainer's run is refused as in use first
            existing = None if resume or continuing else run_in_directory(out_dir)
            outcome = (None, continuing, existing)
        except ConfigError as exc:
            outcome = (str(exc), False, None)
    if info.enabled:
        box = [outcome]
        dist.broadcast_object_list(box, src=0)
        outcome = box[0]
    refusal, continuing, existing = outcome
    if refusal is not None and info.enabled:
        if info.is_main:
            print(f"error: {refusal}", file=sys.stderr, flush=True)
        dist.barrier()  # the line is out before any rank exits: torchrun stops the rest at the first exit
        raise QuietRefusal(refusal)
    if refusal is not None:
        raise ConfigError(refusal)
    return RunDirectory(out_dir, lock, continuing, existing, agents)


def release_claims(refused: bool) -> None:
    """Close the lock files this process holds. A refused run (``refused``) leaves nothing
    behind: its lock file is removed when the directory holds no run (no metrics, no
    checkpoint), and the directory too when then empty. Only the holder removes it:
    :func:`claim_run_directory` checks that the file it locked is still the one at the path."""
    while _CLAIMS:
        out_dir, lock = _CLAIMS.pop()
        if lock.closed:
            continue
        if refused and run_in_directory(out_dir) is None:
            (out_dir / LOCK_FILE).unlink(missing_ok=True)
            (out_dir / f".{JOB_FILE}.tmp").unlink(missing_ok=True)
            try:
                out_dir.rmdir()
            except OSError:
                pass  # other files are there: they are not this run's to remove
        lock.close()
