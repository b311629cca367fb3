"""Checkpoints that survive crashes: atomic, verified, finite, and exact on resume.

One checkpoint is one directory ``<directory>/step_<step:08d>/``::

    state.pt        torch.save of everything that is not sharded: the model and optimizer
                    (single process / DDP), other stateful objects (scheduler, ...), plain
                    values (data-loader position, config, ...) and the RNG states of every rank
    sharded/        FSDP2 only: the model and optimizer, written by torch.distributed.checkpoint
                    (DCP), each rank its own shards
    <extra files>   optional, given to ``save(..., files=...)``: e.g. the model's config and
                    the tokenizer, so that a checkpoint directory is self-contained
    MANIFEST.json   written last: step, backend, world size, model fingerprint (parameter and
                    buffer names, shapes, dtypes), and the size and sha256 of every other file

How a save stays atomic: everything is written into ``<directory>/.tmp-step_<step>`` (same
parent, hence same filesystem), each file fsync'ed, the manifest last, then the directory is
renamed to its final name and the parent fsync'ed. A crash at any point leaves either the
complete new checkpoint or only a ``.tmp-*`` directory, which no load ever reads and the next
save deletes. Older checkpoints are pruned (``keep_last``) only after the new one is in place.

How a load stays safe: the manifest and every file's size and sha256 are checked first. A
damaged checkpoint raises :class:`CheckpointCorruptError`; :meth:`CheckpointManager.latest_verified`
(behind :meth:`~CheckpointManager.load_latest`, and the one way every reader finds "the newest
sound checkpoint") then warns and falls back to the next older one. A checkpoint that does not fit the model raises
:class:`CheckpointMismatchError` naming the differing keys (no fallback: an older checkpoint
would not fit either).

Parameters are loaded in place (``load_state_dict`` without ``assign``, i.e. ``copy_``), so a
``geoopt.ManifoldParameter`` stays one and the optimizer keeps the very tensors it updates; the
load checks that afterwards.

Distributed: with a process group, every rank must call ``save``/``load*`` together. Plain
values and stateful objects other than the model/optimizer are taken from rank 0; RNG states
are gathered from every rank and each rank gets its own back. Collectives use
``all_gather_object``, so with NCCL ``torch.cuda.set_device`` must have been called.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
import time
import uuid
import warnings
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

__all__ = [
    "CheckpointManager",
    "LoadedCheckpoint",
    "VerifiedCheckpoint",
    "CheckpointError",
    "CheckpointCorruptError",
    "CheckpointMismatchError",
    "NonFiniteStateError",
    "CheckpointWarning",
    "model_fingerprint",
]

FORMAT_VERSION = 1
MANIFEST = "MANIFEST.json"
STATE_FILE = "state.pt"
SHARDED_DIR = "sharded"
_STEP_DIR = re.compile(r"^step_(\d+)$")
_TMP_PREFIX = ".tmp-"
_TRASH_PREFIX = ".trash-"
_HASH_CHUNK = 1 << 20
_MAX_LISTED = 12  # keys listed per category in a mismatch message


class CheckpointError(RuntimeError):
    """Base class of the errors raised by :class:`CheckpointManager`."""


class CheckpointCorruptError(CheckpointError):
    """A checkpoint is incomplete, truncated or altered (manifest or hash check failed)."""


class CheckpointMismatchError(CheckpointError):
    """A sound checkpoint that does not fit the objects it is loaded into."""


class NonFiniteStateError(CheckpointError, ValueError):
    """Refused to save: the model or optimizer state holds NaN or inf."""


class CheckpointWarning(UserWarning):
    """A damaged checkpoint was skipped, or the RNG state could not be fully restored."""


@dataclass(frozen=True)
class LoadedCheckpoint:
    """What a load restored. ``extra`` holds the plain values given to ``save`` (e.g. the
    data-loader position and the config), plus the raw state dicts of saved stateful objects
    for which ``load`` was given no target."""

    step: int
    path: Path
    extra: dict[str, Any] = field(default_factory=dict)
    manifest: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class VerifiedCheckpoint:
    """A checkpoint whose manifest and file hashes were checked (by
    :meth:`CheckpointManager.verify` or :meth:`~CheckpointManager.latest_verified`): its files
    can be read, and :meth:`CheckpointManager.load` restores it without hashing again."""

    step: int
    path: Path
    manifest: dict[str, Any] = field(default_factory=dict)

    def has_file(self, name: str) -> bool:
        """Whether ``name`` (relative, e.g. ``"model.json"``) is one of the checkpoint's files."""
        return name in self.manifest.get("files", {})

    def read_file(self, name: str) -> bytes:
        """The bytes of the extra file ``name`` given to ``save(..., files=...)``."""
        if not self.has_file(name):
            raise CheckpointError(f"checkpoint {self.path} has no file {name!r}")
        return (self.path / name).read_bytes()

    def read_state(self) -> dict[str, Any]:
        """The plain values and the stateful objects' state dicts (``{"values": ...,
        "stateful": ...}``) without restoring anything; the model's tensors are memory-mapped,
        not read."""
        rest = torch.load(self.path / STATE_FILE, map_location="cpu", weights_only=True, mmap=True)
        return {"values": dict(rest["values"]), "stateful": dict(rest["stateful"])}


# --------------------------------------------------------------------------------------------
# process group helpers (all trivial without torch.distributed)


def _dist_on() -> bool:
    return dist.is_available() and dist.is_initialized()


class _Group:
    def __init__(self, group):
        self.group = group
        self.on = _dist_on()
        self.rank = dist.get_rank(group) if self.on else 0
        self.world = dist.get_world_size(group) if self.on else 1

    def gather(self, obj) -> list:
        """``obj`` from every rank, on every rank (also acts as a barrier)."""
        if not self.on:
            return [obj]
        out: list = [None] * self.world
        dist.all_gather_object(out, obj, group=self.group)
        return out

    def broadcast(self, obj):
        """Rank 0's ``obj`` on every rank."""
        if not self.on:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=dist.get_global_rank(self.group, 0) if self.group else 0, group=self.group)
        return box[0]

    def agree(self, error: BaseException | None, what: str) -> None:
        """Raise on every rank when ``what`` failed on any rank (keeps ranks out of deadlock)."""
        msgs = self.gather(None if error is None else f"{type(error).__name__}: {error}")
        failed = [(r, m) for r, m in enumerate(msgs) if m is not None]
        if not failed:
            return
        detail = "; ".join(f"rank {r}: {m}" for r, m in failed)
        if error is not None:
            raise CheckpointError(f"{what} failed ({detail})") from error
        raise CheckpointError(f"{what} failed on another rank ({detail})")


# --------------------------------------------------------------------------------------------
# model / state helpers


def _unwrap(model: nn.Module) -> nn.Module:
    """The module under DDP / DataParallel / torch.compile wrappers."""
    while True:
        if isinstance(model, (nn.parallel.DistributedDataParallel, nn.DataParallel)):
            model = model.module
        elif isinstance(getattr(model, "_orig_mod", None), nn.Module):  # torch.compile
            model = model._orig_mod
        else:
            return model


def _dtensor_type():
    if not dist.is_available():
        return None
    from torch.distributed.tensor import DTensor

    return DTensor


def _is_sharded(model: nn.Module) -> bool:
    dtensor = _dtensor_type()
    return dtensor is not None and any(isinstance(p, dtensor) for p in model.parameters())


def _local(t: torch.Tensor) -> torch.Tensor:
    dtensor = _dtensor_type()
    return t.to_local() if dtensor is not None and isinstance(t, dtensor) else t


def model_fingerprint(model_or_state_dict: nn.Module | Mapping[str, Any]) -> dict[str, list]:
    """``{name: [shape, dtype]}`` for every tensor of a model's state dict (parameters and
    buffers, canonical names without DDP/compile prefixes, global shapes under FSDP2)."""
    if isinstance(model_or_state_dict, nn.Module):
        sd = _unwrap(model_or_state_dict).state_dict()
    else:
        sd = model_or_state_dict
    return {k: [list(v.shape), str(v.dtype)] for k, v in sd.items() if isinstance(v, torch.Tensor)}


def _fmt(entry) -> str:
    shape, dtype = entry
    return f"{tuple(shape)} {dtype.replace('torch.', '')}"


def _section(title: str, keys: list[str], describe) -> list[str]:
    if not keys:
        return []
    lines = [f"  {title}:"] + [f"    {k}: {describe(k)}" for k in keys[:_MAX_LISTED]]
    if len(keys) > _MAX_LISTED:
        lines.append(f"    ... and {len(keys) - _MAX_LISTED} more")
    return lines


def _check_fingerprint(saved: Mapping[str, list], current: Mapping[str, list], path: Path) -> None:
    missing = sorted(set(current) - set(saved))
    unexpected = sorted(set(saved) - set(current))
    differ = sorted(k for k in set(saved) & set(current) if list(saved[k]) != list(current[k]))
    if not (missing or unexpected or differ):
        return
    raise CheckpointMismatchError(
        "\n".join(
            [f"checkpoint {path} does not fit this model:"]
            + _section(
                "shape/dtype differ (checkpoint vs model)", differ, lambda k: f"{_fmt(saved[k])} vs {_fmt(current[k])}"
            )
            + _section("in the model but not in the checkpoint", missing, lambda k: _fmt(current[k]))
            + _section("in the checkpoint but not in the model", unexpected, lambda k: _fmt(saved[k]))
        )
    )


def _float_tensors(obj, prefix: str) -> Iterator[tuple[str, torch.Tensor]]:
    if isinstance(obj, torch.Tensor):
        if obj.is_floating_point() or obj.is_complex():
            yield prefix, obj
    elif isinstance(obj, Mapping):
        for k, v in obj.items():
            yield from _float_tensors(v, f"{prefix}.{k}")
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from _float_tensors(v, f"{prefix}.{i}")


def _nonfinite(tree: Mapping[str, Any]) -> list[str]:
    """Names of floating tensors in ``tree`` holding NaN/inf (local shards only)."""
    named = [(n, _local(t).detach()) for n, t in _float_tensors(tree, "")]
    named = [(n.lstrip("."), t) for n, t in named if t.numel()]
    bad: list[str] = []
    by_device: dict[torch.device, list[tuple[str, torch.Tensor]]] = {}
    for n, t in named:
        by_device.setdefault(t.device, []).append((n, t))
    for items in by_device.values():
        flags = torch.stack([torch.isfinite(t).all() for _, t in items]).cpu()  # one sync per device
        bad += [n for (n, _), ok in zip(items, flags.tolist()) if not ok]
    return bad


_PLAIN_LEAVES = (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device, torch.Size)


def _check_plain(obj, where: str) -> None:
    """Refuse values that ``torch.load(weights_only=True)`` could not read back."""
    if isinstance(obj, _PLAIN_LEAVES):
        return
    if isinstance(obj, torch.Tensor):
        if type(obj) not in (torch.Tensor, nn.Parameter):
            raise TypeError(
                f"{where} is a {type(obj).__name__} (a tensor subclass); store a plain tensor "
                "(e.g. t.detach().as_subclass(torch.Tensor))"
            )
        return
    if isinstance(obj, (dict, OrderedDict)):
        for k, v in obj.items():
            if not isinstance(k, (str, int, float, bool, type(None))):
                raise TypeError(f"{where} has a key of type {type(k).__name__}; use str/int keys")
            _check_plain(v, f"{where}[{k!r}]")
        return
    if isinstance(obj, (list, tuple, set, frozenset)):
        for i, v in enumerate(obj):
            _check_plain(v, f"{where}[{i}]")
        return
    raise TypeError(
        f"{where} is a {type(obj).__module__}.{type(obj).__qualname__}; checkpoint values must be "
        "plain data (dict, list, tuple, str, int, float, bool, None, tensor) so that they load "
        "with torch.load(weights_only=True). Convert it first (e.g. dataclasses.asdict(config))."
    )


def _is_stateful(obj) -> bool:
    return callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))


def _split_state(state: Mapping[str, Any]):
    if not isinstance(state, Mapping):
        raise TypeError(f"state must be a dict, got {type(state).__name__}")
    bad_keys = [k for k in state if not isinstance(k, str)]
    if bad_keys:
        raise TypeError(f"state keys must be str, got {bad_keys!r}")
    model = state.get("model")
    if not isinstance(model, nn.Module):
        raise TypeError(f"state['model'] must be an nn.Module, got {type(model).__name__}")
    optimizer = state.get("optimizer")
    if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"state['optimizer'] must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
    stateful = {k: v for k, v in state.items() if k not in ("model", "optimizer") and _is_stateful(v)}
    values = {k: v for k, v in state.items() if k not in ("model", "optimizer") and k not in stateful}
    return model, optimizer, stateful, values


# --------------------------------------------------------------------------------------------
# RNG


def _rng_state() -> dict[str, Any]:
    kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    state = {
        "python": random.getstate(),
        "numpy": (kind, keys.tolist(), int(pos), int(has_gauss), float(cached)),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: Mapping[str, Any]) -> None:
    random.setstate(state["python"])
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    cuda = state.get("cuda")
    if cuda is not None and torch.cuda.is_available():
        if len(cuda) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda)
        else:
            warnings.warn(
                f"checkpoint holds CUDA RNG states for {len(cuda)} devices but {torch.cuda.device_count()} "
                "are visible; CUDA RNG not restored",
                CheckpointWarning,
                stacklevel=3,
            )


# --------------------------------------------------------------------------------------------
# files


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # e.g. Windows: directories cannot be opened
        return
    try:
        os.fsync(fd)
    except OSError:  # some filesystems refuse fsync on a directory
        pass
    finally:
        os.close(fd)


def _torch_save_synced(obj, path: Path) -> None:
    with open(path, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _describe(path: Path, rel: str) -> dict[str, Any]:
    p = path / rel
    return {"size": p.stat().st_size, "sha256": _sha256(p)}


def _all_files(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


def _read_manifest(path: Path) -> dict[str, Any]:
    mpath = path / MANIFEST
    if not path.is_dir():
        raise CheckpointCorruptError(f"{path} is not a directory")
    if not mpath.is_file():
        raise CheckpointCorruptError(f"{path} has no {MANIFEST}: the save did not complete")
    try:
        manifest = json.loads(mpath.read_text())
    except (OSError, ValueError) as e:
        raise CheckpointCorruptError(f"{mpath} is unreadable ({e})") from e
    if not isinstance(manifest, dict) or manifest.get("format") != "spherenet-checkpoint":
        raise CheckpointCorruptError(f"{mpath} is not a spherenet checkpoint manifest")
    if manifest.get("version") != FORMAT_VERSION:
        raise CheckpointCorruptError(
            f"{mpath} has format version {manifest.get('version')!r}; this spherenet reads version {FORMAT_VERSION}"
        )
    files = manifest.get("files")
    if not isinstance(files, dict) or STATE_FILE not in files:
        raise CheckpointCorruptError(f"{mpath} lists no {STATE_FILE}")
    malformed = [k for k in ("step", "backend", "fingerprint") if k not in manifest] + [
        rel for rel, e in files.items() if not (isinstance(e, dict) and {"size", "sha256"} <= set(e))
    ]
    if malformed or manifest["backend"] not in ("torch", "dcp"):
        raise CheckpointCorruptError(f"{mpath} is malformed (bad or missing entries: {malformed or ['backend']})")
    return manifest


def _check_file(path: Path, rel: str, expect: Mapping[str, Any]) -> None:
    p = path / rel
    if not p.is_file():
        raise CheckpointCorruptError(f"{path}: {rel} is missing")
    size = p.stat().st_size
    if size != expect["size"]:
        raise CheckpointCorruptError(
            f"{path}: {rel} has {size} bytes but the manifest records {expect['size']} (truncated or overwritten)"
        )
    digest = _sha256(p)
    if digest != expect["sha256"]:
        raise CheckpointCorruptError(
            f"{path}: {rel} has sha256 {digest[:16]}... but the manifest records {expect['sha256'][:16]}... "
            "(contents altered)"
        )


# --------------------------------------------------------------------------------------------


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
        msd, osd = self._state_dicts_for_save(inner, optimizer, sharded, optim_empty)

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
        g.agree(err, f"preparing {tmp}")

        try:
            shard_files: dict[str, Any] = {}
            if sharded:
                shard_files = self._save_sharded(tmp, msd, osd, optim_empty, g)
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
            g.agree(err, f"saving checkpoint {final}")
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

    def _state_dicts_for_save(self, inner, optimizer, sharded, optim_empty):
        if not sharded:
            return inner.state_dict(), (optimizer.state_dict() if optimizer is not None else None)
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

        # get_state_dict() "initializes" an optimizer that has no state yet by running a step
        # with lr=0: that would change the trajectory (Adam's step count) of the live run. So
        # an optimizer without state is saved as its param_groups only (in state.pt).
        if optimizer is None or optim_empty:
            return get_model_state_dict(inner), None
        return get_state_dict(inner, [optimizer])

    def _save_sharded(self, tmp: Path, msd, osd, optim_empty: bool, g: _Group) -> dict[str, Any]:
        import torch.distributed.checkpoint as dcp

        payload = {"model": msd}
        if osd is not None:
            payload["optimizer"] = osd
        dcp.save(payload, checkpoint_id=str(tmp / SHARDED_DIR), process_group=self.process_group)
        # dcp.save returns once every rank's shards and the .metadata are written (fsync'ed
        # by DCP's FileSystemWriter). Hash the files, each rank a share.
        names = _all_files(tmp / SHARDED_DIR)
        mine, err = {}, None
        try:
            for rel in names[g.rank :: g.world]:
                mine[f"{SHARDED_DIR}/{rel}"] = _describe(tmp, f"{SHARDED_DIR}/{rel}")
        except Exception as e:  # noqa: BLE001
            err = e
        g.agree(err, "hashing checkpoint shards")
        files: dict[str, Any] = {}
        for part in g.gather(mine):
            files.update(part)
        return files

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
            # Renamed first, so that a crash mid-delete leaves a leftover no load reads.
            trash = self.directory / f"{_TRASH_PREFIX}{p.name}-{uuid.uuid4().hex[:8]}"
            os.rename(p, trash)
            shutil.rmtree(trash, ignore_errors=True)

    # ---------------------------------------------------------------- load

    def load(
        self, path: str | os.PathLike | VerifiedCheckpoint, state: Mapping[str, Any], *, restore_rng: bool = True
    ) -> LoadedCheckpoint:
        """Verify the checkpoint at ``path`` and restore it into ``state`` (see the class
        doc). Raises :class:`CheckpointCorruptError` or :class:`CheckpointMismatchError`. A
        :class:`VerifiedCheckpoint` is restored without hashing its files again."""
        verified = path if isinstance(path, VerifiedCheckpoint) else self.verify(path)
        return self._restore(verified.path, verified.manifest, state, restore_rng)

    def load_latest(self, state: Mapping[str, Any], *, restore_rng: bool = True) -> LoadedCheckpoint | None:
        """Restore the newest sound checkpoint (:meth:`latest_verified`); ``None`` when there
        is none at all."""
        verified = self.latest_verified()
        if verified is None:
            return None
        return self._restore(verified.path, verified.manifest, state, restore_rng)

    def verify(self, path: str | os.PathLike) -> VerifiedCheckpoint:
        """Check the manifest and every file's size and sha256 (collective; the verdict is the
        same on every rank). Raises :class:`CheckpointCorruptError` naming what is wrong."""
        path = Path(path)
        manifest = self._verify(path)
        return VerifiedCheckpoint(step=int(manifest["step"]), path=path, manifest=manifest)

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
                skipped.append(str(e))
                if g.rank == 0:
                    warnings.warn(f"skipping damaged checkpoint: {e}", CheckpointWarning, stacklevel=2)
        if skipped:
            raise CheckpointCorruptError(f"every checkpoint in {self.directory} is damaged:\n  " + "\n  ".join(skipped))
        return None

    def _verify(self, path: Path) -> dict[str, Any]:
        """Manifest + size/sha256 of every file, each rank checking a share; the verdict is
        the same on every rank."""
        g = _Group(self.process_group)
        manifest, err = None, None
        try:
            manifest = _read_manifest(path)
            names = sorted(manifest["files"])
            for rel in names[g.rank :: g.world]:
                _check_file(path, rel, manifest["files"][rel])
        except CheckpointCorruptError as e:
            err = str(e)
        except OSError as e:
            err = f"{path} is unreadable ({e})"
        except Exception as e:  # noqa: BLE001 - any surprise must still reach every rank
            err = f"{path} could not be verified ({type(e).__name__}: {e})"
        errors = [e for e in dict.fromkeys(g.gather(err)) if e is not None]
        if errors:
            raise CheckpointCorruptError("; ".join(errors))
        return manifest

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

        _check_fingerprint(
            manifest["fingerprint"], model_fingerprint(self._model_sd_for_fingerprint(inner, backend)), path
        )

        rest = torch.load(path / STATE_FILE, map_location="cpu", weights_only=True)
        params_before = [(n, p, type(p)) for n, p in inner.named_parameters()]

        if backend == "torch":
            inner.load_state_dict(rest["model"])  # copy_ into the existing parameters
            if optimizer is not None:
                self._load_optimizer(optimizer, rest["optimizer"], path)
        else:
            self._load_sharded(path, inner, optimizer, rest)

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

    @staticmethod
    def _model_sd_for_fingerprint(inner: nn.Module, backend: str):
        if backend == "dcp":
            from torch.distributed.checkpoint.state_dict import get_model_state_dict

            return get_model_state_dict(inner)
        return inner.state_dict()

    @staticmethod
    def _load_optimizer(optimizer: torch.optim.Optimizer, osd: dict, path: Path) -> None:
        try:
            optimizer.load_state_dict(osd)
        except (ValueError, KeyError) as e:
            raise CheckpointMismatchError(
                f"checkpoint {path}: optimizer state does not fit this optimizer ({e})"
            ) from e
        saved_ids = [i for g in osd["param_groups"] for i in g["params"]]
        live = [p for g in optimizer.param_groups for p in g["params"]]
        _keep_python_scalars(optimizer, osd["state"], dict(zip(saved_ids, live)))

    def _load_sharded(self, path: Path, inner: nn.Module, optimizer, rest: dict) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
            get_state_dict,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        with_optim = optimizer is not None and not rest["optimizer_empty"]
        if with_optim:
            # Note: on an optimizer without state this runs a zero-lr step to create it; the
            # state is then overwritten below and the parameters reloaded after it.
            msd, osd = get_state_dict(inner, [optimizer])
            # Parameters that never had a gradient have no optimizer state in the checkpoint;
            # the template above gives every parameter one. Ask DCP only for what was saved.
            saved = dcp.FileSystemReader(str(path / SHARDED_DIR)).read_metadata().state_dict_metadata
            prefixes = {key.rsplit(".", 1)[0] for key in saved if key.startswith("optimizer.state.")}
            osd["state"] = {fqn: st for fqn, st in osd["state"].items() if f"optimizer.state.{fqn}" in prefixes}
            payload = {"model": msd, "optimizer": osd}
        else:
            msd = get_model_state_dict(inner)
            payload = {"model": msd}
        with warnings.catch_warnings():
            # DCP warns when used without a process group (loading a sharded checkpoint into
            # one process); that is intended here.
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.load(payload, checkpoint_id=str(path / SHARDED_DIR), process_group=self.process_group)
        if with_optim:
            set_model_state_dict(inner, payload["model"])
            # strict=False: parameters without saved state (never had a gradient) start fresh,
            # as they would have in the uninterrupted run.
            set_optimizer_state_dict(inner, [optimizer], payload["optimizer"], options=StateDictOptions(strict=False))
            _keep_python_scalars(optimizer, payload["optimizer"]["state"], dict(inner.named_parameters()))
        else:
            set_model_state_dict(inner, payload["model"])
            if optimizer is not None:  # saved before its first step: hyperparameters only
                self._load_optimizer(optimizer, rest["optimizer_groups"], path)


def _keep_python_scalars(optimizer: torch.optim.Optimizer, saved_state: Mapping, key_to_param: Mapping) -> None:
    """Give back the python int/float type of per-parameter optimizer state entries.

    ``Optimizer.load_state_dict`` runs ``__setstate__``, and torch's ``Adam.__setstate__`` turns
    a python-int ``step`` into a float32 tensor. geoopt's ``RiemannianAdam`` (a subclass) keeps
    ``step`` as an int and computes ``betas[0] ** step`` from it, so after the conversion the
    bias corrections are computed in float32 and the resumed run drifts (~1e-7 per step) from
    an uninterrupted one. Restoring the saved type keeps the resume bitwise exact.
    """
    for key, saved in saved_state.items():
        param = key_to_param.get(key)
        if param is None or param not in optimizer.state or not isinstance(saved, Mapping):
            continue
        live = optimizer.state[param]
        for name, value in saved.items():
            python_number = isinstance(value, (int, float)) and not isinstance(value, bool)
            if python_number and isinstance(live.get(name), torch.Tensor):
                live[name] = value


def _check_extra_files(files: Mapping[str, bytes | str]) -> dict[str, bytes]:
    """Extra files for a checkpoint: relative POSIX names, outside the names it uses itself."""
    if not isinstance(files, Mapping):
        raise TypeError(f"files must be a dict of name -> bytes/str, got {type(files).__name__}")
    out = {}
    for name, content in files.items():
        parts = name.split("/") if isinstance(name, str) else []
        if not parts or any(part in ("", ".", "..") for part in parts) or "\\" in name:
            raise ValueError(f"extra checkpoint file name {name!r} must be a relative path like 'a/b.json'")
        if name in (STATE_FILE, MANIFEST) or parts[0] == SHARDED_DIR:
            raise ValueError(f"extra checkpoint file name {name!r} is used by the checkpoint itself")
        if isinstance(content, str):
            content = content.encode("utf-8")
        if not isinstance(content, (bytes, bytearray)):
            raise TypeError(f"extra checkpoint file {name!r} must be bytes or str, got {type(content).__name__}")
        out[name] = bytes(content)
    return out


def _write_synced(path: Path, content: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.write(content)
        f.flush()
        os.fsync(f.fileno())


def _write_manifest(tmp: Path, manifest: dict[str, Any]) -> None:
    """Written last: its presence marks the checkpoint complete."""
    with open(tmp / MANIFEST, "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
