"""Every accelerated op of spherenet, one module per op family, below :mod:`spherenet.layers`
and :mod:`spherenet.optim`: they call an op, and neither chooses its implementation.

Each op has a plain-torch reference written in the algorithm's order, and beside it its other
implementations under the same signature (fused torch, native C++, Triton: a Triton kernel, its
``torch.library.custom_op``, fake and wrapper together in the op family's Triton module). Which
one runs is decided in one place, :mod:`spherenet.kernels.resolve` (the op's argument, a
``with use(name):`` block, the environment variable ``SPHERENET_KERNELS``). The Triton kernels
share the helpers of :mod:`spherenet.kernels._triton`.
"""

from . import resolve  # the module (its function resolve.resolve is not re-exported: one name, one thing)
from .resolve import VALUES, Op, active, checkpoint, use

__all__ = ["VALUES", "Op", "resolve", "use", "active", "checkpoint"]
