"""Train nGPT or the baseline GPT: ``python -m recipes.train`` or
``torchrun --nproc_per_node=N -m recipes.train``.

With no arguments it trains a small nGPT on the embedded default corpus (the Python standard
library's source, byte level) on the CPU for a few minutes, then prints a sample.

    python -m recipes.train --config recipes/configs/ngpt-0.5b.toml optim.lr=1e-3
    python -m recipes.train data.source=my_text.txt train.steps=2000
    torchrun --nproc_per_node=8 -m recipes.train --config recipes/configs/gpt-1b.toml --parallel fsdp
    python -m recipes.train --resume            # continue from the newest sound checkpoint
    python -m recipes.train train.loggers=[tensorboard,wandb]   # metrics.jsonl plus TensorBoard and W&B

Overrides are ``section.key=value`` (sections: model, data, optim, train); an unknown key is
an error that names it. The recipe assembles library parts: config (spherenet.train.config),
data (spherenet.data), model (spherenet.models), optimizer (spherenet.optim), parallelism
(spherenet.train.distributed), the step (spherenet.train.step), checkpoints
(spherenet.checkpoint), the metrics log (spherenet.train.metrics), experiment tracking
(spherenet.train.tracking); and the recipe's own: config files (recipes.config_files), the data
per rank (recipes.run_data), starting weights (recipes.init_from), LoRA fine-tuning
(recipes.lora), the resume policy (recipes.resume), a clean stop on a signal (recipes.stop), the
run that trains them, built by keyword from the parts (recipes.trainer.Trainer). The config's
sections build their parts: ``cfg.model.build(vocab_size)`` the model config,
``cfg.optim.build(model, steps)`` the optimizer and schedule.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import torch

from recipes.checkpoints import checkpoint_files, model_class_name
from recipes.cli import prog
from recipes.config_files import DEFAULT_CONFIG, resolve_config, shipped_configs
from recipes.init_from import StartingWeights, adopt_published_model, check_init_from_target, read_starting_weights
from recipes.lora import checkpoint_models, lora_training
from recipes.resume import QuietRefusal, Resumption, open_run_directory, release_claims
from recipes.run_data import batch_geometry, check_vocabulary, prepare_data, run_tokenizer, run_windows
from recipes.stop import StopOnSignal, exit_process
from recipes.trainer import Trainer
from spherenet.checkpoint import (
    RUN_CHECKPOINTS,
    CheckpointError,
    CheckpointManager,
    NonFiniteStateError,
    describe_os_error,
)
from spherenet.data import DataError
from spherenet.models import model_from_config
from spherenet.models.presets import PRESETS
from spherenet.train.config import ConfigError, RunConfig, load_config, resolved, to_toml
from spherenet.train.distributed import DistInfo, init_distributed, shutdown, wrap_model
from spherenet.train.memory import check_run_memory, check_training_memory
from spherenet.train.metrics import MetricsLog
from spherenet.train.step import autocast_dtype
from spherenet.train.tracking import check_available, open_trackers


def _epilog() -> str:
    return (
        f"shipped configs (--config NAME, from any directory): {', '.join(shipped_configs())}\n"
        f"model presets (model.preset=NAME): {', '.join(sorted(PRESETS))}\n"
        "overrides: section.key=value, sections model, data, optim, train; every key with its default and meaning "
        "is in spherenet/train/config.py, and --print-config prints them all as resolved\n"
        "fine-tune: train.init_from=<run dir | checkpoint | exported dir | Hub id> starts from those weights; "
        "train.lora_rank=R (with init_from) trains rank-R LoRA adapters instead, checkpoints hold the merged model"
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog=prog("recipes.train"),
        description=__doc__.split("\n\n")[0],
        epilog=_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--config", default=None, help=f"a TOML file or a shipped config's name (default: {DEFAULT_CONFIG.stem})"
    )
    p.add_argument("--resume", action="store_true", help="continue from the newest sound checkpoint in train.out_dir")
    p.add_argument("--print-config", action="store_true", help="print the resolved config as TOML and exit (a dry run)")
    p.add_argument("--parallel", choices=["none", "ddp", "fsdp"], help="shortcut for train.parallel")
    p.add_argument("--compile", action="store_true", help="shortcut for train.compile=true")
    p.add_argument("--device", choices=["cpu", "cuda"], default=None, help="default: cuda when available")
    p.add_argument("--no-progress", action="store_true", help="shortcut for train.progress=false")
    p.add_argument(
        "--overwrite", action="store_true", help="start afresh in a train.out_dir holding a run: moved aside"
    )
    p.add_argument(
        "--accept-data-change",
        action="store_true",
        help="with --resume: continue on data whose content differs from the checkpoint's (reported)",
    )
    p.add_argument("overrides", nargs="*", metavar="section.key=value")
    return p.parse_intermixed_args(argv)


def build_config(args: argparse.Namespace) -> RunConfig:
    """The run's config as given: the file, the overrides and the flags' shortcuts (unset keys
    stay unset; :func:`spherenet.train.config.resolved` fills them in)."""
    shortcuts = {f"train.parallel={args.parallel}": args.parallel, "train.compile=true": args.compile,
                 "train.progress=false": args.no_progress}  # fmt: skip  # each override beside its flag
    return load_config(resolve_config(args.config), [*args.overrides, *(o for o, on in shortcuts.items() if on)])


def seed_everything(seed: int) -> None:
    """Seed torch, Python's ``random`` and numpy's global generator: checkpoints save all three
    and ``--resume`` restores them, so two runs of one config save the same states."""
    import random

    import numpy as np

    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed % 2**32)


def run_config(args: argparse.Namespace) -> RunConfig:
    """What the run uses, resolved; recorded so in checkpoints and metrics (the model of a
    published directory in train.init_from: its own, recipes.init_from)."""
    return resolved(adopt_published_model(build_config(args), resolve_config(args.config), args.overrides))


def check_arguments(args: argparse.Namespace, cfg: RunConfig) -> None:
    """What the flags and the machine must agree on, before any work."""
    check_available(cfg.train.loggers)  # a missing tensorboard / wandb package
    if args.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda: this machine has no usable CUDA device (torch.cuda.is_available() is False)")
    if args.accept_data_change and not args.resume:
        raise ConfigError("--accept-data-change applies to --resume only (a fresh run has no earlier data)")


def check_model_memory(cfg: RunConfig, vocab_size: int, micro: int, info: DistInfo) -> None:
    """A model that cannot train on this device at this size: refused before it is built or anything written."""
    t = cfg.train
    check_training_memory(
        cfg.model.build(vocab_size), device=info.device, micro_batch=micro, block_size=t.block_size,
        shards=info.world_size if t.parallel == "fsdp" else 1, activation_checkpointing=t.activation_checkpointing,
        activation_bytes_per_value=(autocast_dtype(t.autocast, info.device) or torch.float32).itemsize,
    )  # fmt: skip  # one call, its sizes together


def checked_data(cfg: RunConfig, weights: StartingWeights | None, micro: int, info: DistInfo):
    """The run's prepared data and its tokenizer. What needs the tokenizer but not the tokenized
    data (:func:`check_fit`) is checked as soon as ``data.tokenizer`` is loaded, before the data is
    tokenized with it; for a BPE trained on the data, once the preparation has trained it."""
    loaded = run_tokenizer(cfg)
    if loaded is not None:
        check_fit(cfg, loaded, weights, micro, info)
    data = prepare_data(cfg, info.is_main, loaded)
    tokenizer = data.tokenizer()
    if loaded is None:
        check_fit(cfg, tokenizer, weights, micro, info)
    return data, tokenizer


def check_fit(cfg: RunConfig, tokenizer, weights: StartingWeights | None, micro: int, info: DistInfo) -> None:
    """The model's vocabulary holds the tokenizer's, train.init_from's weights fit the model, and
    the model fits in memory at the tokenizer's vocabulary."""
    check_vocabulary(cfg, tokenizer)
    if weights is not None:
        weights.check_fits(tokenizer, cfg.model.build(tokenizer.vocab_size))
    check_model_memory(cfg, tokenizer.vocab_size, micro, info)


def build_model(cfg: RunConfig, vocab_size: int, device: torch.device) -> torch.nn.Module:
    model = model_from_config(cfg.model.build(vocab_size))  # the data's vocabulary unless [model] sets one
    model.set_activation_checkpointing(cfg.train.activation_checkpointing)
    if cfg.train.block_size > model.config.max_seq_len:
        raise ConfigError(
            f"train.block_size {cfg.train.block_size} exceeds the model's max_seq_len {model.config.max_seq_len}"
        )
    return model.to(device)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cfg = run_config(args)
    if args.print_config:
        print(to_toml(cfg), end="")
        return 0
    check_arguments(args, cfg)
    info = init_distributed(args.device)
    t = cfg.train
    micro, accum = batch_geometry(cfg, info.world_size)
    # a size that cannot run, counted with the smallest vocabulary: refused before anything is written or tokenized
    check_run_memory(cfg, device=info.device, micro_batch=micro, world_size=info.world_size)
    ckpt = CheckpointManager(Path(t.out_dir) / RUN_CHECKPOINTS, keep_last=t.keep_last)
    check_init_from_target(t.init_from, Path(t.out_dir), args.overwrite)
    # A torchrun restart continues the run only when this job wrote it (recipes.resume).
    run_dir = open_run_directory(Path(t.out_dir), ckpt, args.resume, args.overwrite, info)  # rank 0 holds its lock
    resume = Resumption.find(ckpt, cfg, info.world_size, wanted=args.resume, restarted=run_dir.continuing)
    weights = read_starting_weights(t, resume.resuming)  # recipes.init_from: None, or train.init_from's

    data, tokenizer = checked_data(cfg, weights, micro, info)
    resume.check_data(data, args.accept_data_change)
    seed_everything(t.seed)  # identical initial weights on every rank; the saved RNG states repeat
    model = build_model(cfg, data.vocab_size, info.device)
    if weights is not None:
        weights.load_into(model, info.is_main)
    lora = lora_training(model, t, info.is_main)  # recipes.lora: None, or the adapters; checkpoints merge
    train_windows, val_windows = run_windows(data, cfg, info, micro, accum, model.config.vocab_size)
    wrapped = wrap_model(model, t.parallel, info)
    optimizer, scheduler = cfg.optim.build(model, total_steps=t.steps)
    step_model = torch.compile(wrapped) if t.compile else wrapped
    state = {
        **checkpoint_models(model, lora),
        "optimizer": optimizer,
        "scheduler": scheduler,
        "train_windows": train_windows,
        "config": cfg.to_dict(),
        "config_resolved": True,  # compared as such on --resume (an earlier format is refused)
        "tokenizer": tokenizer.spec(),
        "model_class": model_class_name(model),
        "model_config": dataclasses.asdict(model.config),
        "data_content_sha256": data.meta["content_sha256"],  # compared on --resume
    }
    files = checkpoint_files(model, tokenizer)  # the model config and tokenizer, inside every checkpoint
    start = resume.restore(ckpt, state, model, info.is_main)
    run_dir.commit()  # every input checked: an overwritten run moves aside only now
    log = MetricsLog(Path(t.out_dir) / "metrics.jsonl", enabled=info.is_main)
    trackers = open_trackers(
        t.loggers, t.out_dir, cfg.to_dict(), enabled=info.is_main, start_step=start, wandb_project=t.wandb_project
    )
    trainer = Trainer(
        cfg=cfg, info=info, model=model, step_model=step_model, optimizer=optimizer, scheduler=scheduler,
        data=data, tokenizer=tokenizer, train_windows=train_windows, val_windows=val_windows, ckpt=ckpt,
        state=state, files=files, micro=micro, accum=accum, log=log, trackers=trackers,
        stop_on_signal=StopOnSignal(announce=info.is_main), start=start, resume_notes=resume.notes, lora=lora,
    )  # fmt: skip  # the run's parts by name, read together
    return trainer.fit()


def cli(argv: list[str] | None = None, *, ending: bool = False) -> int:
    """Entry point: user errors (config, data, checkpoints) print one clear line, exit code 2;
    non-finite values (a NaN loss under train.nonfinite=stop, NaN weights that a checkpoint
    refused) exit code 3; a second Ctrl-C, whenever it comes after the first, 130. ``ending``:
    the process ends with the code returned (:func:`recipes.stop.exit_process`); otherwise
    Ctrl-C's handling is the caller's again once this returns."""
    StopOnSignal.last = None
    code = _run(argv)
    stop = StopOnSignal.last  # the run's signal handling, entered around its training loop
    return stop.exit_code(code, ending=ending) if stop is not None else code


def _run(argv: list[str] | None) -> int:
    try:
        return main(argv)
    except NonFiniteStateError as exc:  # NaN/inf in the weights: refused to checkpoint them
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 3
    except (ConfigError, DataError, CheckpointError) as exc:
        if not isinstance(exc, QuietRefusal):  # under torchrun rank 0 says it for the job
            print(f"error: {exc}", file=sys.stderr, flush=True)
        release_claims(refused=True)
        return 2
    except KeyboardInterrupt:  # a second Ctrl-C: out at once, without the stop checkpoint
        print(
            "error: aborted by a second Ctrl-C: the step in flight was not checkpointed; --resume continues "
            "from the last saved checkpoint",
            file=sys.stderr,
            flush=True,
        )
        return 130
    except OSError as exc:  # a write outside the checkpoint's (metrics, out_dir, data cache): errno named
        print(
            f"error: {describe_os_error(exc, 'cannot write' if exc.filename else 'file operation failed')}",
            file=sys.stderr,
            flush=True,
        )
        release_claims(refused=True)  # a start that failed leaves no lock behind (a run's files stay)
        return 2
    finally:
        release_claims(refused=False)
        shutdown()


if __name__ == "__main__":
    exit_process(cli(ending=True))
