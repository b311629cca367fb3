"""The components ``recipes.train.main`` assembles a run from, each called through one entry:
the resume (``Resumption``), the starting weights (``read_starting_weights``), LoRA (``lora_training``,
``checkpoint_models``) and the stop on a signal (``StopOnSignal.agreed``); ``main`` itself
short enough to read as that assembly, and the run it builds (``recipes.trainer.Trainer``) taking
its parts by name, with a loop short enough to read as the steps of a run."""

from __future__ import annotations

import ast
import inspect
import signal

import pytest
import torch

import recipes.train
import recipes.trainer
from recipes.init_from import read_starting_weights
from recipes.lora import checkpoint_models, lora_training
from recipes.resume import Resumption
from recipes.stop import StopOnSignal
from spherenet.checkpoint import CheckpointManager
from spherenet.train.config import ConfigError, RunConfig, load_config, resolved


def test_main_reads_as_the_assembly_of_a_run():
    (main,) = [n for n in ast.parse(inspect.getsource(recipes.train)).body if getattr(n, "name", "") == "main"]
    assert main.end_lineno - main.lineno + 1 <= 80


def test_the_trainers_loop_reads_as_the_steps_of_a_run():
    (trainer,) = [n for n in ast.parse(inspect.getsource(recipes.trainer)).body if getattr(n, "name", "") == "Trainer"]
    (fit,) = [n for n in trainer.body if getattr(n, "name", "") == "fit"]
    assert fit.end_lineno - fit.lineno + 1 <= 60


def test_the_trainer_takes_its_parts_by_name_only():
    with pytest.raises(TypeError):
        recipes.trainer.Trainer(RunConfig())  # positional: refused, so no part can land in another's place


def test_a_fresh_start_restores_nothing_and_a_restart_says_so(tmp_path, capsys):
    ckpt = CheckpointManager(tmp_path / "checkpoints")
    cfg = resolved(RunConfig())
    fresh = Resumption.find(ckpt, cfg, world_size=1, wanted=True, restarted=False)  # --resume, nothing saved yet
    assert not fresh.resuming and fresh.notes == []
    assert fresh.restore(ckpt, {}, torch.nn.Linear(1, 1), is_main=True) == 0
    assert capsys.readouterr().out == ""
    restarted = Resumption.find(ckpt, cfg, world_size=1, wanted=False, restarted=True)
    assert restarted.restore(ckpt, {}, torch.nn.Linear(1, 1), is_main=True) == 0
    assert capsys.readouterr().out == f"restart: no checkpoint in {ckpt.directory} yet, starting from step 0\n"


def test_the_starting_weights_are_init_froms_unless_the_run_resumes(tmp_path):
    train = load_config(None, [f"train.init_from={tmp_path / 'missing'}"]).train
    assert read_starting_weights(train, resuming=True) is None  # the run's own checkpoint holds them
    with pytest.raises(ConfigError, match="train.init_from: no run directory, checkpoint or exported model at"):
        read_starting_weights(train, resuming=False)
    assert read_starting_weights(RunConfig().train, resuming=False) is None  # no init_from: as built


def test_without_lora_rank_every_weight_trains_and_checkpoints_hold_the_model():
    model = torch.nn.Linear(2, 2)
    assert lora_training(model, RunConfig().train) is None
    assert checkpoint_models(model, None) == {"model": model}
    assert all(p.requires_grad for p in model.parameters())


def test_a_stop_is_agreed_and_reported_with_its_signal():
    stop = StopOnSignal(announce=False)
    assert not stop.agreed(distributed=False)
    stop.signal = signal.SIGTERM
    assert stop.agreed(distributed=False)
    assert stop.saved_at(7) == "stop requested (SIGTERM): checkpoint saved at step 7; continue with --resume"
