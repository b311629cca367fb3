"""Folded inference values (spherenet.layers.fold): in eval mode without gradients nGPT computes
its effective scalings and scaled weights once; the logits must equal the unfolded path's, the
folded values must follow every change of the parameters, and training must not change at all."""

from __future__ import annotations

import copy
import hashlib
import pickle

import pytest
import torch
import torch.nn.functional as F

from spherenet.layers import KVCache, NGPTConfig
from spherenet.layers.fold import set_weight_folding
from spherenet.models import NGPT

VARIANTS = {
    "mha": {},
    "gqa": {"n_kv_heads": 2},
    "relu2": {"mlp": "relu2"},
    "scalar": {"s_qk": {"mode": "scalar"}, "s_z": {"mode": "fixed", "init": 2.0}},
    "mqa": {"n_kv_heads": 1, "head_dim": 12, "s_qk": {"mode": "scalar"}},
    "no_qk_norm": {"qk_norm": False},
}


def _model(update: str = "lerp", dtype=torch.float32, seed: int = 0, **overrides) -> NGPT:
    """A tiny nGPT whose scalings are moved off their initial values (so that folding them matters)."""
    torch.manual_seed(seed)
    shape = dict(vocab_size=64, n_layers=2, d_model=32, n_heads=4, d_mlp=48, max_seq_len=32)
    config = NGPTConfig(**shape, update=update, **overrides)
    model = NGPT(config).to(dtype)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "weight" not in name:  # every Scale: random values around the stored ones
                p.mul_(torch.empty_like(p).uniform_(0.5, 1.5))
    return model


def _ids(seed: int = 1, batch: int = 2, length: int = 12) -> torch.Tensor:
    return torch.randint(0, 64, (batch, length), generator=torch.Generator().manual_seed(seed))


def _unfolded(model: NGPT, ids: torch.Tensor, **kwargs) -> torch.Tensor:
    """The logits of the unfolded path (train mode: nGPT has no dropout), mode restored."""
    mode = model.training
    model.train()
    with torch.no_grad():
        out = model(ids, **kwargs)
    model.train(mode)
    return out


def _folded(model: NGPT, ids: torch.Tensor, **kwargs) -> torch.Tensor:
    model.eval()
    with torch.no_grad():
        return model(ids, **kwargs)


def _close(a: torch.Tensor, b: torch.Tensor) -> None:
    atol = 1e-12 if a.dtype == torch.float64 else 1e-5
    torch.testing.assert_close(a, b, rtol=0, atol=atol)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("update", ["lerp", "slerp", "riemannian"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_eval_logits_equal_the_unfolded_path(update, variant, dtype):
    model = _model(update, dtype, **VARIANTS[variant])
    ids = _ids()
    reference = _unfolded(model, ids)
    _close(_folded(model, ids), reference)
    _close(_folded(model, ids), reference)  # the second forward reads the folded values


@pytest.mark.parametrize("variant", ["mha", "gqa", "relu2", "mqa"])
def test_kv_cached_decoding_equals_the_unfolded_full_forward(variant):
    model = _model(**VARIANTS[variant])
    ids = _ids(length=10)
    reference = _unfolded(model, ids)
    caches = [KVCache() for _ in model.blocks]
    model.eval()
    with torch.no_grad():
        steps = [model(ids[:, :6], kv_caches=caches)]
        steps += [model(ids[:, t : t + 1], kv_caches=caches) for t in range(6, 10)]
    _close(torch.cat(steps, dim=1), reference)


def test_weight_folding_off_gives_the_same_logits():
    model = _model()
    ids = _ids()
    folded = _folded(model, ids)
    set_weight_folding(model, False)
    _close(_folded(model, ids), folded)
    _close(_folded(model, ids), _unfolded(model, ids))


def test_the_folded_values_are_reused_until_a_parameter_changes():
    model = _model().eval()
    with torch.no_grad():
        first, second = model.s_z(), model.s_z()
        assert second is first  # computed once
        model.s_z.param.add_(0.25)  # an in-place edit bumps the version counter
        third = model.s_z()
    assert third is not first
    torch.testing.assert_close(third, first + 0.25 * model.s_z.init / model.s_z.scale, rtol=0, atol=1e-6)
    with torch.enable_grad():
        assert model.s_z() is not third  # with gradients: never the folded value


def test_in_place_edits_of_weights_and_scalings_are_followed():
    model = _model()
    ids = _ids()
    _folded(model, ids)
    with torch.no_grad():
        model.embed_out.weight.mul_(-1.0)  # E_out, folded with s_z
        model.blocks[0].mlp.s_v.param.mul_(1.7)  # folded into W_v
        model.blocks[1].mlp.w_u.weight.copy_(model.blocks[0].mlp.w_u.weight)
        model.blocks[1].attn.s_qk.param.mul_(0.6)
        model.blocks[0].residual_attn.alpha.param.mul_(2.0)
    _close(_folded(model, ids), _unfolded(model, ids))


def test_a_training_step_is_followed():
    model = _model()
    ids = _ids()
    before = _folded(model, ids)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    model.train()
    F.cross_entropy(model(ids).flatten(0, 1), ids.flatten()).backward()
    optimizer.step()
    after = _folded(model, ids)
    assert (after - before).abs().max() > 1e-3
    _close(after, _unfolded(model, ids))


def test_an_optimizer_writing_through_data_is_followed():
    """``p.data`` writes bypass the version counters; an optimizer step is followed anyway."""

    class DataSGD(torch.optim.Optimizer):
        def __init__(self, params):
            super().__init__(params, {})

        def step(self, closure=None):
            for group in self.param_groups:
                for p in group["params"]:
                    p.data.add_(torch.ones_like(p.data), alpha=0.1)

    model = _model()
    ids = _ids()
    before = _folded(model, ids)
    DataSGD(model.parameters()).step()
    after = _folded(model, ids)
    assert (after - before).abs().max() > 1e-3
    _close(after, _unfolded(model, ids))


@pytest.mark.parametrize("assign", [False, True])
def test_load_state_dict_is_followed(assign):
    model, other = _model(seed=0), _model(seed=5)
    ids = _ids()
    _folded(model, ids)
    model.load_state_dict(other.state_dict(), assign=assign)
    _close(_folded(model, ids), _unfolded(other, ids))


def test_train_drops_the_folded_values_and_eval_recomputes_them():
    model = _model()
    ids = _ids()
    _folded(model, ids)
    stores = [m.__dict__.get("_folded") for m in model.modules()]
    assert sum(len(s.values) for s in stores if s is not None) > 0
    model.train()
    assert all(not s.values for s in (m.__dict__.get("_folded") for m in model.modules()) if s is not None)
    with torch.no_grad():
        model.s_z.param.mul_(3.0)
    _close(_folded(model, ids), _unfolded(model, ids))


def test_copies_and_pickles_do_not_share_folded_values():
    model = _model()
    ids = _ids()
    _folded(model, ids)
    twin = copy.deepcopy(model)
    loaded = pickle.loads(pickle.dumps(model))
    with torch.no_grad():
        twin.s_z.param.mul_(2.0)
    _close(_folded(twin, ids), _unfolded(twin, ids))
    _close(_folded(loaded, ids), _unfolded(model, ids))
    _close(_folded(model, ids), _unfolded(model, ids))


def test_dtype_change_is_followed():
    model = _model()
    ids = _ids()
    _folded(model, ids)
    model.double()
    out = _folded(model, ids)
    assert out.dtype == torch.float64
    _close(out, _unfolded(model, ids))


def test_the_transformers_class_folds_too():
    from spherenet.hf.modeling import SpherenetNGPTForCausalLM

    model = _model(n_kv_heads=2)
    hf = SpherenetNGPTForCausalLM.from_spherenet(model).eval()
    ids = _ids()
    with torch.no_grad():
        logits = hf(input_ids=ids).logits
        generated = hf.generate(ids[:1, :4], max_new_tokens=6, do_sample=False, eos_token_id=None, pad_token_id=0)
    _close(logits, _unfolded(model, ids))
    own = model.eval().generate(ids[:1, :4], 6, temperature=0)
    assert torch.equal(generated, own)


# ---------------------------------------------------------------------------------------------
# Training is unchanged, bitwise


def _train_record(model: NGPT, steps: int = 3, eval_between: bool = False) -> tuple[list[str], str]:
    """Losses (float.hex) and a digest of every gradient of ``steps`` Adam steps on fixed data."""
    optimizer = torch.optim.Adam(model.parameters(), lr=0.02)
    losses, digest = [], hashlib.sha256()
    for step in range(steps):
        ids = _ids(seed=10 + step, batch=2, length=16)
        model.train()
        optimizer.zero_grad()
        loss = F.cross_entropy(model(ids[:, :-1]).flatten(0, 1), ids[:, 1:].flatten())
        loss.backward()
        losses.append(float(loss.detach()).hex())
        for name, p in model.named_parameters():
            digest.update(name.encode() + p.grad.detach().numpy().tobytes())
        optimizer.step()
        if eval_between:  # folded values computed between steps must not leak into training
            _folded(model, ids)
    return losses, digest.hexdigest()


@pytest.mark.parametrize(
    "update",
    ["lerp", pytest.param("slerp", marks=pytest.mark.slow), pytest.param("riemannian", marks=pytest.mark.slow)],
)
def test_training_is_bitwise_the_same_with_eval_forwards_between_steps(update):
    plain = _train_record(_model(update, seed=3))
    with_eval = _train_record(_model(update, seed=3), eval_between=True)
    assert with_eval == plain


# Recorded with the code before folding (same seeds, same steps), per (update, variant):
# `_train_record(_model(update, seed=3, **VARIANTS[variant]))` with 2 threads: the losses, and the
# gradients' digest on each CPU the project has been checked on. The losses agree bitwise on both;
# the gradients' last bits do not (the CPUs' BLAS kernels sum in another order): first, the CPU they
# were recorded on; then an AVX-512 AMD EPYC (recorded there with the code before folding, and for
# SLERP with its autograd function; the digests of today's code are the same). Another CPU may
# round otherwise still (the test above is portable).
RECORDED_BEFORE_FOLDING = {
    ("lerp", "mha"): (
        ["0x1.0b30680000000p+2", "0x1.0b30fa0000000p+2", "0x1.0ac4bc0000000p+2"],
        {
            "f973ec4659c77cf15facd4d48e3a5e14148487f4624030a77bcf0b2977068a59",
            "04e68f37c109c487810d07527161a2658ce9c4477cab601fee0b1bc54ff1214d",
        },
    ),
    ("riemannian", "gqa"): (
        ["0x1.09c36a0000000p+2", "0x1.099dde0000000p+2", "0x1.0853c40000000p+2"],
        {
            "d77e72815a87bf0c9e319a0e5a518a07e6718a2adc344f0cf89c364f02697172",
            "9b695a1fc29b6c6b87dcd39279fd79fa689e02aafc58635a48454ad36eff1bd3",
        },
    ),
    ("slerp", "relu2"): (  # the gradients re-recorded with SLERP's autograd function (last bits; same losses)
        ["0x1.0d0b6a0000000p+2", "0x1.0aac560000000p+2", "0x1.0b58440000000p+2"],
        {
            "cc5607c0d23c31940680366db6dea35628dde8977f95ca89992d141f5d1582a3",
            "e9ed74ac3b06f73e36ec779379ebfdaffe03ed977e9b57a5743d8241dbe6d2b1",
        },
    ),
}


@pytest.fixture
def two_threads():
    """The thread count the values were recorded with: a matmul's rounding depends on it."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("update, variant", sorted(RECORDED_BEFORE_FOLDING))
def test_training_losses_and_gradients_are_those_recorded_before_folding(update, variant, two_threads):
    model = _model(update, seed=3, **VARIANTS[variant])
    losses, digest = _train_record(model)
    recorded_losses, recorded_digests = RECORDED_BEFORE_FOLDING[update, variant]
    assert losses == recorded_losses
    assert digest in recorded_digests, f"gradients changed, or a CPU that rounds otherwise ({digest})"


def test_a_wrapped_linear_is_not_folded_past():
    """A LoRA wrapper (or any module re-defining a SphereLinear's forward) adds to the weight:
    folding must go through its forward, not read the plain weight."""
    from spherenet.layers import SphereLinear

    class Shifted(SphereLinear):
        def forward(self, x, out_scale=None):
            return super().forward(x, out_scale) + 0.5

    model = _model()
    ids = _ids()
    for block in model.blocks:
        shifted = Shifted(32, 48)
        shifted.load_state_dict(block.mlp.w_u.state_dict())
        block.mlp.w_u = shifted
    shifted_out = Shifted(32, 64)
    shifted_out.load_state_dict(model.embed_out.state_dict())
    model.embed_out = shifted_out
    _close(_folded(model, ids), _unfolded(model, ids))


def test_the_attention_projections_are_folded_into_one_matmul_and_follow_their_weights():
    model = _model(n_kv_heads=2)
    ids = _ids()
    _folded(model, ids)
    assert {"qkv", "qk rows"} <= set(model.blocks[0].attn._folded.values)  # the eval path was taken
    with torch.no_grad():
        model.blocks[0].attn.w_q.weight.mul_(-1.0)
        model.blocks[1].attn.w_k.weight.copy_(model.blocks[0].attn.w_k.weight)
        model.blocks[1].attn.w_v.weight.mul_(0.5)
    _close(_folded(model, ids), _unfolded(model, ids))
    state = _model(n_kv_heads=2, seed=5).state_dict()
    model.load_state_dict(state)
    _close(_folded(model, ids), _unfolded(model, ids))


def test_a_wrapped_attention_projection_is_not_folded_past():
    from spherenet.layers import SphereLinear

    class Shifted(SphereLinear):
        def forward(self, x, out_scale=None):
            return super().forward(x, out_scale) + 0.5

    model = _model()
    ids = _ids()
    shifted = Shifted(32, 32)
    shifted.load_state_dict(model.blocks[0].attn.w_k.state_dict())
    model.blocks[0].attn.w_k = shifted
    _close(_folded(model, ids), _unfolded(model, ids))
    assert "qkv" not in model.blocks[0].attn.__dict__.get("_folded").values


@pytest.mark.parametrize("implementation", ["reference", "torch"])
def test_eval_decoding_follows_the_kernel_choice(implementation):
    """The eval path's fused calls go through the resolver: a ``use(...)`` block is obeyed (the
    reference's values, not the fused forward's) and the logits stay those of the unfolded path."""
    from spherenet import kernels

    model = _model(**VARIANTS["gqa"])
    ids = _ids(length=10)
    with kernels.use(implementation):
        reference = _unfolded(model, ids)
        caches = [KVCache() for _ in model.blocks]
        steps = [_folded(model, ids[:, :6], kv_caches=caches)]
        steps += [_folded(model, ids[:, t : t + 1], kv_caches=caches) for t in range(6, 10)]
    _close(torch.cat(steps, dim=1), reference)


@pytest.mark.parametrize("variant", ["mha", "relu2"])
def test_single_token_decoding_reads_a_contiguous_down_projection(variant):
    """Decoding one row, the MLPs' W_o is read from a contiguous copy (folded once); the logits
    stay those of the unfolded path, and follow an edit of W_o."""
    model = _model(**VARIANTS[variant])
    ids = _ids(batch=1, length=10)

    def decode():
        caches = [KVCache() for _ in model.blocks]
        steps = [_folded(model, ids[:, :6], kv_caches=caches)]
        steps += [_folded(model, ids[:, t : t + 1], kv_caches=caches) for t in range(6, 10)]
        return torch.cat(steps, dim=1)

    decoded = decode()
    assert "down" in model.blocks[0].mlp._folded.values  # the single-row path was taken
    _close(decoded, _unfolded(model, ids))
    with torch.no_grad():
        model.blocks[1].mlp.w_o.weight.mul_(-1.0)
    _close(decode(), _unfolded(model, ids))
