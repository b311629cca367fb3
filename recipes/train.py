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
(spherenet.train.distributed), the step (spherenet.train.loop), checkpoints
(spherenet.checkpoint), experiment tracking (spherenet.train.tracking); and the recipe's own:
config files (recipes.config_files), the data per rank (recipes.run_data), starting weights
(recipes.init_from), LoRA fine-tuning (recipes.lora), the resume policy (recipes.resume), a clean
stop on a signal (recipes.stop).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import torch

from recipes.checkpoints import checkpoint_files, model_class_name
from recipes.cli import prog
from recipes.config_files import DEFAULT_CONFIG, resolve_config, shipped_configs
from recipes.init_from import adopt_published_model, check_init_from_target, init_from_weights
from recipes.lora import LoraTraining
from recipes.progress import progress_bar
from recipes.resume import (
    QuietRefusal,
    check_data,
    check_resumable,
    extend_schedule,
    open_run_directory,
    plan_resume,
    release_claims,
    restore_position,
)
from recipes.run_data import batch_geometry, prepare_data, run_windows
from recipes.stop import StopOnSignal
from spherenet.analysis import eigen_learning_rates, sphere_norm_error
from spherenet.checkpoint import CheckpointError, CheckpointManager, NonFiniteStateError, describe_os_error
from spherenet.data import DataError
from spherenet.manifolds import named_sphere_parameters
from spherenet.models import model_from_config
from spherenet.models.presets import PRESETS
from spherenet.optim import build_optimizer, normalize_
from spherenet.train.config import ConfigError, RunConfig, load_config, model_config, resolved, to_toml
from spherenet.train.distributed import all_reduce_max, init_distributed, shutdown, wrap_model
from spherenet.train.loop import MetricsLog, NonFiniteError, autocast_dtype, evaluate, train_step
from spherenet.train.memory import check_run_memory, check_training_memory
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


def build_model(cfg: RunConfig, vocab_size: int, device: torch.device) -> torch.nn.Module:
    model = model_from_config(model_config(cfg, vocab_size))  # the data's vocabulary unless [model] sets one
    model.set_activation_checkpointing(cfg.train.activation_checkpointing)
    return model.to(device)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # what the run uses; recorded so in checkpoints and metrics (the model of a published directory: its own)
    cfg = resolved(adopt_published_model(build_config(args), resolve_config(args.config), args.overrides))
    if args.print_config:
        print(to_toml(cfg), end="")
        return 0
    check_available(cfg.train.loggers)  # a missing tensorboard / wandb package, before any work
    if args.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda: this machine has no usable CUDA device (torch.cuda.is_available() is False)")
    if args.accept_data_change and not args.resume:
        raise ConfigError("--accept-data-change applies to --resume only (a fresh run has no earlier data)")
    info = init_distributed(args.device)
    t = cfg.train
    out_dir = Path(t.out_dir)
    micro, accum = batch_geometry(cfg, info.world_size)
    # a size that cannot run, counted with the smallest vocabulary: refused before anything is written or tokenized
    check_run_memory(cfg, device=info.device, micro_batch=micro, world_size=info.world_size)
    ckpt = CheckpointManager(out_dir / "checkpoints", keep_last=t.keep_last)
    check_init_from_target(t.init_from, out_dir, args.overwrite)
    # A torchrun restart continues the run only when this job wrote it (recipes.resume).
    run_dir = open_run_directory(out_dir, ckpt, args.resume, args.overwrite, info)  # rank 0 holds its lock
    restarted = run_dir.continuing
    plan = None
    if args.resume or restarted:  # a refusal costs nothing
        found = ckpt.latest_verified()
        plan = plan_resume(found, cfg, info.world_size) if found is not None else None

    data = prepare_data(cfg, info.is_main)
    data_changed = check_data(plan, data, args.accept_data_change) if plan is not None else False
    tokenizer = data.tokenizer()
    check_training_memory(  # a size that cannot run: refused before the model is built or anything written
        model_config(cfg, data.vocab_size), device=info.device, micro_batch=micro, block_size=t.block_size,
        shards=info.world_size if t.parallel == "fsdp" else 1, activation_checkpointing=t.activation_checkpointing,
        activation_bytes_per_value=(autocast_dtype(t.autocast, info.device) or torch.float32).itemsize,
    )  # fmt: skip  # one call, its sizes together
    seed_everything(t.seed)  # identical initial weights on every rank; the saved RNG states repeat
    model = build_model(cfg, data.vocab_size, info.device)
    if plan is None and t.init_from:  # before sharding: the weights are whole tensors
        init_from_weights(model, tokenizer, t.init_from, info.is_main)
    lora = LoraTraining(model, t, info.is_main) if t.lora_rank else None  # recipes.lora: checkpoints merge
    block = t.block_size  # resolved: the model's max_seq_len unless set
    if block > model.config.max_seq_len:
        raise ConfigError(f"train.block_size {block} exceeds the model's max_seq_len {model.config.max_seq_len}")
    train_windows, val_windows = run_windows(data, cfg, info, micro, accum, model.config.vocab_size)

    wrapped = wrap_model(model, t.parallel, info)
    o = cfg.optim
    try:
        optimizer, scheduler = build_optimizer(
            model,
            o.method,
            lr=o.lr,
            total_steps=t.steps,
            weight_decay=o.weight_decay,
            warmup_steps=o.warmup_steps,
            betas=(o.beta1, o.beta2),
            eps=o.eps,
            second_moment=o.second_moment,
            gradient=o.gradient,
            sphere_kernel=o.sphere_kernel,
            muon_lr=o.muon_lr,
            matrix_lr=o.matrix_lr,
            muon_momentum=o.muon_momentum,
        )
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"[optim] method {o.method!r} with train.steps={t.steps}: {exc}") from None
    step_model = torch.compile(wrapped) if t.compile else wrapped

    state = {
        "model": lora.merged if lora else model,
        **({"lora": lora} if lora else {}),
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
    run_files = checkpoint_files(model, tokenizer)  # the model config and tokenizer, inside every checkpoint
    start = 0
    if plan is not None:
        # The data position and (with another train.steps) the schedule are restored below.
        skip = {"train_windows"} | ({"scheduler"} if plan.steps_changed else set())
        loaded = ckpt.load(plan.checkpoint, {k: v for k, v in state.items() if k not in skip})
        check_resumable(loaded.extra, cfg, model_class_name(model), dataclasses.asdict(model.config), loaded.path)
        start = loaded.step
        restore_position(train_windows, plan, data_changed)
        if plan.steps_changed:
            extend_schedule(scheduler, loaded.extra["scheduler"])
        if info.is_main:
            print(f"resumed from {loaded.path} at step {start}", flush=True)
            for note in plan.notes:
                print(f"resume: {note}", flush=True)
            if plan.steps_changed and start < t.steps:
                print(f"resume: learning rate at step {start + 1}: {scheduler.get_last_lr()[0]:.3e}", flush=True)
    elif restarted and info.is_main:  # a restart before the first checkpoint: from the start again
        print(f"restart: no checkpoint in {ckpt.directory} yet, starting from step 0", flush=True)

    run_dir.commit()  # every input checked: an overwritten run moves aside only now
    n_params = sum(p.numel() for p in model.parameters())
    tokens_per_step = t.batch_size * block
    log = MetricsLog(out_dir / "metrics.jsonl", enabled=info.is_main)
    # Every rank computes the nGPT health metrics (collectives); rank 0 logs them.
    is_sphere_model = any(True for _ in named_sphere_parameters(model))
    trackers = open_trackers(
        t.loggers, out_dir, cfg.to_dict(), enabled=info.is_main, start_step=start, wandb_project=t.wandb_project
    )

    bar = progress_bar(t.steps, "train", info.is_main and t.progress and start < t.steps, initial=start, unit="it")
    last_step = min(t.steps, t.halt_after) if t.halt_after else t.steps

    model.train()
    skipped_in_row, last_val = 0, None  # None: no validation in this invocation yet
    t_last, step = time.time(), start
    # SIGTERM or Ctrl-C: finish the step, checkpoint, exit cleanly (recipes.stop). Entered before the
    # "start" record, so a signal that arrives once the run reports itself started always ends in a
    # checkpoint.
    with StopOnSignal(announce=info.is_main) as stop_request:
        if info.is_main:
            print(
                f"{cfg.model.preset}: {n_params / 1e6:.2f}M parameters | data {data.num_tokens('train'):,} train tokens "
                f"({tokenizer.name}, vocab {data.vocab_size}) | {t.steps} steps x {tokens_per_step:,} tokens | "
                f"world {info.world_size} ({t.parallel}), micro-batch {micro} x {accum} | {o.method} lr {o.lr:g} | "
                f"update {getattr(model.config, 'update', 'residual')}",
                flush=True,
            )
            log.log(event="start", step=start, params=n_params, world_size=info.world_size, config=cfg.to_dict())
            if plan is not None and plan.notes:
                log.log(event="resume_changes", step=start, changes=plan.notes)
        try:
            for step in range(start + 1, last_step + 1):
                lr = scheduler.get_last_lr()[0]
                x, y = (v.to(info.device) for v in train_windows.next_batch())
                batches = list(zip(x.split(micro), y.split(micro)))
                result = train_step(
                    step_model,
                    batches,
                    optimizer,
                    autocast=t.autocast,
                    grad_clip=o.grad_clip,
                    nonfinite=t.nonfinite,
                    sharded=t.parallel == "fsdp" and info.enabled,
                )
                scheduler.step()
                if o.reproject_every and step % o.reproject_every == 0:
                    normalize_(model)
                skipped_in_row = skipped_in_row + 1 if result.skipped else 0
                if skipped_in_row >= t.max_nonfinite:
                    raise NonFiniteError(f"{skipped_in_row} non-finite steps in a row (train.max_nonfinite); stopping")
                now = time.time()
                tok_s = tokens_per_step / max(now - t_last, 1e-9)
                t_last = now
                record = dict(
                    step=step,
                    loss=result.loss,
                    lr=lr,
                    grad_norm=result.grad_norm,
                    skipped=result.skipped,
                    tokens=step * tokens_per_step,
                    tok_per_s=round(tok_s, 1),
                )
                if step % t.eval_every == 0 or step == t.steps:
                    last_val = evaluate(step_model, val_windows.eval_batches(t.eval_batches), autocast=t.autocast)
                    record["val_loss"] = last_val
                if step % t.log_every == 0 or "val_loss" in record or result.skipped:
                    if is_sphere_model:  # the same decision on every rank: skipped steps are agreed on
                        record["sphere_norm_error"] = sphere_norm_error(model, info.device)
                        record.update(eigen_learning_rates(model, info.device))
                    log.log(**record)
                    trackers.log_record(record)
                report_step(bar, record, last_val, t, info.is_main)
                stop = stop_request.requested
                if info.enabled:  # every rank must leave the loop at the same step
                    stop = bool(all_reduce_max(torch.tensor(float(stop))) > 0)
                if step % t.checkpoint_every == 0 or step == last_step or stop:
                    if lora:
                        lora.refresh_merged()
                    ckpt.save(step, state, files=run_files)
                if stop:
                    last_step = step
                    if info.is_main:
                        print(
                            f"stop requested ({stop_request.describe()}): checkpoint saved at step {step}; "
                            "continue with --resume",
                            flush=True,
                        )
                    break
        except NonFiniteError as exc:
            if bar is not None:
                bar.close()
            if info.is_main:
                print(f"error: {exc}", file=sys.stderr, flush=True)
                log.log(event="stopped", step=step, reason=str(exc))
            return 3
        finally:
            trackers.close()
    if bar is not None:
        bar.close()

    norm_err = sphere_norm_error(model, info.device)
    if info.is_main:
        what = "done" if last_step == t.steps else "halted before train.steps (continue with --resume)"
        val = f"val loss {last_val:.4f}" if last_val is not None else "no validation yet"
        print(
            f"{what}: step {last_step}, {val}, max |row norm - 1| of sphere weights {norm_err:.2e}, "
            f"checkpoints in {ckpt.directory}",
            flush=True,
        )
        ended = dict(val_loss=last_val) if last_val is not None else {}
        log.log(event=what.split()[0], step=last_step, **ended, sphere_norm_error=norm_err)
    if t.sample_tokens > 0 and last_step == t.steps:
        prompt, continuation = generate_sample(model, tokenizer, val_windows, t.sample_tokens, info.device)
        if info.is_main:
            print(f"--- sample: prompt ---\n{prompt}\n--- sample: the model's continuation ---\n{continuation}\n---")
    return 0


def report_step(bar, record: dict, last_val: float | None, t, is_main: bool) -> None:
    """One step on the progress bar (its postfix shows a validation loss once there is one), or,
    without a bar, a log line every ``train.log_every`` steps and at each validation."""
    loss, lr, tok_s = record["loss"], record["lr"], record["tok_per_s"]
    if bar is not None:
        val = {} if last_val is None else {"val": f"{last_val:.4f}"}
        bar.set_postfix(loss=f"{loss:.4f}", **val, lr=f"{lr:.2e}", tok_s=f"{tok_s:,.0f}")
        bar.update(1)
    elif is_main and t.progress and (record["step"] % t.log_every == 0 or "val_loss" in record):
        val = f" val {record['val_loss']:.4f}" if "val_loss" in record else ""
        print(f"step {record['step']}/{t.steps} loss {loss:.4f}{val} lr {lr:.2e} {tok_s:,.0f} tok/s", flush=True)


def generate_sample(model, tokenizer, val_windows, n_tokens: int, device: torch.device) -> tuple[str, str]:
    """The first 32 tokens of the validation split and the model's continuation of them (every
    rank runs it: under FSDP the forward pass is collective; the seeded generator makes all agree)."""
    ids = val_windows.tokens[: min(32, model.config.max_seq_len // 2)].astype("int64").tolist()
    model.eval()
    with torch.no_grad():
        gen = torch.Generator(device=device).manual_seed(0)
        out = model.generate(torch.tensor([ids], device=device), n_tokens, temperature=0.8, top_k=50, generator=gen)
    return tokenizer.decode(ids), tokenizer.decode(out[0, len(ids) :].tolist())


def cli(argv: list[str] | None = None) -> int:
    """Entry point: user errors (config, data, checkpoints) print one clear line, exit code 2;
    non-finite values (a NaN loss under train.nonfinite=stop, NaN weights that a checkpoint
    refused) exit code 3; a second Ctrl-C, whenever it comes after the first, 130."""
    StopOnSignal.last = None
    code = _run(argv)
    stop = StopOnSignal.last  # the run's signal handling, entered around its training loop
    return stop.exit_code(code) if stop is not None else code


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
    sys.exit(cli())
