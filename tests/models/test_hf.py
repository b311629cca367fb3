"""spherenet's models as transformers classes (spherenet.hf): the export's auto_map, the forward
contract (padding, positions, Cache, labels, inputs_embeds, logits_to_keep), generation and
pipelines, and what a directory that is not an export gets."""

import json

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from fresh_python import run_script  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, DynamicCache, TextStreamer, pipeline  # noqa: E402

import spherenet.hf as shf  # noqa: E402
from recipes.checkpoints import Trained  # noqa: E402
from recipes.export import export  # noqa: E402
from spherenet.data.tokenizer_classes import ByteTokenizer  # noqa: E402
from spherenet.hf import (  # noqa: E402
    SpherenetGPTConfig,
    SpherenetGPTForCausalLM,
    SpherenetNGPTConfig,
    SpherenetNGPTForCausalLM,
)
from spherenet.io import PORTABLE_MODELING  # noqa: E402
from spherenet.models import GPT, NGPT, GPTConfig, NGPTConfig, PretrainedFileError  # noqa: E402

VOCAB = 256  # the byte tokenizer's


def tiny(cls, seed=0):
    """A tiny model whose scalings are moved off their initial values, as training would, so
    that a wrong position or mask changes its logits."""
    torch.manual_seed(seed)
    config_class = NGPTConfig if cls is NGPT else GPTConfig
    model = cls(config_class(vocab_size=VOCAB, n_layers=2, d_model=32, n_heads=4, max_seq_len=48)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1:
                p.mul_(1 + 0.5 * torch.rand_like(p))
    return model


MODELS = pytest.mark.parametrize("cls", [NGPT, GPT], ids=["ngpt", "gpt"])


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """``{cls: directory}``: each model exported by recipes.export with the byte tokenizer."""
    out = {}
    for cls in (NGPT, GPT):
        base = tmp_path_factory.mktemp(cls.__name__)
        trained = Trained(tiny(cls), ByteTokenizer(), {}, 0, base / "step_0")
        export(trained, base / "export")
        out[cls] = base / "export"
    return out


def test_export_carries_auto_map_modeling_file_and_card(exported):
    for cls, directory in exported.items():
        config = json.loads((directory / "config.json").read_text())
        assert config["model_type"] == f"spherenet-{cls.model_type}"
        assert config["auto_map"] == {
            "AutoConfig": f"configuration_spherenet.Spherenet{cls.__name__}Config",
            "AutoModelForCausalLM": f"modeling_spherenet.Spherenet{cls.__name__}ForCausalLM",
        }
        for name in (
            "configuration_spherenet.py",
            "guards_spherenet.py",
            "modeling_spherenet.py",
        ):  # no spherenet import
            code = (directory / name).read_text()
            assert code == PORTABLE_MODELING.with_name(name).read_text() and "import spherenet" not in code
        assert "trust_remote_code=True" in (directory / "README.md").read_text()
        hf_config = AutoConfig.from_pretrained(directory)
        assert hf_config.model_type == f"spherenet-{cls.model_type}" and hf_config.hidden_size == 32
        assert hf_config.spherenet_config() == tiny(cls).config


@MODELS
def test_logits_equal_spherenet_models(cls, exported):
    reference = tiny(cls)
    model = AutoModelForCausalLM.from_pretrained(exported[cls], trust_remote_code=True)
    assert isinstance(model, SpherenetNGPTForCausalLM if cls is NGPT else SpherenetGPTForCausalLM)
    ids = torch.randint(0, VOCAB, (3, 11), generator=torch.Generator().manual_seed(1))
    out = model(ids)
    torch.testing.assert_close(out.logits, reference(ids), atol=1e-5, rtol=0)
    assert isinstance(out.cache, DynamicCache) and out.cache.get_seq_length() == 11
    assert model(ids, logits_to_keep=2, use_cache=False).logits.shape == (3, 2, VOCAB)
    embeds = model.get_input_embeddings()(ids)
    torch.testing.assert_close(model(inputs_embeds=embeds).logits, out.logits, atol=1e-6, rtol=0)


@MODELS
def test_padded_rows_give_the_logits_of_the_row_alone(cls):
    reference = tiny(cls)
    model = SpherenetNGPTForCausalLM.from_spherenet(reference) if cls is NGPT else None
    model = model or SpherenetGPTForCausalLM.from_spherenet(reference)
    rows = [torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(n)) for n in (9, 5, 2)]
    width = max(len(r) for r in rows)
    for side in ("left", "right"):
        ids = torch.zeros(len(rows), width, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, r in enumerate(rows):
            where = slice(width - len(r), width) if side == "left" else slice(0, len(r))
            ids[i, where], mask[i, where] = r, 1
        logits = model(ids, attention_mask=mask).logits
        assert torch.isfinite(logits).all()
        for i, r in enumerate(rows):
            where = slice(width - len(r), width) if side == "left" else slice(0, len(r))
            torch.testing.assert_close(logits[i, where], reference(r[None])[0], atol=1e-5, rtol=0)


def test_positions_count_from_the_first_real_token():
    """Without the per-row positions (a left-padded row at positions 3..), a trained nGPT's
    logits differ: the check above could not pass by accident."""
    reference = tiny(NGPT)
    model = SpherenetNGPTForCausalLM.from_spherenet(reference)
    row = torch.randint(0, VOCAB, (1, 6), generator=torch.Generator().manual_seed(3))
    ids, mask = torch.cat([torch.zeros(1, 3, dtype=torch.long), row], 1), torch.tensor([[0, 0, 0] + [1] * 6])
    shifted = model(ids, attention_mask=mask, position_ids=torch.arange(9)[None]).logits[0, 3:]
    assert (shifted - reference(row)[0]).abs().max() > 1e-3
    assert shf.modeling.positions_from_mask(mask, 9).tolist() == [[0, 0, 0, 0, 1, 2, 3, 4, 5]]


@MODELS
def test_cache_continues_the_sequence_exactly(cls):
    reference = tiny(cls)
    model = SpherenetNGPTForCausalLM.from_spherenet(reference) if cls is NGPT else None
    model = model or SpherenetGPTForCausalLM.from_spherenet(reference)
    ids = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(4))
    full = reference(ids)
    cache = DynamicCache(config=model.config)
    first = model(ids[:, :7], cache=cache).logits
    second = model(ids[:, 7:10], past_key_values=cache).logits  # the older name of the argument
    third = model(ids[:, 10:], cache=cache, attention_mask=torch.ones(2, 12, dtype=torch.long)).logits
    torch.testing.assert_close(torch.cat([first, second, third], 1), full, atol=1e-5, rtol=0)
    assert cache.get_seq_length() == 12
    with pytest.raises(ValueError, match="not both"):
        model(ids[:, :1], cache=cache, past_key_values=cache)


@MODELS
def test_labels_give_the_shifted_loss_ignoring_minus_100(cls):
    model = SpherenetNGPTForCausalLM.from_spherenet(tiny(cls)) if cls is NGPT else None
    model = model or SpherenetGPTForCausalLM.from_spherenet(tiny(cls))
    ids = torch.randint(0, VOCAB, (2, 8), generator=torch.Generator().manual_seed(5))
    labels = ids.clone()
    labels[0, 5:] = -100
    out = model(ids, labels=labels, use_cache=False)
    logits, targets = out.logits[:, :-1].reshape(-1, VOCAB), labels[:, 1:].reshape(-1)
    expected = torch.nn.functional.cross_entropy(logits, targets, ignore_index=-100)
    torch.testing.assert_close(out.loss, expected)
    out.loss.backward()
    assert model.embed_in.weight.grad is not None and out.cache is None


@MODELS
def test_greedy_generate_gives_spherenet_tokens(cls):
    reference = tiny(cls)
    model = SpherenetNGPTForCausalLM.from_spherenet(reference) if cls is NGPT else None
    model = model or SpherenetGPTForCausalLM.from_spherenet(reference)
    short, long = torch.tensor([[5, 6, 7]]), torch.tensor([[9, 8, 7, 6, 5, 4]])
    batch = torch.cat([torch.zeros(1, 3, dtype=torch.long), short], 1)
    batch = torch.cat([batch, long])
    mask = torch.tensor([[0, 0, 0, 1, 1, 1], [1] * 6])
    out = model.generate(batch, attention_mask=mask, max_new_tokens=8, do_sample=False, pad_token_id=0)
    assert out[0, 3:].tolist() == reference.generate(short, 8, temperature=0)[0].tolist()
    assert out[1].tolist() == reference.generate(long, 8, temperature=0)[0].tolist()


def test_sampling_beam_search_streamer_and_pipeline(exported, capsys):
    directory = exported[NGPT]
    model = AutoModelForCausalLM.from_pretrained(directory, trust_remote_code=True)
    tokenizer = AutoTokenizer.from_pretrained(directory)
    ids = torch.tensor([tokenizer("Hello").input_ids])
    assert ids.tolist() == [list(b"Hello")]  # byte tokenizer: token id = byte
    torch.manual_seed(0)
    sampled = model.generate(ids, max_new_tokens=6, do_sample=True, top_k=20, temperature=0.9, pad_token_id=0)
    beams = model.generate(ids, max_new_tokens=6, num_beams=3, do_sample=False, pad_token_id=0)
    assert sampled.shape == beams.shape == (1, 11) and sampled[0, :5].tolist() == beams[0, :5].tolist()
    greedy = model.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=0, streamer=TextStreamer(tokenizer))
    assert capsys.readouterr().out.startswith("Hello")
    generator = pipeline("text-generation", model=str(directory), trust_remote_code=True, device="cpu")
    assert generator("Hello", max_new_tokens=6, do_sample=False)[0]["generated_text"].startswith("Hello")
    tokens = generator("Hello", max_new_tokens=6, do_sample=False, return_tensors=True)[0]["generated_token_ids"]
    assert list(tokens) == greedy[0].tolist()


# transformers alone (spherenet unimportable, so its classes are not registered): how many times
# AutoTokenizer asks whether to run the export's code (stdin answered "n"), and what it loads
_TOKENIZER_PROMPTS = """
import builtins, json, sys

asked = []
builtins.input = lambda prompt="": asked.append(prompt) or "n"
from transformers import AutoTokenizer

directory, how = json.loads(sys.argv[1])
tokenizer = AutoTokenizer.from_pretrained(directory, **how)
print("RESULT", json.dumps({"asked": len(asked), "ids": tokenizer("Hello").input_ids, "eos": tokenizer.eos_token}))
"""


@pytest.mark.parametrize("how, asked", [({}, 1), ({"trust_remote_code": False}, 0), ({"trust_remote_code": True}, 0)])
def test_auto_tokenizer_asks_about_the_exports_code_unless_told_and_loads_the_byte_tokenizer(
    exported, how, asked, tmp_path
):
    """What the README says to pass: transformers 5's AutoTokenizer reads config.json through AutoConfig
    (whose ``auto_map`` names the export's code) before the tokenizer's own files, so without
    ``trust_remote_code`` it asks; either value loads the same fast tokenizer without asking."""
    out = run_script(_TOKENIZER_PROMPTS, [str(exported[NGPT]), how], tmp_path, spherenet=False, timeout=120)
    assert out == {"asked": asked, "ids": list(b"Hello"), "eos": "<0xFF>"}


# spherenet installed, nothing of it imported: the README's first call, then spherenet's tools on what it returns
_EXPORT_BEFORE_SPHERENET = """
import json, sys
import torch
from transformers import AutoModelForCausalLM

ngpt, gpt, ids = json.loads(sys.argv[1])
model = AutoModelForCausalLM.from_pretrained(ngpt, trust_remote_code=True)
baseline = AutoModelForCausalLM.from_pretrained(gpt, trust_remote_code=True)
result = {"classes": [f"{type(m).__module__}.{type(m).__name__}" for m in (model, baseline)]}
result["config"] = f"{type(model.config).__module__}.{type(model.config).__name__}"
result["config_auto_class"] = type(model.config)._auto_class
with torch.no_grad():
    result["logits"] = model(torch.tensor(ids)).logits.tolist()
from peft import get_peft_model
from spherenet.hf import SphereCallback
from spherenet.hf.lora import sphere_lora_config

SphereCallback().on_train_begin(None, None, None, model=model)  # refuses a model that declares no sphere weights
model.gradient_checkpointing_enable()
result["checkpointing"] = model.is_gradient_checkpointing
model.resize_token_embeddings(model.config.vocab_size + 8)
result["vocab_size"] = model.config.vocab_size
try:
    AutoModelForCausalLM.from_pretrained(ngpt, trust_remote_code=True, attn_implementation="eager")
except ValueError as error:
    result["eager"] = str(error)
adapted = get_peft_model(model, sphere_lora_config(model, r=2))
result["lora"] = sorted({type(m).__name__ for m in adapted.modules() if hasattr(m, "lora_A")})
print("RESULT", json.dumps(result))
"""


def test_an_export_loaded_before_spherenet_is_imported_is_spherenets_class(exported, tmp_path):
    """Where spherenet is installed, the export's code is spherenet's classes whatever was imported
    first: every spherenet tool takes the model, and it behaves as spherenet's."""
    ids = [[1, 2, 3, 4, 5]]
    out = run_script(_EXPORT_BEFORE_SPHERENET, [str(exported[NGPT]), str(exported[GPT]), ids], tmp_path, True)
    assert out["classes"] == ["spherenet.hf.modeling.SpherenetNGPTForCausalLM", "spherenet.hf.modeling.SpherenetGPTForCausalLM"]  # fmt: skip  # one expectation a line
    assert out["config"] == "spherenet.hf.configuration.SpherenetNGPTConfig" and out["config_auto_class"] is None
    with torch.no_grad():
        torch.testing.assert_close(torch.tensor(out["logits"]), tiny(NGPT)(torch.tensor(ids)), atol=1e-5, rtol=0)
    assert out["checkpointing"] is True and out["vocab_size"] == VOCAB + 8
    assert "attn_implementation='eager' is not supported" in out["eager"]
    assert out["lora"] == ["SphereLoraLinear"]


# spherenet installed, but its transformers module does not import (as with a transformers it does not support)
_SPHERENET_HF_BROKEN = """
import importlib.abc, json, sys, warnings

class BrokenHf(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "spherenet.hf":
            raise ImportError("spherenet.hf needs transformers>=5.24,<6; installed: transformers 9.0")

sys.meta_path.insert(0, BrokenHf())
import torch
from transformers import AutoModelForCausalLM

directory, ids = json.loads(sys.argv[1])
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("default")  # as a user sees warnings: once where they are raised
    model = AutoModelForCausalLM.from_pretrained(directory, trust_remote_code=True)
with torch.no_grad():
    logits = model(torch.tensor(ids)).logits.tolist()
print("RESULT", json.dumps({
    "class": type(model).__module__.rpartition(".")[2] + "." + type(model).__name__,
    "warned": [str(w.message) for w in caught if "spherenet" in str(w.message)],
    "logits": logits,
}))
"""


def test_where_spherenet_hf_does_not_import_the_exports_own_classes_run_and_say_why(exported, tmp_path):
    ids = [[1, 2, 3, 4, 5]]
    out = run_script(_SPHERENET_HF_BROKEN, [str(exported[NGPT]), ids], tmp_path, spherenet=True)
    assert out["class"] == "modeling_spherenet.SpherenetNGPTForCausalLM"
    assert len(out["warned"]) == 1 and "installed: transformers 9.0" in out["warned"][0], out["warned"]
    assert "the export's own classes run, which spherenet's tools do not take" in out["warned"][0]
    with torch.no_grad():
        torch.testing.assert_close(torch.tensor(out["logits"]), tiny(NGPT)(torch.tensor(ids)), atol=1e-5, rtol=0)


def test_save_pretrained_writes_the_export_layout(tmp_path):
    model = SpherenetGPTForCausalLM.from_spherenet(tiny(GPT))
    model.save_pretrained(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "config.json",
        "configuration_spherenet.py",
        "guards_spherenet.py",
        "model.safetensors",
        "modeling_spherenet.py",
        "sha256sums.json",
    ]
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    ids = torch.tensor([[1, 2, 3, 4]])
    torch.testing.assert_close(loaded(ids).logits, model(ids).logits, atol=0, rtol=0)


def test_a_directory_that_is_not_a_spherenet_export_is_named(tmp_path, exported):
    llama = tmp_path / "llama"
    llama.mkdir()
    (llama / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}))
    with pytest.raises(PretrainedFileError, match=r"is not a spherenet export: its config.json has model_type 'llama'"):
        SpherenetNGPTForCausalLM.from_pretrained(llama)
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "weights.bin").write_bytes(b"")
    with pytest.raises(PretrainedFileError, match=r"has no config.json \(it holds weights.bin\)"):
        SpherenetGPTForCausalLM.from_pretrained(empty)
    with pytest.raises(
        PretrainedFileError, match="spherenet export of model_type 'spherenet-gpt', not 'spherenet-ngpt'"
    ):
        SpherenetNGPTForCausalLM.from_pretrained(exported[GPT])
    with pytest.raises(TypeError, match="does not take quantization_config"):
        SpherenetNGPTForCausalLM.from_pretrained(exported[NGPT], quantization_config={})


def test_a_config_of_a_directory_that_is_not_a_spherenet_export_is_refused(tmp_path, exported, capfd):
    """The config classes check a directory as the model classes do: transformers alone would
    log "model of type ... to instantiate ..." and build a config of the other model's fields."""
    llama = tmp_path / "llama"
    llama.mkdir()
    (llama / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}))
    with pytest.raises(PretrainedFileError, match=r"is not a spherenet export: its config.json has model_type 'llama'"):
        SpherenetNGPTConfig.from_pretrained(llama)
    (tmp_path / "empty").mkdir()
    with pytest.raises(PretrainedFileError, match=r"has no config.json \(it holds nothing\)"):
        SpherenetGPTConfig.from_pretrained(tmp_path / "empty")
    with pytest.raises(
        PretrainedFileError,
        match=r"spherenet export of model_type 'spherenet-gpt', not 'spherenet-ngpt': load it with transformers\.AutoConfig$",
    ):
        SpherenetNGPTConfig.from_pretrained(exported[GPT])
    assert "model of type" not in capfd.readouterr().err
    assert (
        SpherenetGPTConfig.from_pretrained(exported[GPT]).spherenet_config()
        == GPT.from_pretrained(exported[GPT]).config
    )


def test_versions_outside_the_supported_range_get_one_line():
    shf.check_versions({"transformers": "5.24.0", "peft": "0.21.2"})
    shf.check_versions({"transformers": "5.30.1", "peft": None})  # peft is needed for PEFT only
    for installed in ({"transformers": "4.57.0", "peft": "0.21.2"}, {"transformers": "5.24.0", "peft": "0.13.0"}):
        with pytest.raises(ImportError) as info:
            shf.check_versions(installed)
        message = str(info.value)
        assert "\n" not in message and "transformers>=5.24,<6" in message
        assert f"installed: transformers {installed['transformers']}, peft {installed['peft']}" in message


def test_bad_inputs_are_named():
    model = SpherenetGPTForCausalLM.from_spherenet(tiny(GPT))
    ids = torch.tensor([[1, 2, 3]])
    with pytest.raises(ValueError, match="exactly one of input_ids and inputs_embeds"):
        model()
    with pytest.raises(ValueError, match=r"attention_mask must have shape .* = \(1, 3\), got \(1, 2\)"):
        model(ids, attention_mask=torch.ones(1, 2))
    with pytest.raises(ValueError, match="position 48 is past the model's context, max_seq_len=48"):
        model(ids, position_ids=torch.tensor([[46, 47, 48]]))


def test_lora_all_linear_adapts_every_gpt_projection_and_merges_to_equal_logits():
    peft = pytest.importorskip("peft")
    model = SpherenetGPTForCausalLM.from_spherenet(tiny(GPT))
    adapted = peft.get_peft_model(model, peft.LoraConfig(target_modules="all-linear", r=4, init_lora_weights=False))
    lora = {n.removeprefix("base_model.model.") for n, m in adapted.named_modules() if hasattr(m, "lora_A")}
    projections = {f"blocks.{i}.{part}" for i in range(2) for part in ("attn.w_q", "attn.w_k", "attn.w_v", "attn.w_o")}
    projections |= {f"blocks.{i}.mlp.{w}" for i in range(2) for w in ("w_u", "w_v", "w_o")}
    assert lora == projections  # the output layer embed_out is left alone
    ids = torch.randint(0, VOCAB, (2, 8), generator=torch.Generator().manual_seed(6))
    adapted(input_ids=ids, labels=ids).loss.backward()
    assert all(p.grad is not None for n, p in adapted.named_parameters() if p.requires_grad)
    assert not any(p.requires_grad for n, p in adapted.named_parameters() if "lora_" not in n)
    expected = adapted(input_ids=ids).logits
    merged = adapted.merge_and_unload()
    assert isinstance(merged, SpherenetGPTForCausalLM)
    torch.testing.assert_close(merged(ids).logits, expected, atol=1e-5, rtol=0)


def test_from_config_builds_a_fresh_ngpt_with_unit_rows():
    config = shf.SpherenetNGPTConfig(vocab_size=VOCAB, n_layers=1, d_model=16, n_heads=2, max_seq_len=16)
    model = AutoModelForCausalLM.from_config(config)
    assert isinstance(model, SpherenetNGPTForCausalLM) and model.spherenet_model.config == config.spherenet_config()
    for name, weight in model.spherenet_model.sphere_weights().items():
        torch.testing.assert_close(weight.norm(dim=-1), torch.ones(weight.shape[0]), msg=name)
    assert len(model.spherenet_model.sphere_weights()) == 2 + 4 + 3  # embeddings, attention, MLP


def test_from_pretrained_takes_what_lm_eval_and_pipelines_pass(exported):
    """Options left at None ask for nothing; ``device_map={"": device}`` puts the whole model there."""
    model = SpherenetGPTForCausalLM.from_pretrained(
        exported[GPT], device_map={"": "cpu"}, quantization_config=None, gguf_file=None, max_memory=None, dtype="auto"
    )
    assert model.device == torch.device("cpu") and not model.training
    assert SpherenetGPTForCausalLM.from_pretrained(exported[GPT], dtype=torch.float64).dtype == torch.float64


def test_sphere_aware_lora_keeps_ngpt_on_the_sphere_and_merges_to_equal_logits():
    peft = pytest.importorskip("peft")
    from spherenet.hf.lora import sphere_lora_config

    model = SpherenetNGPTForCausalLM.from_spherenet(tiny(NGPT))
    ids = torch.randint(0, VOCAB, (2, 8), generator=torch.Generator().manual_seed(7))
    base_logits = model(ids).logits.detach()
    adapted = peft.get_peft_model(model, sphere_lora_config(model, r=4, init_lora_weights=False))
    lora = {n.removeprefix("base_model.model.") for n, m in adapted.named_modules() if hasattr(m, "lora_A")}
    projections = {f"blocks.{i}.attn.{w}" for i in range(2) for w in ("w_q", "w_k", "w_v", "w_o")}
    projections |= {f"blocks.{i}.mlp.{w}" for i in range(2) for w in ("w_u", "w_v", "w_o")}
    assert lora == projections  # the output layer embed_out is left alone
    adapted(input_ids=ids, labels=ids).loss.backward()
    assert not any(p.requires_grad for n, p in adapted.named_parameters() if "lora_" not in n)
    expected = adapted(input_ids=ids).logits.detach()
    assert (expected - base_logits).abs().max() > 1e-3  # the adapters do something
    merged = adapted.merge_and_unload()
    assert isinstance(merged, SpherenetNGPTForCausalLM)
    for name, weight in merged.spherenet_model.sphere_weights().items():
        torch.testing.assert_close(weight.norm(dim=-1), torch.ones(weight.shape[0]), atol=1e-6, rtol=0, msg=name)
    torch.testing.assert_close(merged(ids).logits, expected, atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="no SphereLinear to adapt"):
        sphere_lora_config(SpherenetGPTForCausalLM.from_spherenet(tiny(GPT)))


def tiny_options(cls, seed=0):
    """A tiny model with grouped-query attention (4 query heads, 2 key/value heads), a head size
    that is not d_model / n_heads, and the squared-ReLU MLP; scalings moved off their inits."""
    torch.manual_seed(seed)
    config_class = NGPTConfig if cls is NGPT else GPTConfig
    options = dict(n_heads=4, n_kv_heads=2, head_dim=6, mlp="relu2", d_mlp=48)
    model = cls(config_class(vocab_size=VOCAB, n_layers=2, d_model=32, max_seq_len=48, **options)).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 1:
                p.mul_(1 + 0.5 * torch.rand_like(p))
    return model


@MODELS
def test_grouped_query_relu2_models_match_spherenet_through_cache_padding_export_and_generate(cls, tmp_path):
    reference = tiny_options(cls)
    reference.save_pretrained(tmp_path)
    model = AutoModelForCausalLM.from_pretrained(tmp_path, trust_remote_code=True)
    assert model.config.num_key_value_heads == 2 and model.config.head_dim == 6 and model.config.mlp == "relu2"
    assert model.config.spherenet_config() == reference.config
    ids = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(6))
    full = reference(ids)
    torch.testing.assert_close(model(ids).logits, full, atol=1e-5, rtol=0)
    cache = DynamicCache(config=model.config)
    pieces = [model(ids[:, a:b], cache=cache).logits for a, b in ((0, 7), (7, 11), (11, 12))]
    torch.testing.assert_close(torch.cat(pieces, 1), full, atol=1e-5, rtol=0)
    assert cache.layers[0].keys.shape == cache.layers[0].values.shape == (2, 2, 12, 6)  # the key/value heads only
    # a left-padded batch: each row's logits and greedy tokens are its own
    short, long = torch.tensor([[5, 6, 7]]), torch.tensor([[9, 8, 7, 6, 5, 4]])
    batch = torch.cat([torch.cat([torch.zeros(1, 3, dtype=torch.long), short], 1), long])
    mask = torch.tensor([[0, 0, 0, 1, 1, 1], [1] * 6])
    torch.testing.assert_close(model(batch, attention_mask=mask).logits[0, 3:], reference(short)[0], atol=1e-5, rtol=0)
    out = model.generate(batch, attention_mask=mask, max_new_tokens=8, do_sample=False, pad_token_id=0)
    assert out[0, 3:].tolist() == reference.generate(short, 8, temperature=0)[0].tolist()
    assert out[1].tolist() == reference.generate(long, 8, temperature=0)[0].tolist()
    beams = model.generate(long, max_new_tokens=5, num_beams=3, do_sample=False, pad_token_id=0)
    assert beams.shape == (1, 11) and beams[0, :6].tolist() == long[0].tolist()


@pytest.mark.parametrize(
    "hf_class, config_class",
    [(shf.SpherenetNGPTConfig, NGPTConfig), (shf.SpherenetGPTConfig, GPTConfig)],
    ids=["ngpt", "gpt"],
)
def test_transformers_config_declares_every_field_of_spherenets(hf_class, config_class):
    """A field spherenet's config gains must be declared by the transformers config too, or an
    export would silently load with its default."""
    import dataclasses

    from transformers import PretrainedConfig

    declared = {f.name for f in dataclasses.fields(hf_class)} - {f.name for f in dataclasses.fields(PretrainedConfig)}
    assert declared - {"use_cache", "tie_word_embeddings"} == {f.name for f in dataclasses.fields(config_class)}


@pytest.mark.parametrize(
    "hf_class, config_class",
    [(shf.SpherenetNGPTConfig, NGPTConfig), (shf.SpherenetGPTConfig, GPTConfig)],
    ids=["ngpt", "gpt"],
)
def test_spherenets_loader_passes_over_every_key_transformers_writes_and_no_field_of_its_own(hf_class, config_class):
    """What transformers' ``to_dict`` writes besides spherenet's fields and config.json's metadata is
    in ``TRANSFORMERS_KEYS``, which names none of spherenet's fields."""
    import dataclasses

    from spherenet.io import METADATA_KEYS, TRANSFORMERS_KEYS

    config = hf_class.from_spherenet_config(tiny(NGPT if config_class is NGPTConfig else GPT).config)
    config.pad_token_id = config.eos_token_id = config.bos_token_id = 0  # what Trainer copies from a tokenizer
    fields = {f.name for f in dataclasses.fields(config_class)}
    assert set(config.to_dict()) - fields - set(METADATA_KEYS) <= set(TRANSFORMERS_KEYS)
    assert not fields & set(TRANSFORMERS_KEYS)


@pytest.mark.parametrize("cls", [NGPT, GPT])
def test_train_and_eval_reach_the_spherenet_model_and_every_module(cls):
    """``model.train()`` / ``.eval()`` on the transformers class (Trainer and pipelines call them)
    set spherenet's model's own flag too, not only the modules the two share."""
    hf_class = SpherenetNGPTForCausalLM if cls is NGPT else SpherenetGPTForCausalLM
    model = hf_class.from_spherenet(tiny(cls))
    for mode in (True, False, True):
        assert model.train(mode) is model
        assert model.spherenet_model.training is mode
        assert all(m.training is mode for m in model.spherenet_model.modules())
