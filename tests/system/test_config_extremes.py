"""Every key of the run config against extreme values: refused before anything is written, or
valid and documented as such.

The keys come from the schema itself (the sections' dataclass fields, and the fields of the
default preset's model config with those of its scalings), so a new key is covered without
editing this file. Each value is given as ``recipes.train`` takes it, a ``section.key=value``
override, to the recipe's own ``main`` up to its first write (``open_run_directory``, stubbed to
stop there), in a temporary current directory. Either it raises ``ConfigError`` in one line that
names the key, with the directory still empty, or it reaches the first write, and then the value
must be one the config documents: a special value with its meaning stated beside the key
(``DOCUMENTED_VALUES``), or a value inside the key's documented range (its lower bound, the
upper bound of ``upper_bound``; for model fields the checks of ``spherenet.layers.config``).
A few real ``python -m recipes.train`` runs check the same through the command line.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import os
import subprocess
import sys
import time
import typing
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import recipes.train
from spherenet.layers.config import MAX_SEQ_LEN, MAX_SIZE, ScaleSpec
from spherenet.train import config as run_config
from spherenet.train.config import DOCUMENTED_VALUES, ConfigError, RunConfig, model_config, upper_bound

REPO = Path(__file__).resolve().parents[2]
# Extreme values, as TOML literals of an override (a bare "" is the override ``key=``).
EXTREMES = ["0", "-1", "9223372036854775808", "100000000000000000000", "nan", "inf", "-inf", "", '""', '" "']
EXTREMES += ["1.5", "true", '"text"', "[1]"]  # wrong types for most keys
# Keys where 0 is an ordinary point of the documented range: [0, 1) for the moments' decay,
# [0, 2**63) for seeds, [0, ...) for the weight decay and warmup the method's default replaces.
ZERO_IN_RANGE = {("optim", "beta1"), ("optim", "beta2"), ("optim", "muon_momentum"), ("train", "seed")}
ZERO_IN_RANGE |= {("data", "seed"), ("optim", "weight_decay"), ("optim", "warmup_steps")}


def schema_keys() -> list[tuple[str, str, typing.Any]]:
    """(section, key, type) of every key: each section's fields, then ``model.*``: the fields of
    the default preset's model config, and ``field.sub`` for the fields of its first scaling."""
    keys = []
    sections = typing.get_type_hints(RunConfig)
    for section in dataclasses.fields(RunConfig):
        hints = typing.get_type_hints(sections[section.name])
        keys += [(section.name, f.name, hints[f.name]) for f in dataclasses.fields(sections[section.name])]
    model = model_config(RunConfig())  # the default preset's
    hints = typing.get_type_hints(type(model))
    scaling = None  # the fields of one scaling stand for all (one ScaleSpec check)
    for f in dataclasses.fields(model):
        keys.append(("model", f.name, hints[f.name]))
        if hints[f.name] is ScaleSpec and scaling is None:
            scaling, sub = f.name, typing.get_type_hints(ScaleSpec)
            keys += [("model", f"{f.name}.{s.name}", sub[s.name]) for s in dataclasses.fields(ScaleSpec)]
    return [k for k in keys if k[1] != "overrides"]


KEYS = schema_keys()


def parsed(literal: str) -> typing.Any:
    return run_config.parse_override(f"x.y={literal}")[2]


def documented(section: str, key: str, kind: typing.Any, value: typing.Any) -> bool:
    """Whether an accepted ``value`` (as parsed) is one the config documents as valid for the key."""
    special = DOCUMENTED_VALUES.get((section, key), {})
    if typing.get_origin(kind) is list:  # a list, or text read as one ("a,b"); names must not be blank
        items = value if isinstance(value, list) else [v.strip(" '\"") for v in str(value).strip("[] ").split(",")]
        items = [v for v in items if not isinstance(v, str) or v]
        return tuple(items) in special or (bool(items) and all(isinstance(v, str) and v.strip() for v in items))
    kinds = set(typing.get_args(kind) or (kind,)) - {type(None)}
    if value in special and type(value) is not bool:
        return True
    if bool in kinds:
        return isinstance(value, bool)
    if str in kinds or typing.get_origin(kind) is typing.Literal:
        return isinstance(value, str) and bool(value.strip())
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return False
    if section == "model":
        if key.endswith(".init"):  # a scaling's initial value: any finite number
            return True
        high = MAX_SEQ_LEN if key == "max_seq_len" else MAX_SIZE if int in kinds else math.inf
        return 0 < value <= high
    high = upper_bound(section, key)
    low_ok = value > 0 or (value == 0 and (section, key) in ZERO_IN_RANGE)
    return low_ok and (high is None or value <= high)


class FirstWrite(Exception):
    """``recipes.train.main`` reached the first thing it writes."""


@pytest.fixture
def judge(tmp_path, monkeypatch):
    """``judge(section, key, kind, literal)``: run the recipe's ``main`` on the override up to
    its first write, in an empty current directory, and check the outcome."""

    def first_write(*args, **kwargs):
        raise FirstWrite

    monkeypatch.setattr(recipes.train, "open_run_directory", first_write)
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)

    def run(section: str, key: str, kind: typing.Any, literal: str) -> None:
        override = f"{section}.{key}={literal}"
        start = time.perf_counter()
        try:
            recipes.train.main([override, "--device", "cpu"])
        except FirstWrite:
            value = parsed(literal)
            assert documented(section, key, kind, value), f"{override} is accepted but not documented as valid"
        except ConfigError as exc:
            message = str(exc)  # names the key, or is the memory check's, which names the sizes
            named = key.split(".")[-1] in message or message.startswith("this run needs ")
            assert "\n" not in message and named, (override, message)
        else:  # pragma: no cover - main returns only after training
            pytest.fail(f"{override}: main returned without reaching its first write")
        assert not any(work.iterdir()), f"{override} wrote {sorted(p.name for p in work.iterdir())}"
        assert time.perf_counter() - start < 5, f"{override} took {time.perf_counter() - start:.1f} s to check"

    return run


def test_the_schema_is_enumerated_from_the_config():
    names = {f"{s}.{k}" for s, k, _ in KEYS}
    assert {"train.out_dir", "data.cache_dir", "train.init_from", "data.skip_bad_records", "optim.lr"} <= names
    assert {"model.preset", "model.max_seq_len", "model.d_model", "model.alpha_attn.init"} <= names
    assert len(names) == len(KEYS) > 60


def test_every_documented_value_is_stated_beside_its_key():
    source = inspect.getsource(run_config)
    for (section, key), values in DOCUMENTED_VALUES.items():
        assert key in {f.name for f in dataclasses.fields(getattr(RunConfig(), section))}, key
        for meaning in values.values():
            assert meaning in source, f"{section}.{key}: {meaning!r} is not stated in spherenet/train/config.py"


@pytest.mark.parametrize("section, key, kind", KEYS, ids=[f"{s}.{k}" for s, k, _ in KEYS])
def test_every_key_refuses_or_documents_every_extreme(judge, section, key, kind):
    for literal in EXTREMES:
        judge(section, key, kind, literal)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    case=st.sampled_from(KEYS),
    literal=st.one_of(
        st.integers(min_value=-(2**70), max_value=2**70).map(str),
        st.floats(allow_nan=True, allow_infinity=True).map(repr),
        st.text(alphabet=" \t.x/", max_size=4).map(lambda s: '"' + s + '"'),
    ),
)
def test_any_value_is_refused_in_one_line_or_documented(judge, case, literal):
    section, key, kind = case
    judge(section, key, kind, literal)


# ---------------------------------------------------------------------------------------------
# through the command line: exit 2, one error line, nothing written into the current directory

CLI_CASES = {
    "empty_out_dir": ("train.out_dir=", "train.out_dir is empty"),
    "steps_past_int64": ("train.steps=99999999999999999999", "train.steps must be at most 2**40"),
    "huge_context": ("model.max_seq_len=100000000", "NGPTConfig.max_seq_len must be at most 2**24"),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CLI_CASES))
def test_the_command_line_refuses_in_one_line_and_writes_nothing(tmp_path, case):
    override, message = CLI_CASES[case]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "recipes.train", override], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.splitlines()
    assert line.startswith("error: ") and message in line, line
    assert not any(tmp_path.iterdir())  # no run directory, lock, metrics or data cache
    assert time.perf_counter() - start < 60


def test_the_memory_refusal_says_at_least_only_before_the_vocabulary_is_known():
    from spherenet.train.config import load_config
    from spherenet.train.memory import check_run_memory

    cfg = load_config(None, ["model.preset=ngpt-tiny", "model.d_model=1000000"])
    import torch

    sizes = dict(device=torch.device("cpu"), micro_batch=1, world_size=1)
    with pytest.raises(
        ConfigError, match=r"^this run needs at least an estimated .* parameters before the vocabulary is known"
    ):
        check_run_memory(cfg, **sizes)
    with pytest.raises(ConfigError) as known:
        check_run_memory(cfg, vocab_size=256, **sizes)
    assert str(known.value).startswith("this run needs an estimated ") and "at least" not in str(known.value)


def test_a_size_that_cannot_run_is_refused_before_the_data_is_prepared(tmp_path, capsys):
    """The memory check runs first with the smallest vocabulary: no run directory, no data cache."""
    out, cache = tmp_path / "run", tmp_path / "cache"
    argv = ["model.preset=ngpt-tiny", "model.d_model=1000000", f"train.out_dir={out}", f"data.cache_dir={cache}"]
    assert recipes.train.cli([*argv, "train.progress=false"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("error: this run needs at least an estimated ") and "but this machine has" in line, line
    assert "parameters before the vocabulary is known" in line, line  # the floor says it is one
    assert not out.exists() and not cache.exists()


def test_the_memory_estimate_counts_the_rope_tables_and_any_depth_at_once():
    from spherenet.models import model_from_config
    from spherenet.train.memory import estimate_training_memory

    config = model_config(RunConfig(), 256)  # ngpt-tiny
    deeper = dataclasses.replace(config, n_layers=3)
    est = estimate_training_memory(deeper, micro_batch=1, block_size=32)
    assert est.parameters == sum(p.numel() for p in model_from_config(deeper).parameters())
    assert est.table_bytes == 8 * config.max_seq_len * config.head_dim  # float64 angles, float32 cos and sin
    long = estimate_training_memory(dataclasses.replace(config, max_seq_len=MAX_SEQ_LEN), micro_batch=1, block_size=32)
    assert long.table_bytes == 8 * MAX_SEQ_LEN * config.head_dim and long.total_bytes > 2**30
    start = time.perf_counter()
    huge = estimate_training_memory(dataclasses.replace(config, n_layers=10**7), micro_batch=1, block_size=32)
    per_layer = est.parameters - sum(p.numel() for p in model_from_config(config).parameters())  # 3 layers - 2
    assert time.perf_counter() - start < 2 and huge.parameters == est.parameters + (10**7 - 3) * per_layer
