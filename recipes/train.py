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
(spherenet.checkpoint), experiment tracking (spherenet.train.tracking).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import sys
import time
from pathlib import Path

import torch

from recipes.checkpoints import checkpoint_files, is_exported, load_weights, model_class_name
from recipes.cli import prog
from recipes.progress import progress_bar
from recipes.resume import (
    check_data,
    check_resumable,
    claim_run_directory,
    extend_schedule,
    plan_resume,
    restore_position,
    run_in_directory,
)
from spherenet.analysis import eigen_learning_rates, sphere_norm_error
from spherenet.checkpoint import (
    CheckpointError,
    CheckpointManager,
    NonFiniteStateError,
    describe_os_error,
)
from spherenet.data import DataError, prepare_dataset
from spherenet.manifolds import named_sphere_parameters
from spherenet.models import from_preset
from spherenet.models.presets import PRESETS
from spherenet.optim import build_optimizer, normalize_
from spherenet.train.config import ConfigError, RunConfig, load_config, to_toml
from spherenet.train.distributed import (
    all_reduce_max,
    barrier,
    init_distributed,
    shutdown,
    wrap_model,
)
from spherenet.train.loop import MetricsLog, NonFiniteError, evaluate, train_step
from spherenet.train.tracking import check_available, open_trackers

DEFAULT_CONFIG = Path(__file__).parent / "configs" / "default.toml"


CONFIGS_DIR = DEFAULT_CONFIG.parent


def shipped_configs() -> list[str]:
    """The names of the configs that ship with spherenet (``--config NAME`` finds them anywhere)."""
    return sorted(p.stem for p in CONFIGS_DIR.glob("*.toml"))


def resolve_config(name: str | None) -> Path:
    """The config file ``--config`` names: a path, or the name of a shipped config (``ngpt-tiny``
    or ``ngpt-tiny.toml``) from any directory. ``ConfigError`` lists the shipped ones."""
    if name is None:
        return DEFAULT_CONFIG
    path = Path(name).expanduser()
    if path.is_file():
        return path
    shipped = CONFIGS_DIR / (path.name if path.suffix == ".toml" else f"{path.name}.toml")
    if path.parent != Path("."):
        raise ConfigError(f"config file not found: {path}")
    if shipped.is_file():
        return shipped
    raise ConfigError(
        f"--config {name}: no such file, and no shipped config of that name ({', '.join(shipped_configs())})"
    )


def _epilog() -> str:
    return (
        f"shipped configs (--config NAME, from any directory): {', '.join(shipped_configs())}\n"
        f"model presets (model.preset=NAME): {', '.join(sorted(PRESETS))}\n"
        "overrides: section.key=value, sections model, data, optim, train; every key with its default and meaning "
        "is in spherenet/train/config.py, and --print-config prints them all as resolved\n"
        "fine-tune: train.init_from=<run dir | checkpoint | exported dir | Hub id> starts from those weights"
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
    shortcuts = {f"train.parallel={args.parallel}": args.parallel, "train.compile=true": args.compile,
                 "train.progress=false": args.no_progress}  # fmt: skip  # each override beside its flag
    return load_config(resolve_config(args.config), [*args.overrides, *(o for o, on in shortcuts.items() if on)])


def batch_geometry(cfg: RunConfig, world_size: int) -> tuple[int, int]:
    """(micro-batch size per rank, gradient-accumulation steps) for the global batch."""
    batch = cfg.train.batch_size
    if batch % world_size:
        raise ConfigError(f"train.batch_size {batch} is not divisible by the world size {world_size}")
    per_rank = batch // world_size
    micro = cfg.train.micro_batch_size or per_rank
    if per_rank % micro:
        raise ConfigError(
            f"train.micro_batch_size {micro} does not divide the per-rank batch {per_rank} "
            f"(train.batch_size {batch} / {world_size} ranks)"
        )
    return micro, per_rank // micro


def prepare_data(cfg: RunConfig, is_main: bool):
    d = cfg.data
    cache = Path(d.cache_dir) if d.cache_dir else Path(cfg.train.out_dir).parent / "data_cache"
    kwargs = dict(
        text_field=d.text_field,
        text_unit=d.text_unit,
        hub_config=d.subset or None,
        hub_split=d.split,
        max_documents=d.max_docs or None,
        val_fraction=d.val_fraction,
        seed=d.seed,
        num_proc=d.num_proc,
    )
    # Rank 0 tokenizes; the others wait, then read the cached files.
    if is_main:
        data = prepare_dataset(d.source, d.tokenizer, cache, progress=cfg.train.progress, **kwargs)
    barrier()
    if not is_main:
        data = prepare_dataset(d.source, d.tokenizer, cache, **kwargs)
    return data


def build_model(cfg: RunConfig, vocab_size: int, device: torch.device) -> torch.nn.Module:
    overrides = dict(cfg.model.overrides)
    overrides.setdefault("vocab_size", vocab_size)  # the data's vocabulary unless set explicitly
    try:
        model = from_preset(cfg.model.preset, **overrides)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"[model] preset {cfg.model.preset!r}: {exc}") from None
    model.set_activation_checkpointing(cfg.train.activation_checkpointing)
    return model.to(device)


def check_resume_target(out_dir: Path, ckpt: CheckpointManager, claimed: bool) -> None:
    """``--resume`` continues a run: refused, naming what is there instead, when ``out_dir``
    holds none. Before the directory is claimed (``claimed=False``): a missing directory and an
    exported model; after (the lock taken, so that a directory another trainer is filling is
    reported as in use): a directory without checkpoints."""
    if ckpt.checkpoints():
        return  # verified (and a damaged one named) when it is loaded
    if not claimed and is_exported(out_dir):
        raise ConfigError(
            f"--resume: train.out_dir {out_dir} is an exported model, not a run; to fine-tune from it, "
            f"train.init_from={out_dir} with another train.out_dir (and no --resume)"
        )
    if not claimed and out_dir.exists():
        return
    if out_dir.exists() and run_in_directory(out_dir):  # a run that stopped before its first checkpoint
        raise ConfigError(
            f"--resume: train.out_dir {out_dir} holds a run's {run_in_directory(out_dir)} but no checkpoint (it "
            "stopped before its first): nothing to continue; start it afresh with --overwrite (its files move aside)"
        )
    what = "does not exist" if not out_dir.exists() else f"holds no checkpoint (no {ckpt.directory.name}/step_*)"
    raise ConfigError(
        f"--resume: train.out_dir {out_dir} {what}: there is no run to continue; drop --resume to start one"
    )


def init_from_weights(model: torch.nn.Module, tokenizer, source: str, is_main: bool) -> None:
    """Load the weights of ``source`` (``train.init_from``) into the freshly built ``model``:
    the same tokenizer as the data's, the same class and the same config, field by field, or
    ``ConfigError`` naming every field that differs and how to set it."""
    try:
        given = load_weights(source)
    except (CheckpointError, DataError) as exc:
        raise ConfigError(f"train.init_from={source}: {exc}") from None
    if given.tokenizer.fingerprint != tokenizer.fingerprint:
        raise ConfigError(
            f"train.init_from={source} was trained with the {given.tokenizer.name} tokenizer (vocab "
            f"{given.tokenizer.vocab_size}), the data here is tokenized with {tokenizer.name} (vocab "
            f"{tokenizer.vocab_size}): set data.tokenizer to the weights' tokenizer"
        )
    theirs, ours = model_class_name(given.model), model_class_name(model)
    if theirs != ours:
        raise ConfigError(
            f"train.init_from={source} holds {theirs} weights, but [model] builds a {ours}: set model.preset to "
            f"one of the {theirs.lower()}-* presets"
        )
    saved, built = dataclasses.asdict(given.model.config), dataclasses.asdict(model.config)
    differ = _differences(saved, built)
    if differ:
        raise ConfigError(
            f"train.init_from={source}: the weights' model config differs from the run's in "
            + ", ".join(f"{key} ({there!r} there, {here!r} here)" for key, there, here in differ)
            + "; set "
            + " ".join(f"model.{key}={_spelled(there)}" for key, there, _ in differ)
        )
    model.load_state_dict(given.model.state_dict())  # same class and config: the same tensors
    if is_main:
        print(f"init_from: weights of {given.describe()} (a fresh optimizer)", flush=True)


def _differences(saved: dict, built: dict, prefix: str = "") -> list[tuple[str, object, object]]:
    """``(dotted key, saved value, built value)`` of every field that differs; a table (a
    scaling) is compared field by field, so that only the fields that differ are named."""
    out = []
    for key, here in built.items():
        there = saved.get(key)
        if isinstance(here, dict) and isinstance(there, dict):
            out += _differences(there, here, f"{prefix}{key}.")
        elif there != here:
            out.append((f"{prefix}{key}", there, here))
    return out


def _spelled(value) -> str:
    """A config value as a ``model.key=value`` override spells it."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cfg = build_config(args)
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
    ckpt = CheckpointManager(out_dir / "checkpoints", keep_last=t.keep_last)
    # torchrun --max-restarts: a restarted worker group continues from the last checkpoint.
    restarted = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0
    if args.resume and not restarted:
        check_resume_target(out_dir, ckpt, claimed=False)  # before the directory is made
    _lock = claim_run_directory(out_dir, args.resume or restarted, args.overwrite, info.is_main)  # held to the end
    if args.resume and not restarted:
        check_resume_target(out_dir, ckpt, claimed=True)  # another trainer's run is refused as in use first
    plan = None
    if args.resume or restarted:  # a refusal costs nothing
        found = ckpt.latest_verified()
        plan = plan_resume(found, cfg, info.world_size) if found is not None else None

    data = prepare_data(cfg, info.is_main)
    data_changed = check_data(plan, data, args.accept_data_change) if plan is not None else False
    tokenizer = data.tokenizer()
    torch.manual_seed(t.seed)  # identical initial weights on every rank
    model = build_model(cfg, data.vocab_size, info.device)
    if plan is None and t.init_from:  # before sharding: the weights are whole tensors
        init_from_weights(model, tokenizer, t.init_from, info.is_main)
    block = t.block_size or model.config.max_seq_len
    if block > model.config.max_seq_len:
        raise ConfigError(f"train.block_size {block} exceeds the model's max_seq_len {model.config.max_seq_len}")
    # One draw per step: this rank's share of the global batch, split into micro-batches below.
    # So the data position is the step (global batches), whatever the micro-batch or world size.
    train_windows = data.windows(
        "train",
        block_size=block,
        batch_size=micro * accum,
        seed=t.seed,
        rank=info.rank,
        world_size=info.world_size,
        vocab_size=model.config.vocab_size,
    )
    val_windows = data.windows(
        "val",
        block_size=block,
        batch_size=micro,
        seed=t.seed,
        rank=info.rank,
        world_size=info.world_size,
        vocab_size=model.config.vocab_size,
    )

    wrapped = wrap_model(model, t.parallel, info)
    o = cfg.optim
    try:
        optimizer, scheduler = build_optimizer(
            model,
            o.method,
            lr=o.lr,
            total_steps=t.steps,
            weight_decay=None if o.weight_decay < 0 else o.weight_decay,
            warmup_steps=None if o.warmup_steps < 0 else o.warmup_steps,
            betas=(o.beta1, o.beta2),
            eps=o.eps,
            second_moment=o.second_moment,
            gradient=o.gradient,
            sphere_kernel=o.sphere_kernel,
            muon_lr=None if o.muon_lr < 0 else o.muon_lr,
            matrix_lr=None if o.matrix_lr < 0 else o.matrix_lr,
            muon_momentum=o.muon_momentum,
        )
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"[optim] method {o.method!r} with train.steps={t.steps}: {exc}") from None
    step_model = torch.compile(wrapped) if t.compile else wrapped

    state = {
        "model": model,
        "optimizer": optimizer,
        "scheduler": scheduler,
        "train_windows": train_windows,
        "config": cfg.to_dict(),
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

    n_params = sum(p.numel() for p in model.parameters())
    tokens_per_step = t.batch_size * block
    log = MetricsLog(out_dir / "metrics.jsonl", enabled=info.is_main)
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

    # Every rank computes the nGPT health metrics (collectives); rank 0 logs them.
    is_sphere_model = any(True for _ in named_sphere_parameters(model))
    trackers = open_trackers(
        t.loggers, out_dir, cfg.to_dict(), enabled=info.is_main, start_step=start, wandb_project=t.wandb_project
    )

    bar = progress_bar(t.steps, "train", info.is_main and t.progress and start < t.steps, initial=start, unit="it")
    last_step = min(t.steps, t.halt_after) if t.halt_after else t.steps

    # SIGTERM (preemption, scheduler time limit) or Ctrl-C (SIGINT): finish the step, checkpoint,
    # exit cleanly. A second Ctrl-C aborts at once (the last saved checkpoint stays intact).
    stop_requested = {"signal": None}

    def request_stop(signum, frame):
        if signum == signal.SIGINT and stop_requested["signal"] is not None:
            raise KeyboardInterrupt
        stop_requested["signal"] = signum
        if signum == signal.SIGINT and info.is_main:
            print(
                "\nCtrl-C: finishing this step and saving a checkpoint (Ctrl-C again to abort without it)",
                file=sys.stderr,
                flush=True,
            )

    previous_handlers = {sig: signal.signal(sig, request_stop) for sig in (signal.SIGTERM, signal.SIGINT)}

    model.train()
    skipped_in_row, last_val = 0, float("nan")
    t_last, step = time.time(), start
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
            if bar is not None:
                bar.set_postfix(loss=f"{result.loss:.4f}", val=f"{last_val:.4f}", lr=f"{lr:.2e}", tok_s=f"{tok_s:,.0f}")
                bar.update(1)
            elif info.is_main and t.progress and (step % t.log_every == 0 or "val_loss" in record):
                val = f" val {record['val_loss']:.4f}" if "val_loss" in record else ""
                print(f"step {step}/{t.steps} loss {result.loss:.4f}{val} lr {lr:.2e} {tok_s:,.0f} tok/s", flush=True)
            stop = stop_requested["signal"] is not None
            if info.enabled:  # every rank must leave the loop at the same step
                stop = bool(all_reduce_max(torch.tensor(float(stop))) > 0)
            if step % t.checkpoint_every == 0 or step == last_step or stop:
                ckpt.save(step, state, files=run_files)
            if stop:
                last_step = step
                if info.is_main:
                    why = (
                        signal.Signals(stop_requested["signal"]).name if stop_requested["signal"] else "on another rank"
                    )
                    print(
                        f"stop requested ({why}): checkpoint saved at step {step}; continue with --resume", flush=True
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
        for sig, handler in previous_handlers.items():
            signal.signal(sig, handler)
        trackers.close()
    if bar is not None:
        bar.close()

    norm_err = sphere_norm_error(model, info.device)
    if info.is_main:
        what = "done" if last_step == t.steps else "halted before train.steps (continue with --resume)"
        print(
            f"{what}: step {last_step}, val loss {last_val:.4f}, max |row norm - 1| of sphere weights "
            f"{norm_err:.2e}, checkpoints in {ckpt.directory}",
            flush=True,
        )
        log.log(
            event="done" if last_step == t.steps else "halted",
            step=last_step,
            val_loss=last_val,
            sphere_norm_error=norm_err,
        )
    if t.sample_tokens > 0 and last_step == t.steps:
        prompt, continuation = generate_sample(model, tokenizer, val_windows, t.sample_tokens, info.device)
        if info.is_main:
            print(f"--- sample: prompt ---\n{prompt}\n--- sample: the model's continuation ---\n{continuation}\n---")
    return 0


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
    refused) exit code 3."""
    try:
        return main(argv)
    except NonFiniteStateError as exc:  # NaN/inf in the weights: refused to checkpoint them
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 3
    except (ConfigError, DataError, CheckpointError) as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
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
        return 2
    finally:
        shutdown()


if __name__ == "__main__":
    sys.exit(cli())
