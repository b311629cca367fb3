"""The errors and the warning raised by :class:`~spherenet.checkpoint.CheckpointManager`, and
the one-line wording of a failed write."""

import errno as _errno


class CheckpointError(RuntimeError):
    """Base class of the errors raised by :class:`CheckpointManager`."""


class CheckpointCorruptError(CheckpointError):
    """A checkpoint is incomplete, truncated or altered (manifest or hash check failed)."""


class CheckpointMismatchError(CheckpointError):
    """A sound checkpoint that does not fit the objects it is loaded into."""


class NonFiniteStateError(CheckpointError, ValueError):
    """The model or optimizer state holds NaN or inf: refused to save, or weights refused at load."""


class CheckpointWarning(UserWarning):
    """A damaged checkpoint was skipped, or the RNG state could not be fully restored."""


def describe_os_error(exc: OSError, action: str = "cannot write", path=None) -> str:
    """One line for a failed file operation, the errno named: ``cannot write runs/x/metrics.jsonl:
    no space left on device (ENOSPC)``. ``path`` names what was written when the error itself
    names no file (a failed ``write`` or ``fsync`` of an open file does not)."""
    reason = (exc.strerror or str(exc)).rstrip(".")
    reason = reason[:1].lower() + reason[1:]
    code = f" ({_errno.errorcode[exc.errno]})" if exc.errno in _errno.errorcode else ""
    where = exc.filename if exc.filename is not None else path
    target = f" {where}" if where is not None else ""
    return f"{action}{target}: {reason}{code}"
