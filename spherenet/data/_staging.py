"""A preparation is built out of sight: in a hidden ``.tmp-*`` directory next to its result, renamed
into place when complete (an atomic step on POSIX), so a reader never sees a half-written
directory and concurrent preparations (one per rank) cannot corrupt each other. The ``.tmp-*``
directories of preparations that were killed are removed by the next one.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import time
import uuid
from pathlib import Path

from .errors import DataError
from .prepared import _complete

__all__ = ["OWNER_FILE", "process_alive", "publish", "remove_stale_tmp", "start_tmp"]

OWNER_FILE = "owner.json"  # which process is writing a .tmp-* directory
_STALE_UNOWNED_S = 3600.0  # a .tmp-* directory without an owner file, untouched this long, is stale


def remove_stale_tmp(root: Path) -> None:
    """Delete the ``.tmp-*`` directories of preparations that were killed (their process, on
    this host, is gone; or they never wrote an owner and are an hour old). A directory of a live
    process, or of another host sharing the cache, is left alone."""
    host = socket.gethostname()
    for d in root.glob(".tmp-*"):
        if not d.is_dir():
            continue
        try:
            owner = json.loads((d / OWNER_FILE).read_text(encoding="utf-8"))
            stale = owner.get("host") == host and not process_alive(int(owner["pid"]))
        except (OSError, ValueError, KeyError, TypeError):
            try:
                stale = time.time() - d.stat().st_mtime > _STALE_UNOWNED_S
            except OSError:
                continue
        if stale:
            shutil.rmtree(d, ignore_errors=True)


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` of this host is running (or a zombie not yet reaped): signal 0
    probes it without touching it. Another user's process counts as alive (the probe is refused,
    but the process is there). Used to tell the leftovers of a killed writer from a live one's."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def start_tmp(root: Path, name: str) -> Path:
    """A new hidden directory for the preparation of ``root / name``, marked with this process
    as its owner (after the stale ones of killed preparations are removed). When the mark cannot
    be written (a full disk), the directory is removed before the error goes on: one without an
    owner would only be taken for stale an hour later."""
    root.mkdir(parents=True, exist_ok=True)
    remove_stale_tmp(root)
    tmp = root / f".tmp-{name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        (tmp / OWNER_FILE).write_text(json.dumps({"host": socket.gethostname(), "pid": os.getpid()}), encoding="utf-8")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return tmp


def publish(tmp: Path, final: Path, key: str, force: bool) -> Path:
    """Rename the finished ``tmp`` directory, its owner mark removed, to ``final`` (an atomic step on POSIX)."""
    (tmp / OWNER_FILE).unlink(missing_ok=True)
    if final.exists():
        if not force and _complete(final, key) is not None:
            return final  # another process finished the same preparation first
        old = final.with_name(f".old-{final.name}-{uuid.uuid4().hex[:8]}")
        try:
            os.replace(final, old)
        except OSError:
            pass
        shutil.rmtree(old, ignore_errors=True)
    try:
        os.replace(tmp, final)
    except OSError:
        if _complete(final, key) is None:
            raise DataError(f"could not move the prepared data into {final}") from None
    return final
