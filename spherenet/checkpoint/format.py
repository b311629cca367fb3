"""The on-disk format of a checkpoint and its verification: the directory layout, the manifest,
file hashing, fsync'ed writes, and the check of every file's size and sha256 before a load.

See :mod:`spherenet.checkpoint` for the layout of one checkpoint directory."""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

import torch

from .distributed import _Group
from .errors import CheckpointCorruptError, CheckpointError

FORMAT_VERSION = 1
MANIFEST = "MANIFEST.json"
STATE_FILE = "state.pt"
SHARDED_DIR = "sharded"
_STEP_DIR = re.compile(r"^step_(\d+)$")
_TMP_PREFIX = ".tmp-"
_TRASH_PREFIX = ".trash-"
_HASH_CHUNK = 1 << 20


RUN_CHECKPOINTS = "checkpoints"  # the folder of a training run that holds its step_N checkpoints


def holds_checkpoints(directory: str | os.PathLike) -> str | None:
    """What shows that ``directory`` holds a training run's checkpoints, named for a message:
    it is one (``step_N`` with its manifest), it holds ``step_N`` checkpoints, or it holds the
    run's ``checkpoints/`` folder; None otherwise. Reads names only, never a checkpoint's files."""
    directory = Path(directory)
    if _STEP_DIR.match(directory.name) and (directory / MANIFEST).is_file():
        return f"a checkpoint ({MANIFEST})"
    if (directory / RUN_CHECKPOINTS).exists():
        return RUN_CHECKPOINTS
    if directory.is_dir() and any(_STEP_DIR.match(p.name) and (p / MANIFEST).is_file() for p in directory.iterdir()):
        return "step_* checkpoints"
    return None


class _Pin:
    """A shared ``flock`` on a checkpoint directory, held while a reader verifies and reads it:
    pruning (:func:`claim_for_delete`) passes over a pinned checkpoint, so a reader beside a live
    run is not raced. A no-op where ``fcntl`` is missing (Windows)."""

    def __init__(self, fd: int | None = None):
        self.fd = fd

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing the descriptor drops the lock
            self.fd = None

    def __del__(self):
        self.release()


def _flock_directory(path: Path, exclusive: bool) -> _Pin | OSError:
    """A ``flock`` on the directory ``path`` (exclusive: without waiting): the held lock; a no-op
    :class:`_Pin` where locks are not to be had (no ``fcntl``, or a filesystem without flock, as
    some network mounts); the ``OSError`` when the directory cannot be opened, or
    ``BlockingIOError`` when another process holds it."""
    try:
        import fcntl
    except ImportError:
        return _Pin()
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as exc:
        return exc
    held = _Pin(fd)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB if exclusive else fcntl.LOCK_SH)
    except BlockingIOError as exc:
        held.release()
        return exc
    except OSError:
        held.release()
        return _Pin()
    return held


def pin_directory(path: Path) -> _Pin | None:
    """Pin the checkpoint directory ``path`` for reading; ``None`` when it is gone (pruned
    before, or while, the lock was taken: the shared lock waits out a prune that holds it)."""
    pin = _flock_directory(path, exclusive=False)
    if isinstance(pin, OSError):
        return None
    try:
        if pin.fd is not None and os.stat(path).st_ino != os.fstat(pin.fd).st_ino:
            raise FileNotFoundError(path)
    except OSError:
        pin.release()
        return None
    return pin


def claim_for_delete(path: Path) -> _Pin | None:
    """An exclusive ``flock`` on the checkpoint directory ``path`` before it is pruned; ``None``
    while a reader pins it (pruning then waits for a later save). Where no lock can be had,
    pruning goes on unclaimed (an unreadable directory: the rename reports it)."""
    claim = _flock_directory(path, exclusive=True)
    if isinstance(claim, BlockingIOError):
        return None
    return claim if isinstance(claim, _Pin) else _Pin()


@dataclass(frozen=True)
class VerifiedCheckpoint:
    """A checkpoint whose manifest and file hashes were checked (by
    :meth:`CheckpointManager.verify` or :meth:`~CheckpointManager.latest_verified`): its files
    can be read, and :meth:`CheckpointManager.load` restores it without hashing again. It pins
    its directory (a shared lock that a live run's pruning passes over) until :meth:`release`,
    which :meth:`CheckpointManager.load` calls once it has restored it."""

    step: int
    path: Path
    manifest: dict[str, Any] = field(default_factory=dict)
    pin: _Pin | None = field(default=None, repr=False, compare=False)

    def release(self) -> None:
        """Let pruning delete this checkpoint again (its files are not read after this)."""
        if self.pin is not None:
            self.pin.release()

    def has_file(self, name: str) -> bool:
        """Whether ``name`` (relative, e.g. ``"model.json"``) is one of the checkpoint's files."""
        return name in self.manifest.get("files", {})

    def read_file(self, name: str) -> bytes:
        """The bytes of the extra file ``name`` given to ``save(..., files=...)``, checked against
        the manifest's size and sha256 as read (the file was verified before; this holds the bytes
        handed out to it too). :class:`CheckpointCorruptError` when they differ."""
        if not self.has_file(name):
            raise CheckpointError(f"checkpoint {self.path} has no file {name!r}")
        content = (self.path / name).read_bytes()
        expect = self.manifest["files"][name]
        if len(content) != expect["size"] or hashlib.sha256(content).hexdigest() != expect["sha256"]:
            raise CheckpointCorruptError(
                f"{self.path}: {name} changed after the checkpoint was verified (its bytes no longer match the manifest)"
            )
        return content

    def files_under(self, folder: str) -> list[str]:
        """The manifest's files inside ``folder`` (relative, e.g. ``"tokenizer"``), sorted."""
        return sorted(name for name in self.manifest.get("files", {}) if name.startswith(folder.rstrip("/") + "/"))

    def read_state(self) -> dict[str, Any]:
        """The plain values and the stateful objects' state dicts (``{"values": ...,
        "stateful": ...}``) without restoring anything; the model's tensors are memory-mapped,
        not read."""
        rest = torch.load(self.path / STATE_FILE, map_location="cpu", weights_only=True, mmap=True)
        return {"values": dict(rest["values"]), "stateful": dict(rest["stateful"])}


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


class _Writer:
    """A file for ``torch.save`` that keeps the OSError of a failed write: torch's writer turns it
    into ``unexpected pos N vs M``, which hides a full disk. Once the file is closed (the save
    given up), torch's zip writer may still write its end from its destructor, where an
    exception ends the process (``std::terminate``): those bytes are dropped."""

    def __init__(self, f):
        self.f, self.error = f, None

    def write(self, data) -> int:
        if self.f.closed:
            return len(data)
        try:
            return self.f.write(data)
        except OSError as exc:
            self.error = exc
            raise

    def flush(self) -> None:
        if not self.f.closed:
            self.f.flush()


def _interrupt_behind(exc: BaseException) -> KeyboardInterrupt | None:
    """The Ctrl-C an exception was raised while handling, if any (the chain of contexts)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, KeyboardInterrupt):
            return exc
        seen.add(id(exc))
        exc = exc.__context__
    return None


def _torch_save_synced(obj, path: Path) -> None:
    with open(path, "wb") as f:
        writer = _Writer(f)
        try:
            torch.save(obj, writer)
        except Exception as exc:
            interrupt = _interrupt_behind(exc)
            if interrupt is not None:
                raise interrupt from None
            if writer.error is not None:
                if writer.error.filename is None:
                    writer.error.filename = str(path)
                raise writer.error from None
            raise
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


def verify_directory(path: Path, process_group=None) -> dict[str, Any]:
    """The manifest of the checkpoint at ``path``, after checking it and every file's size and
    sha256, each rank a share (collective; the verdict is the same on every rank). Raises
    :class:`CheckpointCorruptError` naming what is wrong."""
    g = _Group(process_group)
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


# ---------------------------------------------------------------- a manifest for any directory

FILES_MANIFEST_FORMAT = "spherenet-files"


def write_files_manifest(directory: str | os.PathLike, names: Iterable[str], manifest_name: str) -> None:
    """Write ``directory/manifest_name``: the size and sha256 of each file of ``names`` (relative
    to ``directory``), the same entries a checkpoint's manifest holds. Used for exported models."""
    directory = Path(directory)
    files = {rel: _describe(directory, rel) for rel in sorted(names) if rel != manifest_name}
    manifest = {"format": FILES_MANIFEST_FORMAT, "version": FORMAT_VERSION, "files": files}
    _write_synced(directory / manifest_name, (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode())


def verify_files_manifest(directory: str | os.PathLike, names: Iterable[str], manifest_name: str) -> bool:
    """Check the files ``names`` of ``directory`` against ``directory/manifest_name`` (written by
    :func:`write_files_manifest`): each must be listed, with its size and sha256. False when there
    is no manifest at all (nothing to check against); :class:`CheckpointCorruptError`, naming the
    file, when the manifest is unreadable or a file differs from it."""
    directory = Path(directory)
    mpath = directory / manifest_name
    if not mpath.is_file():
        return False
    try:
        manifest = json.loads(mpath.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise CheckpointCorruptError(f"{mpath} is unreadable ({e})") from None
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(manifest, dict) or manifest.get("format") != FILES_MANIFEST_FORMAT or not isinstance(files, dict):
        raise CheckpointCorruptError(f"{mpath} is not a spherenet file manifest")
    for rel in names:
        entry = files.get(rel)
        if not (isinstance(entry, dict) and {"size", "sha256"} <= set(entry)):
            raise CheckpointCorruptError(f"{directory}: {rel} is not listed in {manifest_name}")
        _check_file(directory, rel, entry)
    return True
