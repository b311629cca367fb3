"""What NGPT and GPT share: config checks, input checks, and KV-cached generation."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from ..layers import KVCache

__all__ = ["generate", "sample_next_token", "check_input_ids", "assert_ids_in_vocab", "check_token_ids"]


# ---------------------------------------------------------------------------------------------
# Config checks (each error names the config class, the field and the value)


def check_positive_int(config, name: str) -> None:
    value = getattr(config, name)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{type(config).__name__}.{name} must be a positive int, got {value!r}")


def check_positive_field(config, name: str, allow_none: bool = False) -> None:
    """``config.<name>`` is a finite number > 0 (or None with ``allow_none``); the error names the field."""
    value = getattr(config, name)
    if value is None and allow_none:
        return
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0
    if not ok:
        raise ValueError(f"{type(config).__name__}.{name} must be a finite number > 0, got {value!r}")


def check_choice(config, name: str, choices) -> None:
    value = getattr(config, name)
    if value not in choices:
        raise ValueError(f"{type(config).__name__}.{name} must be one of {tuple(choices)}, got {value!r}")


def check_bool(config, name: str) -> None:
    value = getattr(config, name)
    if not isinstance(value, bool):
        raise ValueError(f"{type(config).__name__}.{name} must be True or False, got {value!r}")


def check_transformer_shape(config) -> None:
    """Sizes positive, ``d_mlp`` resolved (None -> 4 d_model), heads that divide d_model into
    even head dims (RoPE rotates pairs)."""
    name = type(config).__name__
    for field in ("vocab_size", "n_layers", "d_model", "n_heads", "max_seq_len"):
        check_positive_int(config, field)
    if config.d_mlp is None:
        config.d_mlp = 4 * config.d_model
    check_positive_int(config, "d_mlp")
    if config.d_model % config.n_heads:
        raise ValueError(f"{name}: d_model={config.d_model} is not divisible by n_heads={config.n_heads}")
    head_dim = config.d_model // config.n_heads
    if head_dim % 2:
        raise ValueError(
            f"{name}: head dim d_model/n_heads = {config.d_model}/{config.n_heads} = {head_dim} is odd; "
            "RoPE rotates pairs of coordinates and needs an even head dim"
        )
    check_positive_field(config, "rope_base")
    check_bool(config, "causal")


# ---------------------------------------------------------------------------------------------
# Input checks


def _is_integer(t: torch.Tensor) -> bool:
    return not (t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool)


def check_input_ids(input_ids: torch.Tensor, max_seq_len: int, offset: int = 0) -> None:
    """Token ids must be an integer tensor of shape ``(B, T)`` with ``T >= 1`` and
    ``offset + T <= max_seq_len`` (``offset``: tokens already cached).

    Metadata only, so no device synchronization: the ids' values are checked by
    :func:`assert_ids_in_vocab` (every forward) or :func:`check_token_ids` (where ids enter).
    """
    if not isinstance(input_ids, torch.Tensor):
        raise TypeError(f"input_ids must be a torch.Tensor of token ids, got {type(input_ids).__name__}")
    if not _is_integer(input_ids):
        raise TypeError(f"input_ids must be an integer tensor (e.g. torch.long), got dtype {input_ids.dtype}")
    if input_ids.ndim != 2:
        raise ValueError(
            f"input_ids must have shape (batch, seq_len), got {input_ids.ndim} dims: {tuple(input_ids.shape)}"
        )
    seq_len = input_ids.shape[1]
    if seq_len < 1:
        raise ValueError(f"input_ids must hold at least one token per sequence, got shape {tuple(input_ids.shape)}")
    if offset + seq_len > max_seq_len:
        cached = f" after {offset} cached tokens" if offset else ""
        raise ValueError(f"sequence length {seq_len}{cached} exceeds max_seq_len={max_seq_len}")


def assert_ids_in_vocab(input_ids: torch.Tensor, vocab_size: int) -> None:
    """Assert every id is in ``[0, vocab_size)`` without reading the ids on the host.

    A device-side assertion (:func:`torch._assert_async`; compiled code keeps it): on CPU a bad
    id raises ``RuntimeError`` at once; on CUDA it is a device-side assert, reported at the next
    synchronization. Where ids enter (the data loader, :func:`generate`'s prompt) they are
    checked on the host with an error naming the id (:func:`check_token_ids`).
    """
    ids = input_ids.long()  # a narrower integer dtype would wrap the comparison with vocab_size
    in_vocab = ((ids >= 0) & (ids < vocab_size)).all()
    torch._assert_async(in_vocab, f"token id out of vocabulary: every id must be in [0, vocab_size={vocab_size})")


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


# ---------------------------------------------------------------------------------------------
# Generation


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
    or GPT (anything with ``config``, ``blocks`` and ``forward(ids, kv_caches=...)``).
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
            logits = model(ids[:, -window:], kv_caches=caches)[:, -1, :]
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
