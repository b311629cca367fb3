"""Training-run configuration: TOML files plus ``section.key=value`` overrides.

A run is described by four sections, each a dataclass: ``[model]`` (a preset name plus any
field of its model config), ``[data]``, ``[optim]`` and ``[train]``. Every key is checked: an
unknown key or a value of the wrong type is a ``ConfigError`` that names it, raised before any
work starts. This module holds every key with its default and meaning; the sections build the
run's parts: ``[model]`` its model config (``cfg.model.build(vocab_size)``), ``[optim]`` the
optimizer and schedule (``cfg.optim.build(model, total_steps)``). The rules the values obey are
in :mod:`spherenet.train.config_rules`, reading and writing TOML in
:mod:`spherenet.train.config_toml`.

A key whose default is "unset" (``None``: ``optim.weight_decay``, ``optim.warmup_steps``,
``optim.muon_lr``, ``optim.matrix_lr``) stands for a value derived from the others; TOML has no
null, so an unset key is left out of the file. :func:`resolved` replaces every such value (and
``train.block_size = 0``) by the one the run uses; the run records that form, in its checkpoints
and metrics, and ``--print-config`` prints it.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

from ..models import GPTConfig, NGPTConfig
from ..models.presets import preset_config
from ..optim import METHOD_DEFAULTS, SphereAdamOptions, build_optimizer
from . import config_rules
from .config_rules import DOCUMENTED_VALUES, LOGGERS, MAX_COUNT, PATH_KEYS, ConfigError, check_values
from .config_toml import parse_override, read_toml, set_key, to_toml

__all__ = [
    "ConfigError",
    "ModelSection",
    "DataSection",
    "OptimSection",
    "TrainSection",
    "RunConfig",
    "load_config",
    "model_config",
    "resolved",
    "parse_override",
    "to_toml",
    "upper_bound",
    "DOCUMENTED_VALUES",
    "LOGGERS",
    "MAX_COUNT",
    "PATH_KEYS",
]


@dataclass
class ModelSection:
    """``[model]``: a preset and any fields of its config changed; :meth:`build` turns it into
    that config, an ``NGPTConfig`` or ``GPTConfig`` (spherenet.layers.config), typed and checked."""

    preset: str = "ngpt-tiny"
    # Any other key of [model] overrides a field of the preset's model config (NGPTConfig or
    # GPTConfig), e.g. update = "slerp", n_layers = 6. Checked against that dataclass. A scaling
    # (a ScaleSpec) is a table of some of its fields: alpha_attn = {init = 0.1}, or the dotted
    # key alpha_attn.init = 0.1 (the override model.alpha_attn.init=0.1); fields left out keep
    # the preset's values.
    overrides: dict[str, Any] = field(default_factory=dict)

    def build(self, vocab_size: int | None = None) -> NGPTConfig | GPTConfig:
        """The preset's config with this section's fields, and ``vocab_size`` (the data's
        vocabulary) unless the section sets it. An unknown preset or field, or a value its
        config refuses, is a one-line ``ConfigError`` naming it."""
        overrides = dict(self.overrides)
        if vocab_size is not None:
            overrides.setdefault("vocab_size", vocab_size)
        try:
            return preset_config(self.preset, **overrides)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"[model] preset {self.preset!r}: {exc}") from None


@dataclass
class DataSection:
    source: str = "stdlib"  # "stdlib" (embedded), a local text/json/jsonl/parquet file, or a hub dataset
    tokenizer: str = "byte"  # "byte", "bpe:<vocab size or tokenizer.json>", "hf:<name or tokenizer.json>"
    # local files: "auto" (from the extension: .txt/.md text, .json/.jsonl json, .parquet), or
    # "text" | "json" | "parquet" for a file whose extension does not say
    format: str = "auto"
    text_field: str = "text"
    text_unit: str = "paragraph"  # text files: a document is a "paragraph" (between blank lines), "line" or "document"
    split: str = "train"  # hub datasets: which split to read
    subset: str = ""  # hub datasets: configuration name; "" = the dataset's default
    max_docs: int = 0  # 0 = all documents
    val_fraction: float = 0.01
    num_proc: int = 1
    cache_dir: str = ""  # "" = <out_dir>/../data_cache
    seed: int = 1234
    # json/parquet/hub: a record whose text field is missing, null or not a string stops the
    # preparation (an error naming the file, the count and the first); true = skip such records,
    # their count printed and kept in the data cache's meta.json (a separate cache entry).
    skip_bad_records: bool = False


@dataclass
class OptimSection:
    method: str = "riemannian_adam"  # riemannian_adam | adam_normalize | adamw | spherical_muon | muon | adamh | muonh
    lr: float = 3e-3
    weight_decay: float | None = None  # unset: the method's default (Table 3: 0 for nGPT, 0.1 for GPT)
    warmup_steps: int | None = None  # unset: the method's default (Table 3: 0 for nGPT, 2000 for GPT)
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    second_moment: str = "element"  # riemannian_adam: element | row
    gradient: str = "euclidean"  # riemannian_adam: euclidean (the paper's: Adam, then Norm) | riemannian (tangent-projected moments)
    sphere_kernel: str = "auto"  # riemannian_adam: auto | native (CPU C++ kernel) | triton | torch | reference
    grad_clip: float = 0.0  # 0 = off
    reproject_every: int = 0  # also renormalize every sphere weight every N steps (0 = never); bounds norm drift
    muon_lr: float | None = None  # spherical_muon | muon: lr of the Muon part; unset: optim.lr
    muon_momentum: float = 0.95  # spherical_muon | muon | muonh: Muon's momentum, in [0, 1)
    # adamh | muonh: the hidden matrices' rate, the angle (radians) a step turns a matrix by at the
    # schedule's peak; unset: optim.lr. optim.lr stays the AdamW part's (embeddings, head, gains).
    matrix_lr: float | None = None

    def sphere_adam_options(self) -> SphereAdamOptions:
        """``optim.second_moment``, ``optim.gradient`` and ``optim.sphere_kernel`` as the one
        object that reaches the sphere-Adam kernel, checked by it alone: a bad value is a
        ``ConfigError`` naming the key and the allowed values (``RunConfig.validate`` builds one
        to check them before any work starts)."""
        try:
            return SphereAdamOptions(self.second_moment, self.gradient, self.sphere_kernel)
        except (ValueError, RuntimeError) as exc:  # each message starts with the key's name
            raise ConfigError(f"optim.{exc}") from None

    def build(self, model: nn.Module, total_steps: int) -> tuple[torch.optim.Optimizer, LambdaLR]:
        """The optimizer and learning-rate schedule of ``optim.method`` for ``model``'s
        parameters over ``total_steps`` (:func:`spherenet.optim.build_optimizer`, handed
        :meth:`sphere_adam_options`); a combination the method refuses is a ``ConfigError``
        naming the method and ``train.steps``. Unset keys take the method's defaults (a resolved
        config has them spelled out)."""
        options = self.sphere_adam_options()
        try:
            return build_optimizer(
                model,
                self.method,
                lr=self.lr,
                total_steps=total_steps,
                weight_decay=self.weight_decay,
                warmup_steps=self.warmup_steps,
                betas=(self.beta1, self.beta2),
                eps=self.eps,
                options=options,
                muon_lr=self.muon_lr,
                matrix_lr=self.matrix_lr,
                muon_momentum=self.muon_momentum,
            )
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"[optim] method {self.method!r} with train.steps={total_steps}: {exc}") from None


@dataclass
class TrainSection:
    steps: int = 300
    batch_size: int = 16  # global, in sequences, per optimizer step
    micro_batch_size: int = 0  # per rank and forward pass; 0 = batch_size / world_size
    block_size: int = 0  # context length; 0 = the model's max_seq_len
    eval_every: int = 100
    eval_batches: int = 8
    log_every: int = 10
    checkpoint_every: int = 100
    keep_last: int = 3
    seed: int = 1337
    out_dir: str = "runs/default"
    # Start from these weights (a run directory, a checkpoint, an exported directory or a Hub id)
    # with a fresh optimizer; "" = random initialization. Ignored on --resume (the run's own checkpoint).
    init_from: str = ""
    parallel: str = "none"  # none | ddp | fsdp
    compile: bool = False
    activation_checkpointing: bool = False  # recompute each block in backward: less memory, one more forward
    autocast: str = "auto"  # auto (bf16 on CUDA, off on CPU) | bf16 | off
    nonfinite: str = "skip"  # skip | stop: what to do with a NaN/inf loss or gradient
    max_nonfinite: int = 10  # stop after this many skipped steps in a row
    sample_tokens: int = 200  # tokens of text printed at the end (0 = none)
    progress: bool = True  # tqdm bar on rank 0 (plain log lines when stderr is not a terminal)
    halt_after: int = 0  # stop this invocation after this step (0 = run to train.steps); resume later
    # Where metrics go besides metrics.jsonl ("jsonl", always written; [] = metrics.jsonl only):
    # "tensorboard" (event files in <out_dir>/tensorboard), "wandb" (Weights & Biases). See spherenet.train.tracking.
    loggers: list[str] = field(default_factory=lambda: ["jsonl"])
    wandb_project: str = "spherenet"  # train.loggers with "wandb": the W&B project of the run
    # LoRA fine-tuning of train.init_from's weights (needs peft): 0 = train every weight; r > 0 =
    # freeze them and train rank-r adapters (spherenet.hf.lora). Checkpoints and exports hold the
    # merged model; --resume continues the adapters.
    lora_rank: int = 0
    lora_alpha: float = 0.0  # the adapters' scale is lora_alpha / lora_rank; 0 = lora_rank (scale 1)
    # "all-linear" (every attention and MLP projection) or module names (e.g. "w_q", "blocks.0.mlp.w_u")
    lora_targets: list[str] = field(default_factory=lambda: ["all-linear"])
    lora_sphere_aware: bool = True  # nGPT: the adapted matrix back on the sphere (false: a plain LoRA)


@dataclass
class RunConfig:
    model: ModelSection = field(default_factory=ModelSection)
    data: DataSection = field(default_factory=DataSection)
    optim: OptimSection = field(default_factory=OptimSection)
    train: TrainSection = field(default_factory=TrainSection)

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        model = out.pop("model")
        return {"model": {"preset": model["preset"], **model["overrides"]}, **out}

    def validate(self) -> RunConfig:
        """``self``, once every value obeys the rules of :mod:`spherenet.train.config_rules`."""
        check_values(self)
        return self


_INT_KEYS = config_rules.integer_keys(RunConfig())


def upper_bound(section: str, key: str) -> float | None:
    """The largest value a numeric key accepts: ``MAX_COUNT`` for an integer unless the rules
    say otherwise, ``None`` (any finite number) for a float."""
    return config_rules.upper_bound(section, key, (section, key) in _INT_KEYS)


def model_config(cfg: RunConfig, vocab_size: int | None = None) -> NGPTConfig | GPTConfig:
    """The model config ``[model]`` describes: ``cfg.model.build(vocab_size)``."""
    return cfg.model.build(vocab_size)


def resolved(cfg: RunConfig) -> RunConfig:
    """``cfg`` with the values the run will use in place of every unset one: ``[model]`` holds
    every field of the preset's config (overridden), except ``vocab_size`` (the data's, unless
    set) and fields whose ``None`` the model resolves itself (``d_mlp``: ``4 d_model``); unset
    ``optim.weight_decay`` and ``optim.warmup_steps`` are the method's defaults (Table 3 of the
    nGPT paper), unset ``optim.muon_lr`` and ``optim.matrix_lr`` are ``optim.lr``, and
    ``train.block_size = 0`` is the model's ``max_seq_len``. Resolving twice changes nothing, so
    two spellings of one setting resolve to the same config."""
    out = copy.deepcopy(cfg)
    model = cfg.model.build()
    out.model.overrides = {  # None (the model's own default) left out, in a table as in the section
        key: {k: v for k, v in value.items() if v is not None} if isinstance(value, dict) else value
        for key, value in dataclasses.asdict(model).items()
        if value is not None and (key != "vocab_size" or key in cfg.model.overrides)
    }
    optim, defaults = out.optim, METHOD_DEFAULTS[cfg.optim.method]
    if optim.weight_decay is None:
        optim.weight_decay = float(defaults["weight_decay"])
    if optim.warmup_steps is None:
        optim.warmup_steps = int(defaults["warmup_steps"])
    if optim.muon_lr is None:
        optim.muon_lr = optim.lr
    if optim.matrix_lr is None:
        optim.matrix_lr = optim.lr
    if out.train.block_size == 0:
        out.train.block_size = model.max_seq_len
    if out.train.block_size > model.max_seq_len:  # before any data is prepared for it
        raise ConfigError(
            f"train.block_size {out.train.block_size} exceeds the model's max_seq_len {model.max_seq_len}"
        )
    return out


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> RunConfig:
    """Read a TOML file (optional), apply ``section.key=value`` overrides, validate."""
    cfg = RunConfig()
    for section, key, value in read_toml(path) if path is not None else ():
        set_key(cfg, section, key, value)
    for text in overrides:
        set_key(cfg, *parse_override(text))
    return cfg.validate()
