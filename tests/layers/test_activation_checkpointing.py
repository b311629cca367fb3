"""Activation checkpointing per block (``set_activation_checkpointing``, ``train.activation_checkpointing``):
the same loss and gradients with less kept for the backward pass, for nGPT and GPT, under
torch.compile, FSDP2 and DDP (two gloo processes), and through recipes/train.py."""

from __future__ import annotations

import copy
import json

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from gloo import WORLD, spawn
from kernel_setting import kernels_set_to

from spherenet.layers import KVCache
from spherenet.models import from_preset

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny tensors

SHAPE = dict(vocab_size=64, d_model=32, n_heads=2, n_layers=3, max_seq_len=32)


def model_of(kind: str, **shape):
    torch.manual_seed(0)
    return from_preset(f"{kind}-tiny", **{**SHAPE, **shape}).double()


def loss_and_grads(model, ids):
    loss = F.cross_entropy(model(ids).flatten(0, 1), ids.roll(-1, 1).flatten())
    return loss.detach(), torch.autograd.grad(loss, list(model.parameters()))


@pytest.mark.parametrize("kind", ["ngpt", "gpt"])
def test_same_loss_and_gradients_with_less_kept(kind, saved_bytes):
    model = model_of(kind)
    ids = torch.randint(0, 64, (4, 32), generator=torch.Generator().manual_seed(1))
    loss, grads = loss_and_grads(model, ids)
    full = saved_bytes(model, lambda: loss_and_grads(model, ids))
    model.set_activation_checkpointing(True)
    ck_loss, ck_grads = loss_and_grads(model, ids)
    kept = saved_bytes(model, lambda: loss_and_grads(model, ids))
    torch.testing.assert_close(ck_loss, loss, rtol=1e-12, atol=1e-12)
    for got, want in zip(ck_grads, grads):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    assert kept < 0.5 * full, (kept, full)


def test_recomputation_uses_the_implementation_of_the_forward():
    """A forward under ``kernels_set_to("reference")`` whose backward runs after the ``with`` block
    recomputes the plain graph (recomputing the fused one would not match what was saved)."""
    model = model_of("ngpt")
    model.set_activation_checkpointing(True)
    ids = torch.randint(0, 64, (2, 32), generator=torch.Generator().manual_seed(2))
    with kernels_set_to("reference"):
        loss = F.cross_entropy(model(ids).flatten(0, 1), ids.roll(-1, 1).flatten())
    grads = torch.autograd.grad(loss, list(model.parameters()))
    _, want = loss_and_grads(model, ids)
    for got, expected in zip(grads, want):
        torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("kind", ["ngpt", "gpt"])
def test_kv_cached_decoding_is_unchanged(kind):
    """With caches the blocks run directly (a recomputation would append to the cache twice)."""
    model = model_of(kind)
    model.set_activation_checkpointing(True)
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(3))
    full = model(ids)
    caches = [KVCache() for _ in model.blocks]
    chunks = [model(ids[:, :7], kv_caches=caches), model(ids[:, 7:], kv_caches=caches)]
    torch.testing.assert_close(torch.cat(chunks, dim=1), full, rtol=1e-10, atol=1e-12)
    assert all(len(c) == 12 for c in caches)


@pytest.mark.slow  # ~15 s alone, mostly dynamo's first-use cost, which the suite's other compile tests share
def test_compiled_fullgraph_with_checkpointing_and_fused_functions_matches_eager():
    """torch.compile(fullgraph=True) traces the checkpointed blocks with the fused autograd
    functions inside, forward and backward (``aot_eager``: the graphs inductor would get,
    without its code generation)."""
    model = model_of("ngpt", n_layers=1).float()
    ids = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(4))
    loss, grads = loss_and_grads(model, ids)
    model.set_activation_checkpointing(True)
    c_loss, c_grads = loss_and_grads(torch.compile(model, fullgraph=True, backend="aot_eager"), ids)
    torch.testing.assert_close(c_loss, loss, rtol=1e-5, atol=1e-5)
    for got, want in zip(c_grads, grads):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


def test_recipe_trains_the_same_with_checkpointing(tmp_path):
    from recipes.train import cli

    text = tmp_path / "corpus.txt"
    text.write_text("\n\n".join(f"paragraph {i} of the unit sphere and its geodesics." * 3 for i in range(200)))
    common = ["model.preset=ngpt-tiny", "model.max_seq_len=16", "train.batch_size=4", "train.steps=2",
              "train.log_every=1", "train.eval_every=100", "train.checkpoint_every=100", "train.sample_tokens=0",
              "train.progress=false", f"data.source={text}", f"data.cache_dir={tmp_path / 'cache'}"]  # fmt: skip  # options beside their values
    losses = {}
    for flag in ("false", "true"):
        out = tmp_path / flag
        assert cli([*common, f"train.out_dir={out}", f"train.activation_checkpointing={flag}"]) == 0
        with (out / "metrics.jsonl").open() as f:
            losses[flag] = [r["loss"] for r in map(json.loads, f) if "loss" in r]
    assert len(losses["true"]) == 2
    assert losses["true"] == pytest.approx(losses["false"], abs=1e-6)


# ------------------------------------------------------------- two gloo processes, FSDP2 / DDP


def _train(rank: int, parallel: str, checkpointing: bool) -> list[torch.Tensor]:
    from spherenet.optim import RiemannianAdam
    from spherenet.train.distributed import DistInfo, wrap_model

    model = model_of("ngpt", vocab_size=32, n_layers=2, max_seq_len=16)
    model.set_activation_checkpointing(checkpointing)
    wrapped = wrap_model(model, parallel, DistInfo(rank, WORLD, rank, torch.device("cpu")))
    optimizer = RiemannianAdam(model, lr=1e-2)
    for step in range(2):
        ids = torch.randint(0, 32, (2, 16), generator=torch.Generator().manual_seed(100 * step + rank))
        F.cross_entropy(wrapped(ids).flatten(0, 1), ids.roll(-1, 1).flatten()).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return [(p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone() for p in model.parameters()]


def _worker(rank: int) -> None:
    start = [p.detach().clone() for p in model_of("ngpt", vocab_size=32, n_layers=2, max_seq_len=16).parameters()]
    for parallel in ("fsdp", "ddp"):
        plain, checkpointed = _train(rank, parallel, False), _train(rank, parallel, True)
        for a, b in zip(checkpointed, plain):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
        assert not torch.equal(copy.copy(plain[0]), start[0])  # the steps did move the weights


@pytest.mark.distributed
@pytest.mark.slow  # two processes
@pytest.mark.skipif(not dist.is_available(), reason="torch.distributed unavailable")
def test_fsdp2_and_ddp_train_the_same_with_checkpointing():
    spawn(_worker)
