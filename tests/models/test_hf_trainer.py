"""nGPT under transformers' Trainer: it stays on the sphere with Trainer's defaults (the model
renormalizes after every optimizer step), spherenet.hf.SphereCallback or spherenet's optimizers;
weights off the sphere anyway warn once and are refused on save with the remedy,
and the model saves through transformers' own entry points (Trainer.save_model, checkpoints and
resume, push_to_hub with the Hub replaced by a local recorder, save_pretrained's arguments)."""

import json
import shutil
import warnings
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("safetensors")
pytest.importorskip("accelerate", reason="transformers.Trainer needs accelerate")

import huggingface_hub  # noqa: E402
from transformers import AutoModelForCausalLM, Trainer, TrainingArguments  # noqa: E402

from spherenet.hf import SphereCallback, SpherenetGPTForCausalLM, SpherenetNGPTForCausalLM  # noqa: E402
from spherenet.io import INDEX_NAME, MANIFEST_NAME  # noqa: E402
from spherenet.manifolds import Sphere  # noqa: E402
from spherenet.models import GPT, NGPT, GPTConfig, NGPTConfig, PretrainedFileError  # noqa: E402
from spherenet.optim import build_optimizer  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

VOCAB, CONTEXT = 64, 16


def tiny_ngpt(seed=0) -> SpherenetNGPTForCausalLM:
    torch.manual_seed(seed)
    config = NGPTConfig(vocab_size=VOCAB, n_layers=2, d_model=32, n_heads=4, max_seq_len=CONTEXT)
    return SpherenetNGPTForCausalLM.from_spherenet(NGPT(config)).train()


def dataset(n=32):
    """Rows of arithmetic sequences (id i*k mod VOCAB): learnable in a few steps."""
    rows = []
    for i in range(n):
        ids = (torch.arange(CONTEXT) * (i % 5 + 1) + i % 3) % VOCAB
        rows.append({"input_ids": ids, "labels": ids})
    return rows


def arguments(out: Path, max_steps=24, **kwargs) -> TrainingArguments:
    options = dict(per_device_train_batch_size=8, learning_rate=1e-2, logging_steps=4, save_strategy="no")
    options.update(kwargs)
    return TrainingArguments(
        output_dir=str(out), max_steps=max_steps, report_to=[], use_cpu=True, disable_tqdm=True, seed=0, **options
    )


def sphere_error(model) -> float:
    return max(float(Sphere.norm_error(p)) for p in model.spherenet_model.sphere_weights().values())


def sphere_warnings(caught) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, UserWarning) and "left the unit sphere" in str(w.message)]  # fmt: skip  # one filter a line


def train(model, args, resume=None, **kwargs):
    """Trainer's run; returns it, its logged losses and the warnings it raised."""
    trainer = Trainer(model=model, args=args, train_dataset=dataset(), **kwargs)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.train(resume_from_checkpoint=resume)
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    return trainer, losses, caught


@pytest.mark.parametrize("way", ["callback", "optimizers"])
def test_trainer_keeps_ngpt_on_the_sphere(way, tmp_path):
    """24 Trainer steps with SphereCallback (any optimizer, then normalize) or with spherenet's
    optimizer through optimizers=: the loss falls, every row is unit within 1e-5, nothing warns."""
    model = tiny_ngpt()
    trainer, losses, caught = train(model, arguments(tmp_path), **sphere_way(way, model, 24))
    assert trainer.state.global_step == 24 and len(losses) == 6
    assert losses[-1] < losses[0] - 0.2, losses
    assert sphere_error(model) < 1e-5
    assert sphere_warnings(caught) == []
    trainer.save_model(str(tmp_path / "saved"))  # on the sphere: saves and loads back
    loaded = SpherenetNGPTForCausalLM.from_pretrained(tmp_path / "saved")
    ids = dataset()[0]["input_ids"][None]
    torch.testing.assert_close(loaded(ids).logits, model.eval()(ids).logits, atol=1e-5, rtol=0)


def test_trainer_with_its_defaults_keeps_ngpt_on_the_sphere_as_sphere_callback_does(tmp_path):
    """Trainer's own AdamW and nothing else: the model follows every optimizer step with the
    paper's normalization (Section 2.6), so the run is SphereCallback's (the same losses and
    weights), nothing warns, and every checkpoint is written."""
    runs = {}
    for way, options in (("defaults", {}), ("callback", {"callbacks": [SphereCallback()]})):
        model, args = tiny_ngpt(), arguments(tmp_path / way, save_strategy="steps", save_steps=12)
        _, losses, caught = train(model, args, **options)
        assert sphere_error(model) < 1e-5 and sphere_warnings(caught) == []
        runs[way] = model, losses
    (defaults, losses), (callback, callback_losses) = runs["defaults"], runs["callback"]
    assert losses == pytest.approx(callback_losses, abs=1e-6) and losses[-1] < losses[0] - 0.2
    for (name, a), b in zip(defaults.named_parameters(), callback.parameters()):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0, msg=name)
    ids = dataset()[0]["input_ids"][None]
    for step in (12, 24):
        loaded = SpherenetNGPTForCausalLM.from_pretrained(tmp_path / "defaults" / f"checkpoint-{step}")
        assert sphere_error(loaded) < 1e-5
    torch.testing.assert_close(loaded(ids).logits, defaults.eval()(ids).logits, atol=1e-6, rtol=0)


def off_the_sphere_by_hand(model) -> None:
    """Every sphere weight scaled: what no optimizer step did (the model would have renormalized it)."""
    with torch.no_grad():
        for weight in model.sphere_weights().values():
            weight.mul_(1.5)


def test_weights_off_the_sphere_warn_in_training_and_save_names_the_remedy(tmp_path):
    """Weights changed by hand: a training forward warns once naming the remedy; save_pretrained
    then refuses in one message (not a list of every tensor) saying how to put them back, and
    saves after it."""
    model = tiny_ngpt()
    off_the_sphere_by_hand(model)
    ids = dataset()[1]["input_ids"][None]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(model.sphere_check_every):
            model(ids, labels=ids).loss.backward()
    found = sphere_warnings(caught)
    assert len(found) == 1 and "model.normalize_sphere_weights_()" in found[0], found
    with pytest.raises(PretrainedFileError) as info:
        model.save_pretrained(tmp_path / "saved")
    message = str(info.value)
    assert "\n" not in message and message.count(".weight'") == 1, message
    assert "16 of its 16 sphere weights have left the unit sphere" in message
    assert "spherenet.optim.normalize_(model)" in message
    assert not (tmp_path / "saved" / "model.safetensors").exists()
    model.normalize_sphere_weights_()
    model.save_pretrained(tmp_path / "saved")
    assert SpherenetNGPTForCausalLM.from_pretrained(tmp_path / "saved") is not None


def test_drift_warning_is_once_per_model_and_only_in_training(tmp_path):
    """A model off the sphere warns once per model instance; eval forwards (drifted or not)
    never check, and their logits are those of spherenet's model."""
    ids = dataset()[1]["input_ids"][None]
    for _ in range(2):  # each new model warns again, once
        model = tiny_ngpt()
        off_the_sphere_by_hand(model)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(4 * model.sphere_check_every):
                model(ids, labels=ids).loss.backward()
        assert len(sphere_warnings(caught)) == 1
    model.eval()
    checks = model.__dict__.get("_training_forwards")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3 * model.sphere_check_every):
            logits = model(ids).logits
    assert sphere_warnings(caught) == [] and model.__dict__.get("_training_forwards") == checks
    torch.testing.assert_close(logits, model.spherenet_model(ids), atol=1e-6, rtol=0)


def test_trainer_gradient_checkpointing_is_spherenets(tmp_path, monkeypatch):
    """TrainingArguments(activation_checkpointing=True) turns on spherenet's activation
    checkpointing: each training forward recomputes its two blocks."""
    import spherenet.kernels

    calls = []
    checkpoint = spherenet.kernels.checkpoint
    monkeypatch.setattr(spherenet.kernels, "checkpoint", lambda *a: calls.append(1) or checkpoint(*a))
    model = tiny_ngpt()
    train(model, arguments(tmp_path, max_steps=3, activation_checkpointing=True), callbacks=[SphereCallback()])
    assert model.is_gradient_checkpointing and len(calls) == 3 * 2


def test_sphere_callback_refuses_a_model_without_sphere_weights(tmp_path):
    torch.manual_seed(0)
    gpt = SpherenetGPTForCausalLM.from_spherenet(GPT(GPTConfig(vocab_size=VOCAB, n_layers=1, d_model=32, n_heads=4, max_seq_len=CONTEXT)))  # fmt: skip  # one model a line
    with pytest.raises(ValueError, match="GPTForCausalLM declares no sphere weights"):
        Trainer(model=gpt, args=arguments(tmp_path, max_steps=2), train_dataset=dataset(), callbacks=[SphereCallback()]).train()  # fmt: skip  # one call a line


def sphere_way(way: str, model, total_steps: int) -> dict:
    """Trainer's keyword arguments that keep ``model`` on the sphere: the callback or spherenet's optimizer."""
    if way == "callback":
        return {"callbacks": [SphereCallback()]}
    return {"optimizers": build_optimizer(model, lr=1e-2, total_steps=total_steps)}


@pytest.mark.parametrize("way", ["callback", "optimizers"])
def test_trainer_checkpoints_resume_and_continue_the_run(way, tmp_path):
    """Checkpoints every 10 steps (save_pretrained with the arguments Trainer passes); resuming
    from step 10 continues the run (the optimizer's and schedule's states too): global step 20
    and the weights and losses of the run that went straight through."""
    options = dict(max_steps=20, save_steps=10, save_strategy="steps", logging_steps=5)
    model = tiny_ngpt()
    straight, losses, _ = train(model, arguments(tmp_path / "a", **options), **sphere_way(way, model, 20))
    checkpoint = tmp_path / "a" / "checkpoint-10"
    assert json.loads((checkpoint / MANIFEST_NAME).read_text())["files"].keys() >= {"config.json", "model.safetensors"}
    resumed_model = tiny_ngpt(seed=1)  # other weights: the checkpoint's must replace them
    resumed, resumed_losses, _ = train(
        resumed_model,
        arguments(tmp_path / "b", **options),
        resume=str(checkpoint),
        **sphere_way(way, resumed_model, 20),
    )
    assert resumed.state.global_step == 20
    # steps 5 and 10 from the checkpoint's state, 15 and 20 trained again: the same losses
    assert len(losses) == 4 and resumed_losses == pytest.approx(losses, abs=1e-5)
    for (name, a), b in zip(straight.model.named_parameters(), resumed_model.parameters()):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0, msg=name)
    assert sphere_error(resumed_model) < 1e-5


class Killed(Exception):
    """The process ended here, as by kill -9: nothing after it is written."""


def test_resume_after_a_kill_while_saving_continues_from_the_last_complete_checkpoint(tmp_path, monkeypatch):
    """A run killed while Trainer writes checkpoint-10 (the model's files and sha256sums.json are
    there, trainer_state.json is not): ``resume_from_checkpoint=True`` passes over it, saying so in
    one line, and continues from checkpoint-5 exactly: the losses of steps 10 and 15 are those of the
    run that was never stopped."""
    from transformers import Trainer

    options = dict(max_steps=15, save_steps=5, save_strategy="steps", logging_steps=5)
    _, losses, _ = train(tiny_ngpt(), arguments(tmp_path / "straight", **options))
    save_rest = Trainer._save_optimizer_and_scheduler

    def killed_at_step_10(trainer, output_dir):
        if output_dir.endswith("checkpoint-10"):
            raise Killed
        save_rest(trainer, output_dir)

    monkeypatch.setattr(Trainer, "_save_optimizer_and_scheduler", killed_at_step_10)
    with pytest.raises(Killed):
        train(tiny_ngpt(), arguments(tmp_path / "run", **options))
    monkeypatch.undo()
    stopped = tmp_path / "run" / "checkpoint-10"
    assert (stopped / "model.safetensors").is_file() and (stopped / MANIFEST_NAME).is_file()
    assert not (stopped / "trainer_state.json").exists()
    resumed, resumed_losses, caught = train(tiny_ngpt(seed=1), arguments(tmp_path / "run", **options), resume=True)
    passed_over = [str(w.message) for w in caught if "checkpoint-10" in str(w.message)]
    assert len(passed_over) == 1 and "\n" not in passed_over[0] and "checkpoint-5" in passed_over[0], passed_over
    assert resumed.state.global_step == 15
    assert resumed_losses == pytest.approx(losses, abs=1e-6)


def test_resume_with_no_complete_checkpoint_stops_in_one_line_naming_the_incomplete_ones(tmp_path):
    from transformers import Trainer

    run = tmp_path / "run"
    train(tiny_ngpt(), arguments(run, max_steps=5, save_steps=5, save_strategy="steps"))
    (run / "checkpoint-5" / "trainer_state.json").unlink()
    trainer = Trainer(model=tiny_ngpt(), args=arguments(run, max_steps=10), train_dataset=dataset())
    with pytest.raises(ValueError) as info:
        trainer.train(resume_from_checkpoint=True)
    message = str(info.value)
    assert "\n" not in message and "checkpoint-5" in message and "trainer_state.json" in message, message


def test_save_pretrained_takes_transformers_arguments_and_shards(tmp_path):
    """state_dict, safe_serialization, is_main_process and max_shard_size (a sharded index the
    manifest covers, loaded back by spherenet's, the transformers class's and the Auto loader);
    variant and safe_serialization=False refused by name."""
    model = tiny_ngpt().eval()
    ids = dataset()[2]["input_ids"][None]
    expected = model(ids).logits
    model.save_pretrained(tmp_path / "other", is_main_process=False)
    assert not (tmp_path / "other").exists()
    sharded = tmp_path / "sharded"
    model.save_pretrained(sharded, state_dict=model.state_dict(), safe_serialization=True, max_shard_size="20KB")
    index = json.loads((sharded / INDEX_NAME).read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 2 and not (sharded / "model.safetensors").exists()
    assert set(json.loads((sharded / MANIFEST_NAME).read_text())["files"]) >= {INDEX_NAME, *shards}
    for loaded in (
        NGPT.from_pretrained(sharded),
        SpherenetNGPTForCausalLM.from_pretrained(sharded),
        AutoModelForCausalLM.from_pretrained(sharded, trust_remote_code=True),
    ):
        out = loaded(ids)
        torch.testing.assert_close(getattr(out, "logits", out), expected, atol=1e-6, rtol=0)
    # a damaged shard is named by the manifest
    shard = sharded / shards[1]
    raw = bytearray(shard.read_bytes())
    raw[-1] ^= 1
    shard.write_bytes(bytes(raw))
    with pytest.raises(PretrainedFileError, match=shards[1]):
        NGPT.from_pretrained(sharded)
    model.save_pretrained(sharded)  # one file again: the shards and their index are gone
    assert sorted(p.name for p in sharded.glob("model*.safetensors*")) == ["model.safetensors"]
    with pytest.raises(ValueError, match="variant='fp16' is not supported"):
        model.save_pretrained(tmp_path / "v", variant="fp16")
    with pytest.raises(ValueError, match="safe_serialization=False is not supported"):
        model.save_pretrained(tmp_path / "v", safe_serialization=False)
    with pytest.raises(ValueError, match=r"state_dict does not match.*missing \['blocks"):
        model.save_pretrained(tmp_path / "v", state_dict={k: v for k, v in model.state_dict().items() if "blocks" not in k})  # fmt: skip  # one call a line
    with pytest.raises(TypeError, match="does not take colour"):
        model.save_pretrained(tmp_path / "v", colour="red")
    assert not (tmp_path / "v").exists()


class FakeHub:
    """huggingface_hub's HfApi calls as transformers' and spherenet's push_to_hub make them,
    recorded; each upload is copied into its own folder under ``root``."""

    def __init__(self, root: Path, monkeypatch):
        self.root, self.calls, self.uploads = root, [], []
        hub = self

        def create_repo(api, repo_id, *, token=None, private=None, exist_ok=False, **kwargs):
            hub.calls.append(("create_repo", repo_id, private))
            return huggingface_hub.RepoUrl(f"https://huggingface.co/{repo_id}")

        def upload_folder(api, *, repo_id, folder_path, commit_message=None, **kwargs):
            hub.calls.append(("upload_folder", repo_id, commit_message))
            return hub._commit(repo_id, lambda target: shutil.copytree(folder_path, target))

        def create_commit(api, repo_id, operations, *, commit_message=None, **kwargs):
            hub.calls.append(("create_commit", repo_id, commit_message))

            def copy(target):
                target.mkdir()
                for op in operations:
                    shutil.copyfile(op.path_or_fileobj, target / op.path_in_repo)

            return hub._commit(repo_id, copy)

        def no_card(*args, **kwargs):
            raise huggingface_hub.errors.EntryNotFoundError("no README.md in the repository")

        monkeypatch.setattr(huggingface_hub.HfApi, "create_repo", create_repo)
        monkeypatch.setattr(huggingface_hub.HfApi, "upload_folder", upload_folder)
        monkeypatch.setattr(huggingface_hub.HfApi, "create_commit", create_commit)
        monkeypatch.setattr(huggingface_hub.ModelCard, "load", no_card)

    def _commit(self, repo_id, copy):
        target = self.root / f"upload{len(self.uploads)}"
        copy(target)
        self.uploads.append(target)
        url = f"https://huggingface.co/{repo_id}/commit/{len(self.uploads)}"
        return huggingface_hub.CommitInfo(commit_url=url, commit_message="", commit_description="", oid="0")


def test_push_to_hub_uploads_a_loadable_export(tmp_path, monkeypatch):
    """transformers' push_to_hub (with max_shard_size), spherenet's own, save_pretrained with
    push_to_hub=True and the Hub's arguments, and Trainer.push_to_hub upload folders that load;
    a model off the sphere is refused before any repository is created."""
    hub = FakeHub(tmp_path, monkeypatch)
    model = tiny_ngpt().eval()
    ids = dataset()[3]["input_ids"][None]
    expected = model(ids).logits
    model.push_to_hub("someone/tiny", max_shard_size="20KB", commit_message="first")
    model.spherenet_model.push_to_hub("someone/tiny", max_shard_size="20KB", private=True, token="t")
    model.save_pretrained(tmp_path / "local", push_to_hub=True, repo_id="someone/tiny", commit_message="third", private=True, token="t")  # fmt: skip  # one call a line
    assert hub.calls == [
        ("create_repo", "someone/tiny", None),
        ("create_commit", "someone/tiny", "first"),
        ("create_repo", "someone/tiny", True),
        ("upload_folder", "someone/tiny", "Upload model"),
        ("create_repo", "someone/tiny", True),
        ("upload_folder", "someone/tiny", "third"),
    ]
    assert (hub.uploads[0] / INDEX_NAME).is_file() and (hub.uploads[1] / INDEX_NAME).is_file()
    for folder in hub.uploads:
        torch.testing.assert_close(SpherenetNGPTForCausalLM.from_pretrained(folder)(ids).logits, expected, atol=1e-6, rtol=0)  # fmt: skip  # one check a line
    # Trainer's own push: its repository at init, save_model, then the output directory uploaded
    tuned = tiny_ngpt()
    args = arguments(tmp_path / "run", max_steps=2, push_to_hub=True, hub_model_id="someone/tuned")
    trainer, _, _ = train(tuned, args, callbacks=[SphereCallback()])
    trainer.push_to_hub(commit_message="tuned")
    assert hub.calls[-2:] == [("create_repo", "someone/tuned", None), ("upload_folder", "someone/tuned", "tuned")]
    uploaded = SpherenetNGPTForCausalLM.from_pretrained(hub.uploads[-1])
    torch.testing.assert_close(uploaded(ids).logits, tuned.eval()(ids).logits, atol=1e-6, rtol=0)
    calls = len(hub.calls)
    with torch.no_grad():
        model.embed_out.weight.mul_(1.5)
    for push in (lambda: model.push_to_hub("someone/tiny"), lambda: model.spherenet_model.push_to_hub("someone/tiny")):
        with pytest.raises(PretrainedFileError, match="cannot push NGPT: .*normalize_"):
            push()
    assert len(hub.calls) == calls  # no repository created for the refused pushes
