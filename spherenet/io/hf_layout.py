"""The files of a saved model besides its weights (:mod:`spherenet.io.pretrained`): ``config.json``'s
metadata (``model_type``, ``auto_map``), the portable model code that transformers runs under
``trust_remote_code=True``, and ``sha256sums.json``, the manifest that every file is checked
against on load.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

from .hf_weights import WEIGHTS_NAME, PretrainedFileError, resolve

__all__ = [
    "CONFIG_NAME",
    "MANIFEST_NAME",
    "MODELING_NAME",
    "CONFIGURATION_NAME",
    "GUARDS_NAME",
    "PORTABLE_CODE",
    "PORTABLE_MODELING",
    "METADATA_KEYS",
    "TRANSFORMERS_KEYS",
    "PretrainedFileWarning",
    "exported_model_type",
    "auto_map",
    "write_portable_code",
    "write_manifest",
    "verify_manifest",
]

CONFIG_NAME = "config.json"
MANIFEST_NAME = "sha256sums.json"
MODELING_NAME = "modeling_spherenet.py"  # the model classes; imports the two files below
CONFIGURATION_NAME = "configuration_spherenet.py"  # the config classes
GUARDS_NAME = "guards_spherenet.py"  # the sphere's guards and the export's files on save and load
# keys config.json holds besides the config's fields
METADATA_KEYS = ("model_type", "architectures", "spherenet_version", "auto_map")
# keys transformers writes into config.json besides the model's fields (its PretrainedConfig's fields, the
# transformers classes' use_cache and tie_word_embeddings, the token ids Trainer copies from a tokenizer): an
# export saved again by transformers has them. None changes what the model computes (spherenet's models are
# untied; the cache and the token ids are generation's), so a loader passes over them.
TRANSFORMERS_KEYS = (
    "transformers_version",
    "_name_or_path",
    "dtype",
    "torch_dtype",
    "use_cache",
    "tie_word_embeddings",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
    "output_attentions",
    "output_hidden_states",
    "return_dict",
    "chunk_size_feed_forward",
    "is_encoder_decoder",
    "id2label",
    "label2id",
    "problem_type",
)

# The portable model code (torch and transformers only), written into every export under the names it has
# here (the modeling file imports the other two by those names). Read by path: io may not
# import hf, and importing spherenet.hf would need transformers.
PORTABLE_CODE = Path(__file__).resolve().parents[1] / "hf" / "portable"
PORTABLE_MODELING = PORTABLE_CODE / MODELING_NAME
_PORTABLE_NAMES = (CONFIGURATION_NAME, GUARDS_NAME, MODELING_NAME)


class PretrainedFileWarning(UserWarning):
    """A saved model has no manifest: its files are loaded without a check against damage."""


def exported_model_type(model_type: str) -> str:
    """config.json's ``model_type`` for a model class's: prefixed, so that no other library
    reads an export as its own model of the same name (transformers has an "ngpt")."""
    return f"spherenet-{model_type}"


def auto_map(architecture: str) -> dict[str, str]:
    """config.json's ``auto_map`` for ``architecture`` ("NGPT" / "GPT"): transformers' classes in the
    portable code's configuration and modeling files."""
    return {
        "AutoConfig": f"{CONFIGURATION_NAME.removesuffix('.py')}.Spherenet{architecture}Config",
        "AutoModelForCausalLM": f"{MODELING_NAME.removesuffix('.py')}.Spherenet{architecture}ForCausalLM",
    }


def write_portable_code(directory: str | os.PathLike) -> tuple[str, ...]:
    """Write the portable code's files into ``directory``; returns their names."""
    for name in _PORTABLE_NAMES:
        (Path(directory) / name).write_text((PORTABLE_CODE / name).read_text(encoding="utf-8"), encoding="utf-8")
    return _PORTABLE_NAMES


def write_manifest(directory: str | os.PathLike, names=(CONFIG_NAME, WEIGHTS_NAME)) -> None:
    """Write ``sha256sums.json`` over the files ``names`` of ``directory``."""
    from ..checkpoint import write_files_manifest

    write_files_manifest(directory, names, MANIFEST_NAME)


def verify_manifest(path_or_repo, config_file: Path, download: dict[str, Any], names: list[str]) -> None:
    """Check config.json and the weight files ``names`` (model.safetensors, or the shards and their
    index) against the manifest beside them (fetched with them from a Hub repository); warn when
    there is none."""
    from ..checkpoint import CheckpointCorruptError, verify_files_manifest

    directory = Path(config_file).parent
    try:
        resolve(path_or_repo, MANIFEST_NAME, download)  # a Hub repository: into the same snapshot
        listed = verify_files_manifest(directory, (CONFIG_NAME, *names), MANIFEST_NAME)
    except FileNotFoundError:
        listed = False
    except CheckpointCorruptError as exc:
        raise PretrainedFileError(str(exc)) from None
    if not listed:
        warnings.warn(
            f"{directory} has no {MANIFEST_NAME}: its files cannot be checked for damage (saved by hand or by an "
            "older spherenet); loading them with the tensor checks only",
            PretrainedFileWarning,
            stacklevel=4,  # the caller of a model's from_pretrained
        )
