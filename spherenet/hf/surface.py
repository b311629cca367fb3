"""The parts of transformers' model API that spherenet's causal LM classes give their own meaning
(:mod:`spherenet.hf.modeling` mixes :class:`SpherenetModelSurface` in): gradient checkpointing
is spherenet's activation checkpointing, ``resize_token_embeddings`` keeps nGPT's embeddings on
the sphere, attention is SDPA only, ``generate`` slides past the context as spherenet's own
:func:`spherenet.models.generation.generate` does, ``num_parameters`` counts as transformers does, and
nGPT's sphere weights are renormalized after every optimizer step, with a training forward that
warns (once) when they are off the sphere anyway.
"""

from __future__ import annotations

import dataclasses
import math
import warnings

import torch
from torch import nn

from ..io import off_sphere
from ..layers import Scale, SphereEmbedding, SphereLinear
from ..manifolds import named_sphere_parameters
from ..optim import normalize_

__all__ = ["SpherenetModelSurface", "SUPPORTED_ATTENTION", "check_attn_implementation"]

#: the attention implementations the models run (PyTorch's fused scaled_dot_product_attention)
SUPPORTED_ATTENTION = ("sdpa",)


def check_attn_implementation(value, owner: str) -> None:
    """Refuse, in one line naming it, an ``attn_implementation`` other than SDPA (or unset)."""
    if value is not None and value not in SUPPORTED_ATTENTION:
        raise ValueError(
            f"{owner}: attn_implementation={value!r} is not supported; its attention is PyTorch's fused SDPA "
            f"(torch.nn.functional.scaled_dot_product_attention): pass attn_implementation='sdpa' or leave it unset"
        )


class SpherenetModelSurface:
    """Methods of :class:`~spherenet.hf.SpherenetNGPTForCausalLM` and ``...GPTForCausalLM``
    that transformers users call (mixed in before ``PreTrainedModel``)."""

    #: a training forward checks the sphere weights every so many calls (see :meth:`_watch_sphere`)
    sphere_check_every = 10

    # ---- activation (gradient) checkpointing: spherenet's

    def activation_checkpointing_enable(
        self, activation_checkpointing_kwargs: dict | None = None, every_n_layers: int = 1, offload: bool = False
    ) -> None:
        """Turn on spherenet's activation checkpointing
        (:meth:`spherenet.models.common.LanguageModel.set_activation_checkpointing`: non-reentrant
        ``torch.utils.checkpoint``; same loss and gradients, less activation memory) on every
        ``every_n_layers``-th block. What ``TrainingArguments(gradient_checkpointing=True)``
        calls. Training forwards then keep no KV cache. ``activation_checkpointing_kwargs``: only
        ``{"use_reentrant": False}`` (what it is); ``offload`` is not supported."""
        given = dict(activation_checkpointing_kwargs or {})
        if given.pop("use_reentrant", False) or given:
            raise ValueError(
                f"activation checkpointing kwargs {activation_checkpointing_kwargs!r} are not supported: spherenet's "
                "activation checkpointing is non-reentrant (use_reentrant=False) and takes no other option"
            )
        if isinstance(every_n_layers, bool) or not isinstance(every_n_layers, int) or every_n_layers < 1:
            raise ValueError(f"every_n_layers must be an int >= 1, got {every_n_layers!r}")
        if offload:
            raise ValueError("offload=True is not supported: spherenet's activation checkpointing keeps its inputs on the device")  # fmt: skip  # one message a line
        self.spherenet_model.set_activation_checkpointing(True, every_n_layers)

    def activation_checkpointing_disable(self) -> None:
        """Turn spherenet's activation checkpointing off."""
        self.spherenet_model.set_activation_checkpointing(False)

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs: dict | None = None, **kwargs) -> None:
        """transformers' older name of :meth:`activation_checkpointing_enable`."""
        self.activation_checkpointing_enable(gradient_checkpointing_kwargs, **kwargs)

    def gradient_checkpointing_disable(self) -> None:
        """transformers' older name of :meth:`activation_checkpointing_disable`."""
        self.activation_checkpointing_disable()

    @property
    def is_gradient_checkpointing(self) -> bool:
        return bool(self.spherenet_model.activation_checkpointing)

    def _checkpointed_blocks(self) -> int:
        """Every how many blocks this forward recomputes in backward (training, gradients
        enabled); 0: none."""
        if self.is_gradient_checkpointing and self.training and torch.is_grad_enabled():
            return self.spherenet_model.checkpoint_every
        return 0

    # ---- attention implementation: SDPA only

    def set_attn_implementation(self, attn_implementation, *args, **kwargs) -> None:
        """Only SDPA runs here: another implementation is refused by name."""
        value = attn_implementation.get("", None) if isinstance(attn_implementation, dict) else attn_implementation
        check_attn_implementation(value, type(self).__name__)
        self.config._attn_implementation = "sdpa"

    # ---- vocabulary

    def num_parameters(self, only_trainable: bool = False, exclude_embeddings: bool = False) -> int:
        """transformers' count of the parameters (``only_trainable``: those that require
        gradients); ``exclude_embeddings`` leaves out the input embedding's, as transformers does
        for its models' ``nn.Embedding`` (nGPT's is a :class:`~spherenet.layers.SphereEmbedding`,
        which transformers would count)."""
        embedding = {id(p) for p in self.get_input_embeddings().parameters()} if exclude_embeddings else set()
        return sum(
            p.numel() for p in self.parameters() if id(p) not in embedding and (p.requires_grad or not only_trainable)
        )

    def resize_token_embeddings(
        self, new_num_tokens: int | None = None, pad_to_multiple_of: int | None = None, mean_resizing: bool = True
    ) -> nn.Module:
        """Give the model ``new_num_tokens`` tokens (rounded up to ``pad_to_multiple_of``);
        returns the input embedding. The first ``min(old, new)`` tokens keep their rows (their
        logits do not change); new rows are initialized as the model initializes them: for nGPT
        random unit rows of E_input and E_output (Section 2.6) and s_z at its initial value, for
        GPT Normal(0, init_std). ``mean_resizing`` (transformers' mean of the old rows) does not
        apply: a mean of unit rows is not a unit row. ``config.vocab_size`` follows."""
        model = self.spherenet_model
        if new_num_tokens is None:
            return self.get_input_embeddings()
        if isinstance(new_num_tokens, bool) or not isinstance(new_num_tokens, int) or new_num_tokens < 1:
            raise ValueError(f"resize_token_embeddings: new_num_tokens must be an int >= 1, got {new_num_tokens!r}")
        if pad_to_multiple_of is not None:
            if (
                isinstance(pad_to_multiple_of, bool)
                or not isinstance(pad_to_multiple_of, int)
                or pad_to_multiple_of < 1
            ):
                raise ValueError(f"resize_token_embeddings: pad_to_multiple_of must be an int >= 1, got {pad_to_multiple_of!r}")  # fmt: skip  # one message a line
            new_num_tokens = math.ceil(new_num_tokens / pad_to_multiple_of) * pad_to_multiple_of
        old_num_tokens = model.config.vocab_size
        if new_num_tokens == old_num_tokens:
            return self.get_input_embeddings()
        for name, new in _vocab_modules(model, new_num_tokens).items():
            old = getattr(self, name)
            old_params = dict(old.named_parameters())
            if not old_params:
                continue  # a constant scaling (s_z of mode "constant"): no vocabulary rows
            like = next(iter(old_params.values()))
            new.to(device=like.device, dtype=like.dtype)
            with torch.no_grad():
                for param_name, param in new.named_parameters():
                    kept = min(old_num_tokens, new_num_tokens)
                    if param.shape[0] == new_num_tokens and old_params[param_name].shape[0] == old_num_tokens:
                        param[:kept].copy_(old_params[param_name][:kept])
                    else:  # a scaling of one element (s_z as a scalar): the same
                        param.copy_(old_params[param_name])
            new.train(old.training)
            self.add_module(name, new)
        model.config = dataclasses.replace(model.config, vocab_size=new_num_tokens)
        self.config.vocab_size = new_num_tokens
        return self.get_input_embeddings()

    # ---- generation past the context

    def prepare_inputs_for_generation(self, input_ids, next_sequence_length=None, cache=None, **kwargs):
        """transformers' inputs of one generation step, sliding past the context as spherenet's
        :func:`~spherenet.models.generation.generate` does: when the cached and new tokens would pass
        ``max_seq_len``, the cache is emptied and the last ``max_seq_len`` tokens are run again at
        positions 0 .. max_seq_len - 1 (a prompt longer than the context keeps its last
        ``max_seq_len`` tokens)."""
        window = self.config.max_seq_len
        past = 0 if cache is None else cache.get_seq_length()
        n_new = input_ids.shape[1] - past if next_sequence_length is None else next_sequence_length
        if past + n_new > window and kwargs.get("inputs_embeds") is None:
            if past:
                cache.reset()  # rebuilt from the window below, as spherenet's generate rebuilds its KVCache
            next_sequence_length = min(window, input_ids.shape[1])
            mask = kwargs.get("attention_mask")
            if mask is not None:
                kwargs["attention_mask"] = mask[:, -next_sequence_length:]
            kwargs.pop("position_ids", None)  # counted again from the window's mask
        return super().prepare_inputs_for_generation(
            input_ids, next_sequence_length=next_sequence_length, cache=cache, **kwargs
        )

    # ---- the sphere during training

    def sphere_weights(self) -> dict[str, torch.Tensor]:
        """``{name: parameter}`` of the weights declared on the unit sphere (nGPT's; GPT has none)."""
        return dict(named_sphere_parameters(self))

    def normalize_sphere_weights_(self) -> None:
        """Put every sphere weight back on the unit sphere, in place: :func:`spherenet.optim.normalize_`
        (``W <- Norm(W)`` along the embedding dimension, Section 2.6 step 2). The model runs it after
        every step of a torch optimizer that holds one of them
        (:func:`spherenet.hf.portable.guards_spherenet.keep_on_sphere`)."""
        normalize_(self)

    @torch.compiler.disable  # a counter torch.compile would guard on, recompiling at every call
    def _watch_sphere(self) -> None:
        """Warn once per model (a ``UserWarning``) when a training forward finds sphere weights
        off the sphere: changed other than by an optimizer step (after every one of which
        :meth:`normalize_sphere_weights_` runs), by hand or by an optimizer that is not a
        ``torch.optim.Optimizer``. Checked every :attr:`sphere_check_every` training forwards:
        one read of the sphere weights (a forward and backward read them three times) and one host
        synchronization, so under a tenth of a training step's weight traffic; an inference
        forward (eval mode or no gradients) never checks, and logits never change."""
        if self.__dict__.get("_sphere_warned") or not (self.training and torch.is_grad_enabled()):
            return
        calls = self.__dict__.get("_training_forwards", 0) + 1
        self.__dict__["_training_forwards"] = calls
        if calls % self.sphere_check_every == 0:
            self._warn_if_off_sphere()

    def _warn_if_off_sphere(self) -> None:
        named = self.sphere_weights()
        found = off_sphere(named.items())
        if found is None:
            return
        count, name, error, _ = found
        self.__dict__["_sphere_warned"] = True
        warnings.warn(
            f"{type(self).__name__}: {count} of its {len(named)} sphere weights have left the unit sphere during "
            f"training (|row norm - 1| up to {error:.3g} in {name!r}): they were changed other than by an optimizer "
            "step (after each of which the model renormalizes them, Section 2.6), so the model is no longer an nGPT "
            "and save_pretrained will refuse it; put them back with model.normalize_sphere_weights_()",
            UserWarning,
            stacklevel=4,
        )


def _vocab_modules(model: nn.Module, vocab_size: int) -> dict[str, nn.Module]:
    """The vocabulary-sized modules of spherenet's ``model`` built anew for ``vocab_size``
    tokens, initialized as the model initializes them."""
    c = model.config
    if model.model_type == "ngpt":
        return {
            "embed_in": SphereEmbedding(vocab_size, c.d_model),  # random unit rows
            "embed_out": SphereLinear(c.d_model, vocab_size, sphere="in"),
            "s_z": Scale.from_spec(vocab_size, c.s_z, c.d_model),
        }
    modules = {
        "embed_in": nn.Embedding(vocab_size, c.d_model),
        "embed_out": nn.Linear(c.d_model, vocab_size, bias=False),
    }
    with torch.no_grad():
        for module in modules.values():
            nn.init.normal_(module.weight, mean=0.0, std=c.init_std)  # GPT.init_weights
    return modules
