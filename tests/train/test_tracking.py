"""Experiment tracking (spherenet.train.tracking, train.loggers) and the progress bars of the
tools that run for long (recipes.train, recipes.compare, benchmarks/convergence.py,
recipes.analyze, data preparation)."""

from __future__ import annotations

import importlib.util
import json
import shutil
import struct
import sys
from pathlib import Path

import pytest

from recipes import analyze, compare
from recipes.train import build_config, cli, parse_args
from spherenet.train import tracking
from spherenet.train.config import ConfigError, load_config

ROOT = Path(__file__).resolve().parents[2]

# A tiny, fast run (as in test_recipe_train.py): 2-layer nGPT, context 32, batch 8.
TINY = [
    "model.preset=ngpt-tiny",
    "model.max_seq_len=32",
    "train.batch_size=8",
    "train.log_every=1",
    "train.eval_every=2",
    "train.eval_batches=1",
    "train.checkpoint_every=2",
    "train.sample_tokens=0",
    "train.progress=false",
]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    words = "the sphere holds every vector of unit length and the model moves along it".split()
    paras = [" ".join(words[(i + j) % len(words)] for j in range(30)) + "." for i in range(120)]
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text("\n\n".join(paras), encoding="utf-8")
    return path


@pytest.fixture
def offline_wandb(tmp_path, monkeypatch):
    """W&B without network or account: offline mode, every wandb directory under tmp_path."""
    for var in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        path = tmp_path / "wandb-home" / var.lower()
        path.mkdir(parents=True)
        monkeypatch.setenv(var, str(path))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)


# --- train.loggers -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "override, expected",
    [
        ("train.loggers=[tensorboard,wandb]", ["tensorboard", "wandb"]),
        ("train.loggers=tensorboard,wandb", ["tensorboard", "wandb"]),
        ('train.loggers=["jsonl", "wandb"]', ["jsonl", "wandb"]),
        ("train.loggers=tensorboard", ["tensorboard"]),
        ("train.loggers=[]", []),
    ],
)
def test_loggers_override_forms(override, expected):
    assert load_config(None, [override]).train.loggers == expected


def test_loggers_from_a_toml_list_and_the_default(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text('[train]\nloggers = ["jsonl", "tensorboard"]\n')
    assert load_config(path).train.loggers == ["jsonl", "tensorboard"]
    assert load_config(None).train.loggers == ["jsonl"]


@pytest.mark.parametrize("override", ["train.loggers=[tensorboard,mlflow]", "train.loggers=wandb,csv"])
def test_unknown_logger_names_the_key_and_the_allowed_values(override):
    with pytest.raises(ConfigError) as exc:
        load_config(None, [override])
    message = str(exc.value)
    assert "train.loggers" in message and "jsonl, tensorboard, wandb" in message
    assert "mlflow" in message or "csv" in message


def test_loggers_must_be_a_list_of_strings(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text("[train]\nloggers = [1, 2]\n")
    with pytest.raises(ConfigError, match="train.loggers must be a list of strings"):
        load_config(path)


# --- the trackers --------------------------------------------------------------------------------


def test_record_scalars_names_and_skips_missing_values():
    record = {
        "step": 7,
        "loss": 3.5,
        "lr": 1e-3,
        "grad_norm": None,
        "skipped": True,
        "tok_per_s": 900.0,
        "val_loss": 3.7,
        "sphere_norm_error": 2e-7,
        "alpha_A_mean_abs": [0.05, 0.06],
        "tokens": 99,
    }
    assert tracking.record_scalars(record) == {
        "train/loss": 3.5,
        "train/lr": 1e-3,
        "train/tokens_per_s": 900.0,
        "val/loss": 3.7,
        "ngpt/sphere_norm_error": 2e-7,
        "ngpt/alpha_A_mean_abs/layer_0": 0.05,
        "ngpt/alpha_A_mean_abs/layer_1": 0.06,
    }


def test_flatten_config():
    assert tracking.flatten_config({"optim": {"lr": 1e-3}, "model": {"preset": "ngpt-tiny"}}) == {
        "optim.lr": 1e-3,
        "model.preset": "ngpt-tiny",
    }


def test_ranks_other_than_0_write_nothing(tmp_path, offline_wandb):
    out = tmp_path / "run"
    out.mkdir()
    trackers = tracking.open_trackers(["tensorboard", "wandb"], out, {"train": {"steps": 2}}, enabled=False)
    assert not trackers
    trackers.log_record({"step": 1, "loss": 2.0})
    trackers.close()
    assert list(out.iterdir()) == []


@pytest.mark.parametrize(
    "logger, modules", [("tensorboard", ["tensorboard", "torch.utils.tensorboard"]), ("wandb", ["wandb"])]
)
def test_missing_package_names_the_pip_extra_before_any_work(logger, modules, tmp_path, monkeypatch, capsys):
    for module in modules:
        monkeypatch.setitem(sys.modules, module, None)  # import raises ImportError
    out = tmp_path / "run"
    rc = cli(
        [
            *TINY,
            "train.steps=2",
            f"train.out_dir={out}",
            f"data.cache_dir={tmp_path / 'cache'}",
            f"train.loggers=[{logger}]",
        ]
    )
    err = capsys.readouterr().err
    assert rc == 2
    assert f'pip install -e ".[{logger}]"' in err and "train.loggers" in err and "Traceback" not in err
    assert not out.exists() and not (tmp_path / "cache").exists()  # stopped before the data or the run


def _wandb_records(path: Path) -> list:
    """The records of a W&B ``.wandb`` file: a 7-byte header (":W&B", magic, version), then
    LevelDB-log chunks (crc32 4, length 2, type 1: full / first / middle / last) in 32 KiB
    blocks, each record a ``wandb_internal_pb2.Record``."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B run file"
    block, pos, records, pending = 32768, 7, [], b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a chunk header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind == 0:
            break
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
    return records


def _wandb_history_and_config(path: Path) -> tuple[dict[int, dict[str, float]], dict[str, object]]:
    history, config = {}, {}
    for record in _wandb_records(path):
        kind = record.WhichOneof("record_type")
        if kind == "history":
            row = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            history[int(row["_step"])] = row
        elif kind == "config":
            config.update({item.key: json.loads(item.value_json) for item in record.config.update})
    return history, config


@pytest.mark.slow  # two training invocations and W&B's first start in the process (~13 s on 2 shared cores)
def test_tensorboard_and_wandb_mirror_metrics_jsonl_across_a_resume(tmp_path, corpus, offline_wandb, capsys):
    """A run with both loggers, stopped by a crash after step 3 with its newest checkpoint at
    step 2, then resumed: TensorBoard holds every step once (the stale step 3 purged), with the
    values metrics.jsonl holds last; W&B continues the same run id; both got the config."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    out = tmp_path / "run"
    common = [
        *TINY,
        "train.steps=4",
        f"train.out_dir={out}",
        f"data.cache_dir={tmp_path / 'cache'}",
        f"data.source={corpus}",
        "train.loggers=[tensorboard,wandb]",
        "train.wandb_project=spherenet-test",
    ]
    assert cli([*common, "train.halt_after=3"]) == 0
    run_id = (out / tracking.WANDB_ID_FILE).read_text().strip()
    shutil.rmtree(out / "checkpoints" / "step_00000003")  # as if killed before step 3's checkpoint
    assert cli([*common, "--resume"]) == 0
    assert "resumed from" in capsys.readouterr().out

    last: dict[int, dict] = {}  # metrics.jsonl, the last record of each step
    for line in (out / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        if "event" not in r:
            last[r["step"]] = r
    assert sorted(last) == [1, 2, 3, 4]
    expected = {step: tracking.record_scalars(r) for step, r in last.items()}
    assert {
        "ngpt/sphere_norm_error",
        "ngpt/alpha_A_mean_abs/layer_1",
        "ngpt/alpha_M_mean_abs/layer_0",
        "train/grad_norm",
        "train/tokens_per_s",
        "train/lr",
    } <= set(expected[1])
    assert "val/loss" in expected[4] and expected[1]["ngpt/sphere_norm_error"] < 1e-5
    assert 0 < expected[4]["ngpt/alpha_A_mean_abs/layer_0"] < 1

    events = EventAccumulator(str(out / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    for tag in expected[1]:
        scalars = events.Scalars(tag)
        assert [s.step for s in scalars] == [1, 2, 3, 4], tag  # step 3 once: the first run's purged
        for s in scalars:
            assert s.value == pytest.approx(expected[s.step][tag], rel=1e-6, abs=1e-12), (tag, s.step)
    assert [s.step for s in events.Scalars("val/loss")] == [2, 4]
    hparams = events.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    start_info = plugin_data_pb2.HParamsPluginData.FromString(hparams).session_start_info
    assert start_info.hparams["train.steps"].number_value == 4
    assert start_info.hparams["model.preset"].string_value == "ngpt-tiny"

    runs = sorted((out / "wandb").glob(f"offline-run-*-{run_id}/run-{run_id}.wandb"))
    assert len(runs) == 2  # the first invocation and the resumed one, under the same run id
    history: dict[int, dict] = {}
    for run in runs:  # in time order: the resumed run's step 3 replaces the first one's
        steps, config = _wandb_history_and_config(run)
        history.update(steps)
        assert config["optim.lr"] == pytest.approx(3e-3) and config["train.loggers"] == ["tensorboard", "wandb"]
    assert sorted(history) == [1, 2, 3, 4]
    for step, scalars in expected.items():
        for tag, value in scalars.items():
            assert history[step][tag] == pytest.approx(value, rel=1e-9), (tag, step)


# --- progress ---------------------------------------------------------------------------------------


def test_train_no_progress_flag_is_train_progress_false():
    assert build_config(parse_args(["--no-progress"])).train.progress is False
    assert build_config(parse_args([])).train.progress is True


def test_train_bar_on_a_terminal_from_the_resumed_step_unless_turned_off(tmp_path, corpus, capsys, monkeypatch):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    out = tmp_path / "run"
    common = [*TINY, "train.steps=4", f"train.out_dir={out}", f"data.cache_dir={tmp_path / 'cache'}",
              f"data.source={corpus}"]  # fmt: skip  # options beside their values
    assert cli([*common, "train.halt_after=2"]) == 0
    assert "train" not in capsys.readouterr().err  # TINY turns the bar off
    assert cli([*common, "train.progress=true", "--resume"]) == 0
    err = capsys.readouterr().err
    assert "train: 100%" in err and "4/4" in err and "0/4" not in err  # counts on from step 2


def _finished_run(run_dir: Path, val: list[float]) -> None:
    """A finished recipes.train run's metrics.jsonl (what --reuse keeps)."""
    run_dir.mkdir(parents=True)
    lines = [{"step": 10 * (i + 1), "loss": v, "val_loss": v, "tokens": 2560 * (i + 1)} for i, v in enumerate(val)]
    lines.append({"event": "done", "step": 10 * len(val), "val_loss": val[-1], "sphere_norm_error": 0.0})
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))


@pytest.fixture
def finished_compare(tmp_path) -> Path:
    out = tmp_path / "cmp"
    _finished_run(out / "gpt" / "seed0", [4.0, 3.0, 2.5])
    _finished_run(out / "ngpt" / "seed0", [3.5, 2.6, 2.2])
    return out


def _compare(out: Path, *extra: str) -> int:
    return compare.main(
        ["--variants", "gpt", "ngpt", "--seeds", "0", "--size", "tiny", "--out", str(out), "--reuse", *extra]
    )


def test_compare_no_progress_and_no_bar_off_a_terminal(finished_compare, capsys):
    assert _compare(finished_compare, "--no-progress") == 0
    assert "|" not in capsys.readouterr().err
    assert _compare(finished_compare) == 0  # stderr is captured, not a terminal
    assert "runs" not in capsys.readouterr().err


def test_compare_bar_counts_runs_on_a_terminal(finished_compare, capsys, monkeypatch):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    assert _compare(finished_compare) == 0
    err = capsys.readouterr().err
    assert "runs: 100%" in err and "2/2" in err
    assert _compare(finished_compare, "--no-progress") == 0
    assert "runs" not in capsys.readouterr().err


@pytest.fixture(scope="module")
def convergence():
    path = ROOT / "benchmarks" / "convergence.py"
    sys.path.insert(0, str(path.parent))  # the script imports benchmarks/_machine.py
    try:
        spec = importlib.util.spec_from_file_location("convergence_progress", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path.remove(str(path.parent))


def test_convergence_bar_on_a_terminal_and_no_progress(convergence, corpus, tmp_path, capsys, monkeypatch):
    """Every run already finished (--reuse): the study only builds its tables; a bar per stage
    on a terminal, none with --no-progress."""
    out = tmp_path / "study"
    _finished_run(out / "runs" / "gpt_lr1e-2" / "seed0", [4.0, 3.0, 2.5])
    _finished_run(out / "runs" / "ngpt_lr1e-2" / "seed0", [3.5, 2.6, 2.2])
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    argv = [
        "--variants",
        "gpt",
        "ngpt",
        "--lrs",
        "1e-2",
        "--ngpt-lrs",
        "1e-2",
        "--seeds",
        "0",
        "--data",
        str(corpus),
        "--out",
        str(out),
        "--results",
        str(out / "results"),
    ]
    assert convergence.main(argv) == 0
    err = capsys.readouterr().err
    assert "lr sweep: 100%" in err and "2/2" in err and "seeds" not in err  # no second stage: no bar
    assert convergence.main([*argv, "--no-progress"]) == 0
    assert "100%" not in capsys.readouterr().err
    assert (out / "results" / "convergence.md").is_file()


def test_analyze_accepts_no_progress(tmp_path, capsys):
    # A missing run is its one-line error (exit 2), not argparse's rejection of the flag (SystemExit).
    assert analyze.main([str(tmp_path / "missing"), "--out", str(tmp_path / "o"), "--no-progress"]) == 2
    assert "unrecognized arguments" not in capsys.readouterr().err


@pytest.mark.parametrize("tty", [False, True])
def test_data_preparation_bars_only_on_a_terminal(tmp_path, corpus, capsys, monkeypatch, tty):
    from spherenet.data import prepare_dataset

    monkeypatch.setattr(sys.stderr, "isatty", lambda: tty)
    prepare_dataset(corpus, "byte", tmp_path / "data", progress=True)
    assert ("tokenizing with byte" in capsys.readouterr().err) is tty
