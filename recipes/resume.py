"""The resume policy of ``recipes.train``: whose run directory it is (one writer at a time, no
fresh start over a run), what ``--resume`` (or a torchrun restart) continues from, which changed settings it accepts, reports or refuses, and how the data position and the
learning-rate schedule are carried over. Everything here runs before the data or the model is
built, so a refused resume costs nothing and changes nothing."""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path
from typing import Any

from recipes.checkpoints import is_exported, model_class_name, saved_model_config
from spherenet.checkpoint import CheckpointError, CheckpointManager, VerifiedCheckpoint
from spherenet.data import DataError
from spherenet.models import model_class_of
from spherenet.train.config import ConfigError, RunConfig, model_config, resolved
from spherenet.train.tracking import flatten_config

__all__ = [
    "RESUMABLE_CHANGES",
    "ResumePlan",
    "check_resumable",
    "plan_resume",
    "check_data",
    "restore_position",
    "extend_schedule",
    "claim_run_directory",
    "check_resume_target",
    "move_run_aside",
    "open_run_directory",
    "release_claims",
    "QuietRefusal",
]


# Settings that may differ between the invocations of one run (--resume, torchrun restarts).
# Any other difference would be silently overridden by the checkpoint (learning rates live in
# the optimizer/scheduler state, the model's options in nothing that load checks) or would make
# it another run: refused, before any work. Special cases, checked in plan_resume:
#   train.steps             the schedule is recomputed over the new total (not below the checkpoint's step)
#   train.micro_batch_size  the data position counts global batches, so only accumulation changes
#   train.parallel / world  an FSDP (DCP) checkpoint loads into any layout (DCP reshards); an
#                           unsharded one (single process / DDP) into anything but FSDP
RESUMABLE_CHANGES = {
    "train": {"eval_every", "eval_batches", "log_every", "checkpoint_every", "keep_last", "out_dir", "compile",
              "autocast", "progress", "sample_tokens", "halt_after", "nonfinite", "max_nonfinite", "parallel",
              "micro_batch_size", "steps", "loggers", "wandb_project", "activation_checkpointing", "init_from"},
    "optim": {"grad_clip", "reproject_every", "sphere_kernel"},
    "data": {"source", "cache_dir", "num_proc"},
}  # fmt: skip  # key names packed by section


@dataclasses.dataclass
class ResumePlan:
    """What ``--resume`` continues from, found and checked before the data or model is built."""

    checkpoint: VerifiedCheckpoint
    data_position: dict[str, Any]  # the train windows' saved state
    steps_changed: bool  # train.steps differs: the LR schedule is recomputed over the new total
    notes: list[str]  # accepted changes, printed and logged
    data_content_sha256: str | None = None  # the fingerprint of the data it was trained on


def _effective_model_config(cfg: RunConfig, vocab_size: int) -> tuple[str, dict[str, Any]]:
    config = model_config(cfg, vocab_size)
    return model_class_of(config).architecture, dataclasses.asdict(config)


def _saved_model_config(class_name: str, config: dict) -> dict:
    """A checkpoint's model config with each scaling complete, so that it compares field by field
    with ``asdict(config)``; as saved when this version cannot build it (its fields then show in
    the differences)."""
    try:
        return dataclasses.asdict(saved_model_config(class_name, config))
    except (KeyError, TypeError, ValueError):
        return config


def accepted_changes(saved: dict, cfg: RunConfig) -> list[str]:
    """One line per setting of :data:`RESUMABLE_CHANGES` that differs from the checkpoint's
    (``train.steps``, ``train.parallel`` and ``train.micro_batch_size`` are described by
    :func:`plan_resume` itself)."""
    described = {("train", "steps"), ("train", "parallel"), ("train", "micro_batch_size")}
    old_cfg = saved.get("config") if isinstance(saved.get("config"), dict) else {}
    new_cfg = resolved(cfg).to_dict()
    notes = []
    for section, keys in RESUMABLE_CHANGES.items():
        old, new = old_cfg.get(section) or {}, new_cfg[section]
        for key in sorted(keys):
            if (section, key) not in described and key in old and old[key] != new.get(key):
                notes.append(f"{section}.{key} {old[key]!r} -> {new.get(key)!r}")
    return notes


def check_resumable(saved: dict, cfg: RunConfig, model_class: str, model_config: dict, path: Path) -> None:
    """ConfigError naming every setting that differs from the run that wrote the checkpoint
    (``saved``: its plain values), except those in :data:`RESUMABLE_CHANGES`. The model is
    compared by its effective config (preset plus overrides), the rest by their resolved values
    (:func:`spherenet.train.config.resolved`: a run records its config resolved), so that an
    unset key and the value it stands for, spelled out, are the same setting."""
    unset = "(unset)"
    diffs = []

    def compare(where: str, old: dict, new: dict, free=()) -> None:
        for key in sorted(set(old) | set(new)):
            if key not in free and old.get(key, unset) != new.get(key, unset):
                diffs.append(f"{where}{key}: {old.get(key, unset)!r} in the checkpoint, {new.get(key, unset)!r} now")

    if isinstance(saved.get("model_config"), dict):
        saved_class = model_class_name(str(saved.get("model_class")))
        saved_model = _saved_model_config(saved_class, saved["model_config"])
        compare("model ", {"class": saved_class}, {"class": model_class})
        compare("model.", flatten_config(saved_model), flatten_config(model_config))
    old_cfg = saved.get("config")
    if isinstance(old_cfg, dict):
        new_cfg = resolved(cfg).to_dict()
        for section in ("data", "optim", "train"):
            compare(f"{section}.", old_cfg.get(section) or {}, new_cfg[section], RESUMABLE_CHANGES[section])
    if diffs:
        raise ConfigError(
            f"checkpoint {path} was written by a run with other settings; resume with the same values "
            "(or start a new run in another train.out_dir):\n  " + "\n  ".join(diffs)
        )


def plan_resume(ckpt: VerifiedCheckpoint, cfg: RunConfig, world_size: int) -> ResumePlan:
    """Check, from the verified checkpoint alone, that this invocation can continue it: the
    settings (:func:`check_resumable`), ``train.steps``, the global batch and the parallel
    layout. Raises ConfigError naming the key; nothing has been built or written yet."""
    t = cfg.train
    try:
        state = ckpt.read_state()
    except Exception as exc:  # noqa: BLE001 - verified, yet not readable as a training state
        raise CheckpointError(f"checkpoint {ckpt.path} holds no training state this recipe can read: {exc}") from None
    saved = state["values"]
    if not saved.get("config_resolved"):
        raise CheckpointError(
            f"checkpoint {ckpt.path} was written by an earlier spherenet, whose run config spells defaults as -1: "
            "this one cannot resume it; start a new run (train.init_from= takes its weights)"
        )
    position = state["stateful"].get("train_windows")
    if not isinstance(position, dict) or "step" not in position:
        raise CheckpointError(f"checkpoint {ckpt.path} holds no data position (train_windows)")
    vocab = (saved.get("model_config") or {}).get("vocab_size", 0)
    check_resumable(saved, cfg, *_effective_model_config(cfg, vocab), ckpt.path)

    notes = accepted_changes(saved, cfg)
    old_train = (saved.get("config") or {}).get("train") or {}
    old_steps = int(old_train.get("steps", t.steps))
    if t.steps < ckpt.step:
        raise ConfigError(
            f"train.steps {t.steps} is below the step of checkpoint {ckpt.path} ({ckpt.step}); "
            f"resume with train.steps >= {ckpt.step}"
        )
    if t.halt_after and t.halt_after <= ckpt.step:
        raise ConfigError(
            f"train.halt_after {t.halt_after} is not after the step of checkpoint {ckpt.path} ({ckpt.step}): "
            f"nothing to train; pass a later train.halt_after, or 0 to train to train.steps"
        )
    if t.steps != old_steps:
        notes.append(
            f"train.steps {old_steps} -> {t.steps}: the learning-rate schedule (warmup + cosine to 0) "
            f"is recomputed over {t.steps} steps from step {ckpt.step}"
        )

    backend, old_world = ckpt.manifest.get("backend"), int(ckpt.manifest.get("world_size", 1))
    old_parallel = old_train.get("parallel", "none")
    sharded_now = t.parallel == "fsdp" and world_size > 1
    if backend == "torch" and sharded_now:
        raise ConfigError(
            f"train.parallel: checkpoint {ckpt.path} was written unsharded (train.parallel={old_parallel!r}, "
            f"{old_world} process(es)); resuming it under FSDP (train.parallel='fsdp', {world_size} processes) is "
            "not supported: resume with train.parallel=ddp (or none)"
        )
    if (old_parallel, old_world) != (t.parallel, world_size):
        notes.append(
            f"train.parallel {old_parallel} x {old_world} process(es) -> {t.parallel} x {world_size} process(es)"
        )

    # The data position counts global batches of train.batch_size windows (see main): the same
    # in any layout (train.batch_size itself is no resumable change).
    saved_global = int(position.get("batch_size", 0)) * old_world
    if saved_global != t.batch_size:
        raise CheckpointError(
            f"checkpoint {ckpt.path} counts its data position in batches of {saved_global} windows, not global "
            f"batches of {t.batch_size}: it was written by an older spherenet; start a new run"
        )
    old_micro = old_train.get("micro_batch_size", 0)
    if old_micro != t.micro_batch_size:
        notes.append(
            f"train.micro_batch_size {old_micro or 'unset'} -> {t.micro_batch_size or 'unset'}: "
            "gradient accumulation changes, the global batch and the data order do not"
        )
    return ResumePlan(ckpt, dict(position), t.steps != old_steps, notes, saved.get("data_content_sha256"))


def check_data(plan: ResumePlan, data, accept_change: bool) -> bool:
    """Compare the prepared data with the data the checkpoint was trained on, by content: the
    token files are re-read and hashed (:meth:`PreparedData.verify`), and their fingerprint
    (``content_sha256``: both splits and the tokenizer) compared with the one the checkpoint
    records. Other content (an edited file, or a ``data.source`` pointing elsewhere) is refused,
    naming the source and the token file, unless ``accept_change`` (``--accept-data-change``)
    says so: then it is reported as a change (appended to ``plan.notes``). Returns whether it
    changed."""
    data.verify()
    saved, now = plan.data_content_sha256, data.meta["content_sha256"]
    if saved is None:
        plan.notes.append("the checkpoint records no data fingerprint: the data could not be compared")
        return False
    if saved == now:
        return False
    source = data.meta.get("source") or {}
    where = ", ".join(source.get("files") or [str(source.get("name") or source.get("kind", "the data source"))])
    what = f"content sha256 {saved[:12]} in the checkpoint, {now[:12]} now; token file {data.file('train')}"
    if not accept_change:
        raise DataError(
            f"the data changed since checkpoint {plan.checkpoint.path} was written: {where} now gives other tokens "
            f"({what}). Resume with the data it was trained on, or pass --accept-data-change to continue on this data"
        )
    plan.notes.append(f"the data changed: {where} ({what}); the data position keeps only its step")
    return True


def restore_position(train_windows, plan: ResumePlan, data_changed: bool = False) -> None:
    """Set the data position from the checkpoint; the seed, block size and token count must
    match (the windows' own check) unless the data changed as an accepted change (then only
    the step is kept); the per-rank batch may differ (another world size)."""
    saved = dict(plan.data_position)
    saved["batch_size"] = train_windows.batch_size
    try:
        train_windows.load_state_dict(saved, strict=not data_changed)
    except DataError as exc:  # the library's hint (strict=False) is for API users
        raise DataError(
            f"checkpoint {plan.checkpoint.path}: its data position does not fit this run's data: "
            f"{str(exc).split(' (pass strict')[0]}; resume with the data it was trained on, or start a new run"
        ) from None


def extend_schedule(scheduler, saved_state: dict) -> None:
    """Restore a scheduler saved with another ``train.steps``: its position and base LRs from
    the checkpoint, its LR function (warmup + cosine over the new total) from this run; the
    optimizer's LRs are set to the new schedule's value at the current step."""
    saved_state = dict(saved_state, lr_lambdas=[None] * len(scheduler.lr_lambdas))  # keep the new function
    scheduler.load_state_dict(saved_state)
    scheduler.last_epoch -= 1
    scheduler.step()  # recomputes every group's lr at last_epoch with the new function


# ---------------------------------------------------------------- one run, one directory


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


def run_in_directory(out_dir: Path) -> str | None:
    """What shows that ``out_dir`` holds a run already (its metrics or a checkpoint), or None."""
    checkpoints = (
        sorted(p.name for p in (out_dir / "checkpoints").glob("step_*")) if (out_dir / "checkpoints").is_dir() else []
    )
    if checkpoints:
        return f"checkpoints up to {checkpoints[-1]}"
    metrics = out_dir / "metrics.jsonl"
    try:  # an empty one holds no record: what a start that failed at its first write left behind
        return "metrics.jsonl" if metrics.stat().st_size > 0 else None
    except FileNotFoundError:
        return None


def move_run_aside(out_dir: Path) -> Path:
    """Move everything of ``out_dir``'s run (not the lock, not earlier ``previous-*``) into
    ``out_dir/previous-<time>/``; nothing is deleted."""
    import time

    aside = out_dir / f"previous-{time.strftime('%Y%m%d-%H%M%S')}"
    aside.mkdir()
    for entry in out_dir.iterdir():
        if entry.name != LOCK_FILE and entry != aside and not entry.name.startswith("previous-"):
            entry.rename(aside / entry.name)
    return aside


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

JOB_FILE = "job.json"


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
            move_run_aside(self.out_dir)
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
