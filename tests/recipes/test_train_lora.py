"""LoRA fine-tuning in recipes.train (train.lora_*): the adapters train while the weights stay
frozen, checkpoints and exports hold the merged model (unit rows for the sphere-aware LoRA),
--resume continues the adapters as an uninterrupted run does, and bad keys get one clear error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("peft")
pytest.importorskip("safetensors")

from recipes import export  # noqa: E402
from recipes.checkpoints import load_trained  # noqa: E402
from recipes.train import cli as train_cli  # noqa: E402
from spherenet.models import load_pretrained  # noqa: E402
from spherenet.train.config import ConfigError, load_config  # noqa: E402

TINY = [
    "model.max_seq_len=32",
    "train.batch_size=4",
    "train.eval_every=2",
    "train.eval_batches=1",
    "train.sample_tokens=0",
    "train.progress=false",
    "train.checkpoint_every=2",
]
PROJECTIONS = ("attn.w_q", "attn.w_k", "attn.w_v", "attn.w_o", "mlp.w_u", "mlp.w_v", "mlp.w_o")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("lora")
    text = "\n\n".join(f"paragraph {i}: the adapters move the sphere by small angles {i % 7}" for i in range(300))
    (root / "c.txt").write_text(text)
    return root


def train(corpus: Path, out: Path, *extra: str) -> int:
    return train_cli(
        [*TINY, f"train.out_dir={out}", f"data.source={corpus / 'c.txt'}", f"data.cache_dir={corpus / 'cache'}", *extra]
    )


@pytest.fixture(scope="module")
def bases(corpus):
    """``{preset: exported directory}`` of a briefly trained tiny nGPT and GPT."""
    out = {}
    for preset in ("ngpt-tiny", "gpt-tiny"):
        run = corpus / f"base-{preset}"
        assert train(corpus, run, f"model.preset={preset}", "train.steps=2") == 0
        assert export.main([str(run), str(corpus / f"export-{preset}")]) == 0
        out[preset] = corpus / f"export-{preset}"
    return out


def lora_run(corpus, bases, out, preset="ngpt-tiny", *extra):
    return train(
        corpus,
        out,
        f"model.preset={preset}",
        f"train.init_from={bases[preset]}",
        "train.lora_rank=4",
        "train.steps=4",
        "optim.lr=1e-2",
        *extra,
    )


@pytest.mark.parametrize("preset,sphere_aware", [("ngpt-tiny", True), ("ngpt-tiny", False), ("gpt-tiny", False)])
def test_lora_run_trains_adapters_and_checkpoints_the_merged_model(
    corpus, bases, tmp_path, capsys, preset, sphere_aware
):
    out = tmp_path / "ft"
    assert lora_run(corpus, bases, out, preset, f"train.lora_sphere_aware={str(sphere_aware).lower()}") == 0
    printed = capsys.readouterr().out
    kind = "sphere-aware" if sphere_aware else "plain"
    base = load_pretrained(bases[preset])
    n_proj = len(PROJECTIONS) * base.config.n_layers
    assert f"lora: {kind} rank-4 adapters on {n_proj} projections" in printed
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert {r["step"] for r in records if "val_loss" in r} == {2, 4}
    tuned = load_trained(out).model  # the checkpoint's model: merged, an ordinary NGPT / GPT
    assert type(tuned) is type(base)
    changed = {n for (n, p), q in zip(base.named_parameters(), tuned.parameters()) if not torch.equal(p, q)}
    adapted = {f"blocks.{i}.{w}.weight" for i in range(base.config.n_layers) for w in PROJECTIONS}
    assert changed == adapted  # every projection, nothing else (embeddings, output layer, scalings frozen)
    if preset.startswith("ngpt"):
        norms = {n: w.norm(dim=-1) for n, w in tuned.sphere_weights().items()}
        off = {n for n, v in norms.items() if not torch.allclose(v, torch.ones_like(v), atol=1e-5)}
        assert off == (set() if sphere_aware else adapted), off
    exported = tmp_path / "exported"
    if preset.startswith("ngpt") and not sphere_aware:
        assert export.main([str(out), str(exported)]) == 2
        assert "plain LoRA of nGPT" in capsys.readouterr().err
        return
    assert export.main([str(out), str(exported)]) == 0  # the export is the merged model
    for p, q in zip(load_pretrained(exported).parameters(), tuned.parameters()):
        assert torch.equal(p, q)


@pytest.mark.slow
def test_lora_resume_continues_as_an_uninterrupted_run(corpus, bases, tmp_path):
    whole, halted = tmp_path / "whole", tmp_path / "halted"
    assert lora_run(corpus, bases, whole) == 0
    assert lora_run(corpus, bases, halted, "ngpt-tiny", "train.halt_after=2") == 0
    assert load_trained(halted).step == 2
    assert lora_run(corpus, bases, halted, "ngpt-tiny", "--resume") == 0
    a, b = load_trained(whole), load_trained(halted)
    assert a.step == b.step == 4
    for (name, p), q in zip(a.model.named_parameters(), b.model.parameters()):
        torch.testing.assert_close(q, p, rtol=0, atol=1e-6, msg=name)
    assert lora_run(corpus, bases, halted, "ngpt-tiny", "--resume", "train.lora_rank=2", "train.steps=6") == 2


@pytest.mark.slow
def test_lora_under_torch_compile_trains_as_the_eager_run(corpus, bases, tmp_path):
    eager, compiled = tmp_path / "eager", tmp_path / "compiled"
    assert lora_run(corpus, bases, eager, "ngpt-tiny", "optim.lr=5e-2") == 0
    assert lora_run(corpus, bases, compiled, "ngpt-tiny", "optim.lr=5e-2", "train.compile=true") == 0

    def val_losses(run):
        records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        return [r["val_loss"] for r in records if "val_loss" in r]

    assert val_losses(compiled) == pytest.approx(val_losses(eager), abs=1e-5)
    base = load_pretrained(bases["ngpt-tiny"])
    a, b = load_trained(eager).model, load_trained(compiled).model
    moved = 0
    for (name, p), q, w in zip(a.named_parameters(), b.parameters(), base.parameters()):
        torch.testing.assert_close(q, p, rtol=0, atol=1e-4, msg=name)  # inductor rounds otherwise; moves are ~0.07
        moved += not torch.equal(p, w)
    assert moved == len(PROJECTIONS) * base.config.n_layers  # the adapters trained, merged into every projection


def test_lora_keys_are_checked_with_one_clear_error(corpus, bases, tmp_path, capsys):
    def config_error(*overrides):
        with pytest.raises(ConfigError) as info:
            load_config(None, list(overrides))
        return str(info.value)

    assert "set train.init_from" in config_error("train.lora_rank=4")
    assert "train.lora_rank must be >= 0" in config_error("train.lora_rank=-1")
    assert "not fsdp" in config_error("train.lora_rank=4", "train.init_from=x", "train.parallel=fsdp")
    assert "'all-linear' stands alone" in config_error(
        "train.lora_rank=4", "train.init_from=x", "train.lora_targets=[all-linear,w_q]"
    )
    assert "must name modules" in config_error("train.lora_rank=4", "train.init_from=x", "train.lora_targets=[]")
    assert lora_run(corpus, bases, tmp_path / "a", "gpt-tiny") == 2  # sphere-aware is the default
    assert "no SphereLinear to adapt" in capsys.readouterr().err
    assert lora_run(corpus, bases, tmp_path / "b", "ngpt-tiny", "train.lora_targets=[w_nothing]") == 2
    assert "train.lora_targets=['w_nothing']" in capsys.readouterr().err
