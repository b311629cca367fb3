"""Exceptions raised by :mod:`spherenet.data`.

Every error carries a message that names the file or value at fault and says what to do about
it, so that a training script can print ``str(exc)`` and stop, without a deep traceback.
"""

from __future__ import annotations

__all__ = ["DataError", "DataFileNotFoundError", "TokenizerError", "root_cause"]


class DataError(ValueError):
    """A data source, prepared token file, or data option is unusable."""


class DataFileNotFoundError(FileNotFoundError, DataError):
    """A file that the data pipeline needs does not exist.

    It is both a :class:`FileNotFoundError` and a :class:`DataError`, so either can be caught.
    """

    def __str__(self) -> str:  # FileNotFoundError would otherwise format (errno, strerror)
        return str(self.args[0]) if self.args else ""


class TokenizerError(DataError):
    """A tokenizer cannot be built, loaded, or used as asked."""


def root_cause(exc: BaseException) -> str:
    """The innermost message of an exception chain, shortened (library errors nest several levels)."""
    seen = []
    e: BaseException | None = exc
    while e is not None and len(seen) < 10:
        seen.append(e)
        e = e.__cause__ or e.__context__
    for cand in reversed(seen):
        msg = " ".join(str(cand).split())
        if msg:
            msg = f"{type(cand).__name__}: {msg}"
            return msg if len(msg) <= 400 else msg[:397] + "..."
    return type(exc).__name__
