"""Every accelerated op of spherenet, below :mod:`spherenet.layers` and :mod:`spherenet.optim`:
they call an op, and neither chooses its implementation.

Each op has a plain-torch reference written in the algorithm's order, and beside it its other
implementations under the same signature (fused torch, native C++, Triton: a Triton kernel, its
``torch.library.custom_op``, fake and wrapper together in a ``*_triton`` module, imported on
first use). Which one runs is decided in one place, :mod:`spherenet.kernels.resolve`
(the op's argument, else the setting: the environment variable ``SPHERENET_KERNELS``, or
:func:`~spherenet.kernels.resolve.configure`), once per device type and dtype, and kept.
The Triton kernels share the helpers of :mod:`spherenet.kernels.triton_helpers`.

The layer ops (equation numbers of Loshchilov et al., "nGPT", 2024), in
:mod:`~spherenet.kernels.layer_ops` with their references and tables, their fused torch
functions in :mod:`~spherenet.kernels.fused` (SLERP's in :mod:`~spherenet.kernels.slerp_fused`):

- :func:`normalize` ``Norm(x)`` (Table 1) and :func:`qk_normalize` ``Norm(x) * s_qk`` (eq. 15, 16);
- :func:`residual_update`, LERP (eq. 10, 11), SLERP (eq. 6) and Riemannian (eq. 24-26);
- :func:`swiglu` (eq. 19) and :func:`relu2`, the squared ReLU;
- :func:`scaled_linear` (eq. 3, 20, 21).

The optimizer ops (Section 2.6; the Triton kernels of both in :mod:`~spherenet.kernels.sphere_rows_triton`):

- :func:`sphere_adam_`, Adam then the retraction (eq. 22, 24-26): :mod:`~spherenet.kernels.sphere_adam`;
- :func:`normalize_rows_` and :func:`sphere_muon_tail_`: :mod:`~spherenet.kernels.sphere_rows`.
"""

from . import resolve  # the module (its function resolve.resolve is not re-exported: one name, one thing)
from ._choice import implementation_status
from .layer_ops import normalize, qk_normalize, relu2, residual_update, scaled_linear, swiglu
from .resolve import VALUES, Op, checkpoint, configure, setting
from .sphere_adam import SphereAdamOptions, sphere_adam_
from .sphere_rows import normalize_rows_, sphere_muon_tail_

__all__ = [
    "VALUES",
    "Op",
    "resolve",
    "configure",
    "setting",
    "checkpoint",
    "implementation_status",
    "normalize",
    "qk_normalize",
    "residual_update",
    "swiglu",
    "relu2",
    "scaled_linear",
    "sphere_adam_",
    "SphereAdamOptions",
    "normalize_rows_",
    "sphere_muon_tail_",
]
