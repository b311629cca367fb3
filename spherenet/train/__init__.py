"""Pieces of a training run that recipes assemble: configuration, distributed set-up, the step."""

from .config import ConfigError, RunConfig, load_config
from .distributed import DistInfo, all_reduce_mean, barrier, init_distributed, shutdown, unwrap_model, wrap_model

__all__ = [
    "ConfigError",
    "RunConfig",
    "load_config",
    "DistInfo",
    "init_distributed",
    "wrap_model",
    "unwrap_model",
    "all_reduce_mean",
    "barrier",
    "shutdown",
]
