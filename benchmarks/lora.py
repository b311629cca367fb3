"""Fine-tuning on a second corpus: full fine-tuning, sphere-aware LoRA and plain LoRA of nGPT.

    nice python benchmarks/lora.py                   # 100 steps per run, 3 seeds (CPU)
    nice python benchmarks/lora.py --steps 20 --seeds 0   # a smoke run of the pipeline

A tiny nGPT is first trained on the trainer's default corpus (``--base-steps``), then each
method fine-tunes it (``train.init_from``) on ``--data`` (default: tinyshakespeare from
``../shared/data``) for ``--steps`` steps and every seed:

* ``full``: every weight trained (RiemannianAdam at ``--full-lr``);
* ``lora-sphere``: rank ``--rank`` sphere-aware LoRA of every attention and MLP projection
  (the adapted matrix back on the sphere), the rest frozen, at ``--lora-lr``;
* ``lora-plain``: the same adapters as a plain LoRA (``W + s B A``, off the sphere).

Prints a Markdown table: final validation loss (mean ± std over the seeds) and the number of
trainable parameters. Every run is a ``recipes.train`` run in ``--out`` (default
``/tmp/lora-bench``), run in this process one after another.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from recipes.train import cli as train_cli  # noqa: E402

METHODS = {
    "full": [],
    "lora-sphere": ["train.lora_sphere_aware=true"],
    "lora-plain": ["train.lora_sphere_aware=false"],
}


def run(out: Path, overrides: list[str], quiet: bool = True) -> dict:
    """One ``recipes.train`` run (reused when it finished before); its last metrics."""
    metrics = out / "metrics.jsonl"
    if not (metrics.is_file() and '"event": "done"' in metrics.read_text()):
        sink = io.StringIO()
        with contextlib.redirect_stdout(sink) if quiet else contextlib.nullcontext():
            code = train_cli([*overrides, f"train.out_dir={out}", "--overwrite"])
        if code != 0:
            raise SystemExit(f"training failed ({code}): {' '.join(overrides)}\n{sink.getvalue()[-2000:]}")
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    start = next(r for r in records if r.get("event") == "start")
    done = next(r for r in records if r.get("event") == "done")
    return {"val_loss": done["val_loss"], "params": start["params"]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default=str(ROOT.parent / "shared/data/tinyshakespeare/input.txt"))
    p.add_argument("--out", default="/tmp/lora-bench")
    p.add_argument("--base-steps", type=int, default=100)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--rank", type=int, default=8)
    p.add_argument("--full-lr", type=float, default=3e-3)
    p.add_argument("--lora-lr", type=float, default=1e-2)
    args = p.parse_args(argv)
    if not Path(args.data).is_file():
        raise SystemExit(f"no corpus at {args.data}: pass --data FILE")
    out = Path(args.out)
    common = ["model.preset=ngpt-tiny", "model.max_seq_len=64", "train.batch_size=8", "train.sample_tokens=0",
              "train.progress=false", "train.eval_batches=8",
              f"data.cache_dir={out / 'data_cache'}"]  # fmt: skip  # the shared settings, together
    base = out / "base"
    run(base, [*common, f"train.steps={args.base_steps}", f"train.eval_every={args.base_steps}",
               f"train.checkpoint_every={args.base_steps}"])  # fmt: skip  # one run's overrides
    results: dict[str, list[dict]] = {m: [] for m in METHODS}
    for method, extra in METHODS.items():
        lr = args.full_lr if method == "full" else args.lora_lr
        lora = [] if method == "full" else [f"train.lora_rank={args.rank}", *extra]
        for seed in args.seeds:
            overrides = [*common, f"train.init_from={base}", f"data.source={args.data}", f"train.steps={args.steps}",
                         f"train.eval_every={args.steps}", f"train.checkpoint_every={args.steps}",
                         f"train.seed={seed}", f"optim.lr={lr}", *lora]  # fmt: skip  # one run's overrides
            results[method].append(run(out / method / f"seed{seed}", overrides))
            print(f"{method} seed {seed}: val loss {results[method][-1]['val_loss']:.4f}", file=sys.stderr, flush=True)
    lora_trainable = {}
    for method in ("lora-sphere", "lora-plain"):
        lora_trainable[method] = results[method][0]["params"] - results["full"][0]["params"]
    print(f"\nnGPT tiny, base {args.base_steps} steps on the default corpus; {args.steps} steps on "
          f"{Path(args.data).name}, batch 8 x 64 tokens, seeds {args.seeds}\n")  # fmt: skip  # one line
    print("| method | lr | trainable parameters | final val loss (mean ± std) |")
    print("|---|---|---:|---|")
    for method, rows in results.items():
        losses = [r["val_loss"] for r in rows]
        std = statistics.stdev(losses) if len(losses) > 1 else 0.0
        trainable = results["full"][0]["params"] if method == "full" else lora_trainable[method]
        lr = args.full_lr if method == "full" else args.lora_lr
        rank = "" if method == "full" else f" (rank {args.rank})"
        print(f"| {method}{rank} | {lr:g} | {trainable:,} | {statistics.mean(losses):.4f} ± {std:.4f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
