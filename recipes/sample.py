"""Generate text from a trained checkpoint: ``python -m recipes.sample RUN_DIR``.

    python -m recipes.sample runs/default --prompt "def main(" --tokens 300
    python -m recipes.sample runs/default/checkpoints/step_00000400 --temperature 0 # greedy

RUN_DIR is a run's ``train.out_dir``, its ``checkpoints/`` directory, or one ``step_*``
checkpoint; the newest sound checkpoint is used. Generation uses the model's KV cache and slides
past the model's context (each token then sees the last ``max_seq_len`` tokens). A sample ends
after ``--tokens`` new tokens, at the tokenizer's end-of-text token, or at the first ``--stop``
string (which is not printed); one that ends early says so on stderr, and after how many new tokens.
"""

from __future__ import annotations

import argparse
import sys

import torch

from recipes.checkpoints import load_weights
from recipes.cli import prog
from spherenet.checkpoint import CheckpointError
from spherenet.data import DataError
from spherenet.models import fold_for_inference


def continuation(tokenizer, prompt_ids: list[int], ids: list[int]) -> str:
    """The text that the tokens after the prompt add (decoded with the prompt, so that a
    tokenizer that merges across the boundary decodes as it will be printed)."""
    head, full = tokenizer.decode(prompt_ids), tokenizer.decode(ids)
    return full[len(head) :] if full.startswith(head) else tokenizer.decode(ids[len(prompt_ids) :])


def stop_at(text: str, stops: list[str]) -> int | None:
    """Where the first of ``stops`` begins in ``text``, or None."""
    found = [i for i in (text.find(stop) for stop in stops) if i >= 0]
    return min(found) if found else None


def early_end(text: str, cut: int | None, ended: bool, stops: list[str]) -> str | None:
    """What ended a sample before ``--tokens``: the ``--stop`` string found at ``cut`` (it ends
    generation as soon as it appears), the end-of-text token (``ended``), or None."""
    if cut is not None:
        return f"--stop {next(s for s in stops if text.find(s) == cut)!r}"
    return "end-of-text" if ended else None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=prog("recipes.sample"), description=__doc__.split("\n\n")[0])
    p.add_argument("run", help="run directory, checkpoints/ directory, step_* checkpoint, exported directory or Hub id")
    p.add_argument("--prompt", default="\n", help="text to continue (default: a newline)")
    p.add_argument("--tokens", type=int, default=200, help="new tokens per sample (at most)")
    p.add_argument("--stop", action="append", default=[], help="stop at this text (repeatable)")
    p.add_argument("--num-samples", type=int, default=1)
    p.add_argument("--temperature", type=float, default=0.8, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=50, help="0 = no top-k filtering")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = p.parse_args(argv)
    try:
        if args.tokens < 1 or args.num_samples < 1 or args.temperature < 0 or args.top_k < 0:
            raise ValueError("--tokens and --num-samples must be >= 1, --temperature and --top-k >= 0")
        trained = load_weights(args.run, args.device)
        prompt_ids = trained.tokenizer.encode(args.prompt)
        if not prompt_ids:
            raise ValueError(f"--prompt {args.prompt!r} encodes to no tokens")
        if any(not stop for stop in args.stop):
            raise ValueError("--stop must not be empty")
        tokenizer = trained.tokenizer
        gen = torch.Generator(device=args.device).manual_seed(args.seed)
        prompt = torch.tensor([prompt_ids], device=args.device)
        model = fold_for_inference(trained.model, inplace=True)  # it only decodes from here on
        print(f"# {trained.describe()}", file=sys.stderr)
        for i in range(args.num_samples):
            with torch.no_grad():
                out = model.generate(
                    prompt,
                    args.tokens,
                    temperature=args.temperature,
                    top_k=args.top_k or None,
                    generator=gen,
                    eos_token_id=tokenizer.eos_id,
                    stop=(
                        lambda ids: stop_at(continuation(tokenizer, prompt_ids, ids[0].tolist()), args.stop) is not None
                    )
                    if args.stop
                    else None,
                )
            tokens = out[0].tolist()
            ended = len(tokens) > len(prompt_ids) and tokens[-1] == tokenizer.eos_id
            if ended:
                tokens = tokens[:-1]
            text = continuation(tokenizer, prompt_ids, tokens)
            cut = stop_at(text, args.stop)
            if i:
                print("\n" + "-" * 40)
            print(tokenizer.decode(prompt_ids) + (text if cut is None else text[:cut]), flush=True)
            why = early_end(text, cut, ended, args.stop)
            if why is not None:
                which = f"sample {i + 1}" if args.num_samples > 1 else "the sample"
                new = len(tokens) - len(prompt_ids)
                print(f"# {which} stopped at {why} after {new} new tokens (--tokens {args.tokens})", file=sys.stderr)
    except (CheckpointError, DataError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
