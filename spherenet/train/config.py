"""Training-run configuration: TOML files plus ``section.key=value`` overrides.

A run is described by four sections, each a dataclass: ``[model]`` (a preset name plus any
field of its model config), ``[data]``, ``[optim]`` and ``[train]``. Every key is checked: an
unknown key or a value of the wrong type is a ``ConfigError`` that names it, raised before any
work starts.

A key whose default is "unset" (``None``: ``optim.weight_decay``, ``optim.warmup_steps``,
``optim.muon_lr``, ``optim.matrix_lr``) stands for a value derived from the others; TOML has no
null, so an unset key is left out of the file. :func:`resolved` replaces every such value (and
``train.block_size = 0``) by the one the run uses; the run records that form, in its checkpoints
and metrics, and ``--print-config`` prints it.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import json
import math
import sys
import typing
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from ..models.presets import preset_config
from ..optim import METHOD_DEFAULTS

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

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
]


class ConfigError(ValueError):
    """A configuration value or key that cannot work; the message names it."""


@dataclass
class ModelSection:
    preset: str = "ngpt-tiny"
    # Any other key of [model] overrides a field of the preset's model config (NGPTConfig or
    # GPTConfig), e.g. update = "slerp", n_layers = 6. Checked against that dataclass. A scaling
    # (a ScaleSpec) is a table of some of its fields: alpha_attn = {init = 0.1}, or the dotted
    # key alpha_attn.init = 0.1 (the override model.alpha_attn.init=0.1); fields left out keep
    # the preset's values.
    overrides: dict[str, Any] = field(default_factory=dict)


@dataclass
class DataSection:
    source: str = "stdlib"  # "stdlib" (embedded), a local text/json/jsonl/parquet file, or a hub dataset
    tokenizer: str = "byte"  # "byte", "bpe:<vocab size or tokenizer.json>", "hf:<name or tokenizer.json>"
    text_field: str = "text"
    text_unit: str = "paragraph"  # text files: a document is a "paragraph" (between blank lines), "line" or "document"
    split: str = "train"  # hub datasets: which split to read
    subset: str = ""  # hub datasets: configuration name; "" = the dataset's default
    max_docs: int = 0  # 0 = all
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
    sphere_kernel: str = "auto"  # riemannian_adam: auto | native (CPU C++ kernel) | triton | foreach
    grad_clip: float = 0.0  # 0 = off
    reproject_every: int = 0  # also renormalize every sphere weight every N steps (0 = never); bounds norm drift
    muon_lr: float | None = None  # spherical_muon | muon: lr of the Muon part; unset: optim.lr
    muon_momentum: float = 0.95  # spherical_muon | muon | muonh: Muon's momentum, in [0, 1)
    # adamh | muonh: the hidden matrices' rate, the angle (radians) a step turns a matrix by at the
    # schedule's peak; unset: optim.lr. optim.lr stays the AdamW part's (embeddings, head, gains).
    matrix_lr: float | None = None


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


_SECTIONS = {"model": ModelSection, "data": DataSection, "optim": OptimSection, "train": TrainSection}

_CHOICES = {
    ("data", "text_unit"): ("paragraph", "line", "document"),
    ("optim", "method"): ("riemannian_adam", "adam_normalize", "adamw", "spherical_muon", "muon", "adamh", "muonh"),
    ("optim", "second_moment"): ("element", "row"),
    ("optim", "gradient"): ("riemannian", "euclidean"),
    ("optim", "sphere_kernel"): ("auto", "native", "triton", "foreach"),
    ("train", "parallel"): ("none", "ddp", "fsdp"),
    ("train", "autocast"): ("auto", "bf16", "off"),
    ("train", "nonfinite"): ("skip", "stop"),
}
#: The run trackers ``train.loggers`` may name (spherenet.train.tracking opens them).
LOGGERS = ("jsonl", "tensorboard", "wandb")
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
_INT_KEYS = {(s, f.name) for s, cls in _SECTIONS.items() for f in fields(cls) if f.type in ("int", "int | None")}
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
#: Values with a meaning of their own (each also stated beside its key above); any other value
#: of a numeric key lies in the range its checks name.
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


def _bound_text(bound: float) -> str:
    """``2**40 (1,099,511,627,776)`` for a power of two, else the number."""
    power = isinstance(bound, int) and bound >= 1024 and bound & (bound - 1) == 0
    return f"2**{bound.bit_length() - 1} ({bound:,})" if power else f"{bound:,}"


def upper_bound(section: str, key: str) -> float | None:
    """The largest value a numeric key accepts: MAX_COUNT for an integer unless ``_AT_MOST``
    says otherwise, ``None`` (any finite number) for a float."""
    return _AT_MOST.get((section, key), MAX_COUNT if (section, key) in _INT_KEYS else None)


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

    def validate(self) -> "RunConfig":
        for (section, key), choices in _CHOICES.items():
            value = getattr(getattr(self, section), key)
            if value not in choices:
                raise ConfigError(f"{section}.{key} = {value!r} is not one of {', '.join(choices)}")
        for (section, key), choices in _LIST_CHOICES.items():
            unknown = [v for v in getattr(getattr(self, section), key) if v not in choices]
            if unknown:
                raise ConfigError(
                    f"{section}.{key}: {', '.join(map(repr, unknown))} not allowed (allowed values: {', '.join(choices)})"
                )
        self._validate_strings()
        if not 0.0 <= self.optim.beta1 < 1.0 or not 0.0 <= self.optim.beta2 < 1.0:
            raise ConfigError(f"optim.beta1/beta2 must be in [0, 1), got {self.optim.beta1}, {self.optim.beta2}")
        for keys, bound in ((_POSITIVE, "> 0"), (_NON_NEGATIVE, ">= 0")):
            for section, key in keys:
                value = getattr(getattr(self, section), key)
                if value is not None and not (value > 0 if bound == "> 0" else value >= 0):
                    unset = (
                        f" (leave it unset for {_UNSET_MEANS[section, key]})" if (section, key) in _UNSET_MEANS else ""
                    )
                    raise ConfigError(f"{section}.{key} must be {bound}, got {value!r}{unset}")
        for section in ("train", "data"):  # torch.manual_seed and numpy take 64-bit seeds >= 0
            seed = getattr(self, section).seed
            if not 0 <= seed < 2**63:
                raise ConfigError(f"{section}.seed must be in [0, 2**63), got {seed!r}")
        for section, key in sorted(_POSITIVE | _NON_NEGATIVE | set(_AT_MOST)):
            value, high = getattr(getattr(self, section), key), upper_bound(section, key)
            if value is not None and high is not None and value > high:
                raise ConfigError(f"{section}.{key} must be at most {_bound_text(high)}, got {value!r}")
        if not 0.0 <= self.optim.muon_momentum < 1.0:
            raise ConfigError(f"optim.muon_momentum must be in [0, 1), got {self.optim.muon_momentum!r}")
        if not 0.0 < self.data.val_fraction < 1.0:
            raise ConfigError(f"data.val_fraction must be in (0, 1), got {self.data.val_fraction!r}")
        self._validate_lora()
        return self

    def _validate_strings(self) -> None:
        """No string key is blank, none empty unless documented (an empty path: the current directory)."""
        for section, cls in _SECTIONS.items():
            for f in fields(cls):
                value, key = getattr(getattr(self, section), f.name), (section, f.name)
                if (
                    not isinstance(value, str)
                    or value.strip()
                    or (value == "" and "" in DOCUMENTED_VALUES.get(key, {}))
                ):
                    continue
                what = _NOT_EMPTY.get(key, "name a path" if key in PATH_KEYS else "give a value or leave the key out")
                raise ConfigError(f"{section}.{f.name} is {'blank' if value else 'empty'} ({value!r}): {what}")
        t = self.train
        if not t.lora_targets or any(not name.strip() for name in t.lora_targets):
            raise ConfigError(f"train.lora_targets must name modules (or be ['all-linear']), got {t.lora_targets!r}")
        if "all-linear" in t.lora_targets and len(t.lora_targets) > 1:
            raise ConfigError(f"train.lora_targets: 'all-linear' stands alone, got {t.lora_targets!r}")

    def _validate_lora(self) -> None:
        t = self.train
        if not t.lora_rank:
            return
        if not t.init_from:
            raise ConfigError(
                f"train.lora_rank={t.lora_rank} fine-tunes trained weights with LoRA: set train.init_from "
                "(a run directory, checkpoint, exported directory or Hub id), or train.lora_rank=0"
            )
        if t.parallel == "fsdp":
            raise ConfigError("train.lora_rank > 0 trains with train.parallel none or ddp, not fsdp")


def _coerce(section: str, key: str, value: Any, default: Any) -> Any:
    """Check ``value`` against the type of the field's default; ints are accepted for floats."""
    where = f"{section}.{key}"
    if any("\x00" in v for v in (value if isinstance(value, list) else [value]) if isinstance(v, str)):
        raise ConfigError(f"{where} = {value!r} holds a NUL character, which no file system or name takes")
    if isinstance(default, bool):
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{where} must be true or false, got {value!r}")
    if isinstance(default, int):
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{where} must be an integer, got {value!r}")
    if isinstance(default, float):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if not math.isfinite(value):  # TOML reads nan and inf as floats
                raise ConfigError(f"{where} must be a finite number, got {value!r}")
            return float(value)
        raise ConfigError(f"{where} must be a number, got {value!r}")
    if isinstance(default, str):
        if isinstance(value, str):
            return value
        raise ConfigError(f"{where} must be a string, got {value!r}")
    if isinstance(default, list):
        # An override that is not a TOML list arrives as text: "[a,b]", "a,b" or "a".
        if isinstance(value, str):
            value = [v.strip().strip("'\"") for v in value.strip().removeprefix("[").removesuffix("]").split(",")]
            value = [v for v in value if v]
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return list(dict.fromkeys(value))  # duplicates dropped, order kept
        raise ConfigError(f"{where} must be a list of strings, got {value!r}")
    return value


def _set_model(overrides: dict[str, Any], key: str, value: Any) -> None:
    """Record ``[model] key = value``; checked against the model config when the model is built.

    A table (``alpha_attn = {init = 0.1}``) is merged key by key into what is set already, like
    the dotted key ``alpha_attn.init``."""
    if "." in key:  # model.alpha_attn.init=0.1 (parse_override allows one level)
        key, sub = key.split(".", 1)
        value = {sub: value}
    if isinstance(value, dict):
        table = overrides.get(key)
        overrides[key] = {**(table if isinstance(table, dict) else {}), **value}
    else:
        overrides[key] = value


def _set(cfg: RunConfig, section: str, key: str, value: Any) -> None:
    if section not in _SECTIONS:
        raise ConfigError(
            f"unknown config section [{section}]{_did_you_mean(section, _SECTIONS)} (valid: {', '.join(_SECTIONS)})"
        )
    obj = getattr(cfg, section)
    if section == "model" and key != "preset":
        _set_model(obj.overrides, key, value)
        return
    names = {f.name: f for f in fields(obj) if f.name != "overrides"}
    if key not in names:
        raise ConfigError(
            f"unknown config key {section}.{key}{_did_you_mean(key, names, section)} "
            f"(valid keys of [{section}]: {', '.join(names)})"
        )
    like = getattr(obj, key)
    if like is None:  # an unset key: checked against its declared type (``float | None``: a float)
        like = next(t for t in typing.get_args(typing.get_type_hints(type(obj))[key]) if t is not type(None))()
    setattr(obj, key, _coerce(section, key, value, like))


def _did_you_mean(word: str, choices, section: str | None = None) -> str:
    """``"; did you mean optim.lr?"`` for the closest of ``choices``, or "" when none is close. A
    key of another section is named with its section (``lr`` given under [train]: optim.lr)."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    if close:
        return f"; did you mean {section + '.' if section else ''}{close[0]}?"
    if section is not None:
        for other, cls in _SECTIONS.items():
            if other != section and word in {f.name for f in fields(cls)} - {"overrides"}:
                return f"; did you mean {other}.{word}?"
    return ""


def to_toml(cfg: RunConfig) -> str:
    """``cfg`` as a TOML file that :func:`load_config` reads back into the same config; an unset
    (``None``) key, in a section or in a table, is left out."""

    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, float)):
            return repr(v) if not isinstance(v, float) or math.isfinite(v) else ("inf" if v > 0 else "-inf")
        if isinstance(v, str):
            return json.dumps(v)  # a TOML basic string is a JSON string
        if isinstance(v, (list, tuple)):
            return "[" + ", ".join(value(x) for x in v) + "]"
        if isinstance(v, dict):
            return "{ " + ", ".join(f"{k} = {value(x)}" for k, x in v.items() if x is not None) + " }"
        raise TypeError(f"cannot write {v!r} as TOML")

    lines = []
    for section, table in cfg.to_dict().items():
        lines.append(f"[{section}]")
        lines.extend(f"{key} = {value(v)}" for key, v in table.items() if v is not None)
        if section == "model" and "vocab_size" not in table:
            lines.append("# vocab_size: the data's (data.tokenizer's vocabulary) unless set here")
        lines.append("")
    return "\n".join(lines)


def model_config(cfg: RunConfig, vocab_size: int | None = None):
    """The model config ``[model]`` describes (an ``NGPTConfig`` or ``GPTConfig``): the preset's
    fields with the section's overrides, and ``vocab_size`` (the data's vocabulary) unless the
    section sets it. A preset or field that cannot work is a ``ConfigError``."""
    overrides = dict(cfg.model.overrides)
    if vocab_size is not None:
        overrides.setdefault("vocab_size", vocab_size)
    try:
        return preset_config(cfg.model.preset, **overrides)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"[model] preset {cfg.model.preset!r}: {exc}") from None


def resolved(cfg: RunConfig) -> RunConfig:
    """``cfg`` with the values the run will use in place of every unset one: ``[model]`` holds
    every field of the preset's config (overridden), except ``vocab_size`` (the data's, unless
    set) and fields whose ``None`` the model resolves itself (``d_mlp``: ``4 d_model``); unset
    ``optim.weight_decay`` and ``optim.warmup_steps`` are the method's defaults (Table 3 of the
    nGPT paper), unset ``optim.muon_lr`` and ``optim.matrix_lr`` are ``optim.lr``, and
    ``train.block_size = 0`` is the model's ``max_seq_len``. Resolving twice changes nothing, so
    two spellings of one setting resolve to the same config."""
    out = copy.deepcopy(cfg)
    model = model_config(cfg)
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


def parse_override(text: str) -> tuple[str, str, Any]:
    """``"optim.lr=1e-3"`` -> ``("optim", "lr", 0.001)``; the value is read as a TOML value,
    falling back to a plain string (so ``data.source=my.txt`` needs no quotes; a list key also
    takes ``[a,b]`` or ``a,b`` unquoted). A field of a model scaling is
    ``model.alpha_attn.init=0.1`` -> ``("model", "alpha_attn.init", 0.1)``."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} is not of the form section.key=value")
    dotted, raw = text.split("=", 1)
    parts = [part.strip() for part in dotted.split(".")]
    if not (len(parts) == 2 or (len(parts) == 3 and parts[0] == "model")) or not all(parts):
        raise ConfigError(f"override key {dotted!r} must be section.key (e.g. optim.lr, model.alpha_attn.init)")
    section, key = parts[0], ".".join(parts[1:])
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return section, key, value


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> RunConfig:
    """Read a TOML file (optional), apply ``section.key=value`` overrides, validate."""
    cfg = RunConfig()
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file not found: {path}")
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
        for section, table in data.items():
            if not isinstance(table, dict):
                raise ConfigError(f"{path}: top-level key {section!r} must be a [section] table")
            for key, value in table.items():
                _set(cfg, section, key, value)
    for text in overrides:
        _set(cfg, *parse_override(text))
    return cfg.validate()
