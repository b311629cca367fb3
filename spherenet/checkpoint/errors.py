"""The errors and the warning raised by :class:`~spherenet.checkpoint.CheckpointManager`."""


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
