"""Experiment tracking: the training metrics sent to TensorBoard and Weights & Biases as well.

``metrics.jsonl`` (:class:`~spherenet.train.metrics.MetricsLog`) is always written; it is the
record the other loggers mirror. ``train.loggers`` adds

- ``"tensorboard"``: event files in ``<out_dir>/tensorboard`` (``torch.utils.tensorboard``;
  ``tensorboard --logdir <out_dir>``), the run config on the HParams tab;
- ``"wandb"``: a Weights & Biases run in project ``train.wandb_project``, named after the run
  directory, its files in ``<out_dir>/wandb`` (``WANDB_MODE=offline`` logs without an account;
  ``wandb sync`` uploads later). Its id is kept in ``<out_dir>/wandb-run-id``, so ``--resume``
  continues the same W&B run.

Every logger has the same three methods: :meth:`Tracker.log_hparams` (once, at the start),
:meth:`Tracker.log_scalars` (a step's metrics) and :meth:`Tracker.close`.
:func:`open_trackers` builds the ones a run asks for (none on ranks other than 0), and
:func:`check_available` says, before any work, which pip extra a missing package comes with.
"""

from __future__ import annotations

import importlib
import math
import secrets
from pathlib import Path
from typing import Any, Iterable, Mapping

from .. import install_hint
from .config import LOGGERS, ConfigError

__all__ = [
    "LOGGERS",
    "TRACKER_FILES",
    "Tracker",
    "TensorBoardTracker",
    "WandbTracker",
    "Trackers",
    "check_available",
    "open_trackers",
    "flatten_config",
    "record_scalars",
]

# logger -> (modules it imports, the pip extra that installs them)
_REQUIRES = {
    "tensorboard": (("tensorboard", "torch.utils.tensorboard"), "tensorboard"),
    "wandb": (("wandb",), "wandb"),
}
WANDB_ID_FILE = "wandb-run-id"
TENSORBOARD_DIR = "tensorboard"
WANDB_DIR = "wandb"  # what wandb.init(dir=out_dir) makes there
TRACKER_FILES = (TENSORBOARD_DIR, WANDB_DIR, WANDB_ID_FILE)  # what the trackers write into a run's directory

# metrics.jsonl key -> the scalar's name in TensorBoard and W&B
SCALAR_NAMES = {
    "loss": "train/loss",
    "val_loss": "val/loss",
    "lr": "train/lr",
    "grad_norm": "train/grad_norm",
    "tok_per_s": "train/tokens_per_s",
    "sphere_norm_error": "ngpt/sphere_norm_error",
}
# metrics.jsonl keys holding one value per layer -> "<name>/layer_<i>"
PER_LAYER_NAMES = {
    "alpha_A_mean_abs": "ngpt/alpha_A_mean_abs",
    "alpha_M_mean_abs": "ngpt/alpha_M_mean_abs",
}


def record_scalars(record: Mapping[str, Any]) -> dict[str, float]:
    """The finite scalars of one metrics.jsonl record, under their tracker names (a skipped
    step's missing loss or grad norm is left out, not logged as NaN)."""
    out = {}
    for key, name in SCALAR_NAMES.items():
        value = record.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            out[name] = float(value)
    for key, name in PER_LAYER_NAMES.items():
        for layer, value in enumerate(record.get(key) or ()):
            if value is not None and math.isfinite(value):
                out[f"{name}/layer_{layer}"] = float(value)
    return out


def flatten_config(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"optim": {"lr": 3e-3}}`` -> ``{"optim.lr": 3e-3}`` (nested sections joined by dots)."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten_config(value, name + "."))
        else:
            out[name] = value
    return out


def check_available(loggers: Iterable[str]) -> None:
    """ConfigError naming ``train.loggers`` and the pip extra when a logger's package is not
    installed; called before any training work."""
    for name in loggers:
        if name not in _REQUIRES:
            continue
        modules, extra = _REQUIRES[name]
        for module in modules:
            try:
                importlib.import_module(module)
            except ImportError as exc:
                raise ConfigError(
                    f"train.loggers includes {name!r}, but {module} cannot be imported ({exc}); install it with "
                    f'pip install -e ".[{extra}]" (or {install_hint(extra)}), or drop {name!r} from '
                    "train.loggers"
                ) from None


class Tracker:
    """One destination for the metrics: hyperparameters once, scalars per step, then close."""

    def log_hparams(self, hparams: Mapping[str, Any]) -> None:
        raise NotImplementedError

    def log_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class TensorBoardTracker(Tracker):
    """Event files in ``log_dir``. ``purge_step``: on resume, the first step of this invocation;
    TensorBoard hides the events an earlier invocation wrote at or after it (logged after the
    checkpoint it resumed from), so a curve has one value per step."""

    def __init__(self, log_dir: str | Path, purge_step: int | None = None):
        from torch.utils.tensorboard import SummaryWriter

        self.log_dir = Path(log_dir)
        self.writer = SummaryWriter(log_dir=str(self.log_dir), purge_step=purge_step)

    def log_hparams(self, hparams: Mapping[str, Any]) -> None:
        from torch.utils.tensorboard.summary import hparams as hparams_summary

        # The HParams plugin takes numbers, strings and booleans; anything else as its text.
        values = {k: v if isinstance(v, (bool, int, float, str)) else str(v) for k, v in hparams.items()}
        # Written into this run's own file (SummaryWriter.add_hparams would start a sub-run);
        # the metric is the val/loss curve logged below.
        for summary in hparams_summary(values, {SCALAR_NAMES["val_loss"]: math.nan}):
            self.writer.file_writer.add_summary(summary)
        self.writer.flush()

    def log_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
        for name, value in scalars.items():
            self.writer.add_scalar(name, value, global_step=step)

    def close(self) -> None:
        self.writer.close()


class WandbTracker(Tracker):
    """A Weights & Biases run, its local files under ``out_dir/wandb``. ``resume``: continue the
    run whose id ``out_dir/wandb-run-id`` holds (a new one when there is none)."""

    def __init__(self, out_dir: str | Path, project: str, name: str, resume: bool = False):
        import wandb

        out_dir = Path(out_dir)
        id_file = out_dir / WANDB_ID_FILE
        run_id = id_file.read_text().strip() if resume and id_file.is_file() else None
        run_id = run_id or secrets.token_hex(6)  # W&B ids: letters and digits
        try:
            self.run = wandb.init(project=project, dir=str(out_dir), name=name, id=run_id, resume="allow")
        except Exception as exc:  # noqa: BLE001 - login, network or settings: one clear line instead
            raise ConfigError(
                f"train.loggers includes 'wandb', but wandb.init failed: {exc} (run `wandb login`, or set "
                "WANDB_MODE=offline to log locally and `wandb sync` later)"
            ) from None
        id_file.write_text(run_id + "\n")

    def log_hparams(self, hparams: Mapping[str, Any]) -> None:
        self.run.config.update(dict(hparams), allow_val_change=True)

    def log_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
        self.run.log(dict(scalars), step=step)

    def close(self) -> None:
        self.run.finish()


class Trackers:
    """The trackers of one run, used as one; empty on ranks other than 0."""

    def __init__(self, trackers: list[Tracker]):
        self.trackers = trackers

    def __bool__(self) -> bool:
        return bool(self.trackers)

    def log_hparams(self, hparams: Mapping[str, Any]) -> None:
        for tracker in self.trackers:
            tracker.log_hparams(hparams)

    def log_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
        if scalars:
            for tracker in self.trackers:
                tracker.log_scalars(step, scalars)

    def log_record(self, record: Mapping[str, Any]) -> None:
        """A metrics.jsonl record (with its ``step``), as :func:`record_scalars` names it."""
        self.log_scalars(int(record["step"]), record_scalars(record))

    def close(self) -> None:
        for tracker in self.trackers:
            tracker.close()
        self.trackers = []


def open_trackers(
    loggers: Iterable[str],
    out_dir: str | Path,
    config: Mapping[str, Any],
    *,
    enabled: bool = True,
    start_step: int = 0,
    wandb_project: str = "spherenet",
    run_name: str | None = None,
) -> Trackers:
    """The trackers ``loggers`` names ("jsonl" is MetricsLog's, not one of these), each given
    the flattened ``config`` as hyperparameters. ``enabled=False`` (ranks other than 0): none,
    and nothing is written. ``start_step > 0``: a resumed run, continued at the step after it."""
    loggers = list(loggers)
    unknown = [name for name in loggers if name not in LOGGERS]
    if unknown:
        raise ConfigError(f"train.loggers: {unknown} not allowed (allowed values: {', '.join(LOGGERS)})")
    if not enabled:
        return Trackers([])
    check_available(loggers)
    out_dir = Path(out_dir)
    trackers: list[Tracker] = []
    try:
        if "tensorboard" in loggers:
            trackers.append(
                TensorBoardTracker(out_dir / TENSORBOARD_DIR, purge_step=start_step + 1 if start_step else None)
            )
        if "wandb" in loggers:
            name = run_name or out_dir.resolve().name
            trackers.append(WandbTracker(out_dir, wandb_project, name, resume=start_step > 0))
    except BaseException:
        Trackers(trackers).close()
        raise
    opened = Trackers(trackers)
    opened.log_hparams(flatten_config(config))
    return opened
