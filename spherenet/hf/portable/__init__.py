"""The portable model code of an export: nGPT and GPT as transformers classes needing torch and
transformers only, in the files an export carries under the names they have here,
:mod:`~spherenet.hf.portable.configuration_spherenet` (the config classes, config.json's
``auto_map["AutoConfig"]``), :mod:`~spherenet.hf.portable.guards_spherenet` (the sphere's guards)
and :mod:`~spherenet.hf.portable.modeling_spherenet` (the causal LM classes,
``auto_map["AutoModelForCausalLM"]``; it imports the other two, which transformers' remote code
copies along), so that ``AutoModelForCausalLM.from_pretrained(export, trust_remote_code=True)``
loads it where spherenet is not installed. ``save_pretrained`` and ``recipes.export`` write them;
:func:`write_portable_modeling` brings an export written before them (no modeling file, spherenet's
own, or the single-file portable code) up to date.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ...io.hf_layout import (
    CONFIG_NAME,
    MANIFEST_NAME,
    PORTABLE_MODELING,
    auto_map,
    write_manifest,
    write_portable_code,
)

__all__ = ["PORTABLE_MODELING_FILE", "portable_auto_map", "write_portable_modeling"]

#: The source written into an export as its modeling file (it imports the other two files beside it).
PORTABLE_MODELING_FILE = PORTABLE_MODELING

# config.json's model_type -> the architecture whose classes the portable code holds
_ARCHITECTURES = {"spherenet-ngpt": "NGPT", "spherenet-gpt": "GPT"}


def portable_auto_map(architecture: str) -> dict[str, str]:
    """config.json's ``auto_map`` for the classes of ``architecture`` ("NGPT" / "GPT") in the
    portable code's files."""
    return auto_map(architecture)


def write_portable_modeling(directory: str | os.PathLike) -> None:
    """Write the portable code's files into the export ``directory``, point config.json's
    ``auto_map`` at their classes, and rewrite the file manifest (when the directory has one) over
    the files it listed that are still there and the code's files. Raises ``ValueError`` naming the file when the directory holds no
    spherenet export."""
    directory = Path(directory)
    config_file = directory / CONFIG_NAME
    try:
        values = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(f"{config_file}: not a readable config.json of a spherenet export ({exc})") from None
    model_type = values.get("model_type") if isinstance(values, dict) else None
    if model_type not in _ARCHITECTURES:
        raise ValueError(
            f"{config_file} has model_type {model_type!r}; a spherenet export has {' or '.join(_ARCHITECTURES)}"
        )
    code_files = write_portable_code(directory)
    values["auto_map"] = portable_auto_map(_ARCHITECTURES[model_type])
    config_file.write_text(json.dumps(values, indent=2) + "\n", encoding="utf-8")
    manifest = directory / MANIFEST_NAME
    if manifest.is_file():
        # every file it listed that is still there (weights or shards, tokenizer, model card), plus the code
        try:
            listed = json.loads(manifest.read_text(encoding="utf-8")).get("files", {})
        except (OSError, ValueError, AttributeError):
            listed = {}
        kept = [name for name in listed if isinstance(name, str) and (directory / name).is_file()]
        write_manifest(directory, sorted({CONFIG_NAME, *kept, *code_files}))
