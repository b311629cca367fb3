"""The rules a run config's values obey: the choices of each enumerated key, the bounds of the
numeric ones, the keys that may be unset or empty and what that means, and the check that
applies them all (:func:`check_values`, called by ``RunConfig.validate``). A value that breaks
a rule is a ``ConfigError`` whose one line names the key, the value and the rule."""

from __future__ import annotations

import dataclasses
from typing import Any

from ..optim import METHODS

__all__ = [
    "ConfigError",
    "LOGGERS",
    "MAX_COUNT",
    "PATH_KEYS",
    "DOCUMENTED_VALUES",
    "CHOICES",
    "bound_text",
    "upper_bound",
    "check_values",
]


class ConfigError(ValueError):
    """A configuration value or key that cannot work; the message names it."""


#: The run trackers ``train.loggers`` may name (spherenet.train.tracking opens them).
LOGGERS = ("jsonl", "tensorboard", "wandb")
# The [optim] choices are the optimizers' own (spherenet.optim), listed once there; those of
# optim.second_moment, optim.gradient and optim.sphere_kernel are checked by the options object
# they build (OptimSection.sphere_adam_options), and by nothing else.
CHOICES = {
    ("data", "format"): ("auto", "text", "json", "parquet"),
    ("data", "text_unit"): ("paragraph", "line", "document"),
    ("optim", "method"): METHODS,
    ("train", "parallel"): ("none", "ddp", "fsdp"),
    ("train", "autocast"): ("auto", "bf16", "off"),
    ("train", "nonfinite"): ("skip", "stop"),
}
# List-valued keys: every element must be one of these.
_LIST_CHOICES = {("train", "loggers"): LOGGERS}
# Keys that may be unset (None), and the value unset stands for (see resolved()).
_UNSET_MEANS = {("optim", "weight_decay"): "the method's default", ("optim", "warmup_steps"): "the method's default",
                ("optim", "muon_lr"): "optim.lr", ("optim", "matrix_lr"): "optim.lr"}  # fmt: skip  # two a line


def _keys(text: str) -> set[tuple[str, str]]:
    return {tuple(key.split(".", 1)) for key in text.split()}  # type: ignore[misc]


_POSITIVE = _keys(
    "optim.lr optim.muon_lr optim.matrix_lr optim.eps train.steps train.batch_size train.eval_every "
    "train.eval_batches train.log_every train.checkpoint_every train.keep_last train.max_nonfinite data.num_proc"
)
_NON_NEGATIVE = _keys(
    "train.micro_batch_size train.block_size train.sample_tokens train.halt_after train.lora_rank train.lora_alpha "
    "optim.grad_clip optim.weight_decay optim.warmup_steps optim.reproject_every data.max_docs"
)
#: The largest value of a count (steps, sizes, intervals, documents): 2**40, about 1.1e12, past
#: any real run; a larger one (or one past int64) is a typo or cannot finish. Seeds take [0, 2**63).
MAX_COUNT = 2**40
# Bounds other than MAX_COUNT: worker processes, tokens generated at the end, eps (a small number
# added to a denominator), learning rates and weight decay (no method here trains past ~1), seeds.
_AT_MOST = {("data", "num_proc"): 1024, ("train", "sample_tokens"): 2**20, ("optim", "eps"): 1.0}
_AT_MOST |= {("optim", key): 100.0 for key in ("lr", "muon_lr", "matrix_lr", "weight_decay")}
_AT_MOST |= {(section, "seed"): 2**63 - 1 for section in ("data", "train")}
# No string key may be blank or, unless DOCUMENTED_VALUES gives "" a meaning, empty: what to give
# instead, for the keys that name something, and the path-typed keys.
_NOT_EMPTY = {
    ("data", "source"): "a file, a list of files, 'stdlib' or 'hf:<dataset>'", ("data", "split"): "e.g. train",
    ("data", "tokenizer"): "e.g. byte, bpe:8192, hf:<name or tokenizer.json>",
    ("data", "text_field"): "the field or column that holds the text",
    ("train", "out_dir"): "name the run's directory (e.g. runs/mine); an empty one writes into the current directory",
    ("train", "wandb_project"): "the Weights & Biases project, e.g. spherenet",
}  # fmt: skip  # short ones two a line
PATH_KEYS = (("data", "source"), ("data", "cache_dir"), ("train", "out_dir"), ("train", "init_from"))
#: Values with a meaning of their own (each also stated beside its key, in spherenet/train/config.py);
#: any other value of a numeric key lies in the range its checks name.
DOCUMENTED_VALUES: dict[tuple[str, str], dict[Any, str]] = {
    ("data", "max_docs"): {0: "all documents"}, ("data", "subset"): {"": "the dataset's default"},
    ("data", "cache_dir"): {"": "<out_dir>/../data_cache"}, ("optim", "grad_clip"): {0: "off"},
    ("optim", "weight_decay"): {None: "the method's default"}, ("optim", "warmup_steps"): {None: "the method's default"},
    ("optim", "muon_lr"): {None: "optim.lr"}, ("optim", "matrix_lr"): {None: "optim.lr"},
    ("optim", "reproject_every"): {0: "never"}, ("train", "micro_batch_size"): {0: "batch_size / world_size"},
    ("train", "block_size"): {0: "the model's max_seq_len"}, ("train", "init_from"): {"": "random initialization"},
    ("train", "sample_tokens"): {0: "none"}, ("train", "halt_after"): {0: "run to train.steps"},
    ("train", "lora_rank"): {0: "train every weight"}, ("train", "lora_alpha"): {0: "lora_rank (scale 1)"},
    ("train", "loggers"): {(): "metrics.jsonl only"},
}  # fmt: skip  # two keys a line


def bound_text(bound: float) -> str:
    """``2**40 (1,099,511,627,776)`` for a power of two, else the number."""
    power = isinstance(bound, int) and bound >= 1024 and bound & (bound - 1) == 0
    return f"2**{bound.bit_length() - 1} ({bound:,})" if power else f"{bound:,}"


def upper_bound(section: str, key: str, integer: bool) -> float | None:
    """The largest value a numeric key accepts: MAX_COUNT for an ``integer`` one unless
    ``_AT_MOST`` says otherwise, ``None`` (any finite number) for a float."""
    return _AT_MOST.get((section, key), MAX_COUNT if integer else None)


def integer_keys(cfg) -> set[tuple[str, str]]:
    """The (section, key) of every integer-typed key of ``cfg``'s sections."""
    return {
        (section.name, f.name)
        for section in dataclasses.fields(cfg)
        for f in dataclasses.fields(getattr(cfg, section.name))
        if f.type in ("int", "int | None")
    }


def check_values(cfg) -> None:
    """Every rule above, on ``cfg`` (a ``RunConfig``): the first value that breaks one is a
    ``ConfigError`` naming it."""
    for (section, key), choices in CHOICES.items():
        value = getattr(getattr(cfg, section), key)
        if value not in choices:
            raise ConfigError(f"{section}.{key} = {value!r} is not one of {', '.join(choices)}")
    cfg.optim.sphere_adam_options()  # optim.second_moment, gradient, sphere_kernel: the options' own check
    for (section, key), choices in _LIST_CHOICES.items():
        unknown = [v for v in getattr(getattr(cfg, section), key) if v not in choices]
        if unknown:
            raise ConfigError(
                f"{section}.{key}: {', '.join(map(repr, unknown))} not allowed (allowed values: {', '.join(choices)})"
            )
    _check_strings(cfg)
    if not 0.0 <= cfg.optim.beta1 < 1.0 or not 0.0 <= cfg.optim.beta2 < 1.0:
        raise ConfigError(f"optim.beta1/beta2 must be in [0, 1), got {cfg.optim.beta1}, {cfg.optim.beta2}")
    for keys, bound in ((_POSITIVE, "> 0"), (_NON_NEGATIVE, ">= 0")):
        for section, key in keys:
            value = getattr(getattr(cfg, section), key)
            if value is not None and not (value > 0 if bound == "> 0" else value >= 0):
                unset = f" (leave it unset for {_UNSET_MEANS[section, key]})" if (section, key) in _UNSET_MEANS else ""
                raise ConfigError(f"{section}.{key} must be {bound}, got {value!r}{unset}")
    for section in ("train", "data"):  # torch.manual_seed and numpy take 64-bit seeds >= 0
        seed = getattr(cfg, section).seed
        if not 0 <= seed < 2**63:
            raise ConfigError(f"{section}.seed must be in [0, 2**63), got {seed!r}")
    integers = integer_keys(cfg)
    for section, key in sorted(_POSITIVE | _NON_NEGATIVE | set(_AT_MOST)):
        value, high = getattr(getattr(cfg, section), key), upper_bound(section, key, (section, key) in integers)
        if value is not None and high is not None and value > high:
            raise ConfigError(f"{section}.{key} must be at most {bound_text(high)}, got {value!r}")
    if not 0.0 <= cfg.optim.muon_momentum < 1.0:
        raise ConfigError(f"optim.muon_momentum must be in [0, 1), got {cfg.optim.muon_momentum!r}")
    if not 0.0 < cfg.data.val_fraction < 1.0:
        raise ConfigError(f"data.val_fraction must be in (0, 1), got {cfg.data.val_fraction!r}")
    _check_lora(cfg.train)


def _check_strings(cfg) -> None:
    """No string key is blank, none empty unless documented (an empty path: the current directory)."""
    for section in dataclasses.fields(cfg):
        for f in dataclasses.fields(getattr(cfg, section.name)):
            value, key = getattr(getattr(cfg, section.name), f.name), (section.name, f.name)
            if not isinstance(value, str) or value.strip() or (value == "" and "" in DOCUMENTED_VALUES.get(key, {})):
                continue
            what = _NOT_EMPTY.get(key, "name a path" if key in PATH_KEYS else "give a value or leave the key out")
            raise ConfigError(f"{section.name}.{f.name} is {'blank' if value else 'empty'} ({value!r}): {what}")
    t = cfg.train
    if not t.lora_targets or any(not name.strip() for name in t.lora_targets):
        raise ConfigError(f"train.lora_targets must name modules (or be ['all-linear']), got {t.lora_targets!r}")
    if "all-linear" in t.lora_targets and len(t.lora_targets) > 1:
        raise ConfigError(f"train.lora_targets: 'all-linear' stands alone, got {t.lora_targets!r}")


def _check_lora(t) -> None:
    if not t.lora_rank:
        return
    if not t.init_from:
        raise ConfigError(
            f"train.lora_rank={t.lora_rank} fine-tunes trained weights with LoRA: set train.init_from "
            "(a run directory, checkpoint, exported directory or Hub id), or train.lora_rank=0"
        )
    if t.parallel == "fsdp":
        raise ConfigError("train.lora_rank > 0 trains with train.parallel none or ddp, not fsdp")
