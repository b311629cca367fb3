"""The random number generator states saved with every checkpoint: python, numpy, torch CPU and
(when initialized) CUDA; each rank saves and gets back its own."""

from __future__ import annotations

import random
import warnings
from typing import Any, Mapping

import numpy as np
import torch

from .errors import CheckpointWarning


def _rng_state() -> dict[str, Any]:
    kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    state = {
        "python": random.getstate(),
        "numpy": (kind, keys.tolist(), int(pos), int(has_gauss), float(cached)),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: Mapping[str, Any]) -> None:
    random.setstate(state["python"])
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    cuda = state.get("cuda")
    if cuda is not None and torch.cuda.is_available():
        if len(cuda) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda)
        else:
            warnings.warn(
                f"checkpoint holds CUDA RNG states for {len(cuda)} devices but {torch.cuda.device_count()} "
                "are visible; CUDA RNG not restored",
                CheckpointWarning,
                stacklevel=3,
            )
