"""Peak resident memory of loading a checkpoint in the Normalized-Nemotron layout.

Writes a synthetic checkpoint of about ``--params`` parameters in that layout (random unit
rows, the layout's scalings; grouped-query attention and the squared-ReLU MLP, as the released
8B model) into a temporary directory, with ``to_normalized_nemotron``. Then, for each
(file dtype, load dtype), a fresh subprocess imports torch and spherenet, reads its resident
memory (``VmRSS``), builds a tiny NGPT on the meta device (the first model built imports more of
torch, ``torch._dynamo``: memory that any model costs, not the loader), reads it again, loads the
checkpoint with ``from_normalized_nemotron`` and reads its peak resident memory (``VmHWM``,
/proc/self/status). Reported: that peak minus the resident memory before the load, against the
checkpoint's bytes and the loaded model's bytes, and the resident memory the first model's
imports added; best (lowest peak) of ``--repeats`` runs, and the load time of that run.

The loader reads each tensor with plain file reads into its parameter (no memory map, no
second copy): the peak should be one copy of the model plus a staging buffer.

    nice python benchmarks/nemotron_load.py                     # ~300M parameters, fp32 and bf16
    nice python benchmarks/nemotron_load.py --quick             # a small one, one run
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from _machine import emit, header  # benchmarks/ is on sys.path

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}

# the subprocess: resident memory after the imports, then after loading
MEASURE = r"""
import json, sys, time
def status(field):
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
import torch, spherenet
from spherenet.models import NGPT, NGPTConfig
from spherenet.models import from_normalized_nemotron
imports = status("VmRSS")
with torch.device("meta"):  # the first model built imports more of torch (torch._dynamo): not the loader's
    NGPT(NGPTConfig(vocab_size=8, n_layers=1, d_model=8, n_heads=2, n_kv_heads=1, mlp="relu2"))
base = status("VmRSS")
start = time.perf_counter()
model = from_normalized_nemotron(sys.argv[1], dtype=getattr(torch, sys.argv[2]))
seconds = time.perf_counter() - start
model_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
print(json.dumps({"imports": imports, "base": base, "peak": status("VmHWM"), "seconds": seconds,
                  "model_bytes": model_bytes}))
"""


def layout_config(params: float) -> dict:
    """NGPTConfig fields of an 8B-like model scaled to about ``params`` parameters: head size
    64, 4 query heads per key/value head, d_MLP = 4 d_model, vocabulary 32768."""
    d, vocab = 1024, 32768
    per_layer = d * d * 2 + 2 * d * d // 4 + 2 * d * 4 * d
    layers = max(1, round((params - 2 * vocab * d) / per_layer))
    if params < 50e6:  # --quick
        d, vocab, layers = 256, 4096, 4
    return dict(vocab_size=vocab, n_layers=layers, d_model=d, n_heads=d // 64, n_kv_heads=d // 256, head_dim=64)


def write_checkpoint(directory: Path, fields: dict, dtype: torch.dtype) -> int:
    """A random NGPT of the layout, written by to_normalized_nemotron; returns its file bytes."""
    from spherenet.io import to_normalized_nemotron
    from spherenet.models import NGPT, NGPTConfig, ScaleSpec

    config = NGPTConfig(
        **fields,
        d_mlp=4 * fields["d_model"],
        mlp="relu2",
        max_seq_len=4096,
        rope_base=1e6,
        alpha_attn=ScaleSpec(init=0.05, scale=0.014, absolute=True),
        alpha_mlp=ScaleSpec(init=0.05, scale=0.014, absolute=True),
        s_qk=ScaleSpec(init=1.0, scale=0.014),
        s_uv=ScaleSpec(init=1.0, scale=1.0),
        s_z=ScaleSpec(init=1.0, scale=0.014),
    )
    with torch.device("meta"):
        model = NGPT(config)
    model = model.to(dtype).to_empty(device="cpu")
    model.init_weights()
    to_normalized_nemotron(model, directory, max_shard_size="2GB")
    return sum(f.stat().st_size for f in directory.glob("*.safetensors"))


def measure(directory: Path, dtype: str, repeats: int) -> dict:
    runs = []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))}
    for _ in range(repeats):
        out = subprocess.run(
            [sys.executable, "-c", MEASURE, str(directory), dtype], capture_output=True, text=True, env=env
        )
        if out.returncode:
            raise SystemExit(f"the loading subprocess failed:\n{out.stderr}")
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    return min(runs, key=lambda r: r["peak"] - r["base"])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--params", type=float, default=300e6, help="about how many parameters (default 300e6)")
    parser.add_argument("--file-dtypes", nargs="+", choices=sorted(DTYPES), default=["fp32", "bf16"])
    parser.add_argument("--repeats", type=int, default=3, help="runs per case; the lowest peak is reported")
    parser.add_argument("--quick", action="store_true", help="a small checkpoint, fp32 only, one run")
    parser.add_argument("--markdown", help="also append the table to this file")
    args = parser.parse_args(argv)
    if args.quick:
        args.params, args.file_dtypes, args.repeats = 10e6, ["fp32"], 1
    fields = layout_config(args.params)
    rows = []
    for file_dtype in args.file_dtypes:
        with tempfile.TemporaryDirectory(prefix="nemotron-load-") as tmp:
            file_bytes = write_checkpoint(Path(tmp), fields, DTYPES[file_dtype])
            for load_dtype in dict.fromkeys([file_dtype, "fp32"]):
                r = measure(Path(tmp), str(DTYPES[load_dtype]).removeprefix("torch."), args.repeats)
                extra = r["peak"] - r["base"]
                rows.append(
                    f"| {file_dtype} | {load_dtype} | {file_bytes / 2**20:,.0f} | {r['model_bytes'] / 2**20:,.0f} | "
                    f"{extra / 2**20:,.0f} | {extra / file_bytes:.2f} | {extra / r['model_bytes']:.2f} | "
                    f"{r['seconds']:.1f} | {(r['base'] - r['imports']) / 2**20:,.0f} |"
                )
                print(rows[-1], flush=True)
    shape = ", ".join(f"{k} {v}" for k, v in fields.items())
    text = header("Loading a Normalized-Nemotron checkpoint: peak resident memory", torch.device("cpu"), argv)
    text += (
        f"\n{shape}, d_mlp {4 * fields['d_model']} (relu2); best of {args.repeats}; load average "
        f"{os.getloadavg()[0]:.1f} at the end\n\n"
        "| file | loaded as | file MiB | model MiB | peak RSS - RSS before loading, MiB | / file | / model | "
        "load s | first model's imports, MiB |\n|---|---|---:|---:|---:|---:|---:|---:|---:|\n" + "\n".join(rows) + "\n"
    )
    emit(text, args.markdown)


if __name__ == "__main__":
    main()
