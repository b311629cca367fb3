"""Saved models on disk and on the Hub: the files, not the models.

- The Hugging Face layout of spherenet's exports (:mod:`~spherenet.io.pretrained`: what a
  model's ``save_pretrained`` / ``from_pretrained`` / ``push_to_hub`` do): the weight files, one
  ``model.safetensors`` or shards with their index, and the checks of their tensors
  (:mod:`~spherenet.io.hf_weights`); config.json's metadata, the portable model code's files and
  the manifest ``sha256sums.json`` (:mod:`~spherenet.io.hf_layout`).
- NVIDIA's published Normalized-Nemotron layout: its config.json both ways
  (:mod:`~spherenet.io.nemotron_config_map`), its tensor table (:mod:`~spherenet.io.nemotron_layout`),
  reading into a built model (:mod:`~spherenet.io.nemotron_read`) and writing
  (:mod:`~spherenet.io.nemotron_write`).
- Reading safetensors files tensor by tensor into existing tensors
  (:mod:`~spherenet.io.safetensors_stream`).

This package knows a model only as its config's fields, its state dict and which tensors are
sphere weights (the registry of :mod:`spherenet.manifolds`); it imports no model class. Building
the model a directory holds is :mod:`spherenet.models`' (``NGPT.from_pretrained``,
:func:`spherenet.models.load_pretrained`, :func:`spherenet.models.from_normalized_nemotron`,
:func:`spherenet.models.load_saved`).
"""

from .hf_layout import (
    CONFIG_NAME,
    CONFIGURATION_NAME,
    GUARDS_NAME,
    MANIFEST_NAME,
    METADATA_KEYS,
    MODELING_NAME,
    PORTABLE_CODE,
    PORTABLE_MODELING,
    TRANSFORMERS_KEYS,
    PretrainedFileWarning,
    auto_map,
    exported_model_type,
    verify_manifest,
    write_manifest,
    write_portable_code,
)
from .hf_weights import (
    HUB_ARGS,
    INDEX_NAME,
    INSTALL_HINT,
    OFF_SPHERE_REMEDY,
    WEIGHTS_NAME,
    PretrainedFileError,
    check_finite,
    check_tensors,
    check_unit_rows,
    off_sphere,
    pick_device,
    pick_dtype,
    read_weights,
    write_weights,
)
from .nemotron_config_map import (
    LAYOUT_ARCHITECTURE,
    LAYOUT_MODEL_TYPE,
    is_published_config,
    is_published_directory,
    layout_config,
    layout_refusals,
    nemotron_fields,
)
from .nemotron_layout import SPECIAL_TOKENS_MAP, TOKENIZER_CONFIG, TOKENIZER_FILES, TOKENIZER_JSON, layout_tensors
from .nemotron_read import (
    UNIT_TOLERANCE,
    NemotronDirectory,
    nemotron_fields_of,
    open_normalized_nemotron,
    read_normalized_nemotron_into,
)
from .nemotron_write import to_normalized_nemotron, write_transformers_tokenizer_config
from .pretrained import (
    PretrainedContents,
    PretrainedDirectory,
    check_on_sphere,
    config_from_dict,
    open_pretrained,
    push_to_hub,
    save_pretrained,
    saved_model_type,
)
from .safetensors_stream import StoredTensor, TensorFileError, read_header, read_into

__all__ = [
    # the Hugging Face layout
    "save_pretrained",
    "push_to_hub",
    "open_pretrained",
    "saved_model_type",
    "PretrainedContents",
    "PretrainedDirectory",
    "config_from_dict",
    "check_on_sphere",
    "PretrainedFileError",
    "PretrainedFileWarning",
    "CONFIG_NAME",
    "WEIGHTS_NAME",
    "INDEX_NAME",
    "MANIFEST_NAME",
    "MODELING_NAME",
    "CONFIGURATION_NAME",
    "GUARDS_NAME",
    "PORTABLE_CODE",
    "PORTABLE_MODELING",
    "METADATA_KEYS",
    "TRANSFORMERS_KEYS",
    "HUB_ARGS",
    "INSTALL_HINT",
    "exported_model_type",
    "auto_map",
    "write_portable_code",
    "write_manifest",
    "verify_manifest",
    "write_weights",
    "read_weights",
    "check_tensors",
    "check_finite",
    "check_unit_rows",
    "off_sphere",
    "OFF_SPHERE_REMEDY",
    "pick_dtype",
    "pick_device",
    # the Normalized-Nemotron layout
    "LAYOUT_MODEL_TYPE",
    "LAYOUT_ARCHITECTURE",
    "is_published_config",
    "is_published_directory",
    "nemotron_fields",
    "nemotron_fields_of",
    "layout_config",
    "layout_refusals",
    "layout_tensors",
    "open_normalized_nemotron",
    "NemotronDirectory",
    "read_normalized_nemotron_into",
    "to_normalized_nemotron",
    "write_transformers_tokenizer_config",
    "UNIT_TOLERANCE",
    "TOKENIZER_FILES",
    "TOKENIZER_JSON",
    "TOKENIZER_CONFIG",
    "SPECIAL_TOKENS_MAP",
    # safetensors files, tensor by tensor
    "StoredTensor",
    "TensorFileError",
    "read_header",
    "read_into",
]
