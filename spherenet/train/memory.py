"""A rough estimate of the memory a training run needs, so that sizes that cannot run are
refused before anything is built or written, with the estimate and what the machine has.

The estimate is a floor-like rough count, meant to tell "clearly impossible" from "may fit":

- states: ``parameters x bytes_per_value x (1 weight + 1 gradient + optimizer_states)``
  (Adam-style methods keep two moments), divided by the number of ranks when the parameters
  are sharded (FSDP);
- activations, per rank and micro-batch of ``tokens = micro_batch x block_size``, what autograd
  keeps for the backward pass: per layer and token ``6 x d_model`` (block inputs, normalized
  and residual values), the queries, keys, values and attention output
  (``(2 x n_heads + 2 x n_kv_heads) x head_dim``), SDPA's log-sum-exp (``n_heads``) and the MLP's
  ``3 x d_mlp`` with SwiGLU (both projections and the gated product) or ``2 x d_mlp`` with the
  squared ReLU; the output layer ``2 x vocab_size`` (logits and their gradient). No ``T x T``
  term: SDPA's fused kernels keep no attention probabilities. With activation checkpointing a
  layer keeps only its input (``d_model``), and one layer at a time is recomputed in full.
  Activations count ``activation_bytes_per_value`` each (2 under bf16 autocast, where the
  matmul outputs are bf16), weights and their states ``bytes_per_value``. The test suite checks
  the count against the tensors autograd saves (``saved_tensors_hooks``): it stays below them.
- tables: the RoPE cos and sin tables of ``max_seq_len x head_dim / 2`` float32 values each,
  built on the first forward pass from as many float64 angles, whatever ``block_size`` is:
  ``8 x max_seq_len x head_dim`` bytes.

:func:`check_run_memory` runs the check for a run's config; with no vocabulary yet (before the
data is prepared) it counts the smallest one, so a size that cannot run is refused before
anything is written or tokenized, and again with the data's vocabulary before the model is built.

Runs are refused only when this estimate exceeds the memory available, so a run that might fit
is never refused; a run under the estimate may still run out of memory.
"""

from __future__ import annotations

import dataclasses
import os

import torch

from spherenet.train.config import ConfigError
from spherenet.train.config import model_config as run_model_config
from spherenet.train.step import autocast_dtype

__all__ = [
    "MemoryEstimate",
    "available_memory",
    "check_run_memory",
    "check_training_memory",
    "estimate_training_memory",
]

GIB = 1024**3


@dataclasses.dataclass(frozen=True)
class MemoryEstimate:
    parameters: int
    state_bytes: int  # weights, gradients and optimizer state, per rank
    activation_bytes: int  # per rank, one micro-batch
    table_bytes: int = 0  # the RoPE tables, per rank

    @property
    def total_bytes(self) -> int:
        return self.state_bytes + self.activation_bytes + self.table_bytes


def estimate_training_memory(
    model_config,
    *,
    micro_batch: int,
    block_size: int,
    shards: int = 1,
    optimizer_states: int = 2,
    bytes_per_value: int = 4,
    activation_bytes_per_value: int | None = None,
    activation_checkpointing: bool = False,
) -> MemoryEstimate:
    """The rough estimate of the module docstring for a model of ``model_config`` (built on the
    meta device, so that no memory is taken to count its parameters; its resolved config gives
    ``d_mlp``, ``n_kv_heads`` and ``head_dim``). ``activation_bytes_per_value`` defaults to
    ``bytes_per_value``."""
    base, per_layer, resolved_config = _parameter_count(model_config)
    parameters = base + model_config.n_layers * per_layer
    state = parameters * bytes_per_value * (2 + optimizer_states) // max(shards, 1)
    c = dataclasses.replace(resolved_config, n_layers=model_config.n_layers)
    mlp_values = (3 if c.mlp == "swiglu" else 2) * c.d_mlp
    attention_values = (2 * c.n_heads + 2 * c.n_kv_heads) * c.head_dim + c.n_heads
    full_layer = 6 * c.d_model + attention_values + mlp_values
    if activation_checkpointing:
        per_token = c.n_layers * c.d_model + full_layer
    else:
        per_token = c.n_layers * full_layer
    if activation_bytes_per_value is None:
        activation_bytes_per_value = bytes_per_value
    activations = micro_batch * block_size * (per_token + 2 * c.vocab_size) * activation_bytes_per_value
    return MemoryEstimate(parameters, state, activations, table_bytes=8 * c.max_seq_len * c.head_dim)


_COUNTS: dict[str, tuple[int, int, object]] = {}  # one-layer config's repr -> _parameter_count


def _parameter_count(model_config) -> tuple[int, int, object]:
    """(parameters outside the blocks, parameters per block, the resolved config): one and two
    layers built on the meta device, the rest by the difference (the blocks are alike), so that
    a model of a million layers is counted as fast as one of two; remembered per config, since a
    build takes a tenth of a second."""
    from spherenet.models import model_from_config

    key = repr(dataclasses.replace(model_config, n_layers=1))
    if key not in _COUNTS:
        with torch.device("meta"):
            one, two = (model_from_config(dataclasses.replace(model_config, n_layers=n)) for n in (1, 2))
        counts = [sum(p.numel() for p in m.parameters()) for m in (one, two)]
        if len(_COUNTS) >= 64:
            _COUNTS.clear()
        _COUNTS[key] = (2 * counts[0] - counts[1], counts[1] - counts[0], one.config)
    return _COUNTS[key]


def available_memory(device: torch.device) -> tuple[int | None, str]:
    """(bytes available for a run on ``device``, where the number comes from); None when this
    platform does not tell. CUDA: the device's free memory (``torch.cuda.mem_get_info``); CPU:
    ``MemAvailable`` of ``/proc/meminfo``, else the available physical pages (``sysconf``)."""
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return free, f"free on {device} (torch.cuda.mem_get_info)"
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024, "MemAvailable in /proc/meminfo"
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), "available physical pages (sysconf)"
    except (AttributeError, ValueError, OSError):
        return None, "unknown"


def check_training_memory(
    model_config, *, device: torch.device, vocabulary_known: bool = True, **sizes
) -> MemoryEstimate:
    """:func:`estimate_training_memory` (``sizes`` are its keywords), compared with
    :func:`available_memory`: ``ConfigError`` in one line giving both when the estimate is
    larger; nothing is checked where the platform tells no number. ``vocabulary_known`` False:
    the config's vocabulary is a floor, and the message says the numbers are lower bounds."""
    estimate = estimate_training_memory(model_config, **sizes)
    have, source = available_memory(device)
    if have is not None and estimate.total_bytes > have:
        at_least, without = ("", "") if vocabulary_known else ("at least ", " before the vocabulary is known")
        raise ConfigError(
            f"this run needs {at_least}an estimated {estimate.total_bytes / GIB:,.1f} GiB per process "
            f"({at_least}{estimate.parameters:,} parameters{without}: {estimate.state_bytes / GIB:,.1f} GiB of weights, gradients and "
            f"optimizer state; {estimate.activation_bytes / GIB:,.1f} GiB of activations for a micro-batch of "
            f"{sizes.get('micro_batch')} x {sizes.get('block_size')} tokens; {estimate.table_bytes / GIB:,.1f} GiB of "
            f"RoPE tables for max_seq_len {model_config.max_seq_len}), but this machine has "
            f"{have / GIB:,.1f} GiB ({source}): make the model, train.batch_size or train.micro_batch_size smaller"
        )
    return estimate


def check_run_memory(cfg, *, device: torch.device, micro_batch: int, world_size: int, vocab_size: int | None = None):
    """:func:`check_training_memory` for the resolved run config ``cfg`` (its model, block size,
    sharding, activation checkpointing and autocast dtype). ``vocab_size`` None: the one ``[model]``
    sets, else 1, a floor that lets the check run before the data and its vocabulary exist."""
    t = cfg.train
    model_config = run_model_config(cfg, vocab_size or 1)
    return check_training_memory(
        model_config,
        device=device,
        vocabulary_known=vocab_size is not None or model_config.vocab_size > 1,
        micro_batch=micro_batch,
        block_size=t.block_size,
        shards=world_size if t.parallel == "fsdp" else 1,
        activation_checkpointing=t.activation_checkpointing,
        activation_bytes_per_value=(autocast_dtype(t.autocast, device) or torch.float32).itemsize,
    )
