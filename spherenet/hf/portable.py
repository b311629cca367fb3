"""Make an export written before exports carried the portable model code self-contained: its
modeling file becomes :mod:`spherenet.hf.portable_modeling`, which needs torch and transformers
only, so that ``AutoModelForCausalLM.from_pretrained(export, trust_remote_code=True)`` loads it
where spherenet is not installed. (``save_pretrained`` and ``recipes.export`` write that file
themselves.)"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..models.hub import CONFIG_NAME, MANIFEST_NAME, MODELING_NAME, WEIGHTS_NAME, write_manifest

__all__ = ["PORTABLE_MODELING_FILE", "portable_auto_map", "write_portable_modeling"]

#: The source written into an export as its modeling file.
PORTABLE_MODELING_FILE = Path(__file__).with_name("portable_modeling.py")

# config.json's model_type -> the architecture whose classes the modeling file holds
_ARCHITECTURES = {"spherenet-ngpt": "NGPT", "spherenet-gpt": "GPT"}


def portable_auto_map(architecture: str) -> dict[str, str]:
    """config.json's ``auto_map`` for the classes of ``architecture`` ("NGPT" / "GPT") in the
    portable modeling file."""
    module = MODELING_NAME.removesuffix(".py")
    return {
        "AutoConfig": f"{module}.Spherenet{architecture}Config",
        "AutoModelForCausalLM": f"{module}.Spherenet{architecture}ForCausalLM",
    }


def write_portable_modeling(directory: str | os.PathLike) -> None:
    """Write the portable modeling file into the export ``directory`` as its modeling file, point
    config.json's ``auto_map`` at its classes, and rewrite the file manifest (when the directory
    has one) over the files it covers. Raises ``ValueError`` naming the file when the directory
    holds no spherenet export."""
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
    (directory / MODELING_NAME).write_text(PORTABLE_MODELING_FILE.read_text(encoding="utf-8"), encoding="utf-8")
    values["auto_map"] = portable_auto_map(_ARCHITECTURES[model_type])
    config_file.write_text(json.dumps(values, indent=2) + "\n", encoding="utf-8")
    if (directory / MANIFEST_NAME).is_file():
        write_manifest(directory, (CONFIG_NAME, WEIGHTS_NAME, MODELING_NAME))
