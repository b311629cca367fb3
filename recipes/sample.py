"""Generate text from a trained checkpoint: ``python -m recipes.sample RUN_DIR``.

    python -m recipes.sample runs/default --prompt "def main(" --tokens 300
    python -m recipes.sample runs/default/checkpoints/step_00000400 --temperature 0 # greedy

RUN_DIR is a run's ``train.out_dir``, its ``checkpoints/`` directory, or one ``step_*``
checkpoint; the newest sound checkpoint is used. Generation uses the model's KV cache.
"""

from __future__ import annotations

import argparse
import sys

import torch

from recipes.checkpoints import load_trained
from spherenet.checkpoint import CheckpointError
from spherenet.data import DataError


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m recipes.sample", description=__doc__.split("\n\n")[0])
    p.add_argument("run", help="run directory, checkpoints/ directory or step_* checkpoint")
    p.add_argument("--prompt", default="\n", help="text to continue (default: a newline)")
    p.add_argument("--tokens", type=int, default=200, help="new tokens per sample")
    p.add_argument("--num-samples", type=int, default=1)
    p.add_argument("--temperature", type=float, default=0.8, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=50, help="0 = no top-k filtering")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = p.parse_args(argv)
    try:
        if args.tokens < 1 or args.num_samples < 1 or args.temperature < 0 or args.top_k < 0:
            raise ValueError("--tokens and --num-samples must be >= 1, --temperature and --top-k >= 0")
        trained = load_trained(args.run, args.device)
        ids = trained.tokenizer.encode(args.prompt)
        if not ids:
            raise ValueError(f"--prompt {args.prompt!r} encodes to no tokens")
        room = trained.model.config.max_seq_len - len(ids)
        if room < 1:
            raise ValueError(
                f"--prompt is {len(ids)} tokens; the model's context is {trained.model.config.max_seq_len}"
            )
        n_new = min(args.tokens, room)
        gen = torch.Generator(device=args.device).manual_seed(args.seed)
        prompt = torch.tensor([ids], device=args.device)
        print(f"# {trained.path} (step {trained.step}, {type(trained.model).__name__})", file=sys.stderr)
        for i in range(args.num_samples):
            with torch.no_grad():
                out = trained.model.generate(
                    prompt, n_new, temperature=args.temperature, top_k=args.top_k or None, generator=gen
                )
            if i:
                print("\n" + "-" * 40)
            print(trained.tokenizer.decode(out[0].tolist()), flush=True)
    except (CheckpointError, DataError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
