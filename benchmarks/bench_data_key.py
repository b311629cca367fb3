"""What keying the prepared-data cache by content costs: the time to compute the key of a local
source file (``Source.identity``, a streaming sha256 of its bytes) against the size + mtime it
replaced (one ``stat``), with blake2b and the UTF-8 check every preparation already does
(``check_text_file``) for scale. Each is timed ``--repeats`` times on a file of ``--mb`` MB of
text, first after it was written (in the page cache), the best and the median reported.

    python benchmarks/bench_data_key.py [--mb 100] [--repeats 5]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from spherenet.data import check_text_file, file_sha256  # noqa: E402
from spherenet.data.sources import resolve_source  # noqa: E402


def blake2b_of(path: Path) -> str:
    digest = hashlib.blake2b()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def write_text(path: Path, megabytes: int) -> None:
    line = ("the quick brown fox jumps over the lazy dog, and the sphere keeps its unit norm. " * 20)[:1023] + "\n"
    block = line.encode() * 1024  # 1 MiB
    with open(path, "wb") as f:
        for _ in range(megabytes):
            f.write(block)


def timed(fn, repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mb", type=int, default=100, help="size of the text file in MiB")
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "corpus.txt"
        write_text(path, args.mb)
        source = resolve_source(path)  # the UTF-8 check runs here once, as in a preparation
        rows = [
            ("cache key: size + mtime (before)", lambda: os.stat(path)),
            ("cache key: Source.identity (sha256 of the bytes)", source.identity),
            ("sha256 alone (file_sha256)", lambda: file_sha256(path)),
            ("blake2b (for comparison)", lambda: blake2b_of(path)),
            ("UTF-8 check every preparation does (check_text_file)", lambda: check_text_file(path)),
        ]
        size = path.stat().st_size
        print(f"file: {size / 2**20:.0f} MiB ({size / 1e6:.0f} MB) of text, {args.repeats} repeats, in the page cache")
        print("| what | best s | median s | MB/s (best) |")
        print("|---|---|---|---|")
        for name, fn in rows:
            times = timed(fn, args.repeats)
            best = min(times)
            rate = f"{size / 1e6 / best:,.0f}" if best > 1e-3 else "-"
            print(f"| {name} | {best:.4f} | {statistics.median(times):.4f} | {rate} |")


if __name__ == "__main__":
    main()
