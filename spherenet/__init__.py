"""spherenet: neural networks whose weights and hidden states live on the unit hypersphere."""

import re

import torch

__version__ = "0.1.0"

#: The name this project installs under (``pip install spherenet-torch``); the package imports as
#: ``spherenet``. The package index's ``spherenet`` is another, unrelated project.
DISTRIBUTION = "spherenet-torch"


def install_hint(extra: str | None = None) -> str:
    """The command that installs spherenet (with an optional extra, e.g. ``"hf"``)."""
    return f'pip install "{DISTRIBUTION}[{extra}]"' if extra else f"pip install {DISTRIBUTION}"


# The oldest torch spherenet runs on, as declared in pyproject.toml: the Adam/AdamW steps call
# torch.optim.adam.adam(..., decoupled_weight_decay=True), which torch added in 2.7 (with
# AdamW becoming Adam with that flag); FSDP2 also needs the public torch.distributed.fsdp.fully_shard
# (2.6) and torch.distributed.tensor (2.5).
MIN_TORCH = (2, 7)


def _check_torch_version(version: str) -> None:
    found = re.match(r"(\d+)\.(\d+)", version)
    if found and tuple(int(x) for x in found.groups()) < MIN_TORCH:
        floor = ".".join(map(str, MIN_TORCH))
        raise ImportError(
            f"spherenet needs torch >= {floor} (for torch.optim.adam.adam(decoupled_weight_decay=...)), "
            f"but this environment has torch {version}; upgrade with: pip install 'torch>={floor}'"
        )


_check_torch_version(str(torch.__version__))
