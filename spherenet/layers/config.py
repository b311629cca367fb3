"""What the models' configs are made of: :class:`ScaleSpec`, the value that describes one
learnable scaling (Section 2.5), the paper's constants the configs default to, and the field
checks they share. The configs themselves sit beside their models
(:class:`spherenet.models.ngpt.NGPTConfig`, :class:`spherenet.models.gpt.GPTConfig`).

Every constant of the nGPT paper (Loshchilov et al. 2024) that the layers use is stated here
once: the learnable scalings' initial values and stored scales (Section 2.5, 2.6) and the
softmax scales.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "ScaleSpec",
    "SCALE_MODES",
    "ALPHA",
    "S_QK",
    "S_U",
    "S_V",
    "S_UV",
    "S_Z",
    "RESIDUAL_UPDATES",
    "MLP_KINDS",
    "check_transformer_shape",
    "check_ngpt_config",
    "check_choice",
    "check_bool",
    "check_positive_field",
]

# ---------------------------------------------------------------------------------------------
# A scaling's description (Section 2.5)

SCALE_MODES = ("vector", "scalar", "fixed")


def _check_spec(values: Mapping[str, Any], where: str) -> None:
    """Raise ``ValueError`` naming ``where.<field>`` for the first field of ``values`` that is bad."""
    init, scale, mode, absolute = (values[k] for k in ("init", "scale", "mode", "absolute"))
    if isinstance(init, bool) or not isinstance(init, (int, float)) or not math.isfinite(init):
        raise ValueError(f"{where}.init must be a finite number, got {init!r}")
    if scale is not None and (
        isinstance(scale, bool) or not isinstance(scale, (int, float)) or not (math.isfinite(scale) and scale > 0)
    ):
        raise ValueError(f"{where}.scale must be a finite number > 0 or None (1/sqrt(d_model)), got {scale!r}")
    if mode not in SCALE_MODES:
        raise ValueError(f"{where}.mode must be one of {SCALE_MODES}, got {mode!r}")
    if not isinstance(absolute, bool):
        raise ValueError(f"{where}.absolute must be True or False, got {absolute!r}")


@dataclass(frozen=True)
class ScaleSpec:
    """How one scaling is parametrized (Section 2.5): its ``s_init``, its ``s_scale``, its shape.

    - ``init``: the value used in the forward pass at initialization (``s_init``).
    - ``scale``: the value stored at initialization (``s_scale``); ``None`` means
      ``1/sqrt(d_model)``, so the scaling moves like an element of a unit vector of size d_model.
    - ``mode``: ``"vector"`` (one learnable value per element, the paper's), ``"scalar"`` (one
      learnable value, broadcast) or ``"fixed"`` (no parameter: the constant ``init``) (Table 5).
    - ``absolute``: use ``|s|`` in the forward pass (the paper's choice for alpha, Appendix A.2).

    A value, not a module: compare, hash and store it in configs; :meth:`to_dict` and
    :meth:`from_dict` convert it for JSON/TOML.
    """

    init: float
    scale: float | None = None
    mode: Literal["vector", "scalar", "fixed"] = "vector"
    absolute: bool = False

    def __post_init__(self):
        _check_spec(dataclasses.asdict(self), "ScaleSpec")
        object.__setattr__(self, "init", float(self.init))
        if self.scale is not None:
            object.__setattr__(self, "scale", float(self.scale))

    def stored_scale(self, d_model: int) -> float:
        """``s_scale``, with ``None`` resolved to ``1/sqrt(d_model)``."""
        return 1 / math.sqrt(d_model) if self.scale is None else self.scale

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any], base: ScaleSpec | None = None, where: str = "ScaleSpec") -> ScaleSpec:
        """The spec of ``values`` (``{"init": 0.05, ...}``); fields left out are those of
        ``base`` (``init`` is required without one). ``where`` names the spec in errors, e.g.
        ``"NGPTConfig.alpha_attn"`` gives ``NGPTConfig.alpha_attn.init must be ...``."""
        if not isinstance(values, Mapping):
            raise ValueError(f"{where} must be a ScaleSpec or a table of its fields, got {values!r}")
        known = [f.name for f in dataclasses.fields(cls)]
        unknown = [key for key in values if key not in known]
        if unknown:
            raise ValueError(f"{where} has unknown field(s) {', '.join(map(repr, unknown))}; valid: {', '.join(known)}")
        if base is None and "init" not in values:
            raise ValueError(f"{where} needs an 'init' value")
        defaults = base.to_dict() if base is not None else {f.name: f.default for f in dataclasses.fields(cls)}
        merged = {**defaults, **values}
        _check_spec(merged, where)
        return cls(**merged)


# ---------------------------------------------------------------------------------------------
# The paper's constants (Section 2.6; a ScaleSpec's ``scale=None`` is 1/sqrt(d_model))

#: alpha_A and alpha_M (step 3): init 0.05 ("in order of 1/n_layers"), scale 1/sqrt(d_model), one
#: per dimension, used as |alpha| (Appendix A.2).
ALPHA = ScaleSpec(init=0.05, absolute=True)
#: s_qk (step 4): init 1, scale 1/sqrt(d_model), one per dimension.
S_QK = ScaleSpec(init=1.0)
#: s_u and s_v (step 5): init 1, scale 1, one per element of d_MLP.
S_U = ScaleSpec(init=1.0, scale=1.0)
S_V = ScaleSpec(init=1.0, scale=1.0)
#: s_uv: the one scaling of the squared-ReLU MLP (``mlp="relu2"``, not in the paper), on its up
#: projection like s_v on the gate: init 1, scale 1, one per element of d_MLP.
S_UV = ScaleSpec(init=1.0, scale=1.0)
#: s_z (step 6): init 1, scale 1/sqrt(d_model), one per vocabulary entry (or class).
S_Z = ScaleSpec(init=1.0)

#: The hidden-state updates: ``"lerp"`` (eq. 10, 11, the paper's), ``"slerp"`` (eq. 6),
#: ``"riemannian"`` (eq. 24-26); computed by :func:`spherenet.kernels.residual_update`.
RESIDUAL_UPDATES = ("lerp", "slerp", "riemannian")

#: The MLPs: ``"swiglu"`` (gated, eq. 17-21, the paper's) and ``"relu2"`` (squared ReLU, no gate).
MLP_KINDS = ("swiglu", "relu2")


def ngpt_softmax_scale(head_dim: int) -> float:
    """``sqrt(d_k)`` (Section 2.3.2): q and k are unit, so their dot product has variance 1/d_k."""
    return math.sqrt(head_dim)


def gpt_softmax_scale(head_dim: int) -> float:
    """``1/sqrt(d_k)``, the usual scaled dot product (eq. 13)."""
    return 1 / math.sqrt(head_dim)


# ---------------------------------------------------------------------------------------------
# Field checks (each error names the config class, the field and the value)


#: The largest size a config takes (vocab, width, layers, heads): past 2**31 - 1 no model can be
#: built (an embedding or layer stack that large is terabytes), and past 2**63 no tensor is indexed.
MAX_SIZE = 2**31 - 1
#: The longest context: the RoPE tables hold ``max_seq_len x head_dim`` values, built on the first
#: forward pass; past 2**24 positions (16,777,216) they take gigabytes and minutes before the
#: first token, and no attention here (full, O(T^2) per sequence) trains at such a context.
MAX_SEQ_LEN = 2**24


def check_positive_int(config, name: str, at_most: int = MAX_SIZE) -> None:
    value = getattr(config, name)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{type(config).__name__}.{name} must be a positive int, got {value!r}")
    if value > at_most:
        bound = f"2**{at_most.bit_length() - 1}" if at_most & (at_most - 1) == 0 else f"2**{at_most.bit_length()} - 1"
        raise ValueError(f"{type(config).__name__}.{name} must be at most {bound} ({at_most:,}), got {value!r}")


def check_positive_field(config, name: str) -> None:
    """``config.<name>`` is a finite number > 0; the error names the field."""
    value = getattr(config, name)
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
    """Sizes positive, ``d_mlp`` resolved (None -> 4 d_model), ``head_dim`` resolved (None ->
    d_model / n_heads, which must then divide) and even (RoPE rotates pairs), ``n_kv_heads``
    resolved (None -> n_heads) and a divisor of ``n_heads``, ``mlp`` one of :data:`MLP_KINDS`."""
    name = type(config).__name__
    for field in ("vocab_size", "n_layers", "d_model", "n_heads"):
        check_positive_int(config, field)
    check_positive_int(config, "max_seq_len", MAX_SEQ_LEN)
    if config.d_mlp is None:
        config.d_mlp = 4 * config.d_model
    check_positive_int(config, "d_mlp")
    derived = config.head_dim is None
    if derived:
        if config.d_model % config.n_heads:
            raise ValueError(
                f"{name}: d_model={config.d_model} is not divisible by n_heads={config.n_heads} (or set head_dim)"
            )
        config.head_dim = config.d_model // config.n_heads
    check_positive_int(config, "head_dim")
    if config.head_dim % 2:
        value = f"d_model/n_heads = {config.d_model}/{config.n_heads} = " if derived else ""
        raise ValueError(
            f"{name}.head_dim = {value}{config.head_dim} is odd; RoPE rotates pairs of coordinates and needs an even "
            "head dim"
        )
    if config.n_kv_heads is None:
        config.n_kv_heads = config.n_heads
    check_positive_int(config, "n_kv_heads")
    if config.n_heads % config.n_kv_heads:
        raise ValueError(
            f"{name}.n_kv_heads = {config.n_kv_heads} does not divide n_heads = {config.n_heads}: "
            "each key/value head serves a group of n_heads / n_kv_heads query heads"
        )
    check_choice(config, "mlp", MLP_KINDS)
    check_positive_field(config, "rope_base")
    check_bool(config, "causal")


def check_ngpt_config(config) -> None:
    """:func:`check_transformer_shape`, ``update`` one of :data:`RESIDUAL_UPDATES`, ``qk_norm`` a
    bool, and each scaling a :class:`ScaleSpec`: one given as a dict of some of its fields is
    completed from the field's default (errors name ``NGPTConfig.<field>``)."""
    check_transformer_shape(config)
    check_choice(config, "update", RESIDUAL_UPDATES)
    check_bool(config, "qk_norm")
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if isinstance(f.default, ScaleSpec) and not isinstance(value, ScaleSpec):
            where = f"{type(config).__name__}.{f.name}"
            setattr(config, f.name, ScaleSpec.from_dict(value, base=f.default, where=where))
