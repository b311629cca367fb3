"""Bad input never crashes deep inside torch: every input in the table of docs/reliability.md
gets an error of a known type whose message names the problem, raised by spherenet's own
checks. Through the recipe (``recipes.train.cli``) that is one ``error: ...`` line on stderr,
exit code 2, no traceback; through the library API it is an exception raised in spherenet.

Each test (or parametrized case) below is one row of that table.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from corpora import write_paragraphs

import recipes.train
from recipes.train import cli
from spherenet.checkpoint import CheckpointCorruptError, CheckpointWarning
from spherenet.data import DataError, DataFileNotFoundError, TokenizerError, TokenWindows
from spherenet.models import from_preset
from spherenet.train.config import ConfigError

REPO = Path(__file__).resolve().parents[2]
SPHERENET = REPO / "spherenet"
RECIPES = REPO / "recipes"

TINY = [
    "model.preset=ngpt-tiny",
    "model.max_seq_len=32",
    "train.batch_size=8",
    "train.steps=2",
    "train.eval_every=1000",
    "train.eval_batches=1",
    "train.sample_tokens=0",
    "train.progress=false",
]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    before = torch.get_num_threads()  # tiny models: one thread is fastest on a busy shared CPU
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def text_file(tmp_path_factory) -> Path:
    return write_paragraphs(
        tmp_path_factory.mktemp("corpus") / "good.txt",
        "every input gets a clear error that names what is wrong with it",
        200,
        seed=3,
    )


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("data_cache")


@pytest.fixture
def fails(capsys, monkeypatch, cache):
    """``fails(out_dir, source, *overrides, error=Type)`` runs the recipe, which must exit 2 with
    one ``error:`` line on stderr and no traceback, after raising ``error`` from spherenet's or
    the recipe's own code (seen by wrapping ``recipes.train.main``, which ``cli`` calls).
    Returns the message: from ``error:`` to the end of stderr (a mismatch lists keys below)."""
    real, seen = recipes.train.main, []

    def main(argv=None):
        try:
            return real(argv)
        except Exception as exc:
            seen.append(exc)
            raise

    monkeypatch.setattr(recipes.train, "main", main)
    # datasets logs through a handler bound to the stderr of the test that imported it (a
    # capture closed since): make it write to whatever stderr is current.
    for handler in logging.getLogger("datasets").handlers:
        if isinstance(handler, logging.StreamHandler):
            monkeypatch.setattr(handler, "stream", _CurrentStderr())

    def run(out_dir: Path, source, *extra: str, error: type[Exception]) -> str:
        seen.clear()
        capsys.readouterr()
        before = checkpoint_files(out_dir)
        rc = cli([*TINY, f"data.source={source}", f"data.cache_dir={cache}", f"train.out_dir={out_dir}", *extra])
        err = capsys.readouterr().err
        assert rc == 2, err
        assert checkpoint_files(out_dir) == before  # no checkpoint written, changed or deleted
        assert "Traceback" not in err, err
        assert sum(line.startswith("error: ") for line in err.splitlines()) == 1, err
        assert len(seen) == 1 and type(seen[0]) is error, seen
        assert raised_by_us(seen[0].__traceback__), seen[0]
        return err[err.index("error: ") :]

    return run


def checkpoint_files(out_dir: Path) -> dict[str, bytes]:
    root = out_dir / "checkpoints"
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()} if root.is_dir() else {}


class _CurrentStderr:
    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


def raised_by_us(tb) -> bool:
    """The innermost frame of a traceback is in spherenet or the recipes, not torch/numpy/datasets."""
    while tb.tb_next is not None:
        tb = tb.tb_next
    path = Path(tb.tb_frame.f_code.co_filename).resolve()
    return path.is_relative_to(SPHERENET) or path.is_relative_to(RECIPES)


def raised_in_spherenet(excinfo) -> bool:
    """The exception was raised by spherenet code, not from inside torch or numpy."""
    return Path(str(excinfo.traceback[-1].path)).resolve().is_relative_to(SPHERENET)


# --------------------------------------------------------------------------------------------
# configuration values (ConfigError before any work; exit 2)

CONFIG_CASES = {
    "unknown_key": (
        "train.stepz=3",
        "unknown config key train.stepz; did you mean train.steps? (valid keys of [train]:",
    ),
    "unknown_section": ("trian.steps=3", "unknown config section [trian]"),
    "no_equals": ("train.steps", "override 'train.steps' is not of the form section.key=value"),
    "no_section": ("steps=3", "override key 'steps' must be section.key"),
    "text_for_int": ("train.steps=ten", "train.steps must be an integer, got 'ten'"),
    "float_for_int": ("train.steps=1.5", "train.steps must be an integer, got 1.5"),
    "text_for_float": ("optim.lr=fast", "optim.lr must be a number, got 'fast'"),
    "text_for_bool": ("train.compile=yes", "train.compile must be true or false, got 'yes'"),
    "zero_steps": ("train.steps=0", "train.steps must be > 0, got 0"),
    "negative_lr": ("optim.lr=-1", "optim.lr must be > 0, got -1.0"),
    "infinite_lr": ("optim.lr=inf", "optim.lr must be a finite number, got inf"),
    "nan_grad_clip": ("optim.grad_clip=nan", "optim.grad_clip must be a finite number, got nan"),
    "beta_out_of_range": ("optim.beta2=1.0", "optim.beta1/beta2 must be in [0, 1), got 0.9, 1.0"),
    "val_fraction_out_of_range": ("data.val_fraction=1.5", "data.val_fraction must be in (0, 1), got 1.5"),
    "negative_seed": ("train.seed=-1", "train.seed must be in [0, 2**63), got -1"),
    "huge_seed": ("data.seed=99999999999999999999", "data.seed must be in [0, 2**63)"),
    "unknown_choice": ("train.nonfinite=ignore", "train.nonfinite = 'ignore' is not one of skip, stop"),
    "unknown_method": ("optim.method=sgd", "optim.method = 'sgd' is not one of riemannian_adam"),
    "unknown_sphere_kernel": (
        "optim.sphere_kernel=cuda",
        "optim.sphere_kernel (the sphere-Adam implementation) must be one of ('auto', 'reference', 'torch', 'native', "
        "'triton'), got 'cuda'",
    ),
    "empty_out_dir": ("train.out_dir=", "train.out_dir is empty (''): name the run's directory"),
    "blank_init_from": ('train.init_from=" "', "train.init_from is blank (' '): name a path"),
    "steps_past_int64": ("train.steps=9223372036854775808", "train.steps must be at most 2**40 (1,099,511,627,776)"),
    "steps_past_bound": ("train.steps=99999999999999999999", "train.steps must be at most 2**40"),
    "lr_past_bound": ("optim.lr=1e20", "optim.lr must be at most 100.0, got 1e+20"),
}


@pytest.mark.parametrize("case", sorted(CONFIG_CASES))
def test_bad_config_value(fails, tmp_path, text_file, case):
    override, message = CONFIG_CASES[case]
    assert message in fails(tmp_path / "run", text_file, override, error=ConfigError)
    assert not (tmp_path / "run").exists()  # refused before anything was written


MODEL_CASES = {
    "unknown_preset": ("model.preset=ngpt-2b", "unknown preset 'ngpt-2b'; valid presets:"),
    "unknown_field": ("model.nonsense=1", "unknown override(s) 'nonsense' for preset 'ngpt-tiny'"),
    "heads_do_not_divide": ("model.n_heads=3", "d_model=64 is not divisible by n_heads=3"),
    "text_for_int": ("model.n_layers=two", "NGPTConfig.n_layers must be a positive int, got 'two'"),
    "nan_value": ("model.alpha_attn.init=nan", "NGPTConfig.alpha_attn.init must be a finite number, got nan"),
    "unknown_scaling_field": ("model.s_qk.value=2", "NGPTConfig.s_qk has unknown field(s) 'value'"),
    "unknown_choice": ("model.update=jump", "NGPTConfig.update must be one of"),
    "huge_context": (
        "model.max_seq_len=100000000",
        "NGPTConfig.max_seq_len must be at most 2**24 (16,777,216), got 100000000",
    ),
    "size_past_int64": ("model.n_layers=9223372036854775808", "NGPTConfig.n_layers must be at most 2**31 - 1"),
}


@pytest.mark.parametrize("case", sorted(MODEL_CASES))
def test_bad_model_setting(fails, tmp_path, text_file, case):
    override, message = MODEL_CASES[case]
    err = fails(tmp_path / "run", text_file, override, error=ConfigError)
    assert err.startswith("error: [model] preset") and message in err


OPTIM_CASES = {
    "warmup_longer_than_run": (["optim.warmup_steps=5"], "warmup_steps (5) must be < total_steps (2)"),
    "euclidean_optimizer_on_ngpt": (["optim.method=adamw", "optim.warmup_steps=0"],
                                    "method 'adamw' on a model with sphere parameters"),
    "normalize_on_gpt": (["model.preset=gpt-tiny", "optim.method=adam_normalize"],
                         "method 'adam_normalize': the model declares no sphere parameters"),
}  # fmt: skip  # one case per line


@pytest.mark.parametrize("case", sorted(OPTIM_CASES))
def test_bad_optimizer_setting(fails, tmp_path, text_file, case):
    overrides, message = OPTIM_CASES[case]
    err = fails(tmp_path / "run", text_file, *overrides, error=ConfigError)
    assert err.startswith("error: [optim]") and message in err


def test_batch_not_divisible_into_micro_batches(fails, tmp_path, text_file):
    err = fails(tmp_path / "run", text_file, "train.batch_size=7", "train.micro_batch_size=2", error=ConfigError)
    assert "train.micro_batch_size 2 does not divide the per-rank batch 7" in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_requested_without_cuda(fails, tmp_path, text_file):
    err = fails(tmp_path / "run", text_file, "--device", "cuda", error=ConfigError)
    assert "--device cuda: this machine has no usable CUDA device" in err


# --------------------------------------------------------------------------------------------
# config files


def test_config_file_missing(fails, tmp_path, text_file):
    err = fails(tmp_path / "run", text_file, "--config", str(tmp_path / "nope.toml"), error=ConfigError)
    assert f"config file not found: {tmp_path / 'nope.toml'}" in err


@pytest.mark.parametrize(
    "content, message",
    [
        ("[train\nsteps = 3\n", "is not valid TOML"),
        ('[train]\nsteps = "300"\n', "train.steps must be an integer, got '300'"),
        ("steps = 3\n", "top-level key 'steps' must be a [section] table"),
        ("[trian]\nsteps = 3\n", "unknown config section [trian]"),
    ],
    ids=["invalid_toml", "string_for_int", "key_outside_section", "unknown_section"],
)
def test_bad_config_file(fails, tmp_path, text_file, content, message):
    path = tmp_path / "run.toml"
    path.write_text(content)
    assert message in fails(tmp_path / "run", text_file, "--config", str(path), error=ConfigError)


# --------------------------------------------------------------------------------------------
# data files (DataError; exit 2)


def _write(name: str, data: bytes):
    def make(tmp_path: Path) -> Path:
        p = tmp_path / name
        p.write_bytes(data)
        return p

    return make


def _fifo(tmp_path: Path) -> Path:
    p = tmp_path / "pipe.txt"
    os.mkfifo(p)
    return p


def _directory(tmp_path: Path) -> Path:
    p = tmp_path / "texts.txt"
    p.mkdir()
    return p


DATA_CASES = {
    "missing": (lambda t: t / "nope.txt", "source file not found: {path}"),
    "empty": (_write("empty.txt", b""), "source file {path} is empty (0 bytes)"),
    "whitespace_only": (_write("blank.txt", b"  \n\n \t\n"), "text file {path} contains no text (only whitespace)"),
    "binary": (_write("model.txt", b"\x7fELF\x02\x01\x01\x00\x00" * 50), "text file {path} contains a NUL byte at offset 7: it looks binary"),
    "not_utf8": (_write("latin1.txt", "caf\xe9 cr\xe8me\n\nna\xefve".encode("latin-1")),
                 "text file {path} is not valid UTF-8 (bad byte at offset 3)"),
    "directory": (_directory, "{path} is a directory"),
    "not_a_regular_file": (_fifo, "{path} is not a regular file"),
    "single_document": (_write("one.txt", b"just one paragraph of text"), "has only 1 non-empty document"),
    "shorter_than_a_window": (_write("short.txt", b"hi there\n\nyou"),
                              "block_size 32 is too large for"),
    "unknown_extension": (_write("table.csv", b"a,b\n1,2\n"), "cannot tell the format of {path} from its extension '.csv'"),
    "malformed_jsonl": (_write("bad.jsonl", b'{"text": "fine"}\n{"text": \n'), "could not read json source {path}"),
    "jsonl_without_text_field": (_write("body.jsonl", b'{"body": "hello"}\n{"body": "there"}\n'),
                                 "{path} has no column 'text' (columns: body)"),
    "fake_parquet": (_write("fake.parquet", b"not a parquet file"), "parquet file {path} is not a Parquet file"),
    "jsonl_records_without_text": (lambda t: _records(t / "docs.jsonl"),
                                   "{path}: 100 of 300 records have no usable text in field 'text' (missing, null or "
                                   "not a string), the first at line 2 (field missing)"),
    "jsonl_null_text": (_write("null.jsonl", b'{"text": "a b c"}\n{"text": null}\n{"text": "d e f"}\n'),
                        "{path}: 1 of 3 records have no usable text in field 'text'"),
    "json_number_text": (_write("n.json", b'[{"text": "a b c"}, {"text": 5}, {"text": "d e"}]'),
                         "the first at record index 1 (a number)"),
    "parquet_null_text": (lambda t: _parquet(t / "p.parquet", ["a b c", None, "d e f"]),
                          "{path}: 1 of 3 records have no usable text in field 'text' (missing, null or not a "
                          "string), the first at record index 1 (null)"),
}  # fmt: skip  # one case per line


def _records(path: Path, n: int = 300) -> Path:
    """JSON Lines whose every third record, from the second, lacks the text field."""
    lines = [json.dumps({"body": "x"} if i % 3 == 1 else {"text": f"record {i} of the corpus"}) for i in range(n)]
    path.write_text("\n".join(lines) + "\n")
    return path


def _parquet(path: Path, texts: list) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": texts}), path)
    return path


@pytest.mark.parametrize("case", sorted(DATA_CASES))
def test_bad_data_file(fails, tmp_path, case):
    make, message = DATA_CASES[case]
    path = make(tmp_path)
    error = DataFileNotFoundError if case == "missing" else DataError
    assert message.format(path=path) in fails(tmp_path / "run", path, error=error)
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_records_without_text_are_skipped_on_request_and_counted(capsys, tmp_path, cache):
    path = _records(tmp_path / "docs.jsonl")
    argv = [*TINY, f"data.source={path}", f"data.cache_dir={cache}", f"train.out_dir={tmp_path / 'run'}"]
    assert cli([*argv, "data.skip_bad_records=true"]) == 0
    out = capsys.readouterr().out
    assert (
        f"data: skipped 100 records without usable text (data.skip_bad_records); 100 in {path}, the first at line 2 "
        "(field missing)" in out
    ), out
    (meta,) = [json.loads(p.read_text()) for p in cache.glob("docs-byte-*/meta.json")]
    assert meta["bad_records"]["skipped"] == 100 and sum(meta["documents"].values()) == 200


def test_unreadable_data_file(fails, tmp_path, monkeypatch):
    path = tmp_path / "secret.txt"
    path.write_text("some text\n\nmore text")
    path.chmod(0)
    if hasattr(os, "geteuid") and os.geteuid() == 0:  # root reads any file: deny it the way others are
        import spherenet.data._files as files

        real = os.access
        monkeypatch.setattr(files.os, "access", lambda p, mode: False if Path(p) == path else real(p, mode))
    try:
        err = fails(tmp_path / "run", path, error=DataError)
        assert f"source file {path} is not readable (permission denied)" in err
    finally:
        path.chmod(0o600)


def test_unknown_tokenizer(fails, tmp_path, text_file):
    err = fails(tmp_path / "run", text_file, "data.tokenizer=wordpiece", error=TokenizerError)
    assert "unknown tokenizer spec 'wordpiece'" in err


# --------------------------------------------------------------------------------------------
# tokens out of the vocabulary


def test_data_vocab_larger_than_model_vocab(fails, tmp_path, text_file):
    err = fails(tmp_path / "run", text_file, "model.vocab_size=64", error=ConfigError)
    assert (
        "model.vocab_size=64 is smaller than the vocabulary of data.tokenizer=byte (256 ids): set model.vocab_size to "
        "at least 256" in err
    )


@pytest.mark.parametrize(
    "override, message",
    [
        (
            "train.init_from=/nonexistent",
            "error: train.init_from: no run directory, checkpoint or exported model at /nonexistent",
        ),
        (
            "model.vocab_size=10",
            "error: model.vocab_size=10 is smaller than the vocabulary of data.tokenizer=byte (256 ids)",
        ),
    ],
    ids=["init_from_missing", "model_vocab_below_the_tokenizers"],
)
def test_a_refusal_that_needs_no_tokenized_data_comes_before_it(tmp_path, text_file, capsys, override, message):
    """A check that needs no data (a path, train.init_from's weights) or only the tokenizer (its
    vocabulary against the model's) runs before the corpus is tokenized: the refusal leaves no
    data cache."""
    cache = tmp_path / "cache"
    argv = [*TINY, f"data.source={text_file}", f"data.cache_dir={cache}", f"train.out_dir={tmp_path / 'run'}"]
    assert cli([*argv, override]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(message), line
    assert not cache.exists()


def test_token_file_with_ids_beyond_vocab():
    tokens = np.array([1, 2, 3, 300, 4, 5, 6, 7, 8, 9], dtype=np.uint16)
    windows = TokenWindows(tokens, block_size=9, batch_size=1, vocab_size=256, name="tokens.bin")
    with pytest.raises(DataError, match=r"tokens.bin holds token id 300 at position 3 but the vocab has 256 ids"):
        windows.next_batch()


MODELS = ["ngpt-tiny", "gpt-tiny"]


def test_token_file_with_negative_ids():
    tokens = np.array([1, 2, 3, 4, 5, -7, 6, 7, 8, 9], dtype=np.int32)
    windows = TokenWindows(tokens, block_size=9, batch_size=1, vocab_size=256, name="tokens.bin")
    with pytest.raises(DataError, match=r"tokens.bin holds negative token id -7 at position 5"):
        windows.next_batch()


@pytest.mark.parametrize("preset", MODELS)
@pytest.mark.parametrize("bad_id", [256, -1])
def test_token_id_out_of_vocabulary(preset, bad_id):
    """The forward asserts ids on the device (no host sync; on CPU it raises at once)."""
    model = from_preset(preset, max_seq_len=32)
    ids = torch.tensor([[5, bad_id, 7]])
    with pytest.raises(RuntimeError) as e:
        model(ids)
    assert "token id out of vocabulary: every id must be in [0, vocab_size=256)" in str(e.value)
    assert raised_in_spherenet(e)


@pytest.mark.parametrize("preset", MODELS)
@pytest.mark.parametrize("bad_id", [256, -1])
def test_prompt_token_id_out_of_vocabulary(preset, bad_id):
    """A prompt is checked where it enters generation, naming the id and where it is."""
    model = from_preset(preset, max_seq_len=32)
    with pytest.raises(IndexError) as e:
        model.generate(torch.tensor([[5, bad_id, 7]]), 3)
    span = f"[{min(bad_id, 5)}, {max(bad_id, 7)}]"
    expected = (
        f"token id out of vocabulary: id {bad_id} at position (0, 1) is not in [0, vocab_size=256) (ids span {span})"
    )
    assert expected in str(e.value)
    assert raised_in_spherenet(e)


# --------------------------------------------------------------------------------------------
# sequences longer than the model's context


def test_block_size_beyond_context(fails, tmp_path, text_file):
    err = fails(tmp_path / "run", text_file, "train.block_size=64", error=ConfigError)
    assert "train.block_size 64 exceeds the model's max_seq_len 32" in err


@pytest.mark.parametrize("preset", MODELS)
def test_sequence_longer_than_context(preset):
    model = from_preset(preset, max_seq_len=32)
    with pytest.raises(ValueError, match=r"sequence length 33 exceeds max_seq_len=32") as e:
        model(torch.zeros(2, 33, dtype=torch.long))
    assert raised_in_spherenet(e)


@pytest.mark.parametrize("preset", MODELS)
def test_generation_past_context_slides_and_bad_prompts_are_named(preset):
    model = from_preset(preset, max_seq_len=32)
    assert model.generate(torch.zeros(1, 30, dtype=torch.long), 10).shape == (1, 40)
    with pytest.raises(TypeError, match="input_ids must be an integer tensor") as e:
        model.generate(torch.zeros(1, 30), 10)
    assert raised_in_spherenet(e)
    with pytest.raises(ValueError, match=r"input_ids must have shape \(batch, seq_len\), got 1 dims") as e:
        model.generate(torch.zeros(30, dtype=torch.long), 10)
    assert raised_in_spherenet(e)


# --------------------------------------------------------------------------------------------
# wrong types and shapes given to a model

INPUT_CASES = {
    "float_ids": (torch.zeros(1, 4), TypeError, "input_ids must be an integer tensor (e.g. torch.long), got dtype torch.float32"),
    "python_list": ([[1, 2, 3]], TypeError, "input_ids must be a torch.Tensor of token ids, got list"),
    "one_dimensional": (torch.zeros(4, dtype=torch.long), ValueError, "input_ids must have shape (batch, seq_len), got 1 dims"),
    "empty_sequence": (torch.zeros(2, 0, dtype=torch.long), ValueError, "input_ids must hold at least one token per sequence"),
}  # fmt: skip  # one case per line


@pytest.mark.parametrize("preset", MODELS)
@pytest.mark.parametrize("case", sorted(INPUT_CASES))
def test_wrong_input_type_or_shape(preset, case):
    value, error, message = INPUT_CASES[case]
    model = from_preset(preset, max_seq_len=32)
    with pytest.raises(error) as e:
        model(value)
    assert message in str(e.value)
    assert raised_in_spherenet(e)


# --------------------------------------------------------------------------------------------
# checkpoints that do not fit (--resume; exit 2, checkpoints left untouched)


@pytest.fixture(scope="module")
def trained(tmp_path_factory, cache, text_file) -> Path:
    """A finished 2-step run of the tiny nGPT with its checkpoint at step 2."""
    out = tmp_path_factory.mktemp("trained") / "run"
    assert cli([*TINY, f"data.source={text_file}", f"data.cache_dir={cache}", f"train.out_dir={out}"]) == 0
    return out


def resume_fails(fails, trained: Path, tmp_path: Path, source: Path, *extra: str, error) -> str:
    """``--resume`` from a copy of the trained run (``fails`` checks its checkpoints stay as they were)."""
    out = tmp_path / "run"
    shutil.copytree(trained, out)
    assert checkpoint_files(out)
    return fails(out, source, *extra, "--resume", error=error)


CHECKPOINT_CASES = {
    # refused from the checkpoint's recorded settings, before the data or the model is built
    "more_layers": (["model.n_layers=3"], ConfigError,
                    ["was written by a run with other settings", "model.n_layers: 2 in the checkpoint, 3 now"]),
    "wider_model": (["model.d_model=128"], ConfigError,
                    ["model.d_mlp: 256 in the checkpoint, 512 now", "model.d_model: 64 in the checkpoint, 128 now"]),
    "gpt_into_ngpt_run": (["model.preset=gpt-tiny", "optim.method=adamw", "optim.warmup_steps=0"], ConfigError,
                          ["model class: 'NGPT' in the checkpoint, 'GPT' now"]),
    "other_optimizer": (["optim.method=adam_normalize"], ConfigError,
                        ["was written by a run with other settings", "optim.method: 'riemannian_adam' in the checkpoint, 'adam_normalize' now"]),
    # train.steps may change (the schedule is recomputed), the peak learning rate may not
    "other_schedule": (["train.steps=4", "optim.lr=0.01"], ConfigError, ["optim.lr: 0.003 in the checkpoint, 0.01 now"]),
    "other_model_options": (["model.update=slerp"], ConfigError, ["model.update: 'lerp' in the checkpoint, 'slerp' now"]),
    "other_batch_size": (["train.batch_size=4"], ConfigError, ["train.batch_size: 8 in the checkpoint, 4 now"]),
}  # fmt: skip  # one case per line


@pytest.mark.parametrize("case", sorted(CHECKPOINT_CASES))
def test_checkpoint_that_does_not_fit(fails, trained, tmp_path, text_file, case):
    extra, error, messages = CHECKPOINT_CASES[case]
    err = resume_fails(fails, trained, tmp_path, text_file, *extra, error=error)
    for message in messages:
        assert message in err, err


def test_checkpoint_of_other_data(fails, trained, tmp_path, text_file):
    other = tmp_path / "other.txt"
    other.write_text(text_file.read_text() + "\n\none more paragraph at the end.")
    err = resume_fails(fails, trained, tmp_path, other, error=DataError)
    assert f"the data changed since checkpoint {tmp_path / 'run' / 'checkpoints'}" in err
    assert f"{other} now gives other tokens" in err and "--accept-data-change" in err


def test_every_checkpoint_damaged(fails, trained, tmp_path, text_file):
    out = tmp_path / "run"
    shutil.copytree(trained, out)
    state = out / "checkpoints" / "step_00000002" / "state.pt"
    state.write_bytes(state.read_bytes()[:-10])  # torn
    with pytest.warns(CheckpointWarning, match="skipping damaged checkpoint"):
        err = fails(out, text_file, "--resume", error=CheckpointCorruptError)
    assert f"every checkpoint in {out / 'checkpoints'} is damaged" in err
    assert "state.pt has" in err and "(truncated or overwritten)" in err
