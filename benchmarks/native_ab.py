"""The optimizer's native CPU kernel against itself at another git revision, side by side.

Builds ``spherenet/kernels/native/sphere_adam.cpp`` of the working tree and of ``--against`` (a
git revision) as two libraries in one process (each op under its own namespace), then times one
call of each, interleaved round by round, on the same shapes: float32 rows of ``--d`` elements,
``--elements`` in all, the ``--gradient`` (Euclidean by default), per-row and per-element second moments. Prints the
median and minimum of each and the median of the per-round ratios (this tree / the revision).
Both start from the same tensors and take the same steps, so the last line says whether the two
kernels computed the same values, bit for bit.

    python benchmarks/native_ab.py --against HEAD~1 --rounds 40
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.utils.cpp_extension import load

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from spherenet.kernels.native import cpu_build_flags  # noqa: E402

SOURCE = "spherenet/kernels/native/sphere_adam.cpp"


def build(source: str, namespace: str, directory: Path) -> None:
    """``source`` built and loaded with its op under ``torch.ops.<namespace>``."""
    renamed = source.replace("TORCH_LIBRARY(spherenet,", f"TORCH_LIBRARY({namespace},")
    renamed = renamed.replace("TORCH_LIBRARY_IMPL(spherenet,", f"TORCH_LIBRARY_IMPL({namespace},")
    if renamed.count(namespace) != 2:
        raise SystemExit(f"{SOURCE}: expected one TORCH_LIBRARY and one TORCH_LIBRARY_IMPL of 'spherenet'")
    path = directory / f"{namespace}.cpp"
    path.write_text(renamed, encoding="utf-8")
    # A build directory of its own, not torch's shared cache: a run killed mid-build there leaves
    # a lock file on which every later load() would wait forever.
    build_directory = directory / f"{namespace}_build"
    build_directory.mkdir()
    load(
        name=f"{namespace}_ab",
        sources=[str(path)],
        extra_cflags=cpu_build_flags(),
        build_directory=str(build_directory),
        is_python_module=False,
    )


def state(shapes, row_v: bool):
    xs = [torch.nn.functional.normalize(torch.randn(s), dim=-1) for s in shapes]
    gs = [torch.randn(s) * 1e-3 for s in shapes]
    ms = [torch.zeros(s) for s in shapes]
    vs = [torch.zeros(s[0]) if row_v else torch.zeros(s) for s in shapes]
    return xs, gs, ms, vs


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--against", default="HEAD", help="the git revision to compare with (default HEAD)")
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--elements", type=int, default=2**26, help="elements in all (default 2**26, about 67M)")
    p.add_argument("--d", type=int, default=512, help="row length (default 512)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--gradient", choices=("euclidean", "riemannian"), default="euclidean")
    args = p.parse_args(argv)
    try:
        old = subprocess.run(
            ["git", "show", f"{args.against}:{SOURCE}"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout
    except subprocess.CalledProcessError as exc:
        raise SystemExit(f"git show {args.against}:{SOURCE}: {exc.stderr.strip()}") from None
    new = (ROOT / SOURCE).read_text(encoding="utf-8")
    with tempfile.TemporaryDirectory() as directory:
        build(old, "spherenet_ab_old", Path(directory))
        build(new, "spherenet_ab_new", Path(directory))
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    rows = max(1, args.elements // args.d // 8)
    shapes = [(rows, args.d)] * 8
    print(
        f"{8 * rows * args.d / 1e6:.1f}M float32 elements in rows of {args.d}, {args.threads} thread(s), "
        f"{args.rounds} interleaved rounds, the {args.gradient} gradient; this tree against {args.against}"
    )
    project = args.gradient == "riemannian"
    same = True
    for row_v in (True, False):
        start_state = state(shapes, row_v)
        tensors = {
            name: tuple([t.clone() for t in ts] for ts in start_state)
            for name in ("spherenet_ab_old", "spherenet_ab_new")
        }
        times: dict[str, list[float]] = {name: [] for name in tensors}
        for r in range(args.rounds + 2):  # two warm-up rounds
            for name in sorted(tensors, reverse=bool(r % 2)):
                xs, gs, ms, vs = tensors[name]
                op = getattr(torch.ops, name).sphere_adam_
                start = time.perf_counter()
                op(xs, gs, ms, vs, [1e-3] * 8, [1.0] * 8, 0.9, 0.95, 1e-8, 1e-30, row_v, project)
                if r >= 2:
                    times[name].append(time.perf_counter() - start)
        old_t, new_t = times["spherenet_ab_old"], times["spherenet_ab_new"]
        ratio = statistics.median(n / o for n, o in zip(new_t, old_t))
        print(
            f"{'row' if row_v else 'element'} v: {args.against} {statistics.median(old_t) * 1e3:.1f} ms "
            f"(min {min(old_t) * 1e3:.1f}), this tree {statistics.median(new_t) * 1e3:.1f} ms "
            f"(min {min(new_t) * 1e3:.1f}); median per-round ratio {ratio:.3f}"
        )
        old_s, new_s = tensors["spherenet_ab_old"], tensors["spherenet_ab_new"]
        same &= all(torch.equal(a, b) for olds, news in zip(old_s, new_s) for a, b in zip(olds, news))
    print(f"the same values, bit for bit, after {args.rounds + 2} steps: {'yes' if same else 'NO'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
