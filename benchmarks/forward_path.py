"""The path of one training forward through spherenet's code: which files a reader following it
opens, how many lines they hold, how many calls it makes and how often it moves between files.

    python benchmarks/forward_path.py                  # ngpt-tiny, LERP
    python benchmarks/forward_path.py --model gpt-tiny
    python benchmarks/forward_path.py --update slerp --calls 20

The forward runs once untraced (so that first-call work, such as the kernels' decisions, is not
counted), then once under ``sys.setprofile``; only functions defined in ``spherenet/`` count.
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

import torch

import spherenet
from spherenet.models import from_preset

ROOT = Path(spherenet.__file__).parent


def trace(fn) -> tuple[collections.Counter, collections.Counter, int]:
    """``(calls per file, calls per (file, function), switches between files)`` of ``fn()``."""
    files, functions, switches, last = collections.Counter(), collections.Counter(), 0, None

    def profile(frame, event, arg):
        nonlocal switches, last
        path = frame.f_code.co_filename
        if event != "call" or not path.startswith(str(ROOT)):
            return
        name = str(Path(path).relative_to(ROOT))
        files[name] += 1
        functions[name, frame.f_code.co_name] += 1
        switches += last is not None and name != last
        last = name

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return files, functions, switches


def forward_path(model_name: str = "ngpt-tiny", update: str | None = None) -> dict:
    """The numbers of one training forward of ``model_name`` on a batch of 2 x 32 tokens."""
    torch.manual_seed(0)
    overrides = {} if update is None else {"update": update}
    model = from_preset(model_name, **overrides).train()
    ids = torch.randint(0, model.config.vocab_size, (2, 32))
    model(ids)  # first-call work out of the count
    files, functions, switches = trace(lambda: model(ids))
    lines = {f: len((ROOT / f).read_text().splitlines()) for f in files}
    return {"files": files, "lines": lines, "functions": functions, "switches": switches}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="ngpt-tiny", help="a preset name (default ngpt-tiny)")
    p.add_argument("--update", default=None, help="nGPT's update rule (default: the preset's, LERP)")
    p.add_argument("--calls", type=int, default=0, help="also list the N most called functions")
    args = p.parse_args(argv)
    path = forward_path(args.model, args.update)
    print("| file | calls | lines |\n|---|---|---|")
    for name, calls in path["files"].most_common():
        print(f"| `{name}` | {calls} | {path['lines'][name]} |")
    total_calls = sum(path["files"].values())
    print(
        f"\n{len(path['files'])} files, {sum(path['lines'].values())} lines, {total_calls} calls, "
        f"{path['switches']} switches between files"
    )
    for (name, function), calls in path["functions"].most_common(args.calls):
        print(f"  {calls:4d}  {name}:{function}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
