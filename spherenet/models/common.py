"""What NGPT and GPT share: the model's scaffolding (:class:`LanguageModel`: embedding, stack of
blocks, KV caches, activation checkpointing) and the input checks. KV-cached generation is
:mod:`spherenet.models.generation`'s."""

from __future__ import annotations

import functools

import torch
from torch import nn

from .. import kernels
from ..layers import RotaryEmbedding
from ..manifolds.geodesic import peek_transform
from .hub import HubMixin

__all__ = [
    "LanguageModel",
    "check_input_ids",
    "check_inputs_embeds",
    "check_positions",
    "assert_ids_in_vocab",
]


class LanguageModel(nn.Module, HubMixin):
    """A decoder-only language model: ``h = embed_in(ids)``, ``h <- block(h)`` for each of
    ``config.n_layers`` blocks (``block_class(config, rope)``, sharing one stateless
    :class:`RotaryEmbedding`), then ``logits(h)``: each subclass (NGPT, GPT) builds its output
    layers after this ``__init__`` and defines ``logits``, the last hidden state ``(B, T,
    d_model)`` -> logits ``(B, T, vocab_size)``."""

    def __init__(self, config, embed_in: nn.Module, block_class: type[nn.Module]):
        super().__init__()
        self.config = c = config
        self.embed_in = embed_in
        self.rope = RotaryEmbedding(c.head_dim, c.rope_base, initial_length=c.max_seq_len)
        self.blocks = nn.ModuleList(block_class(c, self.rope) for _ in range(c.n_layers))
        self.activation_checkpointing = False  # set_activation_checkpointing
        self.checkpoint_every = 1

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        kv_caches: list | None = None,
        *,
        inputs_embeds: torch.Tensor | None = None,
        attn_mask: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
        hidden_states: list | None = None,
        logits_to_keep: int | torch.Tensor = 0,
    ) -> torch.Tensor:
        """Token ids ``(B, T)`` (or their embeddings ``inputs_embeds``, ``(B, T, d_model)``) ->
        logits ``(B, T, vocab_size)``.

        - ``kv_caches``: one cache per block (a :class:`KVCache`, or anything with ``length`` and
          ``append(keys, values)``), for incremental decoding; the new tokens are then at
          positions ``cache length .. cache length + T - 1``.
        - ``attn_mask``: SDPA's mask ``(B, 1, T, keys)`` (True: may attend), e.g. padding;
          combined with the causal mask.
        - ``positions``: RoPE's positions ``(B, T)`` (or ``(1, T)``) instead: per row, for a
          padded batch.
        - ``hidden_states``: a list the input embedding and each block's output are appended to.
        - ``logits_to_keep``: logits of only the last so many positions (0: all), or of the
          positions a 1-d index tensor names.

        With activation checkpointing on (:meth:`set_activation_checkpointing`), a forward with
        gradients and no caches recomputes every ``checkpoint_every``-th block in backward.
        """
        h = self._embed(input_ids, inputs_embeds, kv_caches)
        if positions is not None:
            check_positions(positions, h.shape[0], h.shape[1], self.config.max_seq_len)
        caches = kv_caches if kv_caches is not None else [None] * len(self.blocks)
        checkpointed = self.activation_checkpointing and kv_caches is None and torch.is_grad_enabled()
        if hidden_states is not None:
            hidden_states.append(h)
        for layer, (block, cache) in enumerate(zip(self.blocks, caches)):
            if checkpointed and layer % self.checkpoint_every == 0:  # keep h only; recompute in backward
                h = kernels.checkpoint(functools.partial(block, attn_mask=attn_mask, positions=positions), h)
            else:
                h = block(h, cache=cache, attn_mask=attn_mask, positions=positions)
            if hidden_states is not None:
                hidden_states.append(h)
        if not isinstance(logits_to_keep, int) or logits_to_keep:
            h = h[:, slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep]
        return self.logits(h)

    def _embed(self, input_ids, inputs_embeds, kv_caches) -> torch.Tensor:
        """The checked input as hidden states ``(B, T, d_model)``: ``E_in[ids]`` or ``inputs_embeds``."""
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of input_ids and inputs_embeds")
        if kv_caches is not None and len(kv_caches) != len(self.blocks):
            raise ValueError(f"kv_caches has {len(kv_caches)} entries, the model has {len(self.blocks)} blocks")
        c = self.config
        if inputs_embeds is not None:
            check_inputs_embeds(inputs_embeds, c.d_model)
            return inputs_embeds
        check_input_ids(input_ids, c.max_seq_len, 0 if kv_caches is None else kv_caches[0].length)
        assert_ids_in_vocab(input_ids, c.vocab_size)  # device-side: no host sync
        return self.embed_in(input_ids)

    def get_input_embeddings(self) -> nn.Module:
        """``embed_in`` (the Hugging Face name for the input embedding)."""
        return self.embed_in

    def get_output_embeddings(self) -> nn.Module:
        """``embed_out``, the output layer (the Hugging Face name; Muon leaves it to Adam)."""
        return self.embed_out

    def set_activation_checkpointing(self, enabled: bool = True, every_n_layers: int = 1) -> None:
        """Activation checkpointing per block: in training forwards (gradients enabled, no KV
        caches) each ``every_n_layers``-th block keeps only its input for the backward pass and
        recomputes its forward there (``torch.utils.checkpoint``, non-reentrant: works under DDP,
        FSDP2 and ``torch.compile``). Same loss and gradients, less activation memory, one more
        forward."""
        if isinstance(every_n_layers, bool) or not isinstance(every_n_layers, int) or every_n_layers < 1:
            raise ValueError(f"every_n_layers must be an int >= 1, got {every_n_layers!r}")
        self.activation_checkpointing = bool(enabled)
        self.checkpoint_every = every_n_layers


# ---------------------------------------------------------------------------------------------
# Input checks


def _is_integer(t: torch.Tensor) -> bool:
    return not (t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool)


def check_input_ids(input_ids: torch.Tensor, max_seq_len: int, offset: int = 0) -> None:
    """Token ids must be an integer tensor of shape ``(B, T)`` with ``T >= 1`` and
    ``offset + T <= max_seq_len`` (``offset``: tokens already cached).

    Metadata only, so no device synchronization: the ids' values are checked by
    :func:`assert_ids_in_vocab` (every forward) or, where ids enter,
    :func:`spherenet.models.generation.check_token_ids`.
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


def check_inputs_embeds(inputs_embeds: torch.Tensor, d_model: int) -> None:
    """Input embeddings must be a tensor of shape ``(B, T, d_model)``."""
    if not isinstance(inputs_embeds, torch.Tensor) or inputs_embeds.ndim != 3 or inputs_embeds.shape[-1] != d_model:
        shape = tuple(inputs_embeds.shape) if isinstance(inputs_embeds, torch.Tensor) else type(inputs_embeds).__name__
        raise ValueError(f"inputs_embeds must have shape (batch, seq_len, {d_model}), got {shape}")


def check_positions(positions: torch.Tensor, batch: int, n_new: int, max_seq_len: int) -> None:
    """RoPE positions must have shape ``(batch, n_new)`` (or ``(1, n_new)``) and stay below
    ``max_seq_len`` (reads their maximum on the host: given positions only)."""
    if positions.ndim != 2 or positions.shape[-1] != n_new or positions.shape[0] not in (1, batch):
        raise ValueError(f"positions (position_ids) must have shape (batch, {n_new}), got {tuple(positions.shape)}")
    if positions.numel() and int(positions.max()) >= max_seq_len:
        raise ValueError(f"position {int(positions.max())} is past the model's context, max_seq_len={max_seq_len}")


def assert_ids_in_vocab(input_ids: torch.Tensor, vocab_size: int) -> None:
    """Assert every id is in ``[0, vocab_size)`` without reading the ids on the host.

    A device-side assertion (:func:`torch._assert_async`; compiled code keeps it): on CPU a bad
    id raises ``RuntimeError`` at once; on CUDA it is a device-side assert, reported at the next
    synchronization. Where ids enter (the data loader, a prompt to ``generate``) they are checked
    on the host with an error naming the id (``spherenet.models.generation.check_token_ids``).
    """
    if peek_transform() is not None:  # a torch.func transform: vmap has no batching rule for the
        return  # assertion, compiled or not; the embedding lookup still refuses an id outside the table
    ids = input_ids.long()  # a narrower integer dtype would wrap the comparison with vocab_size
    in_vocab = ((ids >= 0) & (ids < vocab_size)).all()
    torch._assert_async(in_vocab, f"token id out of vocabulary: every id must be in [0, vocab_size={vocab_size})")
