"""NGPT and GPT: sphere declarations, unit hidden states, causality, gradients, parameter counts,
KV-cached generation, configs and presets, torch.compile."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tiny_models import TINY_SHAPE, tiny_model
from torch.utils._python_dispatch import TorchDispatchMode

from spherenet.layers import KVCache
from spherenet.manifolds import Sphere, named_manifold_parameters
from spherenet.manifolds.sphere import geoopt
from spherenet.models import (
    GPT,
    MODEL_CLASSES,
    NGPT,
    PRESETS,
    GPTConfig,
    LanguageModel,
    NGPTConfig,
    from_preset,
    model_class,
    model_class_of,
    preset_config,
    sample_next_token,
)
from spherenet.models.common import assert_ids_in_vocab

SETTINGS = settings(max_examples=10, deadline=None)


def alphas(init: float) -> dict:
    """alpha_A and alpha_M at ``init``, their other fields the paper's."""
    return dict(alpha_attn={"init": init}, alpha_mlp={"init": init})


def ids(*shape, vocab=32, seed=0):
    return torch.randint(0, vocab, shape, generator=torch.Generator().manual_seed(seed))


def recompute_generate(model, prompt, max_new_tokens, temperature=1.0, top_k=None, generator=None):
    """Generation without a cache: the whole sequence, cropped to its last ``max_seq_len``
    tokens, is run again for every new token (nanoGPT's loop)."""
    tokens = prompt
    with torch.no_grad():
        for _ in range(max_new_tokens):
            logits = model(tokens[:, -model.config.max_seq_len :])[:, -1, :]
            tokens = torch.cat([tokens, sample_next_token(logits, temperature, top_k, generator)], dim=1)
    return tokens


# ----------------------------------------------------------------------- sphere declarations

# Module attribute path (inside a block, or at top level) -> the paper's name of the matrix.
SPHERE_KINDS = {
    "embed_in": "E_in",
    "embed_out": "E_out",
    "attn.w_q": "W_q",
    "attn.w_k": "W_k",
    "attn.w_v": "W_v",
    "attn.w_o": "W_o",
    "mlp.w_u": "W_u",
    "mlp.w_v": "W_v-gate",
    "mlp.w_o": "W_o_mlp",
}


def test_every_ngpt_sphere_weight_is_a_declared_unit_manifold_parameter():
    model = tiny_model("ngpt", n_layers=3)
    d = model.config.d_model
    entries = list(named_manifold_parameters(model))
    kinds = set()
    for entry in entries:
        assert isinstance(entry.param, geoopt.ManifoldParameter), entry.name
        assert isinstance(entry.param.manifold, Sphere) and isinstance(entry.manifold, Sphere), entry.name
        assert entry.param.shape[-1] == d, (entry.name, entry.param.shape)
        torch.testing.assert_close(
            entry.param.detach().norm(dim=-1), torch.ones(entry.param.shape[0]), rtol=0, atol=1e-6
        )
        path = entry.name.removesuffix(".weight")
        kinds.add(SPHERE_KINDS[path.split(".", 2)[-1] if path.startswith("blocks.") else path])
    assert kinds == set(SPHERE_KINDS.values())
    assert len(entries) == 2 + 7 * 3
    # Nothing else is a matrix: every other parameter is a 1-D scaling (alpha, s_qk, s_u, s_v, s_z).
    declared = {e.name for e in entries}
    for name, p in model.named_parameters():
        if name not in declared:
            assert p.ndim == 1 and not isinstance(p, geoopt.ManifoldParameter), name
    # The two square-but-different cases: W_v (input side is d) and W_o (output side is d)
    # have the same shape, so the stored orientation must come from the role.
    block = model.blocks[0]
    assert block.attn.w_v.sphere == "in" and block.attn.w_o.sphere == "out"
    assert block.mlp.w_u.weight.shape == (24, d) and block.mlp.w_o.weight.shape == (24, d)


def test_hidden_state_is_unit_after_every_ngpt_block():
    model = tiny_model("ngpt", n_layers=3, **alphas(0.4))
    norms = []
    hooks = [b.register_forward_hook(lambda m, inp, out: norms.append(out.detach().norm(dim=-1))) for b in model.blocks]
    model(ids(2, 10))
    for hook in hooks:
        hook.remove()
    assert len(norms) == 3
    for n in norms:
        torch.testing.assert_close(n, torch.ones_like(n), rtol=0, atol=1e-5)


@pytest.mark.parametrize("update", ["lerp", "slerp", "riemannian"])
def test_ngpt_update_modes_run_and_differ(update):
    # (Not alpha = 0.5: Norm(a + b) is exactly the geodesic midpoint, so lerp == slerp there.)
    base = tiny_model("ngpt", seed=3, **alphas(0.3))(ids(1, 8))
    other = tiny_model("ngpt", seed=3, **alphas(0.3), update=update)(ids(1, 8))
    assert torch.isfinite(other).all()
    if update == "lerp":
        torch.testing.assert_close(other, base)
    else:
        assert (other - base).abs().max() > 1e-4


# ------------------------------------------------------------------------------- causality


@SETTINGS
@given(kind=st.sampled_from(["ngpt", "gpt"]), t=st.integers(0, 10), new_token=st.integers(0, 31))
def test_changing_a_future_token_never_changes_past_logits(kind, t, new_token):
    model = tiny_model(kind)
    x = ids(2, 12, seed=t)
    y = x.clone()
    y[:, t + 1] = new_token
    with torch.no_grad():
        a, b = model(x), model(y)
    torch.testing.assert_close(a[:, : t + 1], b[:, : t + 1], rtol=0, atol=0)
    if (x[:, t + 1] != new_token).any():
        assert (a[:, t + 1 :] - b[:, t + 1 :]).abs().max() > 0


@pytest.mark.parametrize("kind", ["ngpt", "gpt"])
def test_noncausal_model_sees_the_future(kind):
    model = tiny_model(kind, causal=False)
    x = ids(1, 8)
    y = x.clone()
    y[:, -1] = (x[:, -1] + 1) % 32
    with torch.no_grad():
        a, b = model(x), model(y)
    assert a.shape == (1, 8, 32)
    assert (a[:, 0] - b[:, 0]).abs().max() > 1e-6  # the first position sees the last token
    with pytest.raises(ValueError, match="causal"):
        model.generate(x, 2)


# ------------------------------------------------------------------------------- gradients


@pytest.mark.parametrize("kind", ["ngpt", "gpt"])
def test_every_parameter_gets_a_gradient(kind):
    model = tiny_model(kind)
    x = torch.arange(32).reshape(2, 16)  # every token id used, so every embedding row is reached
    logits = model(x)
    torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 32), x[:, 1:].reshape(-1)).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None, name
        assert torch.isfinite(p.grad).all(), name
        assert p.grad.abs().max() > 0, name


# -------------------------------------------------------------------------- parameter counts


@pytest.mark.parametrize(
    "name, millions",
    [("gpt-0.5b", 468.2), ("gpt-1b", 1025.7), ("ngpt-0.5b", 468.4), ("ngpt-1b", 1026.1)],
)
def test_paper_preset_parameter_counts_on_meta(name, millions):
    with torch.device("meta"):
        model = from_preset(name)
    assert all(p.is_meta for p in model.parameters())
    count = sum(p.numel() for p in model.parameters())
    assert abs(count / 1e6 - millions) / millions < 1e-3, count
    c = model.config
    assert c.vocab_size == 32000 and c.d_mlp == 4 * c.d_model and c.max_seq_len == 4096
    if name.startswith("ngpt"):
        assert len(list(named_manifold_parameters(model))) == 2 + 7 * c.n_layers


def test_meta_model_materializes_with_init_weights():
    with torch.device("meta"):
        model = from_preset("ngpt-tiny", s_qk={"mode": "fixed"})
    model.to_empty(device="cpu")
    model.init_weights()
    for entry in named_manifold_parameters(model):
        torch.testing.assert_close(
            entry.param.detach().norm(dim=-1), torch.ones(entry.param.shape[0]), rtol=0, atol=1e-5
        )
    assert model.blocks[0].attn.s_qk().item() == 1.0  # a fixed scale's constant buffer is refilled
    assert torch.isfinite(model(ids(1, 8, vocab=256))).all()


def test_gpt_init_stds():
    model = from_preset("gpt-small")  # d 256, 4 layers
    std, out_std = 0.02, 0.02 / math.sqrt(2 * 4)
    assert model.embed_in.weight.std().item() == pytest.approx(std, rel=0.05)
    assert model.embed_out.weight.std().item() == pytest.approx(std, rel=0.05)
    assert model.blocks[0].attn.w_q.weight.std().item() == pytest.approx(std, rel=0.05)
    assert model.blocks[0].mlp.w_u.weight.std().item() == pytest.approx(std, rel=0.05)
    assert model.blocks[0].attn.w_o.weight.std().item() == pytest.approx(out_std, rel=0.05)
    assert model.blocks[0].mlp.w_o.weight.std().item() == pytest.approx(out_std, rel=0.05)
    assert torch.equal(model.norm_out.weight, torch.ones(256))


# ------------------------------------------------------------------------------- generation


@pytest.mark.parametrize("kind", ["ngpt", "gpt"])
def test_kv_cache_forward_in_chunks_matches_full_forward(kind):
    model = tiny_model(kind)
    x = ids(2, 11)
    with torch.no_grad():
        full = model(x)
        caches = [KVCache() for _ in model.blocks]
        chunks = [model(x[:, a:b], kv_caches=caches) for a, b in ((0, 4), (4, 9), (9, 10), (10, 11))]
    torch.testing.assert_close(torch.cat(chunks, dim=1), full, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["ngpt", "gpt"])
def test_greedy_generation_with_cache_equals_recompute(kind):
    # Large steps (nGPT) / weights (GPT), so that the context changes the greedy choices.
    model = tiny_model(kind, seed=4, **(alphas(0.5) if kind == "ngpt" else dict(init_std=0.5)))
    if kind == "ngpt":  # sharpen the logits so that greedy choices are not near-ties
        with torch.no_grad():
            model.s_z.param.mul_(20)
    prompt = ids(2, 3, seed=1)
    cached = model.generate(prompt, 10, top_k=1)
    assert cached.shape == (2, 13) and torch.equal(cached[:, :3], prompt)
    torch.testing.assert_close(cached, recompute_generate(model, prompt, 10, top_k=1), rtol=0, atol=0)
    torch.testing.assert_close(model.generate(prompt, 10, temperature=0.0), cached, rtol=0, atol=0)


@pytest.mark.parametrize("kind", ["ngpt", "gpt"])
def test_sampled_generation_with_cache_equals_recompute(kind):
    model = tiny_model(kind, seed=5)
    prompt = ids(3, 2, seed=2)
    cached = model.generate(prompt, 12, temperature=0.8, top_k=10, generator=torch.Generator().manual_seed(7))
    again = recompute_generate(model, prompt, 12, temperature=0.8, top_k=10, generator=torch.Generator().manual_seed(7))
    torch.testing.assert_close(cached, again, rtol=0, atol=0)
    other_seed = model.generate(prompt, 12, temperature=0.8, top_k=10, generator=torch.Generator().manual_seed(8))
    assert not torch.equal(cached, other_seed)  # the generator is actually used


@pytest.mark.parametrize("kind", ["ngpt", "gpt"])
@pytest.mark.parametrize("prompt_length", [10, 20], ids=["prompt_inside", "prompt_past_the_context"])
def test_generation_slides_past_the_context_as_cropping_does(kind, prompt_length):
    """Past max_seq_len (16) each token is predicted from the last 16 alone, as when the
    sequence is cropped and run again; a prompt longer than the context keeps its last 16."""
    model = tiny_model(kind, seed=6)
    prompt = ids(2, prompt_length, seed=3)
    cached = model.generate(prompt, 25, temperature=0.8, top_k=10, generator=torch.Generator().manual_seed(1))
    again = recompute_generate(model, prompt, 25, temperature=0.8, top_k=10, generator=torch.Generator().manual_seed(1))
    assert cached.shape == (2, prompt_length + 25)
    torch.testing.assert_close(cached, again, rtol=0, atol=0)


def test_generation_stops_at_end_of_text_and_at_a_stop_condition():
    model = tiny_model("ngpt", seed=7)
    prompt = ids(2, 3, seed=4)
    free = model.generate(prompt, 12, top_k=1)
    eos = int(free[0, 5])  # row 0 produces it at its third new token
    stopped = model.generate(prompt, 12, top_k=1, eos_token_id=eos)
    row1 = free[1, 3:].tolist()
    ends = 3 + (row1.index(eos) + 1 if eos in row1 else 12)
    assert stopped.shape[1] == max(6, ends)  # stops once every row has produced it
    assert (stopped[0, 6:] == eos).all()  # a finished row goes on with eos
    assert torch.equal(stopped[:, :6], free[:, :6])
    seen = []
    halted = model.generate(prompt, 12, top_k=1, stop=lambda ids: seen.append(ids.shape[1]) or ids.shape[1] >= 7)
    assert halted.shape == (2, 7) and seen == [4, 5, 6, 7] and torch.equal(halted, free[:, :7])


def test_generation_limits():
    model = tiny_model("ngpt")
    assert model.generate(ids(1, 10), 6, top_k=1).shape == (1, 16)
    assert torch.equal(model.generate(ids(1, 4), 0), ids(1, 4))
    with pytest.raises(ValueError, match="eos_token_id must be in \\[0, vocab_size=32\\), got 32"):
        model.generate(ids(1, 4), 2, eos_token_id=32)
    with pytest.raises(ValueError, match="temperature"):
        model.generate(ids(1, 4), 2, temperature=-1.0)
    with pytest.raises(ValueError, match="top_k"):
        model.generate(ids(1, 4), 2, top_k=0)


# ---------------------------------------------------------------------------- input checks


@pytest.mark.parametrize("kind", ["ngpt", "gpt"])
def test_forward_input_errors(kind):
    model = tiny_model(kind)
    with pytest.raises(TypeError, match="float32"):
        model(torch.zeros(1, 4))
    with pytest.raises(ValueError, match="1 dims"):
        model(torch.zeros(4, dtype=torch.long))
    # Values are asserted on the device (no host sync): on CPU the assertion raises at once.
    with pytest.raises(RuntimeError, match=r"token id out of vocabulary: every id must be in \[0, vocab_size=32\)"):
        model(torch.tensor([[1, 32]]))
    with pytest.raises(RuntimeError, match="vocab_size=32"):
        model(torch.tensor([[-1, 3]]))
    with pytest.raises(ValueError, match="17 exceeds max_seq_len=16"):
        model(torch.zeros(1, 17, dtype=torch.long))
    assert model(torch.zeros(1, 16, dtype=torch.int32)).shape == (1, 16, 32)


def test_vocab_assertion_on_narrow_integer_ids():
    """ids of a dtype narrower than vocab_size are compared as int64 (an int16 comparison with
    40000 would wrap around and reject every id)."""
    assert_ids_in_vocab(torch.tensor([[30000, 0]], dtype=torch.int16), 40000)
    assert_ids_in_vocab(torch.tensor([[255]], dtype=torch.uint8), 256)
    with pytest.raises(RuntimeError, match="vocab_size=40000"):
        assert_ids_in_vocab(torch.tensor([[-3]], dtype=torch.int16), 40000)


@pytest.mark.parametrize("kind", ["ngpt", "gpt"])
def test_generate_names_the_bad_prompt_id(kind):
    """The prompt is where ids enter generation: checked on the host, naming the id."""
    model = tiny_model(kind)
    with pytest.raises(
        IndexError, match=r"id 40 at position \(1, 2\) is not in \[0, vocab_size=32\) \(ids span \[0, 40\]\)"
    ):
        model.generate(torch.tensor([[1, 2, 3], [0, 5, 40]]), 2)
    with pytest.raises(IndexError, match=r"id -1 at position \(0, 0\)"):
        model.generate(torch.tensor([[-1, 2]]), 1)


class HostReads(TorchDispatchMode):
    """Records every aten op that hands a tensor's value to the host (``.item()``, ``bool``,
    ``int``: ``_local_scalar_dense``) or whose output shape depends on values (``nonzero``):
    each is a device synchronization on a GPU."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if torch.Tag.data_dependent_output in func.tags or torch.Tag.dynamic_output_shape in func.tags:
            self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("kind", ["ngpt", "gpt"])
def test_forward_and_backward_read_nothing_on_the_host(kind, monkeypatch):
    """No host sync in a training forward/backward: no value is read back (dispatcher ops), and
    no ``tolist``/``numpy`` (which bypass the dispatcher)."""
    model = tiny_model(kind)
    bypass = []

    def counted(name):
        original = getattr(torch.Tensor, name)
        return lambda self, *args, **kwargs: bypass.append(name) or original(self, *args, **kwargs)

    for name in ("tolist", "numpy"):
        monkeypatch.setattr(torch.Tensor, name, counted(name))
    x = ids(2, 8)
    with HostReads() as reads:
        logits = model(x)
        torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids(2, 8, seed=1).flatten()).backward()
    assert reads.ops == [] and bypass == []
    # The detector works: the id check this replaced read the ids back.
    with HostReads() as reads:
        int(x.max())
    assert reads.ops == ["aten._local_scalar_dense.default"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("kind", ["ngpt", "gpt"])
def test_cuda_forward_does_not_synchronize(kind):
    model = tiny_model(kind).cuda()
    x, targets = ids(2, 8).cuda(), ids(2, 8, seed=1).cuda()  # copies from pageable host memory synchronize
    model(x)  # the first call builds the RoPE tables
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        logits = model(x)
        torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten()).backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()


# ------------------------------------------------------------------------- configs, presets


@pytest.mark.parametrize(
    "cls, overrides, expected",
    [
        (NGPTConfig, dict(d_model=18, n_heads=4), "d_model=18"),
        (GPTConfig, dict(d_model=18, n_heads=4), "n_heads=4"),
        (NGPTConfig, dict(d_model=12, n_heads=4), "= 3 is odd"),
        (GPTConfig, dict(d_model=12, n_heads=4), "= 3 is odd"),
        (NGPTConfig, dict(vocab_size=0), "vocab_size must be a positive int, got 0"),
        (GPTConfig, dict(n_layers=-2), "n_layers must be a positive int, got -2"),
        (NGPTConfig, dict(d_mlp=2.5), "d_mlp must be a positive int, got 2.5"),
        (NGPTConfig, dict(max_seq_len=0), "max_seq_len"),
        (NGPTConfig, dict(update="geodesic"), "update must be one of .* got 'geodesic'"),
        (NGPTConfig, dict(alpha_attn={"mode": "matrix"}), r"alpha_attn\.mode .* 'matrix'"),
        (NGPTConfig, dict(s_qk={"mode": "per-head"}), r"s_qk\.mode .* 'per-head'"),
        (NGPTConfig, dict(s_u={"mode": "x"}), r"s_u\.mode .* 'x'"),
        (NGPTConfig, dict(s_z={"mode": None}), r"s_z\.mode .* None"),
        (NGPTConfig, dict(alpha_mlp={"scale": -1.0}), r"alpha_mlp\.scale .* -1.0"),
        (NGPTConfig, dict(s_v={"absolute": 1}), r"s_v\.absolute .* 1"),
        (NGPTConfig, dict(s_qk={"init": 1.0, "shape": 3}), r"s_qk has unknown field\(s\) 'shape'"),
        (NGPTConfig, dict(s_z=0.5), "s_z must be a ScaleSpec or a table of its fields, got 0.5"),
        (NGPTConfig, dict(qk_norm="yes"), "qk_norm .* 'yes'"),
        (GPTConfig, dict(init_std=0.0), "init_std .* 0.0"),
        (GPTConfig, dict(norm_eps=-1e-5), "norm_eps"),
    ],
)
def test_config_errors_name_field_and_value(cls, overrides, expected):
    with pytest.raises(ValueError, match=expected):
        cls(**{**TINY_SHAPE, **overrides})


def test_config_defaults():
    c = NGPTConfig(vocab_size=10, n_layers=1, d_model=8, n_heads=2)
    assert c.d_mlp == 32 and c.rope_base == 10000 and c.update == "lerp" and c.alpha_attn.absolute and c.qk_norm
    assert GPTConfig(vocab_size=10, n_layers=1, d_model=8, n_heads=2).d_mlp == 32


def test_presets():
    c = preset_config("ngpt-tiny")
    assert (c.vocab_size, c.d_model, c.n_layers, c.n_heads, c.max_seq_len) == (256, 64, 2, 4, 128)
    c = preset_config("gpt-small", max_seq_len=64)
    assert isinstance(c, GPTConfig) and (c.d_model, c.n_layers, c.max_seq_len) == (256, 4, 64)
    c = preset_config("ngpt-1b", update="slerp")
    assert (c.n_layers, c.d_model, c.n_heads, c.update) == (36, 1280, 20, "slerp")
    assert isinstance(from_preset("gpt-tiny"), GPT)
    with pytest.raises(ValueError, match="'ngpt-2b'.*gpt-0.5b.*ngpt-tiny"):
        preset_config("ngpt-2b")
    with pytest.raises(ValueError, match="'dmodel'.*valid fields.*d_model"):
        preset_config("gpt-tiny", dmodel=32)
    with pytest.raises(ValueError, match="'update'"):  # an nGPT-only field given to GPT
        preset_config("gpt-tiny", update="slerp")


# --------------------------------------------------------------------------------- compile


@pytest.mark.slow
@pytest.mark.filterwarnings(
    "ignore:`torch.jit.script_method` is deprecated:DeprecationWarning"
)  # torch's inductor imports
def test_torch_compile_matches_eager():
    """The compiled forward agrees with eager (the design doc warns of compounding error through
    repeated normalizations in compiled code). Tiny model: compilation dominates the time."""
    torch._dynamo.reset()
    model = tiny_model("ngpt", n_layers=1, d_model=16, n_heads=2)
    x = ids(2, 8)
    with torch.no_grad():
        eager = model(x)
        compiled = torch.compile(model, fullgraph=True)(x)  # fullgraph: no silent eager fallback
    torch.testing.assert_close(compiled, eager, rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------------------------------------
# The registry of model classes


def test_model_classes_are_registered_by_model_type():
    assert MODEL_CLASSES == {"gpt": GPT, "ngpt": NGPT}
    assert model_class("ngpt") is NGPT and model_class("gpt") is GPT
    with pytest.raises(ValueError, match=r"unknown model_type 'llama'; spherenet knows \['gpt', 'ngpt'\]"):
        model_class("llama")
    config = preset_config("ngpt-tiny")
    assert model_class_of(config) is NGPT and model_class_of(preset_config("gpt-tiny")) is GPT
    with pytest.raises(TypeError, match="expected a model config \\(GPTConfig, NGPTConfig\\), got dict"):
        model_class_of({"vocab_size": 8})
    assert sorted({name.split("-")[0] for name in PRESETS}) == ["gpt", "ngpt"]


def test_a_new_model_class_registers_itself_and_subclasses_without_model_type_do_not():
    @dataclasses.dataclass
    class TinyConfig:
        vocab_size: int = 8

    try:

        class Tiny(LanguageModel):
            config_class = TinyConfig
            model_type = "tiny-test"
            architecture = "Tiny"

        class Wrapped(Tiny):  # as FSDP2's fully_shard subclasses a model's class
            pass

        assert MODEL_CLASSES["tiny-test"] is Tiny and Wrapped not in MODEL_CLASSES.values()
        assert model_class_of(TinyConfig()) is Tiny
        with pytest.raises(TypeError, match="model_type 'ngpt' is taken by NGPT"):

            class Other(LanguageModel):
                model_type = "ngpt"

    finally:
        MODEL_CLASSES.pop("tiny-test", None)
    assert list(MODEL_CLASSES) == ["gpt", "ngpt"]


# ------------------------------------------------------ model options: GQA, head_dim, relu2

OPTIONS = pytest.mark.parametrize(
    "options",
    [dict(n_kv_heads=1), dict(n_kv_heads=2, n_heads=4, head_dim=10, mlp="relu2")],
    ids=["mqa", "gqa_head_dim_relu2"],
)


@pytest.mark.parametrize("kind", ["ngpt", "gpt"])
@OPTIONS
def test_model_options_cache_chunks_and_generation_match_the_full_pass(kind, options):
    model = tiny_model(kind, seed=6, **options)
    c = model.config
    x = ids(2, 11)
    with torch.no_grad():
        full = model(x)
        caches = [KVCache() for _ in model.blocks]
        chunks = [model(x[:, a:b], kv_caches=caches) for a, b in ((0, 4), (4, 9), (9, 10), (10, 11))]
    torch.testing.assert_close(torch.cat(chunks, dim=1), full, rtol=1e-5, atol=1e-5)
    assert all(cache.keys.shape == cache.values.shape == (2, c.n_kv_heads, 11, c.head_dim) for cache in caches)
    prompt = ids(2, 3, seed=1)
    generator = torch.Generator().manual_seed(3)
    cached = model.generate(prompt, 15, temperature=0.8, generator=generator)  # slides past max_seq_len 16
    again = recompute_generate(model, prompt, 15, temperature=0.8, generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(cached, again, rtol=0, atol=0)


@pytest.mark.parametrize("kind", ["ngpt", "gpt"])
def test_model_options_parameter_shapes_and_gradients(kind):
    model = tiny_model(kind, n_heads=4, n_kv_heads=2, head_dim=6, mlp="relu2", d_mlp=36)
    shapes = {name: tuple(p.shape) for name, p in model.blocks[0].named_parameters()}
    assert shapes["attn.w_q.weight"] == (24, 16) and shapes["attn.w_k.weight"] == shapes["attn.w_v.weight"] == (12, 16)
    assert shapes["attn.w_o.weight"] == ((24, 16) if kind == "ngpt" else (16, 24))
    assert shapes["mlp.w_u.weight"] == (36, 16) and "mlp.w_v.weight" not in shapes
    if kind == "ngpt":
        assert (
            shapes["attn.s_qk.param"] == (24,) and shapes["mlp.s_uv.param"] == (36,) and "mlp.s_u.param" not in shapes
        )
    model(ids(2, 8)).logsumexp(-1).mean().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())


def test_model_options_count_on_meta_at_the_8b_shape():
    """Normalized-Nemotron-8B's shape: 32 layers, d 4096, 32 heads of 128, 8 key/value heads,
    squared-ReLU MLP of 21504, vocabulary 131072 (untied)."""
    with torch.device("meta"):
        model = from_preset("ngpt-nemotron-8b")
    d, hd, layer = 4096, 128, 2 * 4096 * 32 * 128 + 2 * 4096 * 8 * 128 + 2 * 4096 * 21504
    scalings = 32 * 128 + 21504 + 2 * d
    expected = 2 * 131072 * d + 131072 + 32 * (layer + scalings)
    assert sum(p.numel() for p in model.parameters()) == expected
    assert model.blocks[0].attn.w_k.weight.shape == (8 * hd, d)


def test_saved_models_round_trip_the_options_and_older_configs_load(tmp_path):
    pytest.importorskip("safetensors")
    model = tiny_model("ngpt", n_heads=4, n_kv_heads=1, head_dim=6, mlp="relu2", s_uv={"init": 0.5})
    model.save_pretrained(tmp_path / "options")
    loaded = NGPT.from_pretrained(tmp_path / "options")
    assert loaded.config == model.config
    torch.testing.assert_close(loaded(ids(1, 5)), model(ids(1, 5)), rtol=0, atol=0)
    # config.json written before the options existed: the defaults
    tiny_model("gpt").save_pretrained(tmp_path / "old")
    config_file = tmp_path / "old" / "config.json"
    values = json.loads(config_file.read_text())
    for key in ("n_kv_heads", "head_dim", "mlp"):
        del values[key]
    config_file.write_text(json.dumps(values))
    (tmp_path / "old" / "sha256sums.json").unlink()  # edited by hand: no manifest
    with pytest.warns(UserWarning):
        old = GPT.from_pretrained(tmp_path / "old")
    assert (old.config.n_kv_heads, old.config.head_dim, old.config.mlp) == (2, 8, "swiglu")
