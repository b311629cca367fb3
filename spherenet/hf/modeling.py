"""nGPT and GPT as transformers causal language models (``PreTrainedModel`` + ``GenerationMixin``).

Each class holds the modules of spherenet's own model (:class:`spherenet.models.NGPT` /
:class:`spherenet.models.GPT`) under the same names, so that an export's model.safetensors,
written by spherenet's ``save_pretrained``, is its state dict as it is. ``from_pretrained``
loads through spherenet's loader (its checks: tensor names and shapes, unit rows of the sphere
weights) and ``save_pretrained`` writes spherenet's export layout.

The forward pass is that of spherenet's model, with transformers' inputs: a padding
``attention_mask``, per-row ``position_ids`` (by default counted from each row's first real
token, so a left-padded row gives the logits of the row alone), a :class:`transformers.Cache`.
"""

from __future__ import annotations

import os
from typing import ClassVar

import torch
from transformers import DynamicCache, GenerationMixin, PreTrainedModel
from transformers.cache_utils import Cache
from transformers.modeling_outputs import CausalLMOutputWithPast

from ..io import exported_model_type, is_published_directory
from ..models import GPT, NGPT, PretrainedFileError, load_saved
from ..models.common import check_input_ids, check_inputs_embeds
from .configuration import SpherenetGPTConfig, SpherenetNGPTConfig, check_is_export
from .portable.guards_spherenet import keep_on_sphere
from .surface import SpherenetModelSurface, check_attn_implementation

__all__ = ["SpherenetNGPTForCausalLM", "SpherenetGPTForCausalLM", "padding_mask", "positions_from_mask", "sdpa_inputs"]

# from_pretrained's keyword arguments passed on to spherenet's loader
_LOADER_ARGS = (
    "revision",
    "cache_dir",
    "force_download",
    "token",
    "local_files_only",
    "dtype",
    "torch_dtype",
    "device",
    "device_map",
)
# keyword arguments transformers' own callers (Auto classes, pipeline) pass that change nothing here
_IGNORED_ARGS = (
    "trust_remote_code",
    "code_revision",
    "_from_auto",
    "_from_pipeline",
    "_commit_hash",
    "config",
    "proxies",
    "user_agent",
    "adapter_kwargs",
    "subfolder",
)


def positions_from_mask(attention_mask: torch.Tensor, n_new: int) -> torch.Tensor:
    """RoPE positions ``(B, n_new)`` of the last ``n_new`` tokens of ``attention_mask``
    (``(B, K)``, 1 = a real token): each row counts from its own first real token (padding
    tokens get position 0)."""
    counted = attention_mask.long().cumsum(-1) - 1
    return counted.clamp(min=0)[:, -n_new:]


def padding_mask(attention_mask: torch.Tensor, n_queries: int) -> torch.Tensor:
    """SDPA's boolean mask ``(B, 1, n_queries, K)`` (True: may attend) of a padding mask
    ``(B, K)`` whose last ``n_queries`` keys are the queries. Every query also sees itself, so
    that a padding token's row is not empty (some SDPA kernels give NaN for an empty row, and NaN
    times a zero weight is still NaN for the real tokens); the causal mask is the attention's own."""
    n_keys = attention_mask.shape[-1]
    keys = attention_mask.bool()[:, None, None, :]
    query_index = torch.arange(n_keys - n_queries, n_keys, device=attention_mask.device)
    itself = torch.arange(n_keys, device=attention_mask.device)[None, :] == query_index[:, None]
    return keys | itself


def sdpa_inputs(attention_mask, position_ids, past: int, batch: int, n_new: int, device):
    """transformers' padding ``attention_mask`` ``(B, past + n_new)`` (or None) and
    ``position_ids`` as spherenet's ``attn_mask`` (None when nothing is padded: the causal mask
    alone) and RoPE ``positions`` (default: :func:`positions_from_mask`, or after the cache)."""
    mask = None
    if attention_mask is not None:
        if attention_mask.ndim != 2 or attention_mask.shape != (batch, past + n_new):
            raise ValueError(
                f"attention_mask must have shape (batch, cached + new tokens) = {(batch, past + n_new)}, "
                f"got {tuple(attention_mask.shape)}"
            )
        if not bool(attention_mask.all()):
            mask = padding_mask(attention_mask, n_new)
    if position_ids is None and attention_mask is not None:
        position_ids = positions_from_mask(attention_mask, n_new)
    elif position_ids is None:
        position_ids = torch.arange(past, past + n_new, device=device)[None, :]
    return mask, position_ids


class _LayerCache:
    """One layer of a transformers :class:`~transformers.Cache`, used as the attention uses a
    :class:`spherenet.layers.KVCache` (``length``, ``append``)."""

    def __init__(self, cache: Cache, layer: int, length: int):
        self.cache, self.layer, self.length = cache, layer, length

    def append(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.cache.update(keys, values, self.layer)


class _SpherenetForCausalLM(SpherenetModelSurface, PreTrainedModel, GenerationMixin):
    """What both models share; a subclass names its spherenet model class and config class."""

    spherenet_class: ClassVar[type]
    base_model_prefix = ""
    main_input_name = "input_ids"
    supports_gradient_checkpointing = True  # spherenet's activation checkpointing (SpherenetModelSurface)
    _supports_sdpa = True

    def __init__(self, config, spherenet_model=None):
        check_attn_implementation(getattr(config, "_attn_implementation_internal", None), type(self).__name__)
        super().__init__(config)
        if spherenet_model is None:
            spherenet_model = self.spherenet_class(config.spherenet_config())
        elif type(spherenet_model) is not self.spherenet_class:
            raise TypeError(f"{type(self).__name__} wraps a {self.spherenet_class.__name__}, got {spherenet_model!r}")
        # spherenet's modules, under their own names: the state dict is spherenet's. One dict of
        # children for both, so a module replaced on either (a resized embedding, a PEFT wrapper)
        # is the other's too
        self._modules = spherenet_model._modules
        self._spherenet_model = [spherenet_model]  # a list: not a submodule (its modules are ours)
        self.post_init()
        if self.sphere_weights():
            keep_on_sphere(self)  # the paper's normalization after every optimizer step, whatever the optimizer

    def _init_weights(self, module) -> None:
        """Nothing: spherenet's modules initialize themselves when built (unit rows, the
        paper's scalings; transformers' generic init would break both)."""

    def train(self, mode: bool = True):
        """``nn.Module.train``, which also sets spherenet's model's own flag (its modules are
        this model's children already, the model itself is not)."""
        super().train(mode)
        self.spherenet_model.training = mode
        return self

    @property
    def spherenet_model(self):
        """spherenet's own model (NGPT / GPT), sharing every module and parameter with this one."""
        return self._spherenet_model[0]

    @classmethod
    def from_spherenet(cls, model):
        """The transformers model of spherenet's ``model`` (an NGPT / GPT), sharing its parameters."""
        config = cls.config_class.from_spherenet_config(model.config)
        return cls(config, spherenet_model=model).train(model.training)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, **kwargs):
        """The model of an export (a directory written by ``save_pretrained`` or
        ``spherenet-export``), loaded and checked by spherenet's loader, in eval mode.

        ``dtype`` / ``torch_dtype``, ``device`` / ``device_map`` and the Hub's download
        arguments are as in :meth:`spherenet.models.NGPT.from_pretrained`. A directory that is
        not a spherenet export of this model raises :class:`spherenet.models.PretrainedFileError`
        saying what it holds. A directory in NVIDIA's Normalized-Nemotron layout loads through
        :func:`spherenet.hf.from_normalized_nemotron` (nGPT's class; GPT's refuses it). The path
        (a local directory's made absolute) is kept as ``name_or_path``, which peft records as an
        adapter's base."""
        if model_args:
            raise TypeError(f"{cls.__name__}.from_pretrained takes no positional arguments after the path")
        check_attn_implementation(kwargs.pop("attn_implementation", None), f"{cls.__name__}.from_pretrained")
        check_attn_implementation(getattr(kwargs.get("config"), "_attn_implementation_internal", None), cls.__name__)
        # an option left at None (lm-eval passes quantization_config=None, ...) asks for nothing
        unknown = sorted(k for k, v in kwargs.items() if k not in _LOADER_ARGS + _IGNORED_ARGS and v is not None)
        if unknown:
            raise TypeError(
                f"{cls.__name__}.from_pretrained does not take {', '.join(unknown)}; it takes {', '.join(_LOADER_ARGS)}"
            )
        if kwargs.get("subfolder"):
            raise ValueError(f"{cls.__name__}.from_pretrained: an export is a directory of its own, not a subfolder")
        if "_adapter_model_path" in (kwargs.get("adapter_kwargs") or {}):
            raise ValueError(
                f"{pretrained_model_name_or_path} holds a PEFT adapter: load its base export, then "
                "peft.PeftModel.from_pretrained(model, adapter)"
            )
        loader_args = {k: v for k, v in kwargs.items() if k in _LOADER_ARGS}
        if isinstance(loader_args.get("device_map"), dict) and set(loader_args["device_map"]) == {""}:
            loader_args["device_map"] = loader_args["device_map"][""]  # the whole model on one device
        if is_published_directory(pretrained_model_name_or_path):  # NVIDIA's Normalized-Nemotron layout: an nGPT
            if cls.spherenet_class is not NGPT:
                raise PretrainedFileError(
                    f"{pretrained_model_name_or_path} holds an nGPT in the Normalized-Nemotron layout, not a "
                    f"{cls.spherenet_class.__name__}: load it with spherenet.hf.from_normalized_nemotron"
                )
            model = load_saved(pretrained_model_name_or_path, **loader_args)
        else:
            check_is_export(pretrained_model_name_or_path, exported_model_type(cls.spherenet_class.model_type))
            model = cls.spherenet_class.from_pretrained(pretrained_model_name_or_path, **loader_args)
        hf_model = cls.from_spherenet(model).eval()
        # what transformers records; peft saves it as an adapter's base_model_name_or_path, which a
        # local directory's absolute path lets the adapter find from any working directory
        where = os.fspath(pretrained_model_name_or_path)
        hf_model.name_or_path = hf_model.config.name_or_path = os.path.abspath(where) if os.path.isdir(where) else where
        return hf_model

    def load_adapter(self, peft_model_id=None, adapter_name=None, peft_config=None, *args, **kwargs):
        """transformers' ``load_adapter``; an adapter directory saved from spherenet's LoRA gets its
        LoRA layers from its adapter_config.json (:func:`spherenet.hf.lora.adapter_config`): peft
        saves the config but not the layer registration it needs for a SphereLinear."""
        if peft_config is None and peft_model_id is not None and kwargs.get("adapter_state_dict") is None:
            from .lora import adapter_config

            peft_config = adapter_config(peft_model_id)
        return super().load_adapter(peft_model_id, adapter_name, peft_config, *args, **kwargs)

    def save_pretrained(self, save_directory, **kwargs) -> str | None:
        """spherenet's export layout (config.json with ``auto_map``, model.safetensors or its
        shards, the modeling file, the manifest): what ``from_pretrained`` and spherenet's own
        loader read. Takes what transformers passes (``state_dict``, ``max_shard_size``,
        ``is_main_process``, ``push_to_hub`` and the Hub's arguments, ...), as
        :func:`spherenet.io.save_pretrained`; sphere weights off the sphere are
        refused in one error saying how to put them back."""
        return self.spherenet_model.save_pretrained(save_directory, **kwargs)

    def push_to_hub(self, repo_id: str, **kwargs) -> str:
        """transformers' ``push_to_hub`` (its model card and tags; the files of
        :meth:`save_pretrained`), refusing sphere weights off the sphere before the Hub
        repository is created."""
        self.spherenet_model.check_on_sphere(action="push")
        return super().push_to_hub(repo_id, **kwargs)

    def get_input_embeddings(self):
        return self.embed_in

    def get_output_embeddings(self):
        return self.embed_out

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        use_cache: bool | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        past_key_values: Cache | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> CausalLMOutputWithPast:
        """transformers' causal LM forward pass, its arguments translated for spherenet's
        :meth:`~spherenet.models.common.LanguageModel.forward`: ``attention_mask`` ``(B, cached +
        new)`` with left or right padding, ``position_ids`` (default: counted from each row's first
        real token), ``cache`` or ``past_key_values`` (a :class:`transformers.Cache`; a
        ``DynamicCache`` when ``use_cache`` and none is given), ``labels`` (transformers' loss)."""
        if past_key_values is not None:
            if cache is not None:
                raise ValueError("pass the cache as cache= or past_key_values=, not both")
            cache = past_key_values
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of input_ids and inputs_embeds")
        if kwargs.get("output_attentions"):
            raise ValueError("output_attentions is not supported: attention runs in fused SDPA, which keeps no weights")
        self._watch_sphere()
        if use_cache is None:  # a checkpointed training forward keeps no cache: it would hold every layer's keys
            use_cache = self.config.use_cache and not self._checkpointed_blocks()
        if use_cache and cache is None:
            cache = DynamicCache(config=self.config)
        past = 0 if cache is None else cache.get_seq_length()
        if input_ids is not None:  # before the shapes are read: one-line errors for bad inputs
            check_input_ids(input_ids, self.config.max_seq_len, past)
        else:
            check_inputs_embeds(inputs_embeds, self.config.d_model)
        given = input_ids if input_ids is not None else inputs_embeds
        batch, n_new = given.shape[:2]
        mask, position_ids = sdpa_inputs(attention_mask, position_ids, past, batch, n_new, given.device)
        caches = None if cache is None else [_LayerCache(cache, layer, past) for layer in range(len(self.blocks))]
        hidden_states = [] if output_hidden_states else None
        logits = self.spherenet_model(
            input_ids,
            caches,
            inputs_embeds=inputs_embeds,
            attn_mask=mask,
            positions=position_ids,
            hidden_states=hidden_states,
            logits_to_keep=logits_to_keep,
        )
        loss = None
        if labels is not None:
            loss = self.loss_function(logits=logits, labels=labels, vocab_size=self.config.vocab_size, **kwargs)
        output = CausalLMOutputWithPast(
            loss=loss,
            logits=logits,
            cache=cache if use_cache else None,
            hidden_states=tuple(hidden_states) if hidden_states is not None else None,
        )
        return output.to_tuple() if return_dict is False else output


class SpherenetNGPTForCausalLM(_SpherenetForCausalLM):
    """nGPT (:class:`spherenet.models.NGPT`) as a transformers causal language model."""

    config_class = SpherenetNGPTConfig
    spherenet_class = NGPT


class SpherenetGPTForCausalLM(_SpherenetForCausalLM):
    """The baseline GPT (:class:`spherenet.models.GPT`) as a transformers causal language model."""

    config_class = SpherenetGPTConfig
    spherenet_class = GPT
