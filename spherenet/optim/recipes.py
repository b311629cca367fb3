"""Deprecated name of :mod:`spherenet.optim.build` (the optimizer and schedule of a run; not the
top-level ``recipes`` package)."""

import warnings

from .build import METHODS, MUON_METHODS, RECIPES, WarmupCosine, build_optimizer

__all__ = ["METHODS", "MUON_METHODS", "RECIPES", "build_optimizer", "WarmupCosine"]

warnings.warn(
    "spherenet.optim.recipes is renamed spherenet.optim.build; import from there", DeprecationWarning, stacklevel=2
)
