"""KV-cached generation for the language models (:class:`GenerationMixin`, which NGPT and GPT
inherit): sampling with a temperature and top-k, stopping on an end token or a callback, sliding
past the context."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from ..layers import KVCache
from .common import check_input_ids

__all__ = ["GenerationMixin", "generate", "sample_next_token", "check_token_ids"]


class GenerationMixin:
    """``generate`` for a :class:`~spherenet.models.common.LanguageModel`."""

    def generate(
        self,
        input_ids: torch.Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        generator: torch.Generator | None = None,
        eos_token_id: int | None = None,
        stop: Callable[[torch.Tensor], bool] | None = None,
    ) -> torch.Tensor:
        """Sample up to ``max_new_tokens`` tokens after ``input_ids`` with a KV cache, sliding
        past the context; see :func:`generate`."""
        return generate(self, input_ids, max_new_tokens, temperature, top_k, generator, eos_token_id, stop)


def sample_next_token(
    logits: torch.Tensor,
    temperature: float = 1.0,
    top_k: int | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Pick one token per row of ``logits`` (shape ``(B, V)``); returns ``(B, 1)`` long.

    ``temperature == 0`` is greedy (argmax). Otherwise logits are divided by ``temperature``,
    restricted to the ``top_k`` largest when given, and sampled with ``generator``. ``top_k=1``
    is greedy too.
    """
    logits = logits.float()
    if temperature == 0 or top_k == 1:
        return logits.argmax(dim=-1, keepdim=True)
    logits = logits / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth_largest = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth_largest, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    return torch.multinomial(probs, num_samples=1, generator=generator)


@torch.no_grad()
def generate(
    model: nn.Module,
    input_ids: torch.Tensor,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    generator: torch.Generator | None = None,
    eos_token_id: int | None = None,
    stop: Callable[[torch.Tensor], bool] | None = None,
) -> torch.Tensor:
    """Append up to ``max_new_tokens`` sampled tokens to ``input_ids`` (``(B, T)``); returns
    ``(B, T + n)``, ``n <= max_new_tokens``.

    The prompt is run once and the keys/values of every layer kept in a :class:`KVCache`; each
    new token then costs one forward pass of length 1. Past ``max_seq_len`` the window slides:
    each new token is predicted from the last ``max_seq_len`` tokens alone (at positions 0 ..
    max_seq_len - 1), the cache rebuilt from them, so the result is that of cropping and
    running the model again at every step (what the tests check). A prompt longer than the
    context keeps its last ``max_seq_len`` tokens as context.

    Stops early when every row has produced ``eos_token_id`` (a row that did goes on with
    ``eos_token_id``), or when ``stop(ids)`` (the ids so far) returns True. ``model`` is an NGPT
    or GPT (anything with ``config``, ``blocks`` and ``forward(ids, kv_caches=..., logits_to_keep=...)``).
    """
    config = model.config
    if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
    if not (isinstance(temperature, (int, float)) and math.isfinite(temperature) and temperature >= 0):
        raise ValueError(f"temperature must be a finite number >= 0, got {temperature!r}")
    if top_k is not None and (not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 1):
        raise ValueError(f"top_k must be None or an int >= 1, got {top_k!r}")
    if eos_token_id is not None and not 0 <= eos_token_id < config.vocab_size:
        raise ValueError(f"eos_token_id must be in [0, vocab_size={config.vocab_size}), got {eos_token_id!r}")
    if not config.causal:
        raise ValueError("generate needs a causal model; this one was built with causal=False")
    check_input_ids(input_ids, math.inf)  # type and shape; any length (the window slides)
    window = config.max_seq_len
    check_token_ids(input_ids, config.vocab_size)  # the prompt: an error naming the id, on any device
    ids = input_ids.clone()
    finished = torch.zeros(ids.shape[0], dtype=torch.bool, device=ids.device)
    caches, logits = None, None
    for _ in range(max_new_tokens):
        if caches is None or len(caches[0]) >= window:
            caches = [KVCache() for _ in model.blocks]  # (re)build from the last `window` tokens
            logits = model(ids[:, -window:], kv_caches=caches, logits_to_keep=1)[:, -1, :]  # the last position only
        next_ids = sample_next_token(logits, temperature, top_k, generator).to(ids.dtype)
        if eos_token_id is not None:
            next_ids = torch.where(finished[:, None], eos_token_id, next_ids)
            finished |= next_ids[:, 0] == eos_token_id
        ids = torch.cat([ids, next_ids], dim=1)
        if (eos_token_id is not None and bool(finished.all())) or (stop is not None and stop(ids)):
            break
        if len(caches[0]) < window:
            logits = model(next_ids, kv_caches=caches)[:, -1, :]
    return ids


def check_token_ids(input_ids: torch.Tensor, vocab_size: int) -> None:
    """Raise ``IndexError`` naming the first id of ``input_ids`` outside ``[0, vocab_size)``.

    Reads the ids on the host (a device synchronization on a GPU): for where ids enter, such
    as a prompt, not for every forward.
    """
    bad = (input_ids < 0) | (input_ids.long() >= vocab_size)
    if bad.any():
        where = tuple(int(i) for i in bad.nonzero()[0])
        low, high = int(input_ids.min()), int(input_ids.max())
        raise IndexError(
            f"token id out of vocabulary: id {int(input_ids[where])} at position {where} is not in "
            f"[0, vocab_size={vocab_size}) (ids span [{low}, {high}])"
        )
