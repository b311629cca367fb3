"""The training loop of ``recipes.train``: the steps of one invocation, from the step it starts
after to ``train.steps`` (or ``train.halt_after``, or a stop on a signal), with validation,
metrics, checkpoints and, at the end, the run's summary line and a sample of text.

``recipes.train.main`` assembles a :class:`TrainingRun` (model, optimizer, data, checkpoints,
the LoRA adapters when there are any) and calls :func:`train`; the loop calls the components:
the step (:func:`spherenet.train.loop.train_step`), :class:`recipes.stop.StopOnSignal`,
:class:`recipes.lora.LoraTraining` before each checkpoint."""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path
from typing import Any

import torch

from recipes.lora import LoraTraining
from recipes.progress import progress_bar
from recipes.stop import StopOnSignal
from spherenet.analysis import eigen_learning_rates, sphere_norm_error
from spherenet.checkpoint import CheckpointManager
from spherenet.manifolds import named_sphere_parameters
from spherenet.optim import normalize_
from spherenet.train.config import RunConfig
from spherenet.train.distributed import DistInfo
from spherenet.train.loop import MetricsLog, NonFiniteError, evaluate, train_step
from spherenet.train.tracking import open_trackers

__all__ = ["TrainingRun", "train", "report_step", "generate_sample"]


@dataclasses.dataclass
class TrainingRun:
    """The parts of a run, built and checked; :func:`train` trains them."""

    cfg: RunConfig  # resolved
    info: DistInfo
    model: torch.nn.Module  # unwrapped: normalized, measured, sampled
    step_model: torch.nn.Module  # wrapped for the parallel layout, compiled with train.compile
    optimizer: torch.optim.Optimizer
    scheduler: Any
    data: Any  # the PreparedData: its size is in the first line
    tokenizer: Any
    train_windows: Any
    val_windows: Any
    ckpt: CheckpointManager
    state: dict[str, Any]  # what each checkpoint saves
    files: dict[str, Any]  # the model config and tokenizer, inside every checkpoint
    micro: int  # micro-batch per rank and forward pass
    accum: int  # micro-batches per optimizer step
    start: int = 0  # the step the run continues after (0: from the beginning)
    resume_notes: list[str] = dataclasses.field(default_factory=list)  # accepted changes, logged
    lora: LoraTraining | None = None


def train(run: TrainingRun) -> int:
    """Train ``run`` from ``run.start``; the exit code (0, or 3 after ``train.max_nonfinite``
    non-finite steps in a row)."""
    cfg, info, model, t, o = run.cfg, run.info, run.model, run.cfg.train, run.cfg.optim
    tokenizer, start, out_dir = run.tokenizer, run.start, Path(run.cfg.train.out_dir)
    n_params = sum(p.numel() for p in model.parameters())
    tokens_per_step = t.batch_size * t.block_size
    log = MetricsLog(out_dir / "metrics.jsonl", enabled=info.is_main)
    # Every rank computes the nGPT health metrics (collectives); rank 0 logs them.
    is_sphere_model = any(True for _ in named_sphere_parameters(model))
    trackers = open_trackers(
        t.loggers, out_dir, cfg.to_dict(), enabled=info.is_main, start_step=start, wandb_project=t.wandb_project
    )
    bar = progress_bar(t.steps, "train", info.is_main and t.progress and start < t.steps, initial=start, unit="it")
    last_step = min(t.steps, t.halt_after) if t.halt_after else t.steps

    model.train()
    skipped_in_row, last_val = 0, last_validation(out_dir / "metrics.jsonl", start) if info.is_main else None
    t_last, step = time.time(), start
    # SIGTERM or Ctrl-C: finish the step, checkpoint, exit cleanly (recipes.stop). Entered before the
    # "start" record, so a signal that arrives once the run reports itself started always ends in a
    # checkpoint.
    with StopOnSignal(announce=info.is_main) as stop_request:
        if info.is_main:
            print(
                f"{cfg.model.preset}: {n_params / 1e6:.2f}M parameters | data {run.data.num_tokens('train'):,} train "
                f"tokens ({tokenizer.name}, vocab {run.data.vocab_size}) | {t.steps} steps x {tokens_per_step:,} "
                f"tokens | world {info.world_size} ({t.parallel}), micro-batch {run.micro} x "
                f"{run.accum} | {o.method} lr {o.lr:g} | "
                f"update {getattr(model.config, 'update', 'residual')}",
                flush=True,
            )
            log.log(event="start", step=start, params=n_params, world_size=info.world_size, config=cfg.to_dict())
            if run.resume_notes:
                log.log(event="resume_changes", step=start, changes=run.resume_notes)
        try:
            for step in range(start + 1, last_step + 1):
                lr = run.scheduler.get_last_lr()[0]
                x, y = (v.to(info.device) for v in run.train_windows.next_batch())
                batches = list(zip(x.split(run.micro), y.split(run.micro)))
                result = train_step(
                    run.step_model,
                    batches,
                    run.optimizer,
                    autocast=t.autocast,
                    grad_clip=o.grad_clip,
                    nonfinite=t.nonfinite,
                    sharded=t.parallel == "fsdp" and info.enabled,
                )
                run.scheduler.step()
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
                    last_val = evaluate(
                        run.step_model, run.val_windows.eval_batches(t.eval_batches), autocast=t.autocast
                    )
                    record["val_loss"] = last_val
                if step % t.log_every == 0 or "val_loss" in record or result.skipped:
                    if is_sphere_model:  # the same decision on every rank: skipped steps are agreed on
                        record["sphere_norm_error"] = sphere_norm_error(model, info.device)
                        record.update(eigen_learning_rates(model, info.device))
                    log.log(**record)
                    trackers.log_record(record)
                report_step(bar, record, last_val, t, info.is_main)
                stop = stop_request.agreed(info.enabled)  # every rank leaves the loop at the same step
                if step % t.checkpoint_every == 0 or step == last_step or stop:
                    if run.lora:
                        run.lora.refresh_merged()
                    run.ckpt.save(step, run.state, files=run.files)
                if stop:
                    last_step = step
                    if info.is_main:
                        print(stop_request.saved_at(step), flush=True)
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
    finish(run, log, last_step, last_val)
    return 0


def last_validation(metrics: Path, start: int) -> float | None:
    """The run's last validation loss up to ``start`` (the step a resumed run continues from), as
    its log has it; None for a fresh run or one not validated yet."""
    if start == 0:
        return None
    found = [
        r["val_loss"]
        for r in MetricsLog.read_complete(metrics)
        if r.get("val_loss") is not None and "event" not in r and r.get("step", 0) <= start
    ]
    return found[-1] if found else None


def finish(run: TrainingRun, log: MetricsLog, last_step: int, last_val: float | None) -> None:
    """The run's last line and record (done, or halted before ``train.steps``) and, when it is
    done, a sample of the model's text."""
    t, info, model = run.cfg.train, run.info, run.model
    norm_err = sphere_norm_error(model, info.device)
    if info.is_main:
        what = "done" if last_step == t.steps else "halted before train.steps (continue with --resume)"
        val = f"val loss {last_val:.4f}" if last_val is not None else "no validation yet"
        has_sphere = any(True for _ in named_sphere_parameters(model))
        sphere = f"max |row norm - 1| of sphere weights {norm_err:.2e}" if has_sphere else "no sphere weights"
        print(
            f"{what}: step {last_step}, {val}, {sphere}, checkpoints in {run.ckpt.directory}",
            flush=True,
        )
        ended = dict(val_loss=last_val) if last_val is not None else {}
        log.log(event=what.split()[0], step=last_step, **ended, sphere_norm_error=norm_err)
    if t.sample_tokens > 0 and last_step == t.steps:
        prompt, continuation = generate_sample(model, run.tokenizer, run.val_windows, t.sample_tokens, info.device)
        if info.is_main:
            print(f"--- sample: prompt ---\n{prompt}\n--- sample: the model's continuation ---\n{continuation}\n---")


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
