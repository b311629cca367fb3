"""Writing an :class:`~spherenet.models.NGPT` in the published Normalized-Nemotron layout
(:func:`to_normalized_nemotron`; the layout is described in :mod:`spherenet.io.nemotron_read`), with
the tokenizer files transformers' ``AutoTokenizer`` reads beside it
(:func:`write_transformers_tokenizer_config`).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from torch import nn

from ..checkpoint import CheckpointError
from .hf_layout import CONFIG_NAME, MANIFEST_NAME, write_manifest
from .hf_weights import WEIGHTS_NAME, require
from .nemotron_config_map import layout_config, layout_refusals
from .nemotron_layout import (
    INDEX_NAME,
    SPECIAL_TOKENS_MAP,
    TOKENIZER_CONFIG,
    TOKENIZER_FILES,
    TOKENIZER_JSON,
    layout_tensors,
    layout_view,
)

__all__ = ["to_normalized_nemotron", "write_transformers_tokenizer_config"]


def _shard_bytes(size: int | str) -> int:
    """Bytes of ``max_shard_size``: an int, or a string like "5GB", "500MB", "2GiB"."""
    if isinstance(size, int) and not isinstance(size, bool) and size > 0:
        return size
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMG]i?B|B)\s*", str(size), re.IGNORECASE)
    if not match:
        raise ValueError(f"max_shard_size must be a positive int or a size like '5GB', got {size!r}")
    unit = match[2].upper()
    factor = 1 if unit == "B" else (1024 if "I" in unit else 1000) ** ("KMG".index(unit[0]) + 1)
    return int(float(match[1]) * factor)


def write_transformers_tokenizer_config(directory: Path, eos_id: int, max_length: int) -> None:
    """Write ``tokenizer_config.json`` and ``special_tokens_map.json`` beside ``directory``'s
    ``tokenizer.json`` unless it has them: transformers' ``AutoTokenizer`` then has the
    tokenizer's end-of-text token as ``eos_token`` (lm-evaluation-harness's ``hf`` model needs
    one) and as ``pad_token`` (a batched ``generate`` pads its rows; the padding is masked, so
    which token fills it does not matter), splits special-token strings inside text as text (as
    spherenet's tokenizers do) and adds no BOS (spherenet's models are trained without one)."""
    from tokenizers import Tokenizer as _Tokenizers

    if (directory / TOKENIZER_CONFIG).exists():
        return
    eos_token = _Tokenizers.from_file(str(directory / TOKENIZER_JSON)).id_to_token(eos_id)
    if eos_token is None:
        raise CheckpointError(f"{directory / TOKENIZER_JSON} has no token of the end-of-text id {eos_id}")
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": eos_token,
        "pad_token": eos_token,
        "model_max_length": max_length,
        "split_special_tokens": True,
        "clean_up_tokenization_spaces": False,
    }
    (directory / TOKENIZER_CONFIG).write_text(json.dumps(config, indent=1) + "\n", encoding="utf-8")
    if not (directory / SPECIAL_TOKENS_MAP).exists():
        (directory / SPECIAL_TOKENS_MAP).write_text(
            json.dumps({"eos_token": eos_token, "pad_token": eos_token}) + "\n", encoding="utf-8"
        )


def to_normalized_nemotron(
    model: nn.Module, path: str | os.PathLike, max_shard_size: int | str = "5GB", tokenizer=None
) -> None:
    """Write ``model`` (an :class:`~spherenet.models.NGPT`) into the directory ``path`` in the
    Normalized-Nemotron layout: config.json and model.safetensors, or shards of at most ``max_shard_size`` with
    model.safetensors.index.json when it is larger; with ``tokenizer`` (a spherenet
    :class:`~spherenet.data.tokenizer.Tokenizer`, e.g. the byte tokenizer), its tokenizer.json,
    and tokenizer_config.json / special_tokens_map.json naming its end-of-text token as
    ``eos_token`` (what transformers' AutoTokenizer and spherenet's recipes read); and
    sha256sums.json, the size and sha256 of each file written, checked when the directory is
    loaded. Tensors keep their dtype and values (the scalings verbatim: nemotron_read's table);
    earlier weight files of the layout in ``path`` (and its tokenizer files, when ``tokenizer``
    is given) are removed, nothing else is written. Raises ``ValueError`` naming every config
    field the layout cannot express (a SwiGLU MLP, another residual update, qk_norm off, scalar
    or fixed or differently scaled scalings), or a tokenizer with more ids than the model."""
    problems = layout_refusals(model)
    if tokenizer is not None and tokenizer.vocab_size > model.config.vocab_size:
        problems.append(f"the tokenizer has {tokenizer.vocab_size} ids, more than vocab_size={model.config.vocab_size}")
    if problems:
        raise ValueError(f"the Normalized-Nemotron layout cannot express this model: {'; '.join(problems)}")
    safetensors_torch = require("safetensors.torch")
    limit = _shard_bytes(max_shard_size)
    parameters = dict(model.named_parameters())
    table = layout_tensors(model.config)
    shards: list[list[tuple[str, str, str]]] = [[]]
    used = 0
    for name, target, how, _ in table:
        nbytes = parameters[target].numel() * parameters[target].element_size()
        if shards[-1] and used + nbytes > limit:
            shards.append([])
            used = 0
        shards[-1].append((name, target, how))
        used += nbytes
    directory = Path(path).expanduser()
    directory.mkdir(parents=True, exist_ok=True)
    stale = [directory / WEIGHTS_NAME, directory / INDEX_NAME, directory / MANIFEST_NAME]
    stale += [directory / name for name in TOKENIZER_FILES] if tokenizer is not None else []
    for old in [*stale, *directory.glob("model-*-of-*.safetensors")]:
        old.unlink(missing_ok=True)
    files = [WEIGHTS_NAME]
    if len(shards) > 1:  # transformers' shard names
        files = [f"model-{i:05d}-of-{len(shards):05d}.safetensors" for i in range(1, len(shards) + 1)]
    weight_map, total = {}, 0
    for file, shard in zip(files, shards):
        tensors = {
            name: layout_view(parameters[target].detach(), how).contiguous().cpu() for name, target, how in shard
        }
        safetensors_torch.save_file(tensors, str(directory / file), metadata={"format": "pt"})
        weight_map |= dict.fromkeys(tensors, file)
        total += sum(t.numel() * t.element_size() for t in tensors.values())
        del tensors
    if len(files) > 1:
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (directory / INDEX_NAME).write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
    (directory / CONFIG_NAME).write_text(json.dumps(layout_config(model), indent=2) + "\n", encoding="utf-8")
    written = [CONFIG_NAME, *files] + ([INDEX_NAME] if len(files) > 1 else [])
    if tokenizer is not None:
        (directory / TOKENIZER_JSON).write_text(tokenizer.tokenizer_json(), encoding="utf-8")
        write_transformers_tokenizer_config(directory, tokenizer.eos_id, model.config.max_seq_len)
        written += list(TOKENIZER_FILES)
    write_manifest(directory, written)
