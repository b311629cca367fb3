"""Memory plan for fine-tuning the Normalized-Nemotron-8B shape with recipes.train under FSDP2.

    python benchmarks/memory_plan.py                       # 8 GPUs of 80 GiB, second_moment=element
    python benchmarks/memory_plan.py --second-moment row --gpus 8 --gpu-gib 80

Builds spherenet's NGPT of the published 8B shape (vocab 131072, d 4096, 32 layers, 32 query
heads, 8 key/value heads, head_dim 128, d_mlp 21504, squared-ReLU MLP, untied embeddings) on the
meta device, counts its parameters exactly, builds recipes.train's optimizer on it
(``build_optimizer(model, "riemannian_adam")``) to learn which parameters are on the sphere, and
prints, per GPU, the bytes of what recipes.train keeps, as the code is written (arithmetic, not
a measurement):

- recipes.train builds the model in float32 and trains under ``torch.autocast`` (bfloat16 on
  CUDA); ``wrap_model`` calls ``fully_shard`` without a ``MixedPrecisionPolicy``. So the float32
  parameters are the only weights kept (the master weights; no separate bfloat16 copy is kept
  between steps), and the gradients are float32;
- RiemannianAdam keeps per parameter tensor ``exp_avg`` (one value per element), ``exp_avg_sq``
  (one per element, or one per row of a sphere weight with ``optim.second_moment=row``) and a
  float32 step count; the scalings (alpha, s_qk, s_uv, s_z) are stepped by Adam with the same
  two moments per element;
- FSDP2 shards every parameter, its gradient and its optimizer state along dim 0 over the GPUs
  (padded to a multiple of the GPU count);
- transient, during a step: the all-gathered float32 parameters of the root module
  (embeddings, output layer, s_z: not resharded between forward and backward) and of two blocks
  (the running one and the prefetched one), with the running block's unsharded float32 gradient
  before its reduce-scatter; without activation checkpointing, the bfloat16 casts of every
  weight matrix that autocast's matmuls save for backward (unsharded, on every GPU).

What is left of the GPU's memory is for activations (and the CUDA context, the allocator's
slack, NCCL buffers). The last rows give ``spherenet.train.memory.estimate_training_memory``'s
rough activation count for a micro-batch of one 8192-token sequence under bf16 autocast (two
bytes a value, as recipes.train counts on CUDA), the number recipes.train compares with the free
memory before it starts.
"""

from __future__ import annotations

import argparse
import math

import torch

from spherenet.models import NGPT, NGPTConfig, preset_config
from spherenet.optim import build_optimizer
from spherenet.optim.groups import SPHERE
from spherenet.train.memory import estimate_training_memory
from spherenet.train.step import autocast_dtype

GIB = 1024**3

#: the published Normalized-Nemotron-8B shape (its config.json)
PRESET_8B = "ngpt-nemotron-8b"


def shard_elements(shape: torch.Size, gpus: int) -> int:
    """Elements of one GPU's shard of a tensor FSDP2 splits along dim 0 (padded to ``gpus`` parts)."""
    if len(shape) == 0:
        return 1
    return math.ceil(shape[0] / gpus) * math.prod(shape[1:])


def plan(config: NGPTConfig, *, gpus: int, second_moment: str, gpu_bytes: int, block_size: int) -> dict:
    with torch.device("meta"):
        model = NGPT(config)
    optimizer, _ = build_optimizer(model, "riemannian_adam", lr=1e-3, total_steps=1, second_moment=second_moment)
    sphere = {id(p) for g in optimizer.param_groups if g["manifold"] == SPHERE for p in g["params"]}
    params = list(model.parameters())
    n_params = sum(p.numel() for p in params)
    n_sphere = sum(p.numel() for p in params if id(p) in sphere)
    fp32 = 4
    weights = sum(shard_elements(p.shape, gpus) for p in params) * fp32
    grads = weights
    exp_avg = weights
    exp_avg_sq = 0
    for p in params:
        per_row = id(p) in sphere and second_moment == "row"
        exp_avg_sq += shard_elements(p.shape[:-1] + (1,) if per_row else p.shape, gpus) * fp32
    steps = len(params) * fp32
    root = [p for name, p in model.named_parameters() if not name.startswith("blocks.")]
    root_bytes = sum(p.numel() for p in root) * fp32
    block_bytes = sum(p.numel() for p in model.blocks[0].parameters()) * fp32
    gathered = root_bytes + 2 * block_bytes + block_bytes  # root + running/prefetched blocks + a block's gradient
    matrices = sum(p.numel() for n, p in model.named_parameters() if p.ndim == 2 and n != "embed_in.weight")
    saved_casts = matrices * 2  # bf16 casts of every matmul weight, saved for backward
    persistent = weights + grads + exp_avg + exp_avg_sq + steps
    rows = [
        ("parameters (exact)", f"{n_params:,} ({n_sphere:,} on the sphere)", None),
        ("float32 weights (master; no bfloat16 copy kept)", "", weights),
        ("float32 gradients", "", grads),
        ("sphere-Adam exp_avg (per element)", "", exp_avg),
        (f"sphere-Adam exp_avg_sq (per {'row of a sphere weight' if second_moment == 'row' else 'element'})", "",
         exp_avg_sq),
        ("step counts (float32, one per tensor)", "", steps),
        ("persistent, sharded", "", persistent),
        ("transient: gathered root + 2 blocks + a block's gradient (float32)", "", gathered),
        ("transient: bfloat16 weight casts saved for backward (no activation checkpointing)", "", saved_casts),
    ]  # fmt: skip  # one row per line, as in the printed table
    left_ckpt = gpu_bytes - persistent - gathered
    left_plain = left_ckpt - saved_casts
    rows += [
        (f"left of {gpu_bytes / GIB:.0f} GiB for activations, activation checkpointing on", "", left_ckpt),
        (f"left of {gpu_bytes / GIB:.0f} GiB for activations, activation checkpointing off", "", left_plain),
    ]
    activation_bytes = autocast_dtype("auto", torch.device("cuda")).itemsize  # as recipes.train on CUDA
    for checkpointing in (True, False):
        estimate = estimate_training_memory(
            config,
            micro_batch=1,
            block_size=block_size,
            shards=gpus,
            activation_checkpointing=checkpointing,
            activation_bytes_per_value=activation_bytes,
        )
        fits = "fits" if estimate.total_bytes <= gpu_bytes else "refused"
        rows.append(
            (
                f"spherenet.train.memory estimate, 1 x {block_size} tokens, checkpointing "
                f"{'on' if checkpointing else 'off'}: activations ({fits} on an empty GPU)",
                "",
                estimate.activation_bytes,
            )
        )
    return {"rows": rows, "parameters": n_params, "sphere": n_sphere}


def markdown(rows) -> str:
    lines = ["| per GPU | count | GiB |", "|---|---:|---:|"]
    for what, count, size in rows:
        lines.append(f"| {what} | {count} | {'' if size is None else f'{size / GIB:,.2f}'} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gpus", type=int, default=8, help="FSDP2 shards (default 8)")
    p.add_argument("--gpu-gib", type=float, default=80.0, help="memory of one GPU, GiB (default 80: an H100)")
    p.add_argument("--second-moment", choices=["element", "row"], default="element", help="optim.second_moment")
    p.add_argument("--block-size", type=int, default=8192, help="tokens per sequence (default 8192, the context)")
    args = p.parse_args(argv)
    config = preset_config(PRESET_8B)
    result = plan(
        config,
        gpus=args.gpus,
        second_moment=args.second_moment,
        gpu_bytes=int(args.gpu_gib * GIB),
        block_size=args.block_size,
    )
    print(
        f"Normalized-Nemotron-8B shape, FSDP2 over {args.gpus} GPUs of {args.gpu_gib:g} GiB, recipes.train "
        f"(float32 parameters, bfloat16 autocast, riemannian_adam, second_moment={args.second_moment})\n"
    )
    print(markdown(result["rows"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
