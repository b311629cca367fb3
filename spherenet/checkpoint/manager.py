"""The checkpoint manager: atomic saves of a training state, pruning, and verified loads
(see :mod:`spherenet.checkpoint` for the guarantees and the directory layout)."""

from __future__ import annotations

import os
import shutil
import time
import uuid
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import torch

from .distributed import _Group, _is_sharded
from .errors import (
    CheckpointCorruptError,
    CheckpointError,
    CheckpointMismatchError,
    CheckpointWarning,
    NonFiniteStateError,
)
from .format import (
    _STEP_DIR,
    _TMP_PREFIX,
    _TRASH_PREFIX,
    FORMAT_VERSION,
    SHARDED_DIR,
    STATE_FILE,
    VerifiedCheckpoint,
    _check_extra_files,
    _describe,
    _fsync_dir,
    _torch_save_synced,
    _write_manifest,
    _write_synced,
    claim_for_delete,
    pin_directory,
    verify_directory,
)
from .rng import _rng_state, _set_rng_state
from .sharded import _load_sharded, _model_sd_for_fingerprint, _save_sharded, _state_dicts_for_save
from .state import (
    _MAX_LISTED,
    _check_fingerprint,
    _check_plain,
    _load_optimizer,
    _nonfinite,
    _split_state,
    _unwrap,
    model_fingerprint,
)


@dataclass(frozen=True)
class LoadedCheckpoint:
    """What a load restored. ``extra`` holds the plain values given to ``save`` (e.g. the
    data-loader position and the config), plus the raw state dicts of saved stateful objects
    for which ``load`` was given no target."""

    step: int
    path: Path
    extra: dict[str, Any] = field(default_factory=dict)
    manifest: dict[str, Any] = field(default_factory=dict)


class CheckpointManager:
    """Saves and restores training state under ``directory``, keeping the newest ``keep_last``.

    ``state`` (for both :meth:`save` and the loads) is a dict:

    * ``"model"`` (required): the ``nn.Module``; DDP / torch.compile wrappers are unwrapped,
      an FSDP2 (``fully_shard``) model is saved sharded through DCP.
    * ``"optimizer"`` (optional): its ``torch.optim.Optimizer``.
    * any other value with ``state_dict``/``load_state_dict`` (LR scheduler, grad scaler,
      stateful data loader, ...): saved through ``state_dict()``; loaded in place when the
      same key holds an object at load time.
    * anything else (data-loader position, config, ...): saved as plain data (it must load
      with ``torch.load(weights_only=True)``) and returned in :attr:`LoadedCheckpoint.extra`;
      such entries in the ``state`` given to a load are ignored, so one dict can serve both.

    RNG states (python, numpy, torch CPU, CUDA when initialized) are saved automatically.
    """

    def __init__(self, directory: str | os.PathLike, keep_last: int | None = 3, *, process_group=None):
        if keep_last is not None and (not isinstance(keep_last, int) or isinstance(keep_last, bool) or keep_last < 1):
            raise ValueError(f"keep_last must be a positive int or None (keep all), got {keep_last!r}")
        self.directory = Path(directory)
        self.keep_last = keep_last
        self.process_group = process_group
        self._warned_newer = False

    # ---------------------------------------------------------------- listing

    def path_for(self, step: int) -> Path:
        return self.directory / f"step_{step:08d}"

    def checkpoints(self) -> list[tuple[int, Path]]:
        """``(step, path)`` of every ``step_*`` directory, oldest first (not verified)."""
        if not self.directory.is_dir():
            return []
        found = []
        for p in self.directory.iterdir():
            m = _STEP_DIR.match(p.name)
            if m and p.is_dir():
                found.append((int(m.group(1)), p))
        return sorted(found)

    # ---------------------------------------------------------------- save

    def save(self, step: int, state: Mapping[str, Any], *, files: Mapping[str, bytes | str] | None = None) -> Path:
        """Write a checkpoint for ``step`` atomically; returns its directory. Collective when
        a process group exists. Raises :class:`NonFiniteStateError` (nothing written) when the
        model or optimizer state holds NaN/inf, ``TypeError`` for values that could not be
        loaded back safely.

        ``files`` (``{relative name: bytes or str}``, rank 0's are written) are stored as files
        inside the checkpoint directory and covered by its manifest like every other file;
        read them back with :meth:`VerifiedCheckpoint.read_file`."""
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise ValueError(f"step must be a non-negative int, got {step!r}")
        extra_files = _check_extra_files(files or {})
        model, optimizer, stateful, values = _split_state(state)
        g = _Group(self.process_group)
        inner = _unwrap(model)
        sharded = _is_sharded(inner)

        # Collect state dicts (model/optimizer in their backend's form) and the rest.
        optim_empty = optimizer is not None and not optimizer.state
        msd, osd = _state_dicts_for_save(inner, optimizer, sharded, optim_empty)

        bad = _nonfinite({"model": msd, "optimizer": osd or {}})
        all_bad = sorted(set().union(*map(set, g.gather(bad))))
        if all_bad:
            raise NonFiniteStateError(
                f"refusing to save step {step}: non-finite values (NaN/inf) in "
                + ", ".join(all_bad[:_MAX_LISTED])
                + (f" and {len(all_bad) - _MAX_LISTED} more" if len(all_bad) > _MAX_LISTED else "")
            )

        rest: dict[str, Any] = {
            "stateful": {k: v.state_dict() for k, v in stateful.items()},
            "values": dict(values),
            "optimizer_empty": optim_empty,
        }
        if sharded and optim_empty:  # see _state_dicts_for_save
            rest["optimizer_groups"] = optimizer.state_dict()
        for k, v in rest["stateful"].items():
            _check_plain(v, f"state[{k!r}].state_dict()")
        for k, v in rest["values"].items():
            _check_plain(v, f"state[{k!r}]")
        rest["rng"] = g.gather(_rng_state())
        fingerprint = model_fingerprint(msd)

        final = self.path_for(step)
        tmp = self.directory / f"{_TMP_PREFIX}{final.name}"
        err = None
        if g.rank == 0:
            try:
                self.directory.mkdir(parents=True, exist_ok=True)
                if tmp.exists():
                    shutil.rmtree(tmp)
                tmp.mkdir()
            except Exception as e:  # noqa: BLE001 - reported to every rank below
                err = e
        g.agree(err, f"preparing {tmp}", path=tmp)

        try:
            shard_files: dict[str, Any] = {}
            if sharded:
                shard_files = _save_sharded(tmp, msd, osd, g, self.process_group)
            err = None
            if g.rank == 0:
                try:
                    if not sharded:
                        rest["model"] = msd
                        rest["optimizer"] = osd
                    _torch_save_synced(rest, tmp / STATE_FILE)
                    for name, content in extra_files.items():
                        _write_synced(tmp / name, content)
                    for directory in {(tmp / name).parent for name in extra_files}:
                        _fsync_dir(directory)
                    files = dict(shard_files)
                    for name in [STATE_FILE, *extra_files]:
                        files[name] = _describe(tmp, name)
                    manifest = {
                        "format": "spherenet-checkpoint",
                        "version": FORMAT_VERSION,
                        "step": step,
                        "backend": "dcp" if sharded else "torch",
                        "world_size": g.world,
                        "created_unix": time.time(),
                        "torch_version": torch.__version__,
                        "has_optimizer": optimizer is not None,
                        "stateful_keys": sorted(stateful),
                        "value_keys": sorted(values),
                        "fingerprint": fingerprint,
                        "files": files,
                    }
                    _write_manifest(tmp, manifest)
                    if sharded:
                        _fsync_dir(tmp / SHARDED_DIR)
                    _fsync_dir(tmp)
                    self._publish(tmp, final)
                except Exception as e:  # noqa: BLE001 - reported to every rank below
                    err = e
            g.agree(err, f"saving checkpoint {final}", path=tmp)
        except Exception:
            if g.rank == 0:
                shutil.rmtree(tmp, ignore_errors=True)
            raise
        if g.rank == 0:
            try:
                self._prune(step, final)
            except OSError as e:  # the new checkpoint is complete; pruning can wait
                msg = f"could not prune old checkpoints in {self.directory}: {e}"
                warnings.warn(msg, CheckpointWarning, stacklevel=2)
        g.gather(None)  # barrier: nobody proceeds (or reads) before pruning is over
        return final

    def _publish(self, tmp: Path, final: Path) -> None:
        trash = None
        if final.exists():  # re-saving a step (e.g. after falling back from a damaged one)
            trash = self.directory / f"{_TRASH_PREFIX}{final.name}-{uuid.uuid4().hex[:8]}"
            os.rename(final, trash)
        os.rename(tmp, final)
        _fsync_dir(self.directory)
        if trash is not None:
            shutil.rmtree(trash, ignore_errors=True)

    def _prune(self, step: int, final: Path) -> None:
        # Leftovers of crashed saves: never read, safe to delete now that a save succeeded.
        for p in self.directory.iterdir():
            if p.name.startswith((_TMP_PREFIX, _TRASH_PREFIX)) and p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
        all_ckpts = self.checkpoints()
        newer = [p for s, p in all_ckpts if s > step]
        if newer and not self._warned_newer:
            self._warned_newer = True
            warnings.warn(
                f"{len(newer)} checkpoint(s) with a higher step than {step} exist in {self.directory} "
                f"(newest {newer[-1].name}); load_latest() will prefer them over {final.name}",
                CheckpointWarning,
                stacklevel=3,
            )
        if self.keep_last is None:
            return
        older = [p for s, p in all_ckpts if s < step]
        keep = self.keep_last - 1
        for p in older[: max(len(older) - keep, 0)]:
            claim = claim_for_delete(p)
            if claim is None:  # a reader (an export, a sample) holds it: pruned by a later save
                continue
            # Renamed first, so that a crash mid-delete leaves a leftover no load reads.
            trash = self.directory / f"{_TRASH_PREFIX}{p.name}-{uuid.uuid4().hex[:8]}"
            try:
                os.rename(p, trash)
                shutil.rmtree(trash, ignore_errors=True)
            finally:
                claim.release()

    # ---------------------------------------------------------------- load

    def load(
        self, path: str | os.PathLike | VerifiedCheckpoint, state: Mapping[str, Any], *, restore_rng: bool = True
    ) -> LoadedCheckpoint:
        """Verify the checkpoint at ``path`` and restore it into ``state`` (see the class
        doc). Raises :class:`CheckpointCorruptError` or :class:`CheckpointMismatchError`. A
        :class:`VerifiedCheckpoint` is restored without hashing its files again."""
        verified = path if isinstance(path, VerifiedCheckpoint) else self.verify(path)
        try:
            return self._restore(verified.path, verified.manifest, state, restore_rng)
        finally:
            verified.release()

    def load_latest(self, state: Mapping[str, Any], *, restore_rng: bool = True) -> LoadedCheckpoint | None:
        """Restore the newest sound checkpoint (:meth:`latest_verified`); ``None`` when there
        is none at all."""
        verified = self.latest_verified()
        if verified is None:
            return None
        try:
            return self._restore(verified.path, verified.manifest, state, restore_rng)
        finally:
            verified.release()

    def verify(self, path: str | os.PathLike) -> VerifiedCheckpoint:
        """Check the manifest and every file's size and sha256 (collective; the verdict is the
        same on every rank). Raises :class:`CheckpointCorruptError` naming what is wrong. The
        result pins the directory until it is loaded or released (see :class:`VerifiedCheckpoint`)."""
        path = Path(path)
        pin = pin_directory(path)  # before hashing: a live run's pruning passes over it from here on
        try:
            manifest = verify_directory(path, self.process_group)
        except BaseException:
            if pin is not None:
                pin.release()
            raise
        return VerifiedCheckpoint(step=int(manifest["step"]), path=path, manifest=manifest, pin=pin)

    def latest_verified(self) -> VerifiedCheckpoint | None:
        """The newest checkpoint that passes :meth:`verify`; ``None`` when there is none at
        all. Damaged ones are skipped with a :class:`CheckpointWarning`; if every checkpoint
        is damaged, raises :class:`CheckpointCorruptError` naming the directory (rather than
        silently starting over)."""
        g = _Group(self.process_group)
        candidates = g.broadcast([str(p) for _, p in reversed(self.checkpoints())] if g.rank == 0 else None)
        skipped = []
        for p in map(Path, candidates):
            try:
                return self.verify(p)
            except CheckpointCorruptError as e:
                if not p.exists():  # pruned since listed (a reader beside a live run): not damaged
                    continue
                skipped.append(str(e))
                if g.rank == 0:
                    warnings.warn(f"skipping damaged checkpoint: {e}", CheckpointWarning, stacklevel=2)
        if skipped:
            raise CheckpointCorruptError(f"every checkpoint in {self.directory} is damaged:\n  " + "\n  ".join(skipped))
        return None

    def _restore(self, path: Path, manifest: dict, state: Mapping[str, Any], restore_rng: bool) -> LoadedCheckpoint:
        # Plain values in ``state`` are ignored: the saved ones come back in ``extra``.
        model, optimizer, stateful, _ = _split_state(state)
        g = _Group(self.process_group)
        inner = _unwrap(model)
        sharded_model = _is_sharded(inner)
        backend = manifest["backend"]

        if optimizer is not None and not manifest.get("has_optimizer", False):
            raise CheckpointMismatchError(f"checkpoint {path} holds no optimizer state, but an optimizer was given")
        missing = sorted(set(stateful) - set(manifest.get("stateful_keys", [])))
        if missing:
            raise CheckpointMismatchError(
                f"checkpoint {path} holds no state for {missing}; it has {manifest.get('stateful_keys')}"
            )
        if backend == "torch" and sharded_model:
            raise CheckpointMismatchError(
                f"checkpoint {path} was written unsharded (single process/DDP); loading it into an FSDP2 "
                "model is not supported: load it into the unsharded model before fully_shard()"
            )

        _check_fingerprint(manifest["fingerprint"], model_fingerprint(_model_sd_for_fingerprint(inner, backend)), path)

        rest = torch.load(path / STATE_FILE, map_location="cpu", weights_only=True)
        params_before = [(n, p, type(p)) for n, p in inner.named_parameters()]

        if backend == "torch":
            inner.load_state_dict(rest["model"])  # copy_ into the existing parameters
            if optimizer is not None:
                _load_optimizer(optimizer, rest["optimizer"], path)
        else:
            _load_sharded(path, inner, optimizer, rest, self.process_group)

        after = list(inner.named_parameters())
        changed = [n for (n, p, t), (_, q) in zip(params_before, after) if p is not q or type(q) is not t]
        if changed:  # would leave the optimizer updating orphaned tensors / lose ManifoldParameter
            raise CheckpointError(f"loading replaced parameter objects instead of copying into them: {changed}")

        for k, obj in stateful.items():
            obj.load_state_dict(rest["stateful"][k])
        extra = dict(rest["values"])
        for k, sd in rest["stateful"].items():
            if k not in stateful:
                extra[k] = sd

        if restore_rng:
            saved = rest["rng"]
            if g.rank < len(saved):
                _set_rng_state(saved[g.rank])
            if len(saved) != g.world and g.rank == 0:
                warnings.warn(
                    f"checkpoint {path} was written by {len(saved)} rank(s), now {g.world}: ranks without a "
                    "saved RNG state keep their current one",
                    CheckpointWarning,
                    stacklevel=3,
                )
        return LoadedCheckpoint(step=int(manifest["step"]), path=path, extra=extra, manifest=manifest)
