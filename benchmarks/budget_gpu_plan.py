"""The budget study on GPUs (``benchmarks/budget.py --gpu-plan``): its command at GPT-2 small's
shape at two contexts, with a second size at the same tokens per parameter, and its cost."""

from __future__ import annotations

from budget_report import RUNS_PER_SWEEP, scaled_budgets
from scaling_ledger import Point, parameters

GPU_POINTS = ["base@1024", "base@4096", "0.5b@1024"]  # two contexts at base; a second size at 1024
GPU_TOKENS_PER_STEP = 512 * 1024  # the paper's global batch: 512 sequences of 1k tokens (App. A.5)
GPU_BUDGETS = [750, 3000, 12000]  # 2.4, 9.7 and 39 tokens per parameter at base: the CPU study's range
# H100/H200 SXM dense bf16 per GPU: NVIDIA's datasheets give 1,979 TFLOP/s with 2:4 sparsity, half without
GPU_PEAK_FLOPS = 989e12
GPU_MFU = 0.4  # the fraction of peak a training step sustains: an assumption, to be measured


def gpu_plan(arms: list[str]) -> str:
    """The command of the budget study at GPT-2 small's shape on a GPU (two contexts) and at a
    second size (0.5b) at the same tokens per parameter, and its cost: training FLOPs by
    ``6 N D`` per run (N: parameters, D: tokens), with attention's ``6 L T d`` per token beside
    it, in GPU-hours at :data:`GPU_MFU` of :data:`GPU_PEAK_FLOPS`."""
    from spherenet.models import preset_config

    runs = (RUNS_PER_SWEEP + 3 - 1) * len(arms)  # per budget: each arm's sweep and two more seeds
    lines = [
        "| point | params N | budget (steps) | tokens D | tokens / param | runs | 6 N D per run | "
        "with attention | GPU-hours |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    total_hours = 0.0
    points = [Point.parse(t) for t in GPU_POINTS]
    reference = parameters(points[0])
    for pt in points:
        n = parameters(pt)
        c = preset_config(f"ngpt-{pt.size}", max_seq_len=pt.context)
        attention = 6 * c.n_layers * pt.context * c.d_model  # per token, forward and backward
        for budget in scaled_budgets(GPU_BUDGETS, n, reference):
            tokens = budget * GPU_TOKENS_PER_STEP
            flops, with_attention = 6 * n * tokens, (6 * n + attention) * tokens
            hours = runs * with_attention / (GPU_PEAK_FLOPS * GPU_MFU) / 3600
            total_hours += hours
            lines.append(
                f"| {pt} | {n / 1e6:.1f}M | {budget} | {tokens / 1e9:.2f}B | {tokens / n:.1f} | {runs} | "
                f"{flops:.2e} | {with_attention:.2e} | {hours:.0f} |"
            )
    command = (
        f"python benchmarks/budget.py --points {' '.join(GPU_POINTS)} --budgets {' '.join(map(str, GPU_BUDGETS))} "
        f"--scale-budgets --tokens-per-step {GPU_TOKENS_PER_STEP} --evals 10 --jobs 1 --data openwebtext "
        "data.tokenizer=bpe:32000 train.micro_batch_size=16"
    )
    return (
        f"Command (one GPU, the runs one after another; --scale-budgets: {points[-1]} at {points[0]}'s tokens per "
        f"parameter, the size axis):\n\n    {command}\n\n"
        + "\n".join(lines)
        + f"\n\nIn all about {total_hours:,.0f} GPU-hours at {GPU_MFU:.0%} of {GPU_PEAK_FLOPS / 1e12:.0f} TFLOP/s "
        "(an H200's dense bf16 peak, NVIDIA's datasheet; the fraction is an assumption until measured), "
        f"{RUNS_PER_SWEEP} sweep runs and 2 more seeds per arm and budget.\n"
    )
