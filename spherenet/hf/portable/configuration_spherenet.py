"""The configs of nGPT (Loshchilov et al. 2024, "nGPT: Normalized Transformer with Representation
Learning on the Hypersphere") and its baseline GPT as transformers ``PretrainedConfig`` classes,
needing transformers only: an export carries this file as ``configuration_spherenet.py`` (config.json's
``auto_map["AutoConfig"]`` names its classes) beside the model code, ``modeling_spherenet.py``, which
imports it.

config.json's keys are spherenet's names (transformers' generic names are aliases); an option value
the model code cannot compute is refused in one line naming the key rather than computed as another.

Where spherenet is installed, an export's copy of this file and of the model code are spherenet's own
classes (:func:`installed_spherenet`): one model, whichever of spherenet and the export was imported
first, which every spherenet tool takes.
"""

import importlib
import math
import warnings
from typing import Any, ClassVar

from transformers import PretrainedConfig

UPDATES = ("lerp", "slerp", "riemannian")  # the residual updates: eq. 10, 11 / eq. 6 / eq. 24-26
MLPS = ("swiglu", "relu2")
SCALE_MODES = ("vector", "scalar", "fixed")
# The paper's scalings (Section 2.5, 2.6): stored at ``scale`` (None: 1/sqrt(d_model)), used as ``stored * init /
# scale``; ``mode``: one value per element, one, or the constant ``init``; ``absolute``: |s| (alphas, Appendix A.2).
SCALINGS = {
    "alpha_attn": {"init": 0.05, "scale": None, "mode": "vector", "absolute": True},  # alpha_A, eq. 10
    "alpha_mlp": {"init": 0.05, "scale": None, "mode": "vector", "absolute": True},  # alpha_M, eq. 11
    "s_qk": {"init": 1.0, "scale": None, "mode": "vector", "absolute": False},  # eq. 15, 16
    "s_u": {"init": 1.0, "scale": 1.0, "mode": "vector", "absolute": False},  # eq. 20
    "s_v": {"init": 1.0, "scale": 1.0, "mode": "vector", "absolute": False},  # eq. 21
    "s_uv": {"init": 1.0, "scale": 1.0, "mode": "vector", "absolute": False},  # mlp="relu2"
    "s_z": {"init": 1.0, "scale": None, "mode": "vector", "absolute": False},  # eq. 3
}


def _number(value, low: float = -math.inf) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > low


class _SpherenetConfig(PretrainedConfig):
    """The fields both models have. ``None`` takes spherenet's default; an option value this file
    cannot compute is refused (``ValueError`` naming the key) rather than computed as another."""

    attribute_map: ClassVar[dict[str, str]] = {
        "hidden_size": "d_model",
        "num_hidden_layers": "n_layers",
        "num_attention_heads": "n_heads",
        "num_key_value_heads": "n_kv_heads",
        "intermediate_size": "d_mlp",
        "max_position_embeddings": "max_seq_len",
    }
    option_defaults: ClassVar[dict] = {"max_seq_len": 1024, "rope_base": 10000.0, "causal": True, "mlp": "swiglu"}
    vocab_size: int | None = None
    n_layers: int | None = None
    d_model: int | None = None
    n_heads: int | None = None
    d_mlp: int | None = None  # None: 4 d_model
    max_seq_len: int | None = None
    rope_base: float | None = None
    causal: bool | None = None
    n_kv_heads: int | None = None  # grouped-query attention; None: n_heads
    head_dim: int | None = None  # None: d_model / n_heads
    mlp: str | None = None
    use_cache: bool = True
    tie_word_embeddings: bool = False  # spherenet's models are untied

    def __post_init__(self, **kwargs):
        super().__post_init__(**kwargs)
        for key, value in self.option_defaults.items():
            if getattr(self, key) is None:
                setattr(self, key, value)
        self._check_options()
        if self.d_model is not None and self.n_heads is not None:  # None in transformers' `cls()`
            self._resolve_sizes()

    def _require(self, ok: bool, key: str, expected: str) -> None:
        if not ok:
            raise ValueError(f"{self.model_type} config: {key} must be {expected}, got {getattr(self, key)!r}")

    def _check_options(self) -> None:
        self._require(self.mlp in MLPS, "mlp", f"one of {MLPS}")
        self._require(isinstance(self.causal, bool), "causal", "true or false")
        self._require(_number(self.rope_base, 0), "rope_base", "a number > 0")

    def _resolve_sizes(self) -> None:
        """spherenet's derived sizes (d_mlp, head_dim, n_kv_heads), and every size checked."""
        self.d_mlp = 4 * self.d_model if self.d_mlp is None else self.d_mlp
        self.n_kv_heads = self.n_heads if self.n_kv_heads is None else self.n_kv_heads
        if self.head_dim is None and _number(self.d_model) and _number(self.n_heads, 0):
            self.head_dim = self.d_model // self.n_heads if self.d_model % self.n_heads == 0 else None
        for key in ("vocab_size", "n_layers", "d_model", "n_heads", "max_seq_len", "d_mlp", "head_dim", "n_kv_heads"):
            value = getattr(self, key)
            ok = isinstance(value, int) and not isinstance(value, bool) and value > 0
            self._require(ok, key, "a positive int" + (" (null: d_model / n_heads)" if key == "head_dim" else ""))
        self._require(self.head_dim % 2 == 0, "head_dim", "even (RoPE rotates pairs)")
        self._require(self.n_heads % self.n_kv_heads == 0, "n_kv_heads", f"a divisor of n_heads={self.n_heads}")


class SpherenetNGPTConfig(_SpherenetConfig):
    """nGPT's fields (spherenet's ``NGPTConfig``); a scaling is a dict of init, scale, mode, absolute."""

    model_type = "spherenet-ngpt"
    option_defaults: ClassVar[dict[str, Any]] = {**_SpherenetConfig.option_defaults, "update": "lerp", "qk_norm": True}
    update: str | None = None
    qk_norm: bool | None = None  # eq. 15, 16; false drops their Norm (Table 6)
    alpha_attn: dict[str, Any] | None = None
    alpha_mlp: dict[str, Any] | None = None
    s_qk: dict[str, Any] | None = None
    s_u: dict[str, Any] | None = None
    s_v: dict[str, Any] | None = None
    s_uv: dict[str, Any] | None = None
    s_z: dict[str, Any] | None = None

    def _check_options(self) -> None:
        super()._check_options()
        self._require(self.update in UPDATES, "update", f"one of {UPDATES}")
        self._require(isinstance(self.qk_norm, bool), "qk_norm", "true or false")
        for name, default in SCALINGS.items():
            given = getattr(self, name) or {}
            self._require(
                isinstance(given, dict) and not set(given) - set(default), name, f"a dict of {tuple(default)}"
            )
            spec = {**default, **given}
            setattr(self, name, spec)
            for key, ok, expected in (
                ("init", _number(spec["init"]), "a finite number"),
                ("scale", spec["scale"] is None or _number(spec["scale"], 0), "a number > 0 or null (1/sqrt(d_model))"),
                ("mode", spec["mode"] in SCALE_MODES, f"one of {SCALE_MODES}"),
                ("absolute", isinstance(spec["absolute"], bool), "true or false"),
            ):
                if not ok:
                    raise ValueError(f"{self.model_type} config: {name}.{key} must be {expected}, got {spec[key]!r}")


class SpherenetGPTConfig(_SpherenetConfig):
    """The baseline GPT's fields (spherenet's ``GPTConfig``)."""

    model_type = "spherenet-gpt"
    option_defaults: ClassVar[dict[str, Any]] = {**_SpherenetConfig.option_defaults, "init_std": 0.02, "norm_eps": 1e-5}
    init_std: float | None = None  # training only
    norm_eps: float | None = None  # RMSNorm's

    def _check_options(self) -> None:
        super()._check_options()
        self._require(_number(self.norm_eps, 0), "norm_eps", "a number > 0")


def installed_spherenet(say_why: bool = False):
    """spherenet's transformers module (``spherenet.hf``) where spherenet is installed and this file
    runs as an export's code, whose classes then stand for this file's; None where spherenet is not
    installed (this file's classes run) and in spherenet's own copy of this file. ``say_why``: a
    spherenet that is installed but whose transformers module does not import (a transformers
    version outside the range it supports) is named in a warning (the model code says it, once: this
    file runs for the config and again beside the model code)."""
    if __name__.startswith("spherenet."):
        return None
    try:
        return importlib.import_module("spherenet.hf")
    except ImportError as error:
        if say_why and not (isinstance(error, ModuleNotFoundError) and error.name == "spherenet"):
            warnings.warn(
                f"spherenet is installed, but spherenet.hf does not import ({error}): the export's own classes run, "
                "which spherenet's tools do not take",
                UserWarning,
                stacklevel=2,
            )
        return None


SPHERENET_HF = installed_spherenet()
if SPHERENET_HF is not None:
    SpherenetNGPTConfig, SpherenetGPTConfig = SPHERENET_HF.SpherenetNGPTConfig, SPHERENET_HF.SpherenetGPTConfig
