"""Inspect a trained nGPT or GPT (see :mod:`spherenet.analysis.plots`)."""

from .plots import *  # noqa: F403
from .plots import __all__ as __all__
