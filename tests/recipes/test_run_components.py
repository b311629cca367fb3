"""The components ``recipes.train.main`` assembles a run from, each called through one entry:
the resume (``Resumption``), the starting weights (``start_weights``), LoRA (``lora_training``,
``checkpoint_models``) and the stop on a signal (``StopOnSignal.agreed``); and ``main`` itself
short enough to read as that assembly."""

from __future__ import annotations

import ast
import inspect
import signal

import pytest
import torch

import recipes.train
from recipes.init_from import start_weights
from recipes.lora import checkpoint_models, lora_training
from recipes.resume import Resumption
from recipes.stop import StopOnSignal
from spherenet.checkpoint import CheckpointManager
from spherenet.train.config import ConfigError, RunConfig, load_config, resolved


def test_main_reads_as_the_assembly_of_a_run():
    (main,) = [n for n in ast.parse(inspect.getsource(recipes.train)).body if getattr(n, "name", "") == "main"]
    assert main.end_lineno - main.lineno + 1 <= 80


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
    model = torch.nn.Linear(2, 2)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    start_weights(model, None, train, resuming=True, is_main=True)  # the run's own checkpoint holds them
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    with pytest.raises(ConfigError, match="train.init_from: no run directory, checkpoint or exported model at"):
        start_weights(model, None, train, resuming=False, is_main=True)
    start_weights(model, None, RunConfig().train, resuming=False, is_main=True)  # no init_from: as built


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
