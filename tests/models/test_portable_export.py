"""The portable model code of an export (spherenet/hf/portable/: configuration_spherenet.py,
guards_spherenet.py and modeling_spherenet.py, written into every export under those names): it needs torch and transformers only, and computes spherenet's logits for every option an export can carry, through
transformers' inputs (padding, positions, cache), generate and pipeline."""

import json
import shutil

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from fresh_python import run_script  # noqa: E402

from recipes.checkpoints import Trained  # noqa: E402
from recipes.export import export  # noqa: E402
from spherenet.data.tokenizer_classes import ByteTokenizer  # noqa: E402
from spherenet.hf import SpherenetGPTForCausalLM, SpherenetNGPTForCausalLM  # noqa: E402
from spherenet.hf.portable import PORTABLE_MODELING_FILE, write_portable_modeling  # noqa: E402
from spherenet.hf.portable import configuration_spherenet as portable_config  # noqa: E402
from spherenet.hf.portable import modeling_spherenet as portable  # noqa: E402
from spherenet.io import write_manifest  # noqa: E402
from spherenet.models import GPT, NGPT, GPTConfig, NGPTConfig  # noqa: E402

VOCAB = 64

# every option an export can carry, each with spherenet's model it must match
CASES = {
    "ngpt-lerp": (NGPT, {}),
    "ngpt-slerp": (NGPT, {"update": "slerp"}),
    "ngpt-riemannian": (NGPT, {"update": "riemannian"}),
    "ngpt-mqa": (NGPT, {"n_kv_heads": 1}),
    "ngpt-gqa-head-dim": (NGPT, {"n_kv_heads": 2, "head_dim": 6}),
    "ngpt-relu2": (NGPT, {"mlp": "relu2", "s_uv": {"init": 0.7, "scale": None}}),
    "ngpt-scalings": (
        NGPT,
        {
            "qk_norm": False,
            "s_qk": {"mode": "scalar", "init": 0.9},
            "alpha_attn": {"mode": "fixed", "init": 0.3},
            "alpha_mlp": {"init": -0.2, "scale": 0.5},  # absolute: used as |alpha|
            "s_u": {"init": 2.0, "scale": None},
            "s_v": {"mode": "fixed", "init": 0.5},
            "s_z": {"init": 3.0, "scale": 0.25, "absolute": True},
        },
    ),
    "ngpt-gqa-scalar-s-qk": (NGPT, {"n_kv_heads": 2, "s_qk": {"mode": "scalar"}, "update": "slerp"}),
    "gpt": (GPT, {}),
    "gpt-gqa-head-dim-relu2": (GPT, {"n_kv_heads": 1, "head_dim": 6, "mlp": "relu2", "norm_eps": 1e-3}),
}


def spherenet_model(cls, options, seed=0, dtype=torch.float32):
    """A small spherenet model whose learnable scalings are moved off their initial values, as
    training would, so that a misplaced factor changes the logits."""
    torch.manual_seed(seed)
    config_class = NGPTConfig if cls is NGPT else GPTConfig
    config = config_class(vocab_size=VOCAB, n_layers=2, d_model=16, n_heads=4, max_seq_len=40, **options)
    model = cls(config).to(dtype).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 1:
                p.mul_(1 + 0.5 * torch.rand_like(p))
        for p in model.sphere_weights().values():  # unit rows again in float64's precision
            p.div_(p.norm(dim=-1, keepdim=True))
    return model


def portable_export(model, directory):
    """The model saved by spherenet (its modeling file is the portable code); the portable class loaded from it."""
    model.save_pretrained(directory)
    cls = portable.SpherenetNGPTForCausalLM if isinstance(model, NGPT) else portable.SpherenetGPTForCausalLM
    return cls.from_pretrained(directory, dtype=next(model.parameters()).dtype).eval()


def left_padded(short, long):
    """``(batch, mask)``: ``short`` left-padded with 0 to ``long``'s length, then ``long``."""
    pad = long.shape[1] - short.shape[1]
    batch = torch.cat([torch.cat([torch.zeros(1, pad, dtype=torch.long), short], 1), long])
    mask = torch.ones_like(batch)
    mask[0, :pad] = 0
    return batch, mask


@pytest.mark.parametrize("case", list(CASES))
@torch.no_grad()
def test_portable_model_computes_spherenets_logits_cache_padding_and_greedy_tokens(case, tmp_path):
    cls, options = CASES[case]
    reference = spherenet_model(cls, options)
    model = portable_export(reference, tmp_path)
    ids = torch.randint(0, VOCAB, (2, 11), generator=torch.Generator().manual_seed(1))
    full = reference(ids)
    torch.testing.assert_close(model(ids).logits, full, atol=1e-5, rtol=0)
    # the same through the cache, in pieces
    out = model(ids[:, :6], use_cache=True)
    pieces = [out.logits, model(ids[:, 6:10], cache=out.cache).logits, model(ids[:, 10:], cache=out.cache).logits]
    torch.testing.assert_close(torch.cat(pieces, 1), full, atol=1e-5, rtol=0)
    # KV-cached greedy generation, token for token
    prompt = ids[:1, :5]
    tokens = model.generate(prompt, max_new_tokens=10, do_sample=False, pad_token_id=0)
    assert tokens.tolist() == reference.generate(prompt, 10, temperature=0).tolist()
    # a left-padded batch: each row's logits and greedy tokens are its own, and the logits (pad
    # positions included) those of spherenet's own transformers class
    short, long = ids[:1, 3:7], ids[1:, :9]
    batch, mask = left_padded(short, long)
    padded = model(batch, attention_mask=mask).logits
    torch.testing.assert_close(padded[0, 5:], reference(short)[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(padded[1], reference(long)[0], atol=1e-5, rtol=0)
    hf_class = SpherenetNGPTForCausalLM if cls is NGPT else SpherenetGPTForCausalLM
    torch.testing.assert_close(padded, hf_class.from_spherenet(reference)(batch, attention_mask=mask).logits)
    out = model.generate(batch, attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert out[0, 5:].tolist() == reference.generate(short, 6, temperature=0)[0].tolist()
    assert out[1].tolist() == reference.generate(long, 6, temperature=0)[0].tolist()


# bf16 as well: both compute the paper's equations in the same order (the eval forward folds
# nothing), so the logits are the same to the bit.
@pytest.mark.parametrize("dtype, tolerance", [(torch.float64, 1e-10), (torch.bfloat16, 0.0)], ids=["fp64", "bf16"])
@pytest.mark.parametrize("case", ["ngpt-slerp", "ngpt-gqa-head-dim", "ngpt-scalings", "gpt-gqa-head-dim-relu2"])
@torch.no_grad()
def test_portable_model_matches_in_float64_and_bfloat16(case, dtype, tolerance, tmp_path):
    cls, options = CASES[case]
    reference = spherenet_model(cls, options, dtype=dtype)
    model = portable_export(reference, tmp_path)
    assert model.dtype == dtype
    ids = torch.randint(0, VOCAB, (2, 11), generator=torch.Generator().manual_seed(2))
    logits = model(ids).logits
    assert logits.dtype == dtype
    expected = reference(ids)
    scale = 1.0 if dtype == torch.float64 else float(expected.abs().max())
    torch.testing.assert_close(logits, expected, atol=tolerance * scale, rtol=0)


@pytest.mark.parametrize("cls", [NGPT, GPT], ids=["ngpt", "gpt"])
@torch.no_grad()
def test_a_bidirectional_model_matches_too(cls, tmp_path):
    reference = spherenet_model(cls, {"causal": False, "n_kv_heads": 2})
    model = portable_export(reference, tmp_path)
    ids = torch.randint(0, VOCAB, (2, 7), generator=torch.Generator().manual_seed(4))
    torch.testing.assert_close(model(ids).logits, reference(ids), atol=1e-5, rtol=0)
    torch.testing.assert_close(model(ids[:, :3]).logits, reference(ids[:, :3]), atol=1e-5, rtol=0)
    assert not torch.allclose(model(ids).logits[:, :3], reference(ids[:, :3]), atol=1e-3)  # the future counts


# torch's own notice that SDPA has no batching rule under vmap (it loops over the batch)
@pytest.mark.filterwarnings("ignore:There is a performance drop:UserWarning")
@pytest.mark.parametrize("case", ["ngpt-lerp", "ngpt-slerp", "ngpt-riemannian", "gpt"])
def test_per_sample_gradients_by_vmap_equal_autograd_on_each_sample(case, tmp_path):
    """torch.func over an export: the vocabulary assertion (no batching rule) stands aside under
    the transform, and the embedding still refuses an id outside the table."""
    from torch.func import functional_call, grad, vmap

    model = portable_export(spherenet_model(*CASES[case]), tmp_path)
    params = {name: p.detach() for name, p in model.named_parameters()}
    ids = torch.randint(0, VOCAB, (3, 8), generator=torch.Generator().manual_seed(1))

    def loss(p, x):
        logits = functional_call(model, p, (x[None],), {"use_cache": False}).logits
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), x)

    per_sample = vmap(grad(loss), in_dims=(None, 0))(params, ids)
    for i in range(len(ids)):
        model.zero_grad()
        loss(dict(model.named_parameters()), ids[i]).backward()
        for name, p in model.named_parameters():
            torch.testing.assert_close(per_sample[name][i], p.grad, rtol=1e-4, atol=1e-6)
    outside = ids.clone()
    outside[1, 3] = VOCAB  # one id past the table, in one sample
    with pytest.raises(IndexError, match="out of range"):
        vmap(grad(loss), in_dims=(None, 0))(params, outside)


@torch.no_grad()
def test_labels_hidden_states_logits_to_keep_embeds_sampling_and_beams_match_spherenets_class(tmp_path):
    reference = spherenet_model(NGPT, {"n_kv_heads": 2, "mlp": "relu2"})
    model = portable_export(reference, tmp_path)
    wrapped = SpherenetNGPTForCausalLM.from_spherenet(reference).eval()
    ids = torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(3))
    labels = ids.clone()
    labels[0, :3] = -100
    ours = model(ids, labels=labels, output_hidden_states=True)
    theirs = wrapped(ids, labels=labels, output_hidden_states=True)
    assert len(ours.hidden_states) == 3
    torch.testing.assert_close(ours.logits, theirs.logits, atol=1e-5, rtol=0)
    kept = model(ids, logits_to_keep=4).logits
    assert kept.shape == (2, 4, VOCAB)
    torch.testing.assert_close(kept, theirs.logits[:, -4:], atol=1e-5, rtol=0)
    torch.testing.assert_close(ours.loss, theirs.loss, atol=1e-5, rtol=0)
    for a, b in zip(ours.hidden_states, theirs.hidden_states):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    embeds = model.get_input_embeddings()(ids)
    torch.testing.assert_close(model(inputs_embeds=embeds).logits, theirs.logits, atol=1e-5, rtol=0)
    positions = torch.arange(3, 12)[None].expand(2, -1)
    torch.testing.assert_close(
        model(ids, position_ids=positions).logits, wrapped(ids, position_ids=positions).logits, atol=1e-5, rtol=0
    )
    assert not torch.allclose(model(ids, position_ids=positions).logits, theirs.logits)  # positions do count
    for kwargs in ({"do_sample": True, "top_k": 20, "temperature": 0.9}, {"num_beams": 3, "do_sample": False}):
        torch.manual_seed(5)
        ours = model.generate(ids, max_new_tokens=6, pad_token_id=0, **kwargs)
        torch.manual_seed(5)
        assert ours.tolist() == wrapped.generate(ids, max_new_tokens=6, pad_token_id=0, **kwargs).tolist()


@pytest.mark.parametrize(
    "key, value",
    [
        ("update", "geodesic"),
        ("mlp", "geglu"),
        ("qk_norm", "yes"),
        ("s_qk", {"init": 1.0, "mode": "tensor"}),
        ("s_z", {"init": 1.0, "shift": 0.5}),
        ("alpha_attn", {"scale": -1.0}),
        ("head_dim", 7),
        ("n_kv_heads", 3),
    ],
)
def test_a_config_the_file_cannot_compute_is_refused_in_one_line(key, value, tmp_path):
    reference = spherenet_model(NGPT, {})
    reference.save_pretrained(tmp_path)
    values = json.loads((tmp_path / "config.json").read_text())
    values[key] = value
    (tmp_path / "config.json").write_text(json.dumps(values))
    write_manifest(tmp_path, ("config.json", "model.safetensors"))  # edited on purpose: the manifest agrees
    with pytest.raises(ValueError, match=f"spherenet-ngpt config: {key}") as error:
        portable.SpherenetNGPTForCausalLM.from_pretrained(tmp_path)
    assert "\n" not in str(error.value)
    with pytest.raises(ValueError, match=f"spherenet-ngpt config: {key}"):
        portable_config.SpherenetNGPTConfig.from_pretrained(tmp_path)


def test_config_classes_read_every_key_of_an_export_and_keep_transformers_defaults(tmp_path):
    reference = spherenet_model(GPT, {"n_kv_heads": 2})
    reference.save_pretrained(tmp_path)
    written = json.loads((tmp_path / "config.json").read_text())
    config = portable_config.SpherenetGPTConfig.from_pretrained(tmp_path)
    for key, value in written.items():
        if key != "auto_map":
            assert getattr(config, key) == value, key
    assert config.num_key_value_heads == 2 and config.hidden_size == 16 and config.num_hidden_layers == 2
    bare = portable_config.SpherenetNGPTConfig()  # what transformers builds for its defaults
    assert bare.update == "lerp" and bare.s_qk == portable_config.SCALINGS["s_qk"] and bare.head_dim is None


@pytest.mark.parametrize("cls", [NGPT, GPT], ids=["ngpt", "gpt"])
@torch.no_grad()
def test_an_export_saved_again_by_transformers_loads_in_spherenet_with_the_same_logits(cls, tmp_path):
    """transformers' own config fields (its version, dtype, use_cache, the token ids Trainer copies
    from a tokenizer) are not another spherenet version's: spherenet's loader, its transformers
    class and AutoModelForCausalLM read the re-saved export, and compute the export's logits."""
    from transformers import AutoModelForCausalLM

    from spherenet.models import load_pretrained

    reference = spherenet_model(cls, {"n_kv_heads": 2})
    model = portable_export(reference, tmp_path / "export")
    model.config.pad_token_id, model.config.eos_token_id = 0, VOCAB - 1  # as Trainer aligns them with a tokenizer
    model.save_pretrained(tmp_path / "resaved")  # transformers' PreTrainedModel.save_pretrained
    written = json.loads((tmp_path / "resaved" / "config.json").read_text())
    assert {"transformers_version", "dtype", "use_cache", "tie_word_embeddings", "pad_token_id"} <= set(written)
    ids = torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(6))
    expected = reference(ids)
    hf_class = SpherenetNGPTForCausalLM if cls is NGPT else SpherenetGPTForCausalLM
    torch.testing.assert_close(load_pretrained(tmp_path / "resaved")(ids), expected, atol=0, rtol=0)
    for loader in (hf_class.from_pretrained, AutoModelForCausalLM.from_pretrained):
        torch.testing.assert_close(loader(tmp_path / "resaved")(ids).logits, expected, atol=0, rtol=0)


def remote_class(directory, class_ref):
    """The class ``class_ref`` of ``directory``'s own code, loaded as transformers' remote code
    (what ``trust_remote_code=True`` runs where spherenet's classes are not registered)."""
    from transformers.dynamic_module_utils import get_class_from_dynamic_module

    return get_class_from_dynamic_module(class_ref, str(directory))


PORTABLE_CONFIGURATION_FILE = PORTABLE_MODELING_FILE.with_name("configuration_spherenet.py")
PORTABLE_GUARDS_FILE = PORTABLE_MODELING_FILE.with_name("guards_spherenet.py")


def single_file_export(reference, directory):
    """``reference`` saved as exports were before the portable code was split: one self-contained
    ``modeling_spherenet.py`` that config.json's ``auto_map`` names for both classes."""
    reference.save_pretrained(directory)
    relative_imports = (
        "from .configuration_spherenet import SpherenetGPTConfig, SpherenetNGPTConfig, _SpherenetConfig, installed_spherenet\n",
        "from .guards_spherenet import SphereGuards, keep_on_sphere\n",
    )
    modeling = PORTABLE_MODELING_FILE.read_text()
    for line in relative_imports:
        assert line in modeling
        modeling = modeling.replace(line, "")
    code = PORTABLE_CONFIGURATION_FILE.read_text() + PORTABLE_GUARDS_FILE.read_text() + modeling
    (directory / "modeling_spherenet.py").write_text(code)
    (directory / "configuration_spherenet.py").unlink()
    (directory / "guards_spherenet.py").unlink()
    values = json.loads((directory / "config.json").read_text())
    values["auto_map"] = {k: "modeling_spherenet." + v.partition(".")[2] for k, v in values["auto_map"].items()}
    (directory / "config.json").write_text(json.dumps(values, indent=2))
    write_manifest(directory, ("config.json", "model.safetensors", "modeling_spherenet.py"))


@torch.no_grad()
def test_an_export_written_before_the_split_still_loads_and_write_portable_modeling_updates_it(tmp_path):
    reference = spherenet_model(NGPT, {"update": "riemannian"})
    ids = torch.tensor([[1, 2, 3]])
    old = tmp_path / "single_file_export"
    single_file_export(reference, old)
    torch.testing.assert_close(NGPT.from_pretrained(old)(ids), reference(ids))
    torch.testing.assert_close(SpherenetNGPTForCausalLM.from_pretrained(old)(ids).logits, reference(ids))
    remote = remote_class(old, "modeling_spherenet.SpherenetNGPTForCausalLM").from_pretrained(old)
    torch.testing.assert_close(remote(ids).logits, reference(ids), atol=1e-5, rtol=0)

    updated = tmp_path / "updated_export"
    shutil.copytree(old, updated)
    write_portable_modeling(updated)
    assert (updated / "modeling_spherenet.py").read_text() == PORTABLE_MODELING_FILE.read_text()
    assert (updated / "configuration_spherenet.py").read_text() == PORTABLE_CONFIGURATION_FILE.read_text()
    assert (updated / "guards_spherenet.py").read_text() == PORTABLE_GUARDS_FILE.read_text()
    assert json.loads((updated / "config.json").read_text())["auto_map"] == {
        "AutoConfig": "configuration_spherenet.SpherenetNGPTConfig",
        "AutoModelForCausalLM": "modeling_spherenet.SpherenetNGPTForCausalLM",
    }
    torch.testing.assert_close(NGPT.from_pretrained(updated)(ids), reference(ids))  # the rewritten manifest checks out
    remote = remote_class(updated, "modeling_spherenet.SpherenetNGPTForCausalLM")  # its relative import resolves
    assert remote is SpherenetNGPTForCausalLM  # spherenet is installed here: the export's code gives its classes
    assert remote_class(updated, "configuration_spherenet.SpherenetNGPTConfig").from_pretrained(updated).d_model == 16
    torch.testing.assert_close(remote.from_pretrained(updated)(ids).logits, reference(ids), atol=1e-5, rtol=0)
    (updated / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ValueError, match="model_type 'llama'"):
        write_portable_modeling(updated)


def test_write_portable_modeling_keeps_every_file_the_manifest_listed(tmp_path):
    # a sharded export with a tokenizer: the rewritten manifest still lists the shards, their index
    # and the tokenizer, so the export loads and an --overwrite still recognizes its files
    reference = spherenet_model(NGPT, {})
    export = tmp_path / "sharded"
    reference.save_pretrained(export, max_shard_size="20KB")
    (export / "tokenizer.json").write_text("{}")
    names = sorted(p.name for p in export.iterdir() if p.name != "sha256sums.json")
    write_manifest(export, names)
    write_portable_modeling(export)
    listed = set(json.loads((export / "sha256sums.json").read_text())["files"])
    assert listed == set(names) | {"configuration_spherenet.py", "guards_spherenet.py", "modeling_spherenet.py"}
    assert any(name.startswith("model-0000") for name in listed)
    ids = torch.tensor([[1, 2, 3]])
    torch.testing.assert_close(NGPT.from_pretrained(export)(ids), reference(ids))


def test_portable_code_imports_nothing_but_torch_transformers_the_standard_library_and_its_own_files():
    import ast

    def imports(path):
        tree = ast.parse(path.read_text())
        found = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        return found | {"." * n.level + n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}

    own = {".configuration_spherenet", ".guards_spherenet"}
    assert imports(PORTABLE_MODELING_FILE) == {"math", "typing", "torch", "transformers"} | own
    assert imports(PORTABLE_CONFIGURATION_FILE) == {"importlib", "math", "typing", "transformers", "warnings"}
    standard = {"hashlib", "json", "math", "os", "shutil", "typing", "warnings", "weakref"}
    assert imports(PORTABLE_GUARDS_FILE) == standard | {"torch", "transformers"}


# Run where spherenet cannot be imported (fresh_python.run_script); prints what the parent compares.
_WITHOUT_SPHERENET = """
import json, sys

try:
    import spherenet
    spherenet_importable = True
except ImportError:
    spherenet_importable = False

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, pipeline

directory, bad_directory, ids, short, long = json.loads(sys.argv[1])
try:  # an option value the file cannot compute
    AutoModelForCausalLM.from_pretrained(bad_directory, trust_remote_code=True)
    refused = None
except ValueError as error:
    refused = str(error)
model = AutoModelForCausalLM.from_pretrained(directory, trust_remote_code=True)
tokenizer = AutoTokenizer.from_pretrained(directory, trust_remote_code=True)
ids, short, long = torch.tensor(ids), torch.tensor(short), torch.tensor(long)
pad = long.shape[1] - short.shape[1]
batch = torch.cat([torch.cat([torch.zeros(1, pad, dtype=torch.long), short], 1), long])
mask = torch.ones_like(batch)
mask[0, :pad] = 0
with torch.no_grad():
    logits = model(ids).logits
    padded = model(batch, attention_mask=mask).logits
    generated = model.generate(batch, attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0)
    beams = model.generate(long, max_new_tokens=4, num_beams=3, do_sample=False, pad_token_id=0)
generator = pipeline("text-generation", model=model, tokenizer=tokenizer, device="cpu")
text = generator("Hello", max_new_tokens=5, do_sample=False)[0]["generated_text"]
piped = generator("Hello", max_new_tokens=5, do_sample=False, return_tensors=True)[0]["generated_token_ids"]
print("RESULT", json.dumps({
    "spherenet_importable": spherenet_importable,
    "spherenet_loaded": sorted(m for m in sys.modules if m.split(".")[0] == "spherenet"),
    "class": type(model).__module__.split(".")[-1] + "." + type(model).__name__,
    "logits": logits.tolist(), "padded": padded.tolist(), "generated": generated.tolist(),
    "beams": beams.tolist(), "text": text, "piped": list(piped), "refused": refused,
}))
"""


@pytest.mark.slow
@pytest.mark.parametrize("cls", [NGPT, GPT], ids=["ngpt", "gpt"])
def test_an_export_loads_and_generates_where_spherenet_cannot_be_imported(cls, tmp_path):
    options = {"update": "slerp", "n_kv_heads": 2, "mlp": "relu2"} if cls is NGPT else {"n_kv_heads": 1}
    torch.manual_seed(0)
    config_class = NGPTConfig if cls is NGPT else GPTConfig
    reference = cls(config_class(vocab_size=256, n_layers=2, d_model=16, n_heads=4, max_seq_len=40, **options)).eval()
    directory = tmp_path / "export"
    export(Trained(reference, ByteTokenizer(), {}, 0, tmp_path / "step_0"), directory)  # as recipes.export writes it
    bad = tmp_path / "bad"
    shutil.copytree(directory, bad)
    values = json.loads((bad / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**values, "mlp": "geglu"}))
    write_manifest(bad, ("config.json", "model.safetensors"))  # edited on purpose: the manifest agrees
    ids, short, long = [[5, 9, 200, 31, 7, 7, 64]], [[72, 101, 108]], [[1, 2, 3, 4, 5, 6]]
    out = run_script(
        _WITHOUT_SPHERENET, [str(directory), str(bad), ids, short, long], tmp_path / "run", spherenet=False
    )
    assert out["spherenet_importable"] is False and out["spherenet_loaded"] == []
    assert out["class"] == f"modeling_spherenet.Spherenet{cls.__name__}ForCausalLM"
    with torch.no_grad():
        torch.testing.assert_close(torch.tensor(out["logits"]), reference(torch.tensor(ids)), atol=1e-5, rtol=0)
        padded = torch.tensor(out["padded"])
        torch.testing.assert_close(padded[0, 3:], reference(torch.tensor(short))[0], atol=1e-5, rtol=0)
        torch.testing.assert_close(padded[1], reference(torch.tensor(long))[0], atol=1e-5, rtol=0)
        assert out["generated"][0][3:] == reference.generate(torch.tensor(short), 6, temperature=0)[0].tolist()
        assert out["generated"][1] == reference.generate(torch.tensor(long), 6, temperature=0)[0].tolist()
        greedy = reference.generate(torch.tensor([list(b"Hello")]), 5, temperature=0)[0].tolist()
    assert out["piped"] == greedy and out["text"].startswith("Hello")
    assert out["refused"].startswith(f"spherenet-{cls.model_type} config: mlp must be one of")
    assert len(out["beams"][0]) == 10 and out["beams"][0][:6] == long[0]
