"""recipes.sample (and load_trained), end to end on tiny runs. recipes.compare: test_recipe_compare.py."""

from __future__ import annotations

import json
import shutil

import pytest
import tool_runs
from tool_runs import FAST

import recipes.train
from recipes import sample
from recipes.checkpoints import load_trained
from recipes.train import cli as train_cli
from spherenet.checkpoint import CheckpointCorruptError, CheckpointWarning

# the tools' corpus: a text file and its data cache
corpus = tool_runs.corpus


@pytest.fixture(scope="module")
def trained_run(corpus):
    out = corpus / "run"
    rc = train_cli(
        [
            "model.preset=ngpt-tiny",
            *FAST,
            "train.steps=4",
            f"train.out_dir={out}",
            f"data.source={corpus / 'c.txt'}",
            f"data.cache_dir={corpus / 'cache'}",
        ]
    )
    assert rc == 0
    return out


def test_sample_from_checkpoint(trained_run, capsys):
    assert sample.main([str(trained_run), "--prompt", "line 1", "--tokens", "12", "--temperature", "0"]) == 0
    first = capsys.readouterr().out
    assert first.startswith("line 1") and len(first.rstrip("\n")) > len("line 1")
    # greedy is deterministic; a step directory works as well as the run directory
    step_dir = sorted((trained_run / "checkpoints").glob("step_*"))[-1]
    assert sample.main([str(step_dir), "--prompt", "line 1", "--tokens", "12", "--temperature", "0"]) == 0
    assert capsys.readouterr().out == first


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--tokens", "0"], "--tokens"),
        (["--stop", ""], "--stop must not be empty"),
    ],
)
def test_sample_bad_arguments(trained_run, capsys, args, needle):
    assert sample.main([str(trained_run), *args]) == 2
    assert needle in capsys.readouterr().err


def test_sample_goes_past_the_context_and_stops_at_a_stop_string(trained_run, capsys):
    """--tokens N gives N new tokens past the 32-token context (or fewer when end-of-text comes
    first); --stop ends the sample before the stop string."""
    import torch

    from recipes.checkpoints import load_trained

    trained = load_trained(trained_run)
    tokenizer, model = trained.tokenizer, trained.model
    assert model.config.max_seq_len == 32
    prompt = tokenizer.encode("line 1")
    out = model.generate(torch.tensor([prompt]), 60, temperature=0, eos_token_id=tokenizer.eos_id)[0].tolist()
    new = out[len(prompt) :]
    assert len(new) == 60 or new[-1] == tokenizer.eos_id  # not cut at the context
    expected = tokenizer.decode(out[:-1] if new[-1] == tokenizer.eos_id else out)
    assert sample.main([str(trained_run), "--prompt", "line 1", "--tokens", "60", "--temperature", "0"]) == 0
    assert capsys.readouterr().out == expected + "\n"

    continuation = expected[len("line 1") :]
    stop = continuation[5:8]
    args = ["--prompt", "line 1", "--tokens", "60", "--temperature", "0", "--stop", stop]
    assert sample.main([str(trained_run), *args]) == 0
    captured = capsys.readouterr()
    assert captured.out == "line 1" + continuation[: continuation.find(stop)] + "\n"
    assert f"# the sample stopped at --stop {stop!r} after " in captured.err


def test_sample_says_when_it_stopped_at_end_of_text_and_after_how_many_tokens(trained_run, monkeypatch, capsys):
    """A model that emits end-of-text after 5 new tokens: the text stops there, and stderr says
    so with the count; a sample that runs to --tokens says nothing of the kind."""
    import torch

    real = sample.load_weights

    def ends_after_five(run, device):
        trained = real(run, device)
        generate = trained.model.generate

        def generate_then_end(prompt, n, **kwargs):
            out = generate(prompt, min(n, 5), **{**kwargs, "eos_token_id": None})
            return torch.cat([out, torch.tensor([[trained.tokenizer.eos_id]])], dim=1) if n > 5 else out

        trained.model.generate = generate_then_end
        return trained

    args = [str(trained_run), "--prompt", "line 1", "--tokens", "40", "--temperature", "0"]
    monkeypatch.setattr(sample, "load_weights", ends_after_five)
    assert sample.main(args) == 0
    captured = capsys.readouterr()
    assert "# the sample stopped at end-of-text after 5 new tokens (--tokens 40)" in captured.err
    assert len(captured.out) == len("line 1") + 5 + 1  # five bytes and the newline: the end-of-text is not printed
    assert sample.main([*args, "--num-samples", "2"]) == 0
    err = capsys.readouterr().err
    assert "# sample 1 stopped at end-of-text after 5" in err and "# sample 2 stopped at end-of-text after 5" in err
    assert sample.main([*args[:4], "5", *args[5:]]) == 0  # exactly --tokens new tokens: no end-of-text
    assert "stopped" not in capsys.readouterr().err


def test_sample_without_checkpoint(tmp_path, capsys):
    assert sample.main([str(tmp_path)]) == 2
    assert "no checkpoint found" in capsys.readouterr().err


# --- reading a damaged run: the same verification and fallback as --resume -----------------


@pytest.fixture(scope="module")
def two_checkpoints(corpus):
    """A finished run with checkpoints at steps 2 and 4."""
    out = corpus / "two"
    rc = train_cli(
        [
            "model.preset=ngpt-tiny",
            *FAST,
            "train.steps=4",
            "train.checkpoint_every=2",
            f"train.out_dir={out}",
            f"data.source={corpus / 'c.txt'}",
            f"data.cache_dir={corpus / 'cache'}",
        ]
    )
    assert rc == 0
    return out


def _garble(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2 : len(data) // 2 + 16] = b"\xff\xfe\x00garbage\x80\x81\x82\x83\x84\x85"
    path.write_bytes(bytes(data))


DAMAGE = {
    "state_truncated": lambda ck: (ck / "state.pt").write_bytes((ck / "state.pt").read_bytes()[:1000]),
    "state_missing": lambda ck: (ck / "state.pt").unlink(),
    "state_garbled": lambda ck: _garble(ck / "state.pt"),
    "manifest_garbled": lambda ck: _garble(ck / "MANIFEST.json"),
    "manifest_missing": lambda ck: (ck / "MANIFEST.json").unlink(),
    "model_json_garbled": lambda ck: _garble(ck / "model.json"),
    "tokenizer_missing": lambda ck: (ck / "tokenizer" / "tokenizer_spec.json").unlink(),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_sample_falls_back_from_a_damaged_checkpoint(two_checkpoints, tmp_path, capsys, damage):
    run = tmp_path / "run"
    shutil.copytree(two_checkpoints, run)
    DAMAGE[damage](run / "checkpoints" / "step_00000004")
    with pytest.warns(CheckpointWarning, match="skipping damaged checkpoint.*step_00000004"):
        assert sample.main([str(run), "--prompt", "line 1", "--tokens", "8", "--temperature", "0"]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("line 1") and len(captured.out.rstrip("\n")) > len("line 1")
    assert f"{run / 'checkpoints' / 'step_00000002'} (step 2" in captured.err


def test_load_trained_falls_back_and_names_the_directory_when_all_are_damaged(two_checkpoints, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(two_checkpoints, run)
    DAMAGE["manifest_garbled"](run / "checkpoints" / "step_00000004")
    with pytest.warns(CheckpointWarning, match="step_00000004"):
        trained = load_trained(run)
    assert trained.step == 2 and trained.path == run / "checkpoints" / "step_00000002"

    DAMAGE["state_truncated"](run / "checkpoints" / "step_00000002")
    with (
        pytest.warns(CheckpointWarning),
        pytest.raises(CheckpointCorruptError, match="every checkpoint in .* is damaged"),
    ):
        load_trained(run)
    with pytest.warns(CheckpointWarning):
        assert sample.main([str(run)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: every checkpoint in {run / 'checkpoints'} is damaged"), err
    assert "Traceback" not in err
    assert "step_00000004/MANIFEST.json is unreadable" in err and "state.pt has 1000 bytes" in err  # each one's fault
    # An explicitly named step directory is verified too, and not replaced by another one.
    assert sample.main([str(run / "checkpoints" / "step_00000004")]) == 2
    assert "MANIFEST.json is unreadable" in capsys.readouterr().err


# --- a run directory is self-contained ------------------------------------------------------


def _train_bpe_run(corpus, root):
    out, cache = root / "run", root / "cache"
    rc = train_cli(
        [
            "model.preset=ngpt-tiny",
            *FAST,
            "train.steps=2",
            "data.tokenizer=bpe:300",
            f"train.out_dir={out}",
            f"data.source={corpus / 'c.txt'}",
            f"data.cache_dir={cache}",
        ]
    )
    assert rc == 0
    return out, cache


def test_bpe_run_samples_after_moving_it_and_deleting_the_cache(corpus, tmp_path, capsys):
    out, cache = _train_bpe_run(corpus, tmp_path / "a")
    ckpt = out / "checkpoints" / "step_00000002"
    manifest = json.loads((ckpt / "MANIFEST.json").read_text())
    assert {"model.json", "tokenizer/tokenizer.json", "tokenizer/tokenizer_spec.json"} <= set(manifest["files"])
    capsys.readouterr()
    assert sample.main([str(out), "--prompt", "line 1", "--tokens", "8", "--temperature", "0"]) == 0
    before = capsys.readouterr().out

    moved = tmp_path / "elsewhere" / "run"
    shutil.move(str(out), moved)
    shutil.rmtree(cache)
    trained = load_trained(moved)
    assert trained.tokenizer.vocab_size == 300 and trained.model.config.vocab_size == 300
    assert sample.main([str(moved), "--prompt", "line 1", "--tokens", "8", "--temperature", "0"]) == 0
    assert capsys.readouterr().out == before  # the same tokenizer and weights: the same greedy text


def test_checkpoint_without_stored_tokenizer_uses_the_recorded_path(corpus, tmp_path, capsys, monkeypatch):
    """Checkpoints written before they held model.json and tokenizer/ still load; when the
    tokenizer file they point to is gone, the message says so."""
    monkeypatch.setattr(recipes.train, "checkpoint_files", lambda model, tokenizer: {})
    out, cache = _train_bpe_run(corpus, tmp_path)
    assert not (out / "checkpoints" / "step_00000002" / "model.json").exists()
    assert load_trained(out).tokenizer.vocab_size == 300
    shutil.rmtree(cache)
    assert sample.main([str(out)]) == 2
    err = capsys.readouterr().err
    assert "written before checkpoints held their tokenizer" in err and "Traceback" not in err, err
