"""The one language-model forward (LanguageModel.forward): input embeddings, an SDPA mask,
per-row positions, per-layer caches of any kind, hidden-state capture, logits_to_keep and
activation checkpointing every n blocks; and the transformers classes, which translate their
arguments into it and share the model's modules."""

from __future__ import annotations

import copy

import pytest
import torch
from tiny_models import tiny_model

from spherenet import kernels
from spherenet.layers import KVCache

# three blocks: the checkpointing and the error messages below count them
MODELS = pytest.mark.parametrize("kind", ["ngpt", "gpt"])


def token_ids(batch=2, length=6):
    return torch.randint(0, 32, (batch, length), generator=torch.Generator().manual_seed(1))


@MODELS
def test_inputs_embeds_hidden_states_and_logits_to_keep(kind):
    model, ids = tiny_model(kind, n_layers=3).eval(), token_ids()
    with torch.no_grad():
        hidden = []
        full = model(ids, hidden_states=hidden)
        assert len(hidden) == len(model.blocks) + 1 and torch.equal(hidden[0], model.embed_in(ids))
        assert torch.equal(model(inputs_embeds=model.embed_in(ids)), full)
        assert torch.equal(model.logits(hidden[-1]), full)  # the last captured state gives the logits
        # fewer rows in the output matmul: equal up to rounding
        torch.testing.assert_close(model(ids, logits_to_keep=2), full[:, -2:])
        torch.testing.assert_close(model(ids, logits_to_keep=torch.tensor([0, 3])), full[:, [0, 3]])


@MODELS
def test_mask_and_positions_give_a_left_padded_row_its_own_logits(kind):
    model, ids = tiny_model(kind, n_layers=3).eval(), token_ids()
    padded = torch.cat([torch.zeros(1, 2, dtype=torch.long), ids[:1, :4]], 1)  # two pad tokens, then 4 real
    may_attend = torch.ones(1, 1, 6, 6, dtype=torch.bool)
    may_attend[..., :2] = False
    may_attend |= torch.eye(6, dtype=torch.bool)  # a pad query sees itself (no empty row)
    positions = torch.tensor([[0, 0, 0, 1, 2, 3]])
    with torch.no_grad():
        alone = model(ids[:1, :4])
        got = model(padded, attn_mask=may_attend, positions=positions)
    torch.testing.assert_close(got[:, 2:], alone, atol=1e-5, rtol=1e-5)


class _ListCache:
    """A cache that is not a KVCache: ``length`` and ``append`` are all the forward uses."""

    def __init__(self):
        self.keys, self.values, self.calls = [], [], 0

    @property
    def length(self):
        return sum(k.shape[-2] for k in self.keys)

    def append(self, keys, values):
        self.calls += 1
        self.keys.append(keys)
        self.values.append(values)
        return torch.cat(self.keys, -2), torch.cat(self.values, -2)


@MODELS
def test_any_cache_with_length_and_append_decodes_as_kv_cache(kind):
    model, ids = tiny_model(kind, n_layers=3).eval(), token_ids()
    with torch.no_grad():
        caches, ours = [KVCache() for _ in model.blocks], [_ListCache() for _ in model.blocks]
        want = torch.cat([model(ids[:, :4], kv_caches=caches), model(ids[:, 4:], kv_caches=caches)], 1)
        got = torch.cat([model(ids[:, :4], kv_caches=ours), model(ids[:, 4:], kv_caches=ours)], 1)
    assert torch.equal(got, want) and all(c.calls == 2 for c in ours)
    torch.testing.assert_close(want, model(ids), atol=1e-5, rtol=1e-5)


@MODELS
def test_input_errors_are_named(kind):
    model, ids = tiny_model(kind, n_layers=3).eval(), token_ids()
    with pytest.raises(ValueError, match="exactly one of input_ids and inputs_embeds"):
        model()
    with pytest.raises(ValueError, match="exactly one of input_ids and inputs_embeds"):
        model(ids, inputs_embeds=model.embed_in(ids))
    with pytest.raises(ValueError, match=r"inputs_embeds must have shape \(batch, seq_len, 16\), got \(2, 6\)"):
        model(inputs_embeds=torch.zeros(2, 6))
    with pytest.raises(ValueError, match=r"positions \(position_ids\) must have shape \(batch, 6\), got \(2, 5\)"):
        model(ids, positions=torch.zeros(2, 5, dtype=torch.long))
    with pytest.raises(ValueError, match="position 16 is past the model's context, max_seq_len=16"):
        model(ids, positions=torch.arange(11, 17)[None])
    with pytest.raises(ValueError, match="kv_caches has 1 entries, the model has 3 blocks"):
        model(ids, kv_caches=[KVCache()])
    with pytest.raises(ValueError, match="every_n_layers must be an int >= 1, got 0"):
        model.set_activation_checkpointing(True, every_n_layers=0)


def test_activation_checkpointing_every_n_blocks(monkeypatch):
    model, ids = tiny_model("ngpt", n_layers=3).train(), token_ids()
    calls = []
    checkpoint = kernels.checkpoint
    monkeypatch.setattr(kernels, "checkpoint", lambda *a: calls.append(1) or checkpoint(*a))
    plain = model(ids)
    model.set_activation_checkpointing(True, every_n_layers=2)
    assert torch.equal(model(ids), plain) and len(calls) == 2  # blocks 0 and 2 of 3
    with torch.no_grad():
        model(ids)  # no gradients: nothing to keep for a backward
    model(ids, kv_caches=[KVCache() for _ in model.blocks])  # with caches: never checkpointed
    assert len(calls) == 2


@MODELS
def test_transformers_class_shares_the_models_modules(kind):
    shf = pytest.importorskip("spherenet.hf")
    hf_class = shf.SpherenetNGPTForCausalLM if kind == "ngpt" else shf.SpherenetGPTForCausalLM
    hf = hf_class.from_spherenet(tiny_model(kind, n_layers=3).eval())
    own = hf.spherenet_model
    assert list(hf.state_dict()) == list(own.state_dict())
    hf.embed_out = copy.deepcopy(hf.embed_out)  # replaced on the transformers model
    assert own.embed_out is hf.embed_out
    own.embed_in = copy.deepcopy(own.embed_in)  # replaced on spherenet's
    assert hf.embed_in is own.embed_in and hf.get_input_embeddings() is own.embed_in
    copied = copy.deepcopy(hf)
    assert copied.spherenet_model.blocks is copied.blocks and copied.blocks is not hf.blocks
    ids = token_ids()
    with torch.no_grad():
        assert torch.equal(copied(input_ids=ids).logits, own(ids))
