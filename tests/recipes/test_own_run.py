"""A user's own run: fine-tuning from weights (train.init_from), exported directories accepted
by the recipes, configs by name, --print-config, did-you-mean, --resume refused where there is
no run, Hugging Face habits (dtype=/device_map=, tokenizer.json, a model card) and one CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from recipes import analyze, evaluate, export, sample
from recipes.checkpoints import load_trained, load_weights
from recipes.config_files import resolve_config
from recipes.train import cli as train_cli
from spherenet.data.tokenizer_classes import ByteTokenizer
from spherenet.models import NGPT, from_preset, load_pretrained
from spherenet.train.config import ConfigError, load_config, model_config, resolved, to_toml

ROOT = Path(__file__).resolve().parents[2]

TINY = [
    "model.preset=ngpt-tiny",
    "model.max_seq_len=32",
    "train.batch_size=4",
    "train.eval_every=2",
    "train.eval_batches=1",
    "train.sample_tokens=0",
    "train.progress=false",
    "train.steps=2",
    "train.checkpoint_every=2",
]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("own")
    text = "\n\n".join(f"paragraph {i}: weights on the sphere move by small angles {i % 5}" for i in range(300))
    (root / "c.txt").write_text(text)
    return root


def train(corpus: Path, out: Path, *extra: str) -> int:
    return train_cli(
        [*TINY, f"train.out_dir={out}", f"data.source={corpus / 'c.txt'}", f"data.cache_dir={corpus / 'cache'}", *extra]
    )


@pytest.fixture(scope="module")
def run_and_export(corpus):
    pytest.importorskip("safetensors")
    run = corpus / "run"
    assert train(corpus, run) == 0
    exported = corpus / "exported"
    assert export.main([str(run), str(exported)]) == 0
    return run, exported


# -- fine-tuning -------------------------------------------------------------------------------


@pytest.mark.parametrize("source", ["run", "checkpoint", "exported"])
def test_init_from_starts_a_new_run_from_the_weights(corpus, run_and_export, tmp_path, source, capsys):
    run, exported = run_and_export
    path = {"run": run, "checkpoint": run / "checkpoints" / "step_00000002", "exported": exported}[source]
    out = tmp_path / "ft"
    # one step at lr ~ 0 keeps the weights where init_from put them
    assert train(corpus, out, f"train.init_from={path}", "train.steps=1", "optim.lr=1e-12") == 0
    assert "init_from: weights of" in capsys.readouterr().out
    start = load_trained(run).model
    tuned = load_trained(out)
    assert tuned.step == 1  # a new run: its own step count, a fresh optimizer
    for (name, p), q in zip(start.named_parameters(), tuned.model.parameters()):
        assert torch.allclose(p, q, atol=1e-6), name


def test_init_from_refuses_another_model_by_name(corpus, run_and_export, tmp_path, capsys):
    _, exported = run_and_export
    assert train(corpus, tmp_path / "a", f"train.init_from={exported}", "model.n_layers=3") == 2
    err = capsys.readouterr().err
    assert "n_layers (2 there, 3 here)" in err and "set model.n_layers=2" in err
    assert train(corpus, tmp_path / "b", f"train.init_from={exported}", "model.preset=gpt-tiny") == 2
    assert "holds NGPT weights, but [model] builds a GPT" in capsys.readouterr().err
    assert train(corpus, tmp_path / "c", f"train.init_from={tmp_path / 'nothing'}") == 2
    assert "no run directory, checkpoint or exported model" in capsys.readouterr().err


def test_init_from_that_does_not_fit_is_refused_before_the_data_is_tokenized(corpus, run_and_export, tmp_path, capsys):
    """Another model config or another tokenizer than the weights': refused right after the
    tokenizer is loaded, before the corpus is tokenized (no data cache)."""
    _, exported = run_and_export
    cache = tmp_path / "cache"
    for override, message in [
        ("model.n_layers=3", "n_layers (2 there, 3 here)"),
        ("data.tokenizer=byte:257", "was trained with the byte tokenizer (vocab 256)"),
    ]:
        assert train(corpus, tmp_path / "run", f"train.init_from={exported}", f"data.cache_dir={cache}", override) == 2
        assert message in capsys.readouterr().err
        assert not cache.exists()


def test_resume_into_a_directory_without_a_run_is_refused(corpus, run_and_export, tmp_path, capsys):
    _, exported = run_and_export
    assert train(corpus, tmp_path / "empty", "--resume") == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --resume: train.out_dir") and "no run to continue" in err
    assert not (tmp_path / "empty").exists()  # refused before the directory is made
    assert train(corpus, exported, "--resume") == 2
    assert "is an exported model, not a run" in capsys.readouterr().err
    stopped = tmp_path / "stopped"  # a run that ended before its first checkpoint
    stopped.mkdir()
    (stopped / "metrics.jsonl").write_text('{"event": "start"}\n')
    assert train(corpus, stopped, "--resume") == 2
    assert "but no checkpoint (it stopped before its first)" in capsys.readouterr().err
    assert train(corpus, stopped, "--overwrite") == 0  # and the way out it names works
    assert not (exported / "checkpoints").exists()


# -- exported directories in the recipes -----------------------------------------------------


def test_sample_and_analyze_accept_an_exported_directory(run_and_export, tmp_path, capsys):
    run, exported = run_and_export
    assert sample.main([str(exported), "--tokens", "5", "--device", "cpu"]) == 0
    assert "(exported NGPT)" in capsys.readouterr().err
    assert analyze.main([str(exported), "--out", str(tmp_path / "a"), "--no-progress", "--device", "cpu"]) == 0
    assert (tmp_path / "a" / "stats.json").is_file()
    assert analyze.main([str(exported), "--out", str(tmp_path / "b"), "--extrapolate", "--no-progress"]) == 2
    assert "name the data with --data" in capsys.readouterr().err
    assert export.main([str(exported), str(tmp_path / "again")]) == 2
    assert "is an exported model already" in capsys.readouterr().err


def test_load_weights_reads_runs_and_exports_alike(run_and_export):
    run, exported = run_and_export
    a, b = load_weights(run), load_weights(exported)
    assert a.step == 2 and b.exported and not a.exported
    ids = torch.randint(0, 256, (1, 16))
    with torch.no_grad():
        assert torch.equal(a.model(ids), b.model(ids))


def test_a_sharded_save_pretrained_directory_is_read_by_the_recipes(run_and_export, tmp_path, capsys):
    """save_pretrained with max_shard_size writes shards and their index, no model.safetensors:
    the recipes that take an exported directory read it all the same."""
    run, exported = run_and_export
    reference = load_weights(exported)
    sharded = tmp_path / "sharded"
    reference.model.save_pretrained(sharded, max_shard_size="20KB")
    reference.tokenizer.save(sharded)
    assert not (sharded / "model.safetensors").exists() and (sharded / "model.safetensors.index.json").is_file()
    loaded = load_weights(sharded)
    ids = torch.randint(0, 256, (1, 16))
    with torch.no_grad():
        assert torch.equal(loaded.model(ids), reference.model(ids))
    assert sample.main([str(sharded), "--tokens", "5", "--device", "cpu"]) == 0
    assert "(exported NGPT)" in capsys.readouterr().err


# -- Hugging Face habits -----------------------------------------------------------------------


def test_from_pretrained_takes_dtype_and_device_spellings(run_and_export):
    _, exported = run_and_export
    assert next(NGPT.from_pretrained(exported, torch_dtype=torch.bfloat16).parameters()).dtype == torch.bfloat16
    assert next(load_pretrained(exported, dtype="float16", device="cpu").parameters()).dtype == torch.float16
    model = load_pretrained(exported, torch_dtype="auto", device_map="auto")
    assert next(model.parameters()).dtype == torch.float32
    with pytest.raises(ValueError, match="'int8' is not a dtype"):
        load_pretrained(exported, dtype="int8")
    with pytest.raises(ValueError, match="disagree"):
        load_pretrained(exported, dtype="bfloat16", torch_dtype="float32")
    with pytest.raises(ValueError, match="device_map as a dict"):
        load_pretrained(exported, device_map={"": 0})


@pytest.mark.parametrize("extra_eos", [False, True])
def test_the_byte_tokenizer_has_a_tokenizer_json_with_the_same_ids(extra_eos):
    tokenizers = pytest.importorskip("tokenizers")
    ours = ByteTokenizer(extra_eos=extra_eos)
    theirs = tokenizers.Tokenizer.from_str(ours.tokenizer_json())
    text = "héllo wörld 🙂 <0x61>\n\ttabs, ÿ and ‽"
    assert theirs.encode(text).ids == ours.encode(text)
    assert theirs.decode(ours.encode(text)) == text
    assert theirs.get_vocab_size() == ours.vocab_size


def test_export_writes_a_tokenizer_json_and_a_model_card(run_and_export):
    tokenizers = pytest.importorskip("tokenizers")
    run, exported = run_and_export
    tok = tokenizers.Tokenizer.from_file(str(exported / "tokenizer.json"))
    assert tok.encode("paragraph 7").ids == load_trained(run).tokenizer.encode("paragraph 7")
    card = (exported / "README.md").read_text()
    assert card.startswith("---\nlibrary_name: spherenet\n") and "# NGPT, " in card
    assert "| trained | 2 steps" in card and "train.init_from=" in card
    config = json.loads(card.split("```json\n", 1)[1].split("```", 1)[0])
    assert config["train"]["steps"] == 2 and config["model"]["preset"] == "ngpt-tiny"


# -- configs by name, --print-config, did-you-mean ---------------------------------------------


def test_shipped_configs_are_found_by_name_from_any_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in ("ngpt-tiny", "ngpt-tiny.toml"):
        assert resolve_config(name) == ROOT / "recipes" / "configs" / "ngpt-tiny.toml"
    with pytest.raises(ConfigError, match="no shipped config of that name.*ngpt-tiny"):
        resolve_config("ngpt-huge")
    (tmp_path / "ngpt-tiny.toml").write_text("[train]\nsteps = 7\n")  # a file of that name wins
    assert resolve_config("ngpt-tiny.toml") == Path("ngpt-tiny.toml")


def test_print_config_prints_the_resolved_config_and_reads_back(tmp_path, capsys, monkeypatch):
    """--print-config prints what the run uses: no unset key, the preset's model fields under
    [model]; loaded back, that file makes the same run (the same resolved config and model)."""
    monkeypatch.chdir(tmp_path)
    given = ["optim.lr=0.01", "model.n_layers=3", "optim.method=adamh"]
    assert train_cli(["--config", "gpt-tiny", "--print-config", *given]) == 0
    printed = capsys.readouterr().out
    assert not (tmp_path / "runs").exists()  # a dry run
    assert "-1" not in printed
    for line in ("matrix_lr = 0.01", "muon_lr = 0.01", "weight_decay = 0.1", "warmup_steps = 30", "block_size = 128"):
        assert f"\n{line}\n" in printed, line  # unset keys resolved (gpt-tiny.toml sets warmup_steps = 30)
    model = printed[printed.index("[model]") :]
    for line in ('preset = "gpt-tiny"', "n_layers = 3", "d_model = 64", "n_heads = 4", "max_seq_len = 128"):
        assert f"\n{line}\n" in model, line
    (tmp_path / "printed.toml").write_text(printed)
    again = load_config(tmp_path / "printed.toml")
    original = load_config(ROOT / "recipes/configs/gpt-tiny.toml", given)
    assert resolved(again) == resolved(original)
    assert model_config(again, 256) == model_config(original, 256)
    assert to_toml(resolved(again)) == printed
    assert train_cli(["--config", str(tmp_path / "printed.toml"), "--print-config"]) == 0
    assert capsys.readouterr().out == printed


def test_an_unset_key_is_left_out_of_the_toml_and_reads_back_unset():
    cfg = load_config(None, ["optim.method=muon"])
    text = to_toml(cfg)
    assert "muon_lr" not in text and "matrix_lr" not in text and "weight_decay" not in text
    assert load_config(None, ["optim.method=muon"]).optim.muon_lr is None
    with pytest.raises(ConfigError, match=r"optim.muon_lr must be > 0, got -1.0 \(leave it unset for optim.lr\)"):
        load_config(None, ["optim.muon_lr=-1"])


def test_unknown_keys_get_a_did_you_mean():
    with pytest.raises(ConfigError, match=r"optim.lrr; did you mean optim.lr\?"):
        load_config(None, ["optim.lrr=1"])
    with pytest.raises(ConfigError, match=r"train.warmup_steps; did you mean optim.warmup_steps\?"):
        load_config(None, ["train.warmup_steps=10"])
    with pytest.raises(ConfigError, match=r"\[trian\]; did you mean train\?"):
        load_config(None, ["trian.steps=3"])


def test_train_help_lists_configs_presets_and_where_keys_are(capsys):
    with pytest.raises(SystemExit):
        train_cli(["--help"])
    out = capsys.readouterr().out
    assert "ngpt-tiny" in out and "gpt-1b" in out and "spherenet/train/config.py" in out and "--print-config" in out


# -- one CLI -----------------------------------------------------------------------------------


@pytest.mark.slow
def test_console_scripts_use_their_own_names_and_one_error_line(tmp_path):
    bin_dir = Path(sys.executable).parent
    scripts = {
        "spherenet-sample": [str(tmp_path / "nowhere")],
        "spherenet-export": [str(tmp_path / "nowhere"), str(tmp_path / "out")],
        "spherenet-analyze": [str(tmp_path / "nowhere"), "--out", str(tmp_path / "a")],
        "spherenet-plot": [str(tmp_path / "nowhere")],
        "spherenet-train": ["--config", str(tmp_path / "nowhere.toml")],
        "spherenet-compare": ["--config", str(tmp_path / "nowhere.toml")],
    }
    for script, args in scripts.items():
        if not (bin_dir / script).exists():
            pytest.skip(f"{script} is not installed (pip install -e .)")
        done = subprocess.run([str(bin_dir / script), *args], capture_output=True, text=True, timeout=120)
        assert done.returncode == 2 and done.stderr.startswith("error: "), (script, done.stderr)
        assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, (script, done.stderr)
        usage = subprocess.run([str(bin_dir / script), "--help"], capture_output=True, text=True, timeout=120)
        assert usage.stdout.startswith(f"usage: {script} "), (script, usage.stdout[:80])


def test_eval_with_a_bad_path_is_one_error_line_and_its_help_names_the_model(tmp_path, capsys):
    pytest.importorskip("lm_eval")
    rc = evaluate.main(["--model", "spherenet", "--model_args", f"path={tmp_path / 'nowhere'}", "--tasks", "x"])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("error: --model_args path=") and err.count("\n") == 1
    assert evaluate.main(["--model", "spherenet", "--tasks", "x"]) == 2
    assert "needs --model_args path=PATH" in capsys.readouterr().err
    assert evaluate.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert out.index("--model spherenet") < out.index("path=PATH") < out.index("lm_eval's own options")


def test_from_preset_model_still_matches_after_its_export(run_and_export):
    """A guard on the fixture: the exported model is the run's, not a fresh one."""
    run, exported = run_and_export
    fresh = from_preset("ngpt-tiny", max_seq_len=32, vocab_size=256)
    loaded = load_pretrained(exported)
    assert any(not torch.equal(p, q) for p, q in zip(fresh.parameters(), loaded.parameters()))


@pytest.mark.slow
def test_init_from_under_torchrun_fsdp_with_two_gloo_ranks(corpus, run_and_export, tmp_path):
    """Each rank loads the exported weights before sharding; the FSDP run's first checkpoint,
    after one step at lr ~ 0, holds them."""
    _, exported = run_and_export
    out = tmp_path / "fsdp"
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "recipes.train",
        *TINY, "train.steps=1", "train.checkpoint_every=1", "optim.lr=1e-12", "--parallel", "fsdp", "--device", "cpu",
        f"train.init_from={exported}", f"train.out_dir={out}", f"data.source={corpus / 'c.txt'}",
        f"data.cache_dir={corpus / 'cache'}",
    ]  # fmt: skip  # the launcher's options, then the trainer's
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "init_from: weights of" in done.stdout
    tuned, start = load_trained(out).model, load_pretrained(exported)
    for (name, p), q in zip(start.named_parameters(), tuned.parameters()):
        assert torch.allclose(p, q, atol=1e-6), name
