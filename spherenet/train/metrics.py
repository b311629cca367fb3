"""``metrics.jsonl``, a training run's record: one JSON object a line, written by rank 0 and
read back whole or beside the live writer."""

from __future__ import annotations

import errno
import json
import math
import os
import time
from pathlib import Path

__all__ = ["MetricsLog"]


class MetricsLog:
    """Appends one JSON object per line to ``path`` (rank 0 only); flushed every record so a
    killed run keeps everything logged up to the kill."""

    def __init__(self, path: str | Path, enabled: bool = True):
        self.path = Path(path)
        self.enabled = enabled
        self._t0 = time.time()
        if enabled:
            self.path.parent.mkdir(parents=True, exist_ok=True)

    def log(self, **record) -> None:
        if not self.enabled:
            return
        record.setdefault("time_s", round(time.time() - self._t0, 3))
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}
        line = (json.dumps(clean) + "\n").encode("utf-8")
        # One write of the whole line; a failed one (disk full) is cut back, never left half written.
        try:
            fd, created = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL, 0o644), True
        except FileExistsError:
            fd, created = os.open(self.path, os.O_WRONLY | os.O_APPEND), False
        try:
            size = os.fstat(fd).st_size
            try:
                written = os.write(fd, line)
                if written != len(line):
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self.path))
            except OSError as exc:
                os.ftruncate(fd, size)
                if created:  # a first record that could not be written leaves no empty file
                    self.path.unlink(missing_ok=True)
                if exc.filename is None:
                    exc.filename = str(self.path)
                raise
        finally:
            os.close(fd)

    @staticmethod
    def read(path: str | Path) -> list[dict]:
        with Path(path).open(encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]

    @staticmethod
    def read_complete(path: str | Path) -> list[dict]:
        """The records of ``path`` as a reader beside a live writer sees them: none when there is
        no file yet, and a line that is not a whole record (caught mid-append) left out."""
        try:
            lines = Path(path).read_text(encoding="utf-8").splitlines()
        except OSError:
            return []
        records = []
        for line in lines:
            try:
                records.append(json.loads(line))
            except ValueError:
                continue
        return records
