"""The transformers calls users reach for beyond forward and save: gradient checkpointing
(spherenet's activation checkpointing), resize_token_embeddings (nGPT's new rows on the sphere),
attn_implementation (SDPA only, others refused by name), generate past the context (sliding as
spherenet's generate does) and batched generation with an export's pad token."""

import json

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

import spherenet.kernels  # noqa: E402
from recipes.checkpoints import Trained  # noqa: E402
from recipes.export import export  # noqa: E402
from spherenet.data.tokenizer_classes import ByteTokenizer  # noqa: E402
from spherenet.hf import SpherenetGPTForCausalLM, SpherenetNGPTForCausalLM  # noqa: E402
from spherenet.manifolds import Sphere  # noqa: E402
from spherenet.models import GPT, NGPT, GPTConfig, NGPTConfig  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

VOCAB, CONTEXT = 256, 16  # the byte tokenizer's vocabulary
MODELS = pytest.mark.parametrize("cls", [NGPT, GPT], ids=["ngpt", "gpt"])


def tiny(cls, seed=0):
    """A tiny spherenet model with its scalings moved off their initial values, as training would."""
    torch.manual_seed(seed)
    config_class = NGPTConfig if cls is NGPT else GPTConfig
    model = cls(config_class(vocab_size=VOCAB, n_layers=2, d_model=32, n_heads=4, max_seq_len=CONTEXT)).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 1:
                p.mul_(1 + 0.5 * torch.rand_like(p))
    return model


def hf(model):
    return (SpherenetNGPTForCausalLM if isinstance(model, NGPT) else SpherenetGPTForCausalLM).from_spherenet(model)


def ids_of(shape, seed=1):
    return torch.randint(0, VOCAB, shape, generator=torch.Generator().manual_seed(seed))


@MODELS
def test_gradient_checkpointing_is_spherenets_and_gives_the_same_gradients(cls, monkeypatch):
    model = hf(tiny(cls)).train()
    ids = ids_of((2, 12))

    def gradients():
        model.zero_grad()
        model(ids, labels=ids).loss.backward()
        return {name: p.grad.clone() for name, p in model.named_parameters()}

    plain = gradients()
    calls = []
    checkpoint = spherenet.kernels.checkpoint
    monkeypatch.setattr(spherenet.kernels, "checkpoint", lambda *a: calls.append(1) or checkpoint(*a))
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    assert model.is_gradient_checkpointing and model.spherenet_model.activation_checkpointing
    checkpointed = gradients()
    assert len(calls) == 2  # one per block
    hidden = model(ids, output_hidden_states=True).hidden_states
    assert len(hidden) == 3 and len(calls) == 4  # the embedding and each block's output, checkpointed too
    for name, grad in plain.items():
        torch.testing.assert_close(checkpointed[name], grad, atol=1e-6, rtol=1e-5, msg=name)
    with torch.no_grad():
        model(ids)  # no gradients: nothing to recompute
    assert len(calls) == 4
    model.gradient_checkpointing_disable()
    assert not model.is_gradient_checkpointing
    gradients()
    assert len(calls) == 4
    model.activation_checkpointing_enable(every_n_layers=2)  # transformers' newer name: block 0 of 2
    for name, grad in gradients().items():
        torch.testing.assert_close(grad, plain[name], atol=1e-6, rtol=1e-5, msg=name)
    assert len(calls) == 5
    model.activation_checkpointing_disable()
    assert not model.is_gradient_checkpointing
    with pytest.raises(ValueError, match="non-reentrant"):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    with pytest.raises(ValueError, match="offload=True is not supported"):
        model.activation_checkpointing_enable(offload=True)


@MODELS
def test_resize_token_embeddings_keeps_old_logits_and_inits_new_rows_as_the_model_does(cls, tmp_path):
    model = hf(tiny(cls))
    ids = ids_of((2, 10))
    before = model(ids).logits
    embedding = model.resize_token_embeddings(VOCAB + 700, pad_to_multiple_of=64)
    new_vocab = 960  # 956 rounded up to a multiple of 64
    assert embedding is model.get_input_embeddings() and embedding.weight.shape == (new_vocab, 32)
    assert model.config.vocab_size == new_vocab and model.spherenet_model.config.vocab_size == new_vocab
    assert model.get_output_embeddings().weight.shape == (new_vocab, 32)
    after = model(ids).logits
    assert after.shape == (2, 10, new_vocab)
    torch.testing.assert_close(after[..., :VOCAB], before, atol=1e-6, rtol=0)
    new_rows = [model.embed_in.weight[VOCAB:].detach(), model.embed_out.weight[VOCAB:].detach()]
    if cls is NGPT:
        assert all(float(Sphere.norm_error(rows)) < 1e-5 for rows in new_rows)  # unit rows
        assert torch.equal(model.s_z.param[VOCAB:], torch.full((new_vocab - VOCAB,), model.s_z.scale))
    else:
        for rows in new_rows:  # Normal(0, init_std), as GPT.init_weights
            assert float(rows.std()) == pytest.approx(model.config.init_std, rel=0.05)
            assert abs(float(rows.mean())) < 0.1 * model.config.init_std
    assert not any(torch.equal(a, b) for a, b in zip(new_rows[0][:5], new_rows[0][5:10]))  # random, not copies
    model.save_pretrained(tmp_path)  # on the sphere and the new size: saves and loads back
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, trust_remote_code=True)
    assert loaded.config.vocab_size == new_vocab
    torch.testing.assert_close(loaded(ids).logits, after, atol=1e-6, rtol=0)
    first_rows = hf(tiny(cls))(ids % 100).logits[..., :100]
    model.resize_token_embeddings(100)  # shrinking keeps the first rows
    assert model.config.vocab_size == 100
    torch.testing.assert_close(model(ids % 100).logits, first_rows, atol=1e-6, rtol=0)


def test_attn_implementation_other_than_sdpa_is_refused_by_name(tmp_path):
    tiny(NGPT).save_pretrained(tmp_path)
    for call in (
        lambda: AutoModelForCausalLM.from_pretrained(tmp_path, trust_remote_code=True, attn_implementation="eager"),
        lambda: SpherenetNGPTForCausalLM.from_pretrained(tmp_path, attn_implementation="eager"),
        lambda: SpherenetNGPTForCausalLM.from_pretrained(tmp_path).set_attn_implementation("eager"),
    ):
        with pytest.raises(ValueError, match=r"attn_implementation='eager' is not supported.*SDPA.*'sdpa'") as info:
            call()
        assert "\n" not in str(info.value)
    model = AutoModelForCausalLM.from_pretrained(tmp_path, trust_remote_code=True, attn_implementation="sdpa")
    assert model.config._attn_implementation == "sdpa"
    config = model.config.__class__.from_dict(model.config.to_dict())
    config._attn_implementation = "flash_attention_2"
    with pytest.raises(ValueError, match="attn_implementation='flash_attention_2' is not supported"):
        SpherenetNGPTForCausalLM(config)


@MODELS
def test_generate_slides_past_the_context_as_spherenets_generate(cls):
    """Greedy tokens past max_seq_len, and from a prompt longer than it, are spherenet's own."""
    reference = tiny(cls)
    model = hf(reference).eval()
    for prompt in (ids_of((2, 10)), ids_of((1, CONTEXT + 5), seed=2)):
        out = model.generate(prompt, max_new_tokens=2 * CONTEXT, do_sample=False, pad_token_id=0)
        assert out.shape[1] == prompt.shape[1] + 2 * CONTEXT
        assert out.tolist() == reference.generate(prompt, 2 * CONTEXT, temperature=0).tolist()


def test_an_export_has_a_pad_token_for_batched_generation(tmp_path):
    reference = tiny(NGPT)
    export(Trained(reference, ByteTokenizer(), {}, 0, tmp_path / "step_0"), tmp_path / "export")
    tokenizer_config = json.loads((tmp_path / "export" / "tokenizer_config.json").read_text())
    assert tokenizer_config["pad_token"] == tokenizer_config["eos_token"]
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "export")
    assert tokenizer.pad_token is not None and tokenizer.pad_token_id == tokenizer.eos_token_id
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "export", trust_remote_code=True)
    texts = ["Hi", "Hello there"]
    batch = tokenizer(texts, return_tensors="pt", padding=True, padding_side="left")
    out = model.generate(**batch, max_new_tokens=6, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    width = batch["input_ids"].shape[1]
    for row, text in zip(out, texts):
        prompt = torch.tensor([tokenizer(text)["input_ids"]])
        assert row[width:].tolist() == reference.generate(prompt, 6, temperature=0)[0, prompt.shape[1] :].tolist()


@MODELS
def test_num_parameters_leaves_out_the_input_embedding_as_transformers_counts(cls, tmp_path):
    """transformers' ``num_parameters(exclude_embeddings=True)`` leaves out its models' input
    embedding: so does spherenet's class (nGPT's is a SphereEmbedding, not an nn.Embedding), and
    both counts equal the export's own class's."""
    from spherenet.hf.portable import modeling_spherenet as portable

    model = hf(tiny(cls))
    total = sum(p.numel() for p in model.parameters())
    assert model.num_parameters() == total
    assert model.num_parameters(exclude_embeddings=True) == total - VOCAB * 32
    model.spherenet_model.save_pretrained(tmp_path)
    exported = getattr(portable, type(model).__name__).from_pretrained(tmp_path)
    for exclude in (False, True):
        assert exported.num_parameters(exclude_embeddings=exclude) == model.num_parameters(exclude_embeddings=exclude)
    model.embed_out.weight.requires_grad_(False)
    assert model.num_parameters(only_trainable=True, exclude_embeddings=True) == total - 2 * VOCAB * 32
