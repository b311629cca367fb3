"""Model exchange in the Hugging Face layout (spherenet.models.hub, recipes.export) and the
console scripts."""

from __future__ import annotations

import importlib
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from recipes import export
from recipes.checkpoints import load_trained
from recipes.train import cli as train_cli
from spherenet.data.tokenizer import load_tokenizer
from spherenet.models import GPT, NGPT, PretrainedFileError, from_preset, load_pretrained

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def safetensors_torch():
    pytest.importorskip("huggingface_hub")
    return pytest.importorskip("safetensors.torch")


def logits(model, seed=0):
    ids = torch.randint(0, model.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        return model(ids)


def unit_row_error(tensor: torch.Tensor) -> float:
    return float((tensor.float().norm(dim=-1) - 1).abs().max())


@pytest.mark.parametrize("preset, cls", [("ngpt-tiny", NGPT), ("gpt-tiny", GPT)])
def test_round_trip_gives_identical_logits(safetensors_torch, tmp_path, preset, cls):
    model = from_preset(preset).eval()
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == "spherenet-" + preset.split("-")[0] and config["architectures"] == [cls.__name__]
    assert config["d_model"] == model.config.d_model and config["n_layers"] == model.config.n_layers

    loaded = cls.from_pretrained(tmp_path)
    assert loaded.config == model.config and not loaded.training
    assert torch.equal(logits(loaded), logits(model))
    assert type(load_pretrained(tmp_path)) is cls  # load_pretrained picks the class from config.json


def test_sphere_weights_are_stored_as_unit_rows(safetensors_torch, tmp_path):
    model = from_preset("ngpt-tiny")
    model.save_pretrained(tmp_path)
    tensors = safetensors_torch.load_file(str(tmp_path / "model.safetensors"))
    sphere = model.sphere_weights()
    assert "embed_in.weight" in sphere and "blocks.0.attn.w_q.weight" in sphere and "embed_out.weight" in sphere
    for name in sphere:
        assert unit_row_error(tensors[name]) < 1e-5, name


def test_bfloat16_model_loads_in_bfloat16(safetensors_torch, tmp_path):
    model = from_preset("ngpt-tiny").to(torch.bfloat16).eval()
    model.save_pretrained(tmp_path)
    loaded = NGPT.from_pretrained(tmp_path)
    assert loaded.embed_in.weight.dtype == torch.bfloat16
    assert torch.equal(logits(loaded), logits(model))


def _save_with(safetensors_torch, directory: Path, change) -> None:
    """Save a tiny NGPT, then rewrite its model.safetensors after ``change(tensors)``."""
    from_preset("ngpt-tiny").save_pretrained(directory)
    tensors = safetensors_torch.load_file(str(directory / "model.safetensors"))
    change(tensors)
    safetensors_torch.save_file(tensors, str(directory / "model.safetensors"))


@pytest.mark.parametrize(
    "change, needles",
    [
        (lambda t: t.update({"blocks.1.mlp.w_u.weight": torch.randn(256, 32)}),
         ["'blocks.1.mlp.w_u.weight' has shape (256, 32), expected (256, 64)"]),
        (lambda t: t.pop("blocks.0.attn.w_k.weight"), ["missing tensor 'blocks.0.attn.w_k.weight' (expected shape (64, 64))"]),
        (lambda t: t.update({"blocks.9.extra": torch.zeros(3)}), ["unexpected tensor 'blocks.9.extra' (shape (3,))"]),
    ],
    ids=["wrong_shape", "missing", "unexpected"],
)  # fmt: skip  # one case per line
def test_mismatched_tensors_are_named(safetensors_torch, tmp_path, change, needles):
    _save_with(safetensors_torch, tmp_path, change)
    with pytest.raises(PretrainedFileError) as info:
        NGPT.from_pretrained(tmp_path)
    message = str(info.value)
    assert "model.safetensors" in message and all(needle in message for needle in needles), message


def test_sphere_weight_without_unit_rows_is_refused(safetensors_torch, tmp_path):
    _save_with(safetensors_torch, tmp_path, lambda t: t["blocks.0.mlp.w_v.weight"].mul_(1.5))
    with pytest.raises(
        PretrainedFileError, match=r"unit rows.*'blocks\.0\.mlp\.w_v\.weight' \(\|row norm - 1\| up to 0\.5"
    ):
        NGPT.from_pretrained(tmp_path)


@pytest.mark.parametrize("value", [float("nan"), float("inf")], ids=["nan", "inf"])
def test_non_finite_values_in_any_parameter_are_refused(safetensors_torch, tmp_path, value):
    def poison(tensors):
        scale = "blocks.0.mlp.s_u.param"  # a scaling vector, not a sphere weight
        tensors[scale][0] = value

    _save_with(safetensors_torch, tmp_path, poison)
    with pytest.raises(PretrainedFileError, match=r"non-finite values \(NaN/inf\) in 'blocks\.0\.mlp\.s_u\.param'"):
        load_pretrained(tmp_path)


def test_export_to_a_read_only_destination_is_one_error_line(tmp_path, capsys, monkeypatch):
    """A destination that cannot be written: exit 2, errno named, nothing left behind."""
    pytest.importorskip("safetensors.torch")
    run = tmp_path / "run"
    assert (
        train_cli(
            [
                "model.preset=ngpt-tiny",
                "model.max_seq_len=32",
                "train.batch_size=4",
                "train.steps=2",
                "train.sample_tokens=0",
                "train.progress=false",
                "train.eval_batches=1",
                f"train.out_dir={run}",
                f"data.cache_dir={tmp_path / 'cache'}",
            ]
        )
        == 0
    )
    real_mkdir = Path.mkdir

    def read_only(self, *args, **kwargs):
        if self.parent == tmp_path / "ro":
            raise OSError(30, "Read-only file system", str(self))
        return real_mkdir(self, *args, **kwargs)

    (tmp_path / "ro").mkdir()
    monkeypatch.setattr(Path, "mkdir", read_only)
    capsys.readouterr()
    assert export.main([str(run), str(tmp_path / "ro" / "model")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: cannot write ") and "read-only file system (EROFS)" in err[0]
    assert list((tmp_path / "ro").iterdir()) == []


def test_config_of_another_model_is_refused(safetensors_torch, tmp_path):
    from_preset("gpt-tiny").save_pretrained(tmp_path)
    with pytest.raises(
        PretrainedFileError, match="model_type 'spherenet-gpt', not 'spherenet-ngpt': load it with GPT.from_pretrained"
    ):
        NGPT.from_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "n_experts": 8}))
    with pytest.raises(PretrainedFileError, match="'n_experts' that GPTConfig does not know"):
        GPT.from_pretrained(tmp_path)


def test_missing_directory_and_files_are_named(safetensors_torch, tmp_path):
    with pytest.raises(FileNotFoundError, match="no config.json in"):
        NGPT.from_pretrained(tmp_path)
    with pytest.raises(FileNotFoundError, match="not a directory written by save_pretrained"):
        NGPT.from_pretrained(tmp_path / "nothing" / "here")


def test_saving_non_unit_sphere_rows_is_refused(safetensors_torch, tmp_path):
    model = from_preset("ngpt-tiny")
    with torch.no_grad():
        model.embed_out.weight.mul_(2)
    with pytest.raises(PretrainedFileError, match="cannot save NGPT: .*'embed_out.weight'"):
        model.save_pretrained(tmp_path)
    assert not (tmp_path / "model.safetensors").exists()


def test_hub_repository_that_cannot_be_fetched_is_named(safetensors_torch, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))  # an empty cache: nothing to find offline
    with pytest.raises(
        FileNotFoundError, match="config.json of the Hub repository 'someone/no-such-model' cannot be fetched"
    ):
        NGPT.from_pretrained("someone/no-such-model", local_files_only=True, cache_dir=tmp_path)


def test_push_to_hub_uploads_the_saved_files(safetensors_torch, monkeypatch):
    """push_to_hub creates the repository and uploads config.json and model.safetensors (the Hub
    API replaced by a recorder: no network here)."""
    import huggingface_hub

    calls = []

    class RecordingApi:
        def __init__(self, token=None):
            calls.append(("token", token))

        def create_repo(self, repo_id, private=None, exist_ok=False):
            calls.append(("create_repo", repo_id, exist_ok))
            return huggingface_hub.RepoUrl(f"https://huggingface.co/{repo_id}")

        def upload_folder(self, *, repo_id, folder_path, **kwargs):
            calls.append(("upload_folder", repo_id, sorted(p.name for p in Path(folder_path).iterdir())))
            return huggingface_hub.CommitInfo(
                commit_url=f"https://huggingface.co/{repo_id}/commit/abc",
                commit_message=kwargs["commit_message"],
                commit_description="",
                oid="abc",
            )

    monkeypatch.setattr(huggingface_hub, "HfApi", RecordingApi)
    url = from_preset("gpt-tiny").push_to_hub("someone/gpt-tiny", token="t")
    assert url == "https://huggingface.co/someone/gpt-tiny/commit/abc"
    assert calls == [
        ("token", "t"),
        ("create_repo", "someone/gpt-tiny", True),
        ("upload_folder", "someone/gpt-tiny", ["config.json", "model.safetensors", "modeling_spherenet.py"]),
    ]


def test_without_the_hub_extra_import_works_and_saving_names_the_extra(tmp_path):
    """With safetensors and huggingface_hub unimportable, spherenet and recipes.export import,
    and save_pretrained / from_pretrained raise ImportError naming the extra."""
    code = f"""
import sys
sys.modules.update({{"safetensors": None, "safetensors.torch": None, "huggingface_hub": None}})
import spherenet, spherenet.models, recipes.export
from spherenet.models import NGPT, from_preset
for call in (lambda: from_preset("ngpt-tiny").save_pretrained({str(tmp_path)!r}),
             lambda: NGPT.from_pretrained({str(tmp_path)!r})):
    try:
        call()
    except ImportError as exc:
        assert 'pip install "spherenet[hub]"' in str(exc), exc
    else:
        raise SystemExit("no ImportError")
print("ok")
"""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


# ---------------------------------------------------------------------------------------------
# recipes.export


@pytest.fixture(scope="module")
def bpe_run(tmp_path_factory):
    """A two-step nGPT run with a BPE tokenizer (a tokenizer.json to export), checkpoints at 1 and 2."""
    root = tmp_path_factory.mktemp("export")
    text = "\n\n".join(f"line {i}: the quick brown fox jumps over the lazy dog {i % 7}" for i in range(300))
    (root / "c.txt").write_text(text)
    out = root / "run"
    rc = train_cli(
        [
            "model.preset=ngpt-tiny",
            "model.max_seq_len=32",
            "train.batch_size=4",
            "train.eval_every=2",
            "train.eval_batches=1",
            "train.sample_tokens=0",
            "train.progress=false",
            "train.steps=2",
            "train.checkpoint_every=1",
            "data.tokenizer=bpe:300",
            f"train.out_dir={out}",
            f"data.source={root / 'c.txt'}",
            f"data.cache_dir={root / 'cache'}",
        ]
    )
    assert rc == 0
    return out


def test_export_recipe_round_trip(safetensors_torch, bpe_run, tmp_path, capsys):
    out = tmp_path / "exported"
    assert export.main([str(bpe_run), str(out)]) == 0
    printed = capsys.readouterr().out
    assert "step 2" in printed
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_spec.json"):
        assert (out / name).is_file() and str(out / name) in printed, name

    trained = load_trained(bpe_run)
    loaded = NGPT.from_pretrained(out)
    assert torch.equal(logits(loaded), logits(trained.model))
    tensors = safetensors_torch.load_file(str(out / "model.safetensors"))
    assert all(unit_row_error(tensors[name]) < 1e-5 for name in loaded.sphere_weights())

    tokenizer = load_tokenizer(out)
    assert tokenizer.vocab_size == 300 == trained.tokenizer.vocab_size
    assert tokenizer.encode("line 1: the quick fox") == trained.tokenizer.encode("line 1: the quick fox")


def test_export_recipe_picks_a_step(safetensors_torch, bpe_run, tmp_path, capsys):
    assert export.main([str(bpe_run), str(tmp_path / "s1"), "--step", "1"]) == 0
    assert "step 1" in capsys.readouterr().out
    first = load_trained(bpe_run / "checkpoints" / "step_00000001").model
    assert torch.equal(logits(NGPT.from_pretrained(tmp_path / "s1")), logits(first))

    assert export.main([str(bpe_run), str(tmp_path / "s7"), "--step", "7"]) == 2
    assert "no checkpoint of step 7" in capsys.readouterr().err and not (tmp_path / "s7").exists()


def test_export_recipe_without_a_run(tmp_path, capsys):
    assert export.main([str(tmp_path / "missing"), str(tmp_path / "out")]) == 2
    assert "no run directory or checkpoint at" in capsys.readouterr().err
    assert export.main([str(tmp_path), str(tmp_path / "out")]) == 2
    assert "no checkpoint found" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# console scripts


def test_console_scripts_resolve_to_callables_without_arguments():
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    names = {"spherenet-train", "spherenet-sample", "spherenet-compare", "spherenet-export", "spherenet-analyze"}
    assert names <= set(scripts)
    for name, target in scripts.items():
        module_name, _, attr = target.partition(":")
        entry = getattr(importlib.import_module(module_name), attr)
        assert callable(entry), name
        required = [p for p in inspect.signature(entry).parameters.values() if p.default is inspect.Parameter.empty]
        assert not required, f"{name} -> {target} needs arguments {required}"
