"""spherenet's models in transformers: configs and causal LM classes of nGPT and GPT, registered
with ``AutoConfig`` and ``AutoModelForCausalLM`` (model_type ``spherenet-ngpt`` /
``spherenet-gpt``) when this package is imported.

An export (``save_pretrained``, ``spherenet-export``) carries the portable model code
(:mod:`spherenet.hf.portable`: a configuration, a guards and a modeling file, torch and transformers only),
so ``AutoModelForCausalLM.from_pretrained(export, trust_remote_code=True)`` loads it where
spherenet is not installed. Needs ``pip install "spherenet-torch[hf]"``.

Training with ``transformers.Trainer`` keeps nGPT on the sphere with its defaults (the model
renormalizes its sphere weights after every optimizer step), :class:`SphereCallback` or
spherenet's optimizers (``optimizers=spherenet.optim.build_optimizer(model, ...)``), and resumes
from the last checkpoint it finished writing; see :mod:`spherenet.hf.trainer`.

:func:`from_normalized_nemotron` and :func:`to_normalized_nemotron` read and write NGPT in the
published Normalized-Nemotron layout (:func:`spherenet.models.from_normalized_nemotron` and
:mod:`spherenet.io`, which need no transformers).
"""

from importlib import metadata

from packaging.version import Version

from .. import install_hint

#: package -> (lowest supported version, first unsupported one)
SUPPORTED_VERSIONS = {"transformers": ("5.24", "6"), "peft": ("0.21", "1")}


def check_versions(installed: dict[str, str | None] | None = None) -> None:
    """Raise ``ImportError`` in one line naming both packages' versions when transformers or
    peft (when installed) is outside :data:`SUPPORTED_VERSIONS`. ``installed``: ``{package:
    version or None}``, by default what is installed."""
    if installed is None:
        installed = {}
        for package in SUPPORTED_VERSIONS:
            try:
                installed[package] = metadata.version(package)
            except metadata.PackageNotFoundError:
                installed[package] = None
    outside = [
        package
        for package, (low, high) in SUPPORTED_VERSIONS.items()
        if installed.get(package) is not None and not Version(low) <= Version(installed[package]) < Version(high)
    ]
    if installed.get("transformers") is None or outside:
        supported = ", ".join(f"{p}>={low},<{high}" for p, (low, high) in SUPPORTED_VERSIONS.items())
        found = ", ".join(f"{p} {installed.get(p) or 'not installed'}" for p in SUPPORTED_VERSIONS)
        raise ImportError(f"spherenet.hf needs {supported}; installed: {found} ({install_hint('hf')})")


check_versions()

from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402 - after the version check

from ..io import to_normalized_nemotron  # noqa: E402
from ..models import from_normalized_nemotron  # noqa: E402
from .configuration import SpherenetGPTConfig, SpherenetNGPTConfig  # noqa: E402
from .modeling import SpherenetGPTForCausalLM, SpherenetNGPTForCausalLM  # noqa: E402
from .trainer import SphereCallback  # noqa: E402

for _config, _model in ((SpherenetNGPTConfig, SpherenetNGPTForCausalLM), (SpherenetGPTConfig, SpherenetGPTForCausalLM)):
    AutoConfig.register(_config.model_type, _config, exist_ok=True)
    AutoModelForCausalLM.register(_config, _model, exist_ok=True)

__all__ = [
    "SpherenetNGPTConfig",
    "SpherenetGPTConfig",
    "SpherenetNGPTForCausalLM",
    "SpherenetGPTForCausalLM",
    "SphereCallback",
    "from_normalized_nemotron",
    "to_normalized_nemotron",
    "SUPPORTED_VERSIONS",
    "check_versions",
]
