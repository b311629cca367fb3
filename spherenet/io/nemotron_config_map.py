"""config.json of the published Normalized-Nemotron layout (model_type "ngpt") and the fields of
:class:`~spherenet.models.NGPTConfig`, both ways: :func:`nemotron_fields` reads one, refusing by
name every field it cannot map (:func:`spherenet.models.nemotron_config` builds the config); :func:`layout_config` writes one; :func:`layout_refusals` says
what of an NGPT the layout cannot express; :func:`is_published_directory` tells a directory in
the layout from spherenet's own exports. The tensors are :mod:`spherenet.io.nemotron_read`'s.

The layout is that of transformers' ``ngpt`` model: config.json says ``model_type`` "ngpt" and
``architectures`` names "NGPTForCausalLM". spherenet's own exports say "spherenet-ngpt", so the
two are never confused.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from torch import nn

from ..layers import ScaleSpec
from ..layers.config import MAX_SEQ_LEN, MAX_SIZE
from .hf_layout import CONFIG_NAME
from .hf_weights import PretrainedFileError

__all__ = [
    "LAYOUT_MODEL_TYPE",
    "LAYOUT_ARCHITECTURE",
    "nemotron_fields",
    "layout_config",
    "layout_refusals",
    "is_published_config",
    "is_published_directory",
]

LAYOUT_MODEL_TYPE = "ngpt"
LAYOUT_ARCHITECTURE = "NGPTForCausalLM"

# config.json fields that fix the model: all required
_REQUIRED = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "hidden_act",
    "max_position_embeddings",
    "initializer_range",
    "sqk_init_value",
    "attn_alpha_init_value",
    "suv_init_value",
    "suv_init_scaling",
    "mlp_alpha_init_value",
    "sz_init_value",
)
# fields whose absence means the layout's plain model; any other value is refused by name
_OPTIONAL = {
    "head_dim": None,
    "num_key_value_heads": None,
    "rope_theta": None,
    "rope_scaling": None,
    "rope_parameters": None,
    "partial_rotary_factor": 1.0,
    "attention_bias": False,
    "mlp_bias": False,
    "attention_dropout": 0.0,
    "tie_word_embeddings": False,
}
# transformers' bookkeeping and generation defaults: nothing in the forward pass
_IGNORED = set(
    """
    architectures model_type transformers_version _name_or_path torch_dtype dtype use_cache bos_token_id
    eos_token_id pad_token_id sep_token_id decoder_start_token_id auto_map output_attentions output_hidden_states
    return_dict id2label label2id problem_type chunk_size_feed_forward is_encoder_decoder is_decoder
    add_cross_attention tokenizer_class use_bfloat16 torchscript pruned_heads finetuning_task prefix
    task_specific_params max_length min_length do_sample early_stopping num_beams num_beam_groups diversity_penalty
    temperature top_k top_p typical_p repetition_penalty length_penalty no_repeat_ngram_size
    encoder_no_repeat_ngram_size bad_words_ids num_return_sequences output_scores return_dict_in_generate
    forced_bos_token_id forced_eos_token_id remove_invalid_values exponential_decay_length_penalty suppress_tokens
    begin_suppress_tokens tf_legacy_loss tie_encoder_decoder cross_attention_hidden_size
    """.split()
)


def _positive_int(values: dict, name: str, where: str) -> int:
    value = values[name]
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise PretrainedFileError(f"{where}: {name} must be a positive integer, got {value!r}")
    at_most = MAX_SEQ_LEN if name == "max_position_embeddings" else MAX_SIZE  # NGPTConfig's bounds
    if value > at_most:
        raise PretrainedFileError(f"{where}: {name}={value} is larger than any model built here ({at_most:,})")
    return value


def _positive_number(values: dict, name: str, where: str) -> float:
    value = values[name]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and value > 0):
        raise PretrainedFileError(f"{where}: {name} must be a finite number > 0, got {value!r}")
    return float(value)


def _finite_number(values: dict, name: str, where: str) -> float:
    value = values[name]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise PretrainedFileError(f"{where}: {name} must be a finite number, got {value!r}")
    return float(value)


def _rope_theta(values: dict, where: str) -> float:
    """rope_theta, from the top level or transformers' newer ``rope_parameters``; refuses any
    rotary scaling but the plain one."""
    for field in ("rope_scaling", "rope_parameters"):
        rope = values[field]
        if rope is None:
            continue
        if not isinstance(rope, dict):
            raise PretrainedFileError(f"{where}: {field} must be null or an object, got {rope!r}")
        kind = rope.get("rope_type", rope.get("type", "default"))
        if kind != "default":
            raise PretrainedFileError(f"{where}: {field} of rope_type {kind!r} is not supported (only 'default')")
        unknown = sorted(set(rope) - {"rope_type", "type", "rope_theta", "partial_rotary_factor"})
        if unknown:
            raise PretrainedFileError(f"{where}: {field} has field(s) {unknown} that are not supported")
        for key in ("rope_theta", "partial_rotary_factor"):
            if key in rope:
                if values.get(key) is not None and values[key] != rope[key]:
                    raise PretrainedFileError(
                        f"{where}: {field}.{key}={rope[key]!r} disagrees with {key}={values[key]!r}"
                    )
                values[key] = rope[key]
    if values["rope_theta"] is None:
        raise PretrainedFileError(f"{where}: rope_theta is missing")
    return _positive_number(values, "rope_theta", where)


def nemotron_fields(values: dict, where: str = CONFIG_NAME) -> dict[str, Any]:
    """The :class:`~spherenet.models.NGPTConfig` fields (keyword arguments: every field the layout fixes) of a
    config.json in the layout (a dict); a :class:`PretrainedFileError` naming ``where`` and the
    field for any field or value it cannot map: a model_type but "ngpt", biases, partial rotary, rotary scaling, dropout, tied
    embeddings, an activation but "relu2", an odd head_dim, heads not a multiple of the key/value
    heads, or an unknown field."""
    if not isinstance(values, dict):
        raise PretrainedFileError(f"{where} must hold a JSON object, got {type(values).__name__}")
    if values.get("model_type") != LAYOUT_MODEL_TYPE:
        raise PretrainedFileError(
            f"{where}: model_type is {values.get('model_type')!r}, not {LAYOUT_MODEL_TYPE!r} (the Normalized-Nemotron "
            "layout)"
        )
    unknown = sorted(set(values) - set(_REQUIRED) - set(_OPTIONAL) - _IGNORED)
    if unknown:
        raise PretrainedFileError(f"{where}: field(s) {', '.join(map(repr, unknown))} are not supported")
    missing = [name for name in _REQUIRED if name not in values]
    if missing:
        raise PretrainedFileError(f"{where}: required field(s) {', '.join(map(repr, missing))} are missing")
    values = {**_OPTIONAL, **values}
    for name in ("attention_bias", "mlp_bias", "tie_word_embeddings"):
        if values[name] is not False:
            raise PretrainedFileError(f"{where}: {name}={values[name]!r} is not supported (only false)")
    if values["attention_dropout"] not in (0, 0.0) or isinstance(values["attention_dropout"], bool):
        raise PretrainedFileError(
            f"{where}: attention_dropout={values['attention_dropout']!r} is not supported (only 0)"
        )
    if values["hidden_act"] != "relu2":
        raise PretrainedFileError(f"{where}: hidden_act={values['hidden_act']!r} is not supported (only 'relu2')")
    rope_base = _rope_theta(values, where)
    if values["partial_rotary_factor"] != 1 or isinstance(values["partial_rotary_factor"], bool):
        raise PretrainedFileError(
            f"{where}: partial_rotary_factor={values['partial_rotary_factor']!r} is not supported (only 1.0)"
        )
    sizes = {name: _positive_int(values, name, where) for name in _REQUIRED[:5] + ("max_position_embeddings",)}
    d, heads = sizes["hidden_size"], sizes["num_attention_heads"]
    if values["head_dim"] is None:
        if d % heads:
            raise PretrainedFileError(
                f"{where}: head_dim is null and hidden_size={d} is not divisible by {heads} heads"
            )
        values["head_dim"] = d // heads
    head_dim = _positive_int(values, "head_dim", where)
    if head_dim % 2:
        raise PretrainedFileError(f"{where}: head_dim={head_dim} is odd; rotary embeddings rotate pairs")
    if values["num_key_value_heads"] is None:
        values["num_key_value_heads"] = heads
    kv_heads = _positive_int(values, "num_key_value_heads", where)
    if heads % kv_heads:
        raise PretrainedFileError(
            f"{where}: num_attention_heads={heads} is not divisible by num_key_value_heads={kv_heads}"
        )
    scale = _positive_number(values, "initializer_range", where)
    init = {name: _finite_number(values, name, where) for name in _REQUIRED[8:]}
    return dict(
        vocab_size=sizes["vocab_size"],
        n_layers=sizes["num_hidden_layers"],
        d_model=d,
        n_heads=heads,
        n_kv_heads=kv_heads,
        head_dim=head_dim,
        d_mlp=sizes["intermediate_size"],
        mlp="relu2",
        max_seq_len=sizes["max_position_embeddings"],
        rope_base=rope_base,
        causal=True,
        update="lerp",
        qk_norm=True,
        alpha_attn=ScaleSpec(init=init["attn_alpha_init_value"], scale=scale, absolute=True),
        alpha_mlp=ScaleSpec(init=init["mlp_alpha_init_value"], scale=scale, absolute=True),
        s_qk=ScaleSpec(init=init["sqk_init_value"], scale=scale),
        s_uv=ScaleSpec(init=init["suv_init_value"], scale=_positive_number(values, "suv_init_scaling", where)),
        s_z=ScaleSpec(init=init["sz_init_value"], scale=scale),
    )


def layout_refusals(model: nn.Module) -> list[str]:
    """What of ``model`` the layout cannot express, by field."""
    if getattr(model, "model_type", None) != LAYOUT_MODEL_TYPE:  # an NGPT (its class's model_type)
        return [f"the layout holds an NGPT, not a {type(model).__name__}"]
    c = model.config
    problems = [f"mlp={c.mlp!r} (the layout's MLP is 'relu2')"] if c.mlp != "relu2" else []
    problems += [f"update={c.update!r} (the layout's is 'lerp')"] if c.update != "lerp" else []
    problems += ["qk_norm=False (the layout normalizes q and k)"] if not c.qk_norm else []
    problems += ["causal=False (the layout is causal)"] if not c.causal else []
    specs = {"alpha_attn": True, "alpha_mlp": True, "s_qk": False, "s_uv": False, "s_z": False}
    for field, absolute in specs.items():
        spec = getattr(c, field)
        if spec.mode != "vector":
            problems.append(f"{field}.mode={spec.mode!r} (the layout stores one value per element)")
        if spec.absolute != absolute:
            problems.append(f"{field}.absolute={spec.absolute} (the layout's is {absolute})")
    ranges = {field: getattr(c, field).stored_scale(c.d_model) for field in ("alpha_attn", "alpha_mlp", "s_qk", "s_z")}
    if len(set(ranges.values())) > 1:
        problems.append(f"stored scales {ranges} differ (the layout has one initializer_range for them)")
    return problems


def layout_config(model: nn.Module) -> dict:
    """config.json of an NGPT in the layout (one :func:`layout_refusals` accepts)."""
    c = model.config
    return {
        "architectures": [LAYOUT_ARCHITECTURE],
        "model_type": LAYOUT_MODEL_TYPE,
        "vocab_size": c.vocab_size,
        "hidden_size": c.d_model,
        "intermediate_size": c.d_mlp,
        "num_hidden_layers": c.n_layers,
        "num_attention_heads": c.n_heads,
        "num_key_value_heads": c.n_kv_heads,
        "head_dim": c.head_dim,
        "hidden_act": "relu2",
        "max_position_embeddings": c.max_seq_len,
        "initializer_range": c.s_z.stored_scale(c.d_model),
        # no "rope_scaling": absent means the plain rotation, and transformers >= 5 warns on the key
        "rope_theta": c.rope_base,
        "partial_rotary_factor": 1.0,
        "attention_bias": False,
        "mlp_bias": False,
        "attention_dropout": 0.0,
        "tie_word_embeddings": False,
        "sqk_init_value": c.s_qk.init,
        "attn_alpha_init_value": c.alpha_attn.init,
        "suv_init_value": c.s_uv.init,
        "suv_init_scaling": c.s_uv.stored_scale(c.d_model),
        "mlp_alpha_init_value": c.alpha_mlp.init,
        "sz_init_value": c.s_z.init,
        "torch_dtype": str(model.embed_in.weight.dtype).removeprefix("torch."),
    }


def is_published_config(values: Any) -> bool:
    """Whether a config.json's contents describe a model in the published layout."""
    if not isinstance(values, dict) or values.get("model_type") != LAYOUT_MODEL_TYPE:
        return False
    architectures = values.get("architectures")
    return isinstance(architectures, list) and LAYOUT_ARCHITECTURE in architectures


def is_published_directory(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a local directory whose config.json describes the published layout
    (an unreadable config.json is not; loading it says why)."""
    config_file = Path(path).expanduser() / CONFIG_NAME
    try:
        return config_file.is_file() and is_published_config(json.loads(config_file.read_text(encoding="utf-8")))
    except (OSError, ValueError):
        return False
