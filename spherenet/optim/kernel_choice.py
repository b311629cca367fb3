"""Which kernel runs a step: torch's fused Adam or the foreach one for each tensor, and which sphere
kernel (native C++, Triton, foreach) a ``sphere_kernel`` choice means on a device.

All sphere kernels take the same arguments (``sphere_adam_(xs, gs, ms, vs, step_sizes,
bias2_sqrts, beta1, beta2, eps, tiny, row_v, project)``, the step counter already moved) and
compute the same step, up to float rounding. Which one a ``sphere_kernel`` choice means is
:func:`spherenet.kernels.resolve.resolve`'s answer for the op below: the ``sphere_kernel`` argument, and
for ``"auto"`` a ``spherenet.kernels.use`` block or the environment variable ``SPHERENET_KERNELS``
(``triton``: the Triton kernel on every device, CPU tensors under ``TRITON_INTERPRET=1``;
``torch`` or ``reference``: the foreach kernels; ``native``: the C++ kernel on CPU).
"""

from __future__ import annotations

import importlib.util

import torch

from ..kernels.resolve import Op, resolve

__all__ = ["SPHERE_KERNELS", "resolve_sphere_kernel", "split_fused", "triton_status", "takes_triton_rows"]

SPHERE_KERNELS = ("auto", "native", "triton", "foreach")
_FUSED_DEVICES = ("cpu", "cuda", "xpu")
_FUSED_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
# The sphere step's implementations (the resolver's names -> this package's kernel names) and
# what "auto" takes per device type.
_SPHERE_ADAM = Op(
    "sphere_adam_",
    implementations={"reference": "foreach", "torch": "foreach", "native": "native", "triton": "triton"},
    auto={"cpu": "native", "cuda": "triton", "*": "torch"},
)


def triton_status() -> tuple[bool, str | None]:
    """Whether the Triton kernel can run (Triton installed), and why not."""
    if importlib.util.find_spec("triton") is None:
        return False, "triton is not installed (pip install 'spherenet[triton]')"
    return True, None


def _fusable(t: torch.Tensor) -> bool:
    return t.device.type in _FUSED_DEVICES and t.dtype in _FUSED_DTYPES


def resolve_sphere_kernel(choice: str, device_type: str) -> str:
    """The kernel a ``sphere_kernel`` choice asks for, for a tensor on ``device_type``, before
    availability and layout are checked: ``"auto"`` is ``"native"`` on CPU, ``"triton"`` on
    CUDA, ``"foreach"`` elsewhere (``SPHERENET_KERNELS=triton``: ``"triton"`` everywhere;
    ``=torch`` or ``=reference``: ``"foreach"``); ``"native"`` is CPU only (``"foreach"``
    elsewhere)."""
    requested = None if choice == "auto" else {"foreach": "torch"}.get(choice, choice)
    kernel = _SPHERE_ADAM.implementations[resolve(_SPHERE_ADAM, requested, device_type)]
    if kernel == "native" and device_type != "cpu":
        return "foreach"
    return kernel


def takes_triton_rows(*tensors: torch.Tensor) -> bool:
    """Whether the row kernels outside ``RiemannianAdam`` (``normalize_``, ``SphericalMuon``'s
    tail) take Triton for these tensors: the sphere optimizer's ``"auto"`` choice for their device
    is Triton, Triton is installed, and every tensor is contiguous float32/bf16/fp16."""
    return (
        resolve_sphere_kernel("auto", tensors[0].device.type) == "triton"
        and all(t.dtype in (torch.float32, torch.bfloat16, torch.float16) and t.is_contiguous() for t in tensors)
        and triton_status()[0]
    )


def split_fused(option, tensors: list[torch.Tensor]) -> list[bool]:
    """Per tensor: take the fused kernel? ``option=True/False`` forces it; ``None`` picks it
    wherever torch has one (CPU/CUDA/XPU, float dtypes), small CPU tensors included (faster
    than the foreach kernel there; BENCHMARKS.md)."""
    if option is not None:
        return [bool(option)] * len(tensors)
    return [_fusable(t) for t in tensors]
