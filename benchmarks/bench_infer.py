"""Inference time of nGPT and the baseline GPT against transformers' ``LlamaForCausalLM`` of the same shape.

Every model is a transformers causal LM with random weights (spherenet's through
:mod:`spherenet.hf.modeling`), timed under ``torch.no_grad`` in eval mode:

- ``prefill``: one forward pass over ``--batch`` x ``--prefill-len`` tokens (filling a KV cache);
- ``generate``: transformers' greedy ``generate`` of ``--new-tokens`` tokens after a
  ``--prompt-len``-token prompt (batch 1, a KV cache, exactly that many new tokens);
- ``spherenet generate``: spherenet's own ``model.generate`` (temperature 0) on the same model,
  for nGPT and GPT.

The models run one after the other inside each round, and the rounds repeat (``--rounds``), so
that a load change on a shared machine hits every model alike; each cell is the median over the
rounds, and its ratio is to Llama's median. ``--clock cpu`` times the process's CPU time instead
of the wall clock: on a shared, loaded machine, with ``--threads 1``, it counts the work done and
not the time spent waiting for a core (the wall clock of a loaded machine varies by tens of
percent between rounds, and OpenMP threads spinning for a busy core can slow 2 threads tenfold).
``--compile`` adds the same rows with every model's
forward under ``torch.compile`` (dynamic shapes: the cache grows every step). The rows:
``ngpt``, ``gpt``, ``llama``, ``ngpt-gqa`` (``--kv-heads`` key/value heads), ``ngpt-relu2``
(the squared-ReLU MLP, d_MLP 1.5 times as large: as many weights), every nGPT folded for
inference (:func:`spherenet.models.fold_for_inference`, as a server would apply it), and
``ngpt-unfolded`` (the model's own equations, as in training and evaluation).

    python benchmarks/bench_infer.py                       # CPU, 2 threads, fp32, eager
    python benchmarks/bench_infer.py --compile --rounds 3
    python benchmarks/bench_infer.py --device cuda --dtype bf16 --compile
    python benchmarks/bench_infer.py --small               # a smoke test, seconds
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _machine import header, pick_device, sync  # noqa: E402

from spherenet.models import GPT, NGPT, GPTConfig, NGPTConfig, fold_for_inference  # noqa: E402  # noqa: E402

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
MODELS = ("ngpt", "gpt", "llama", "ngpt-gqa", "ngpt-relu2", "ngpt-unfolded")
SMALL = dict(d_model=64, layers=2, heads=4, kv_heads=2, d_mlp=176, vocab=512, batch=2, prefill_len=32)
SMALL.update(prompt_len=8, new_tokens=8, rounds=2)


def build(name: str, args, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    """The transformers model ``name`` of the benchmark's shape, random weights, eval mode."""
    from spherenet.hf.modeling import SpherenetGPTForCausalLM, SpherenetNGPTForCausalLM

    torch.manual_seed(0)
    context = max(args.prefill_len, args.prompt_len + args.new_tokens)
    shape = dict(vocab_size=args.vocab, n_layers=args.layers, d_model=args.d_model, n_heads=args.heads)
    shape.update(d_mlp=args.d_mlp, max_seq_len=context)
    if name == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM

        config = LlamaConfig(
            vocab_size=args.vocab,
            hidden_size=args.d_model,
            intermediate_size=args.d_mlp,
            num_hidden_layers=args.layers,
            num_attention_heads=args.heads,
            num_key_value_heads=args.heads,
            max_position_embeddings=context,
            tie_word_embeddings=False,
            attn_implementation="sdpa",
        )
        model = LlamaForCausalLM(config)
    elif name == "gpt":
        model = SpherenetGPTForCausalLM.from_spherenet(GPT(GPTConfig(**shape)))
    else:
        if name == "ngpt-gqa":
            shape["n_kv_heads"] = args.kv_heads
        elif name == "ngpt-relu2":
            shape.update(mlp="relu2", d_mlp=args.d_mlp * 3 // 2)
        model = SpherenetNGPTForCausalLM.from_spherenet(NGPT(NGPTConfig(**shape)))
        if name != "ngpt-unfolded":  # the transform a server applies (spherenet.models.fold_for_inference)
            model = fold_for_inference(model, inplace=True)
    model = model.to(device=device, dtype=dtype).eval()
    model.generation_config.eos_token_id = None  # exactly --new-tokens new tokens
    model.generation_config.pad_token_id = 0
    return model


def measurements(name: str, model, args, device: torch.device, compiled: bool) -> dict[str, Callable[[], object]]:
    """What is timed for one model: name -> a call."""
    g = torch.Generator().manual_seed(1)
    prefill_ids = torch.randint(0, args.vocab, (args.batch, args.prefill_len), generator=g).to(device)
    prompt = torch.randint(0, args.vocab, (1, args.prompt_len), generator=g).to(device)
    new = args.new_tokens
    if compiled:
        model.forward = torch.compile(model.forward, dynamic=True)
    calls = {
        "prefill": lambda: model(input_ids=prefill_ids, use_cache=True),
        "generate": lambda: model.generate(prompt, max_new_tokens=new, min_new_tokens=new, do_sample=False),
    }
    if name != "llama" and not compiled:  # spherenet's generate calls the model's own forward
        own = model.spherenet_model
        calls["spherenet generate"] = lambda: own.generate(prompt, new, temperature=0)
    return calls


def run(args) -> str:
    device = pick_device(args.device)
    dtype = DTYPES[args.dtype]
    if device.type == "cpu":
        torch.set_num_threads(args.threads)
    modes = ["eager", "compile"] if args.compile else ["eager"]
    names = [m for m in args.models.split(",") if m]
    unknown = [m for m in names if m not in MODELS]
    if unknown or "llama" not in names:
        raise SystemExit(f"--models: {unknown or 'llama is needed'}; choose among {', '.join(MODELS)} (llama included)")
    if args.clock == "cpu" and device.type != "cpu":
        raise SystemExit("--clock cpu times CPU work; on a GPU use the wall clock (the default)")
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    timers: dict[tuple[str, str, str], list[float]] = {}
    calls = {}
    for mode in modes:
        for name in names:
            model = build(name, args, device, dtype)
            for what, call in measurements(name, model, args, device, mode == "compile").items():
                calls[mode, name, what] = call
    with torch.no_grad():
        for key, call in calls.items():  # warm-up (and compilation): not timed
            call()
        for _ in range(args.rounds):
            for key, call in calls.items():
                sync(device)
                start = clock()
                call()
                sync(device)
                timers.setdefault(key, []).append(clock() - start)
    median = {key: statistics.median(times) * 1000 for key, times in timers.items()}
    lines = [
        header("Inference: nGPT and GPT against transformers' Llama", device, args.argv),
        f"shape: d_model {args.d_model}, {args.layers} layers, {args.heads} heads (GQA row: {args.kv_heads} "
        f"key/value heads), d_MLP {args.d_mlp}, vocab {args.vocab}; {args.dtype}; prefill {args.batch} x "
        f"{args.prefill_len} tokens; generate {args.new_tokens} new tokens after {args.prompt_len} (batch 1, "
        f"greedy); median of {args.rounds} interleaved rounds, {args.clock} clock; load average {os.getloadavg()[0]:.2f} after the run",
        "",
        "| mode | model | "
        + " | ".join(f"{w} (ms, x Llama)" for w in ("prefill", "generate", "spherenet generate"))
        + " |",
        "|---|---|---:|---:|---:|",
    ]
    for mode in modes:
        for name in names:
            cells = []
            for what in ("prefill", "generate", "spherenet generate"):
                ms = median.get((mode, name, what))
                llama = median[mode, "llama", "generate" if what == "spherenet generate" else what]
                cells.append("-" if ms is None else f"{ms:.1f} ({ms / llama:.2f}x)")
            lines.append(f"| {mode} | {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--d-model", type=int, default=512)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=2, help="key/value heads of the ngpt-gqa row")
    p.add_argument("--d-mlp", type=int, default=1408)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--batch", type=int, default=4, help="prefill batch")
    p.add_argument("--prefill-len", type=int, default=512)
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=2, help="CPU threads (torch.set_num_threads)")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--dtype", default="fp32", choices=DTYPES)
    p.add_argument("--clock", default="wall", choices=("wall", "cpu"), help="wall clock, or the process's CPU time")
    p.add_argument("--compile", action="store_true", help="also time every model under torch.compile")
    p.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, among {', '.join(MODELS)}")
    p.add_argument("--small", action="store_true", help="a tiny shape and 2 rounds: a smoke test")
    args = p.parse_args(argv)
    if args.small:
        for key, value in SMALL.items():
            setattr(args, key, value)
    args.argv = argv
    return args


def main(argv=None) -> None:
    print(run(parse(argv)), flush=True)


if __name__ == "__main__":
    main()
