"""Checkpoints that survive crashes (see :mod:`spherenet.checkpoint.manager`)."""

from .manager import *  # noqa: F403
from .manager import __all__ as __all__
