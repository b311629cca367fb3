"""The training run of ``recipes.train``: a :class:`Trainer`, built by keyword from the run's parts,
whose :meth:`Trainer.fit` trains them for one invocation, from the step it starts after to
``train.steps`` (or ``train.halt_after``, or a stop on a signal), with validation, metrics,
checkpoints and, at the end, the run's summary line and a sample of text.

``recipes.train.main`` builds the parts (model, optimizer, data, checkpoints, metrics log,
trackers, the stop on a signal, the LoRA adapters when there are any), hands them to a
:class:`Trainer` and calls ``fit``. The loop calls one small method for each thing it does;
the step itself is :func:`spherenet.train.step.train_step`, the stop
:class:`recipes.stop.StopOnSignal`, and :class:`recipes.lora.LoraTraining` merges the adapters
before each checkpoint."""

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
from spherenet.train.metrics import MetricsLog
from spherenet.train.step import NonFiniteError, evaluate, train_step
from spherenet.train.tracking import Trackers

__all__ = ["Trainer", "report_step", "generate_sample"]


@dataclasses.dataclass(kw_only=True, eq=False)
class Trainer:
    """The parts of a run, built and checked, given by name; :meth:`fit` trains them."""

    cfg: RunConfig  # resolved
    info: DistInfo  # this rank and the world
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
    log: MetricsLog  # metrics.jsonl (rank 0)
    trackers: Trackers  # TensorBoard, W&B (rank 0; none when train.loggers names neither)
    stop_on_signal: StopOnSignal  # entered around the loop
    start: int = 0  # the step the run continues after (0: from the beginning)
    resume_notes: list[str] = dataclasses.field(default_factory=list)  # accepted changes, logged
    lora: LoraTraining | None = None

    # What the loop keeps between steps, set when it begins.
    last_step: int = dataclasses.field(init=False, default=0)  # train.steps, train.halt_after, or the stop's
    last_val: float | None = dataclasses.field(init=False, default=None)  # the latest validation loss
    skipped_in_row: int = dataclasses.field(init=False, default=0)
    step_began: float = dataclasses.field(init=False, default=0.0)  # time.time() when this step began
    bar: Any = dataclasses.field(init=False, default=None)  # the progress bar, or None
    sphere_weights: bool = dataclasses.field(init=False, default=False)  # the model has some: health metrics

    def fit(self) -> int:
        """Train from ``start``; the exit code (0, or 3 after ``train.max_nonfinite`` non-finite
        steps in a row)."""
        self._begin()
        step = self.start
        # SIGTERM or Ctrl-C: finish the step, checkpoint, exit cleanly (recipes.stop). Entered before the
        # "start" record, so a signal that arrives once the run reports itself started always ends in a
        # checkpoint.
        with self.stop_on_signal as stop_request:
            self._announce()
            try:
                for step in range(self.start + 1, self.last_step + 1):
                    record = self._step(step)
                    self._validate(step, record)
                    self._log(record)
                    report_step(self.bar, record, self.last_val, self.cfg.train, self.info.is_main)
                    stop = stop_request.agreed(self.info.enabled)  # every rank leaves the loop at the same step
                    self._checkpoint(step, stop)
                    if stop:
                        self._stopped_on_signal(step)
                        break
            except NonFiniteError as exc:
                return self._stopped_nonfinite(exc, step)
            finally:
                self.trackers.close()
        self._close_bar()
        self._finish()
        return 0

    @property
    def tokens_per_step(self) -> int:
        return self.cfg.train.batch_size * self.cfg.train.block_size

    def _begin(self) -> None:
        """The progress bar, the last step of this invocation and, resumed, the last validation loss."""
        t, info, start = self.cfg.train, self.info, self.start
        self.bar = progress_bar(
            t.steps, "train", info.is_main and t.progress and start < t.steps, initial=start, unit="it"
        )
        self.last_step = min(t.steps, t.halt_after) if t.halt_after else t.steps
        self.sphere_weights = any(True for _ in named_sphere_parameters(self.model))
        self.model.train()
        self.skipped_in_row = 0
        self.last_val = last_validation(self.log.path, start) if info.is_main else None
        self.step_began = time.time()

    def _announce(self) -> None:
        """The run's first line and its "start" record (and, resumed, the changes it accepted)."""
        cfg, info, t, o, start = self.cfg, self.info, self.cfg.train, self.cfg.optim, self.start
        if not info.is_main:
            return
        n_params = sum(p.numel() for p in self.model.parameters())
        print(
            f"{cfg.model.preset}: {n_params / 1e6:.2f}M parameters | data {self.data.num_tokens('train'):,} train "
            f"tokens ({self.tokenizer.name}, vocab {self.data.vocab_size}) | {t.steps} steps x "
            f"{self.tokens_per_step:,} tokens | world {info.world_size} ({t.parallel}), micro-batch {self.micro} x "
            f"{self.accum} | {o.method} lr {o.lr:g} | "
            f"update {getattr(self.model.config, 'update', 'residual')}",
            flush=True,
        )
        self.log.log(event="start", step=start, params=n_params, world_size=info.world_size, config=cfg.to_dict())
        if self.resume_notes:
            self.log.log(event="resume_changes", step=start, changes=self.resume_notes)

    def _step(self, step: int) -> dict:
        """One optimizer step on the next batch; its record (loss, rate, gradient norm, throughput)."""
        t, o, info = self.cfg.train, self.cfg.optim, self.info
        lr = self.scheduler.get_last_lr()[0]
        x, y = (v.to(info.device) for v in self.train_windows.next_batch())
        batches = list(zip(x.split(self.micro), y.split(self.micro)))
        result = train_step(
            self.step_model,
            batches,
            self.optimizer,
            autocast=t.autocast,
            grad_clip=o.grad_clip,
            nonfinite=t.nonfinite,
            sharded=t.parallel == "fsdp" and info.enabled,
        )
        self.scheduler.step()
        if o.reproject_every and step % o.reproject_every == 0:
            normalize_(self.model)
        self.skipped_in_row = self.skipped_in_row + 1 if result.skipped else 0
        if self.skipped_in_row >= t.max_nonfinite:
            raise NonFiniteError(f"{self.skipped_in_row} non-finite steps in a row (train.max_nonfinite); stopping")
        now = time.time()
        tok_s = self.tokens_per_step / max(now - self.step_began, 1e-9)
        self.step_began = now
        return dict(
            step=step,
            loss=result.loss,
            lr=lr,
            grad_norm=result.grad_norm,
            skipped=result.skipped,
            tokens=step * self.tokens_per_step,
            tok_per_s=round(tok_s, 1),
        )

    def _validate(self, step: int, record: dict) -> None:
        """Every ``train.eval_every`` steps and at the last: the validation loss, into ``record``."""
        t = self.cfg.train
        if step % t.eval_every == 0 or step == t.steps:
            self.last_val = evaluate(
                self.step_model, self.val_windows.eval_batches(t.eval_batches), autocast=t.autocast
            )
            record["val_loss"] = self.last_val

    def _log(self, record: dict) -> None:
        """Every ``train.log_every`` steps, at each validation and at a skipped step: ``record`` with
        the nGPT health metrics, to metrics.jsonl and the trackers."""
        if record["step"] % self.cfg.train.log_every == 0 or "val_loss" in record or record["skipped"]:
            # Every rank computes the health metrics (collectives; skipped steps are agreed on); rank 0 logs them.
            if self.sphere_weights:
                record["sphere_norm_error"] = sphere_norm_error(self.model, self.info.device)
                record.update(eigen_learning_rates(self.model, self.info.device))
            self.log.log(**record)
            self.trackers.log_record(record)

    def _checkpoint(self, step: int, stop: bool) -> None:
        """Every ``train.checkpoint_every`` steps, at the last and at a stop: a checkpoint (LoRA: merged first)."""
        if step % self.cfg.train.checkpoint_every == 0 or step == self.last_step or stop:
            if self.lora:
                self.lora.refresh_merged()
            self.ckpt.save(step, self.state, files=self.files)

    def _stopped_on_signal(self, step: int) -> None:
        self.last_step = step
        if self.info.is_main:
            print(self.stop_on_signal.saved_at(step), flush=True)

    def _stopped_nonfinite(self, exc: NonFiniteError, step: int) -> int:
        """Too many non-finite steps: said and logged; exit code 3, the last good checkpoint kept."""
        self._close_bar()
        if self.info.is_main:
            print(f"error: {exc}", file=sys.stderr, flush=True)
            self.log.log(event="stopped", step=step, reason=str(exc))
        return 3

    def _close_bar(self) -> None:
        if self.bar is not None:
            self.bar.close()

    def _finish(self) -> None:
        """The run's last line and record (done, or halted before ``train.steps``) and, when it is
        done, a sample of the model's text."""
        t, info, model, last_step, last_val = self.cfg.train, self.info, self.model, self.last_step, self.last_val
        norm_err = sphere_norm_error(model, info.device)
        if info.is_main:
            what = "done" if last_step == t.steps else "halted before train.steps (continue with --resume)"
            val = f"val loss {last_val:.4f}" if last_val is not None else "no validation yet"
            sphere = (
                f"max |row norm - 1| of sphere weights {norm_err:.2e}" if self.sphere_weights else "no sphere weights"
            )
            print(f"{what}: step {last_step}, {val}, {sphere}, checkpoints in {self.ckpt.directory}", flush=True)
            ended = dict(val_loss=last_val) if last_val is not None else {}
            self.log.log(event=what.split()[0], step=last_step, **ended, sphere_norm_error=norm_err)
        if t.sample_tokens > 0 and last_step == t.steps:
            self._sample()

    def _sample(self) -> None:
        """A sample of the model's text, printed by rank 0 (every rank generates it)."""
        t, info = self.cfg.train, self.info
        prompt, continuation = generate_sample(
            self.model, self.tokenizer, self.val_windows, t.sample_tokens, info.device
        )
        if info.is_main:
            print(f"--- sample: prompt ---\n{prompt}\n--- sample: the model's continuation ---\n{continuation}\n---")


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
