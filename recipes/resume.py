"""The resume policy of ``recipes.train``: what ``--resume`` (or a torchrun restart) continues
from, which changed settings it accepts, reports or refuses, and how the data position and the
learning-rate schedule are carried over (whose run directory it is: ``recipes.run_directory``).
``recipes.train`` calls one entry, :class:`Resumption`. The plan is checked before the data or the
model is built, so a refused resume costs nothing and changes nothing."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from recipes.checkpoints import model_class_name, saved_model_config
from recipes.run_directory import (  # the run directory's side of resuming, re-exported here
    LOCK_FILE,
    QuietRefusal,
    RunDirectory,
    check_resume_target,
    claim_run_directory,
    move_run_aside,
    open_run_directory,
    release_claims,
    run_in_directory,
)
from spherenet.checkpoint import CheckpointError, CheckpointManager, VerifiedCheckpoint
from spherenet.data import DataError
from spherenet.models import model_class_of
from spherenet.train.config import ConfigError, RunConfig, resolved
from spherenet.train.tracking import flatten_config

__all__ = [
    "RESUMABLE_CHANGES",
    "Resumption",
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
    "run_in_directory",
    "RunDirectory",
    "LOCK_FILE",
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


# Settings added after runs were written without them, with the value those runs trained with:
# a checkpoint that predates one reads as that value. (Not every new key: optim.gradient, say,
# arrived with another behaviour as its default, so a checkpoint without it is refused.)
ADDED_SINCE = {
    "data": {"format": "auto"},  # a source's format from its extension, as every earlier run read it
}


@dataclasses.dataclass
class ResumePlan:
    """What ``--resume`` continues from, found and checked before the data or model is built."""

    checkpoint: VerifiedCheckpoint
    data_position: dict[str, Any]  # the train windows' saved state
    steps_changed: bool  # train.steps differs: the LR schedule is recomputed over the new total
    notes: list[str]  # accepted changes, printed and logged
    data_content_sha256: str | None = None  # the fingerprint of the data it was trained on


def _effective_model_config(cfg: RunConfig, vocab_size: int) -> tuple[str, dict[str, Any]]:
    config = cfg.model.build(vocab_size)
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

    def compare(where: str, old: dict, new: dict, free=(), predates: dict | None = None) -> None:
        for key in sorted(set(old) | set(new)):
            # a setting added after the checkpoint was written: it ran with what ADDED_SINCE says
            was = old.get(key, (predates or {}).get(key, unset))
            if key not in free and was != new.get(key, unset):
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
            old = old_cfg.get(section) or {}
            compare(f"{section}.", old, new_cfg[section], RESUMABLE_CHANGES[section], ADDED_SINCE.get(section))
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


@dataclasses.dataclass
class Resumption:
    """What this invocation continues: ``plan`` (``None``: it starts at step 0), found by
    :meth:`find` before the data or the model is built, then :meth:`check_data` on the prepared
    data and :meth:`restore` into the run's state once it is built."""

    cfg: RunConfig
    plan: ResumePlan | None
    restarted: bool  # a torchrun restart of the job that wrote the run directory
    data_changed: bool = False

    @classmethod
    def find(cls, ckpt: CheckpointManager, cfg: RunConfig, world_size: int, wanted: bool, restarted: bool):
        """The newest sound checkpoint's plan when ``--resume`` (``wanted``) or a restart asks
        for one and there is one; refused (ConfigError, CheckpointError) while that costs nothing."""
        found = ckpt.latest_verified() if wanted or restarted else None
        return cls(cfg, plan_resume(found, cfg, world_size) if found is not None else None, restarted)

    @property
    def resuming(self) -> bool:
        return self.plan is not None

    @property
    def notes(self) -> list[str]:
        """The accepted changes, printed and logged."""
        return self.plan.notes if self.plan is not None else []

    def check_data(self, data, accept_change: bool) -> None:
        """:func:`check_data` when resuming."""
        if self.plan is not None:
            self.data_changed = check_data(self.plan, data, accept_change)

    def restore(self, ckpt: CheckpointManager, state: dict, model, is_main: bool) -> int:
        """Load the checkpoint into ``state`` (the model, optimizer, scheduler and data position
        of the run, built), check what it records against this run, and report it; returns the
        step the run continues after (0 for a fresh start)."""
        plan = self.plan
        if plan is None:
            if self.restarted and is_main:  # a restart before the first checkpoint: from the start again
                print(f"restart: no checkpoint in {ckpt.directory} yet, starting from step 0", flush=True)
            return 0
        # The data position and (with another train.steps) the schedule are restored below.
        skip = {"train_windows"} | ({"scheduler"} if plan.steps_changed else set())
        loaded = ckpt.load(plan.checkpoint, {k: v for k, v in state.items() if k not in skip})
        check_resumable(loaded.extra, self.cfg, model_class_name(model), dataclasses.asdict(model.config), loaded.path)
        start, scheduler = loaded.step, state["scheduler"]
        restore_position(state["train_windows"], plan, self.data_changed)
        if plan.steps_changed:
            extend_schedule(scheduler, loaded.extra["scheduler"])
        if is_main:
            print(f"resumed from {loaded.path} at step {start}", flush=True)
            for note in plan.notes:
                print(f"resume: {note}", flush=True)
            if plan.steps_changed and start < self.cfg.train.steps:
                print(f"resume: learning rate at step {start + 1}: {scheduler.get_last_lr()[0]:.3e}", flush=True)
        return start
