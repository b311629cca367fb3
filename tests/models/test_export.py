"""Model exchange in the Hugging Face layout (spherenet.io.pretrained, recipes.export) and the
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
from spherenet.checkpoint import MANIFEST, CheckpointManager
from spherenet.data.tokenizer import load_tokenizer
from spherenet.io import MANIFEST_NAME, PretrainedFileWarning, write_manifest
from spherenet.models import GPT, NGPT, PretrainedFileError, from_preset, load_pretrained

ROOT = Path(__file__).resolve().parents[2]


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
    """Save a tiny NGPT, then rewrite its model.safetensors after ``change(tensors)`` and its
    manifest after that (a file written so by another tool: the content checks must catch it)."""
    from_preset("ngpt-tiny").save_pretrained(directory)
    tensors = safetensors_torch.load_file(str(directory / "model.safetensors"))
    change(tensors)
    safetensors_torch.save_file(tensors, str(directory / "model.safetensors"))
    write_manifest(directory)


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


def flip_bit_of_tensor(path: Path, name: str) -> None:
    """Flip the lowest bit of the first byte of tensor ``name`` inside a safetensors file (its
    header: 8 bytes of length, then JSON with each tensor's data offsets)."""
    raw = bytearray(path.read_bytes())
    header_len = int.from_bytes(raw[:8], "little")
    start = json.loads(raw[8 : 8 + header_len])[name]["data_offsets"][0]
    raw[8 + header_len + start] ^= 1
    path.write_bytes(bytes(raw))


def test_a_saved_model_carries_a_manifest_of_its_files(safetensors_torch, tmp_path):
    import hashlib

    from_preset("ngpt-tiny").save_pretrained(tmp_path)
    manifest = json.loads((tmp_path / MANIFEST_NAME).read_text())
    assert sorted(manifest["files"]) == [
        "config.json",
        "configuration_spherenet.py",
        "guards_spherenet.py",
        "model.safetensors",
        "modeling_spherenet.py",
    ]
    for name, entry in manifest["files"].items():
        data = (tmp_path / name).read_bytes()
        assert entry == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def test_one_flipped_bit_in_a_saved_model_is_refused_naming_the_file(safetensors_torch, tmp_path):
    """A bit flipped in s_qk (a scaling vector: finite, no unit rows to break) loads silently
    without the manifest; with it, the load stops with one line naming the file."""
    from_preset("ngpt-tiny").save_pretrained(tmp_path)
    flip_bit_of_tensor(tmp_path / "model.safetensors", "blocks.0.attn.s_qk.param")
    with pytest.raises(PretrainedFileError) as info:
        load_pretrained(tmp_path)
    message = str(info.value)
    assert "\n" not in message and f"{tmp_path}: model.safetensors has sha256" in message, message
    assert "(contents altered)" in message


def test_a_saved_model_without_a_manifest_loads_with_a_warning(safetensors_torch, tmp_path):
    """Saved by hand or by an older spherenet: loaded (the tensor checks still run), with a
    warning that says its files could not be checked."""
    model = from_preset("ngpt-tiny").eval()
    model.save_pretrained(tmp_path)
    (tmp_path / MANIFEST_NAME).unlink()
    with pytest.warns(PretrainedFileWarning, match=f"has no {MANIFEST_NAME}: its files cannot be checked"):
        loaded = NGPT.from_pretrained(tmp_path)
    assert torch.equal(logits(loaded), logits(model))


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
    write_manifest(tmp_path)
    with pytest.raises(PretrainedFileError, match="'n_experts' that GPTConfig does not know"):
        GPT.from_pretrained(tmp_path)


def test_missing_directory_and_files_are_named(safetensors_torch, tmp_path):
    with pytest.raises(FileNotFoundError, match="no config.json in"):
        NGPT.from_pretrained(tmp_path)
    with pytest.raises(FileNotFoundError, match="not a directory written by save_pretrained"):
        NGPT.from_pretrained(tmp_path / "nothing" / "here")
    # a training run, or one of its checkpoints: the message says how to make it loadable
    (tmp_path / "run" / "checkpoints" / "step_00000002").mkdir(parents=True)
    (tmp_path / "run" / "checkpoints" / "step_00000002" / "MANIFEST.json").write_text("{}")
    run = tmp_path / "run"
    for where in (run, run / "checkpoints", run / "checkpoints" / "step_00000002"):
        with pytest.raises(FileNotFoundError, match=f"holds a training run .*python -m recipes.export {where} OUT_DIR"):
            NGPT.from_pretrained(where)
    with pytest.raises(FileNotFoundError) as plain:
        NGPT.from_pretrained(tmp_path)
    assert "training run" not in str(plain.value)


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
        (
            "upload_folder",
            "someone/gpt-tiny",
            [
                "config.json",
                "configuration_spherenet.py",
                "guards_spherenet.py",
                "model.safetensors",
                "modeling_spherenet.py",
                MANIFEST_NAME,
            ],
        ),
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
        assert 'pip install "spherenet-torch[hub]"' in str(exc), exc
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


def test_export_recipe_manifest_lists_every_file(safetensors_torch, bpe_run, tmp_path):
    out = tmp_path / "exported"
    assert export.main([str(bpe_run), str(out)]) == 0
    listed = json.loads((out / MANIFEST_NAME).read_text())["files"]
    assert sorted(listed) == sorted(p.name for p in out.iterdir() if p.name != MANIFEST_NAME)
    assert {"config.json", "model.safetensors", "tokenizer.json", "README.md"} <= set(listed)


def test_export_into_a_non_empty_directory_needs_overwrite(safetensors_torch, bpe_run, tmp_path, capsys):
    out = tmp_path / "exported"
    assert export.main([str(bpe_run), str(out), "--step", "1"]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    capsys.readouterr()
    assert export.main([str(bpe_run), str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"error: {out} is not empty; pass --overwrite to replace the earlier export there, or export elsewhere"
    ]
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # untouched
    # --overwrite is offered only where it would be taken
    for directory, why in ((bpe_run, "holds a training run (checkpoints)"), (bpe_run / "checkpoints", "holds a training run (step_* checkpoints)"), (bpe_run.parent, "holds no earlier export")):  # fmt: skip  # a table
        assert export.main([str(bpe_run), str(directory)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and why in err[0] and "--overwrite" not in err[0], err

    (out / "stray.txt").write_text("left from before")  # not the export's: --overwrite keeps its hands off
    assert export.main([str(bpe_run), str(out), "--overwrite"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "holds stray.txt, which no export wrote" in err[0], err
    assert (out / "stray.txt").read_text() == "left from before"
    (out / "stray.txt").unlink()
    assert export.main([str(bpe_run), str(out), "--overwrite"]) == 0
    assert "step 2" in capsys.readouterr().out
    assert sorted(p.name for p in out.iterdir()) == sorted(before)
    assert torch.equal(logits(NGPT.from_pretrained(out)), logits(load_trained(bpe_run).model))
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary directory left


def test_init_from_non_finite_weights_is_refused_at_load(safetensors_torch, bpe_run, tmp_path, capsys):
    """A checkpoint whose weights hold a NaN (sound hashes: written so, not damaged later) is
    refused when train.init_from loads it, with one line naming the tensor, before any step."""
    import hashlib
    import shutil

    source = tmp_path / "nan_run"
    shutil.copytree(bpe_run / "checkpoints", source / "checkpoints")
    step = CheckpointManager(source / "checkpoints").path_for(2)
    state = torch.load(step / "state.pt", map_location="cpu", weights_only=True)
    state["model"]["blocks.0.attn.s_qk.param"][0] = float("nan")
    torch.save(state, step / "state.pt")
    manifest = json.loads((step / MANIFEST).read_text())
    data = (step / "state.pt").read_bytes()
    manifest["files"]["state.pt"] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (step / MANIFEST).write_text(json.dumps(manifest))

    root = bpe_run.parent
    out = tmp_path / "fine_tuned"
    rc = train_cli(
        [
            "model.preset=ngpt-tiny",
            "model.max_seq_len=32",
            "train.batch_size=4",
            "train.steps=2",
            "train.eval_batches=1",
            "train.sample_tokens=0",
            "train.progress=false",
            "data.tokenizer=bpe:300",
            f"data.source={root / 'c.txt'}",
            f"data.cache_dir={root / 'cache'}",
            f"train.out_dir={out}",
            f"train.init_from={source}",
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2, err
    assert len(err) == 1 and err[0].startswith("error: train.init_from: "), err
    assert err[0].count(str(source)) == 1, err  # the path named once
    assert "non-finite weights (NaN/inf) in 'blocks.0.attn.s_qk.param'" in err[0], err
    assert not (out / "checkpoints").exists()


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
