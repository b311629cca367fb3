"""Appendix A.7 and Fig. 13 of the nGPT paper: validation loss beyond the training context."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ._model_access import _family, _unwrap


def with_max_seq_len(model: nn.Module, max_seq_len: int) -> nn.Module:
    """A copy of ``model`` whose config allows sequences of ``max_seq_len`` tokens.

    Neither model has learned positions: RoPE (shared by all blocks) computes its rotation
    angles for any position, and ``max_seq_len`` only bounds the accepted input length. So the
    same state dict loads, unchanged, into a model built from the config with a larger
    ``max_seq_len`` (``strict=True``: an error if any tensor were missing or extra). The copy
    is on the original's device and dtype, in eval mode; the original is not touched.
    """
    from ..models import model_from_config

    model = _unwrap(model)
    _family(model)
    if not isinstance(max_seq_len, int) or max_seq_len < 1:
        raise ValueError(f"max_seq_len must be a positive int, got {max_seq_len!r}")
    config = dataclasses.replace(model.config, max_seq_len=max_seq_len)
    param = next(model.parameters())
    with torch.random.fork_rng(devices=[]):  # the throw-away init must not move the caller's RNG
        copy = model_from_config(config)
    copy.to(device=param.device, dtype=param.dtype)
    copy.load_state_dict(model.state_dict(), strict=True)
    return copy.eval()


def _token_array(tokens: Any) -> np.ndarray:
    """A 1-D integer array from a numpy array, a torch tensor, a TokenWindows, or a
    PreparedData (its validation split)."""
    if hasattr(tokens, "tokens") and callable(tokens.tokens):  # PreparedData
        tokens = tokens.tokens("val")
    elif hasattr(tokens, "tokens") and hasattr(tokens, "eval_batches"):  # TokenWindows
        tokens = tokens.tokens
    if isinstance(tokens, torch.Tensor):
        tokens = tokens.detach().cpu().numpy()
    arr = np.asarray(tokens)
    if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"tokens must be a 1-D integer array of token ids, got dtype {arr.dtype}, shape {arr.shape}")
    return arr


@torch.no_grad()
def length_extrapolation(
    model: nn.Module,
    tokens: Any,
    block_size: int,
    factors: Sequence[int] = (1, 2, 4),
    *,
    batches: int = 4,
    batch_size: int = 8,
    device: str | torch.device | None = None,
) -> dict[str, Any]:
    """Validation loss at contexts ``f * block_size`` for each ``f`` in ``factors`` (Appendix
    A.7, Fig. 13: the paper reports PG19 perplexity from 1k to 32k tokens).

    ``tokens``: the validation token ids (a 1-D array or tensor, a
    :class:`~spherenet.data.TokenWindows`, or a :class:`~spherenet.data.PreparedData`, whose
    ``val`` split is used). ``block_size``: the training context.

    Every factor scores **the same tokens**: the first ``span`` targets of ``tokens``, where
    ``span`` is ``batches * batch_size * block_size`` rounded down to a multiple of
    ``max(factors) * block_size`` (and shortened to what ``tokens`` holds). At factor ``f`` they
    are cut into consecutive windows of ``f * block_size`` tokens, so only the context available
    to each prediction differs. Batches hold ``max(1, batch_size // f)`` windows (constant
    memory per forward).

    The model is evaluated through :func:`with_max_seq_len` when the longest context exceeds its
    ``max_seq_len`` (a copy; the given model's weights, config and mode stay as they were).

    Returns ``block_size``, ``factors``, ``contexts``, ``tokens`` (= ``span``), ``loss`` (mean
    next-token cross entropy per factor, float64 array), ``perplexity`` and ``loss_by_segment``:
    for each factor, the mean loss over positions ``[k b, (k+1) b)`` of the windows, ``k < f``
    (positions past ``block_size`` were never seen in training; with equal token counts per
    segment their mean is ``loss``).
    """
    inner = _unwrap(model)
    _family(inner)
    if not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size must be a positive int, got {block_size!r}")
    factors = [int(f) for f in factors]
    if not factors or any(f < 1 for f in factors):
        raise ValueError(f"factors must be positive ints, got {factors!r}")
    if batches < 1 or batch_size < 1:
        raise ValueError(f"batches and batch_size must be >= 1, got {batches}, {batch_size}")
    arr = _token_array(tokens)
    longest = max(factors) * block_size
    budget = batches * batch_size * block_size
    span = (min(budget, len(arr) - 1) // longest) * longest
    if span == 0:
        span = longest if len(arr) - 1 >= longest else 0
    if span == 0:
        raise ValueError(
            f"length_extrapolation needs at least {longest + 1} tokens (one window of "
            f"{max(factors)} x {block_size}), got {len(arr)}"
        )
    if arr.size and int(arr[: span + 1].max()) >= inner.config.vocab_size:
        raise ValueError(f"tokens hold ids >= the model's vocab_size {inner.config.vocab_size}")

    param = next(inner.parameters())
    device = param.device if device is None else torch.device(device)
    if longest <= inner.config.max_seq_len and device == param.device:
        runner = inner  # evaluated in place (eval mode, restored below)
    else:  # a copy: longer context and/or another device
        runner = with_max_seq_len(inner, max(longest, inner.config.max_seq_len)).to(device)
    was_training = inner.training
    runner.eval()

    data = torch.from_numpy(arr[: span + 1].astype(np.int64))
    losses, segments = [], []
    try:
        for f in factors:
            length = f * block_size
            n_windows = span // length
            starts = torch.arange(n_windows) * length
            per_pos = torch.zeros(length, dtype=torch.float64)
            per_batch = max(1, batch_size // f)
            for i in range(0, n_windows, per_batch):
                idx = starts[i : i + per_batch, None] + torch.arange(length + 1)
                window = data[idx].to(device)
                logits = runner(window[:, :-1])
                loss = F.cross_entropy(logits.float().flatten(0, 1), window[:, 1:].flatten(), reduction="none")
                per_pos += loss.view(-1, length).double().sum(0).cpu()
            per_pos /= n_windows
            losses.append(float(per_pos.mean()))
            segments.append(per_pos.view(f, block_size).mean(1).numpy())
    finally:
        if runner is inner:
            inner.train(was_training)
    loss = np.asarray(losses)
    return {
        "block_size": block_size,
        "factors": factors,
        "contexts": [f * block_size for f in factors],
        "tokens": int(span),
        "loss": loss,
        "perplexity": np.exp(loss),
        "loss_by_segment": segments,
    }
