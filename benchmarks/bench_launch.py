"""Host-side cost of one Triton sphere-Adam call: everything ``sphere_adam_`` does on the CPU
before a kernel runs (grouping, checks, the launch tables), with the kernel launch itself replaced
by a no-op, so it runs without a GPU. On a GPU this time is spent at every optimizer step, beside
the kernels; torch's fused Adam spends almost none.

The tensors are those of a preset's sphere weights (default: the paper's 0.5B nGPT), allocated
but never touched (only their addresses are read), four per parameter (x, gradient, m, v).

    python benchmarks/bench_launch.py [--preset ngpt-0.5b] [--calls 20]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("TRITON_INTERPRET", "1")  # CPU tensors are accepted (no kernel runs)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402

from spherenet.kernels import sphere_rows_triton as triton_kernel  # noqa: E402
from spherenet.manifolds import named_sphere_parameters  # noqa: E402
from spherenet.models import from_preset  # noqa: E402


class NoLaunch:
    """Stands in for a ``@triton.jit`` kernel: ``kernel[grid](...)`` does nothing."""

    def __getitem__(self, grid):
        return lambda *args, **meta: None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="ngpt-0.5b")
    parser.add_argument("--calls", type=int, default=20)
    args = parser.parse_args()
    with torch.device("meta"):
        shapes = [tuple(p.shape) for _, p in named_sphere_parameters(from_preset(args.preset))]
    tensors = [[torch.empty(shape) for shape in shapes] for _ in range(4)]  # never written: no memory used
    triton_kernel._sphere_adam_rows = NoLaunch()
    n = len(shapes)

    def call():
        triton_kernel.sphere_adam_rows_(*tensors, [1e-3] * n, [0.1] * n, 0.9, 0.95, 1e-8, 1e-30, False, False)

    call()  # the first call builds what later calls reuse
    times = []
    for _ in range(args.calls):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    first = time.perf_counter()
    triton_kernel._work_items.cache_clear() if hasattr(triton_kernel, "_work_items") else None
    call()
    first = time.perf_counter() - first
    elements = sum(torch.Size(s).numel() for s in shapes)
    print(f"{args.preset}: {n} sphere tensors, {elements / 1e6:.1f}M elements, torch {torch.__version__}")
    print(f"host time per sphere_adam_ call: median {statistics.median(times) * 1e3:.3f} ms "
          f"(min {min(times) * 1e3:.3f}, max {max(times) * 1e3:.3f}; {args.calls} calls); "
          f"a call with nothing cached: {first * 1e3:.3f} ms")  # fmt: skip  # one line of output


if __name__ == "__main__":
    main()
