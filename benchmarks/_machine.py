"""What the benchmark scripts share: the machine they ran on, the device, the model shape,
timing on a GPU, and the markdown they write."""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shlex
import sys
from pathlib import Path

import torch

from spherenet.models.presets import PRESETS

# Preset sizes (spherenet.models.presets): ngpt-SIZE and gpt-SIZE have the same shape.
SIZES = sorted({name.split("-", 1)[1] for name in PRESETS})
SHAPE_FIELDS = {
    "vocab": "vocab_size",
    "n_layers": "n_layers",
    "d_model": "d_model",
    "n_heads": "n_heads",
    "ctx": "max_seq_len",
}


def cpu_name() -> str:
    """The CPU model from /proc/cpuinfo (Linux), else what ``platform`` knows."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def pick_device(name: str) -> torch.device:
    """``torch.device(name)``; exits with a message when CUDA is asked for and absent."""
    if name == "cuda" and not torch.cuda.is_available():
        raise SystemExit(
            f"--device cuda: no CUDA device (torch {torch.__version__}, built with CUDA {torch.version.cuda}, "
            "torch.cuda.is_available() is False)"
        )
    return torch.device(name)


def machine(device: torch.device) -> str:
    """One line: the device (GPU name and CUDA version, or CPU model and threads) and torch."""
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return (
            f"{torch.cuda.get_device_name(device)} ({props.total_memory / 2**30:.0f} GiB, CUDA {torch.version.cuda}), "
            f"torch {torch.__version__}"
        )
    return f"{cpu_name()}, {os.cpu_count()} CPUs (nproc), {threads()}, torch {torch.__version__}"


def threads() -> str:
    n = torch.get_num_threads()
    return f"{n} thread" + ("s" if n != 1 else "")


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (CUDA kernels run asynchronously): call before
    reading a clock at either end of a timed region."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def add_shape_args(parser: argparse.ArgumentParser, default_size: str | None = "small") -> None:
    """``--size`` (a preset size) and per-field overrides of it."""
    parser.add_argument(
        "--size",
        default=default_size,
        choices=SIZES,
        help=f"model shape of the presets ngpt-SIZE / gpt-SIZE (default {default_size})",
    )
    parser.add_argument("--d-model", type=int, help="override the preset's d_model")
    parser.add_argument("--n-layers", type=int, help="override the preset's layer count")
    parser.add_argument("--n-heads", type=int, help="override the preset's head count")
    parser.add_argument("--vocab", type=int, help="override the preset's vocabulary size")
    parser.add_argument("--ctx", type=int, help="context length (the model's max_seq_len); default the preset's")


def shape_overrides(args, fallback_size: str = "small", **defaults) -> tuple[str, dict]:
    """(size, config overrides) from ``add_shape_args``'s options. ``defaults`` (keyed like the
    options: ``d_model``, ``vocab``...) apply only when ``--size`` was not given."""
    size = args.size or fallback_size
    overrides = {}
    for option, field in SHAPE_FIELDS.items():
        value = getattr(args, option)
        if value is None and args.size is None:
            value = defaults.get(option)
        if value is not None:
            overrides[field] = value
    return size, overrides


def shape_text(config) -> str:
    return (
        f"d_model {config.d_model}, {config.n_layers} layers, {config.n_heads} heads, d_MLP {config.d_mlp}, "
        f"vocab {config.vocab_size}, context {config.max_seq_len}"
    )


def header(title: str, device: torch.device, argv: list[str] | None) -> str:
    """A markdown section title, the date, the machine and the command that made it."""
    script = os.path.relpath(sys.argv[0]) if sys.argv and sys.argv[0].endswith(".py") else "benchmarks/?"
    command = " ".join(["python", script, *map(shlex.quote, sys.argv[1:] if argv is None else argv)])
    return f"### {title}\n\n{datetime.date.today()}; {machine(device)}\n\n`{command}`\n"


# Options that name where a run's scratch files go: they do not change a result, and a
# recorded command keeps only what reproduces it.
SCRATCH_OPTIONS = ("--out",)
REPO = Path(__file__).resolve().parent.parent


def portable_command(command: str) -> str:
    """``command`` as a results file records it: scratch options dropped, and absolute paths
    inside this checkout written relative to its root (where the scripts run from)."""
    words, kept = shlex.split(command), []
    skip = False
    for word in words:
        if skip:
            skip = False
            continue
        if word in SCRATCH_OPTIONS:
            skip = True
            continue
        if word.split("=", 1)[0] in SCRATCH_OPTIONS:
            continue
        option, sep, value = word.rpartition("=") if word.startswith("--") and "=" in word else ("", "", word)
        path = Path(value)
        if path.is_absolute() and path.resolve().is_relative_to(REPO):
            value = str(path.resolve().relative_to(REPO)) or "."
        kept.append(option + sep + value)
    return shlex.join(kept)


def emit(text: str, markdown_path: str | None) -> None:
    """Print ``text``; with ``--markdown FILE``, also append it to FILE (so that several runs
    can share one file)."""
    print(text, flush=True)
    if markdown_path:
        folder = os.path.dirname(os.path.abspath(markdown_path))
        os.makedirs(folder, exist_ok=True)
        with open(markdown_path, "a") as f:
            f.write(text.rstrip("\n") + "\n\n")
