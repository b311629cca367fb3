"""nGPT in eval mode computes the logits of its current weights, whatever way they were
changed (no value is cached behind a parameter), and the inference transform
(:func:`spherenet.models.fold_for_inference`) gives the same logits as the model it was folded
from, to float rounding, while training stays bitwise what it was."""

from __future__ import annotations

import hashlib

import pytest
import torch
import torch.nn.functional as F
from kernel_setting import kernels_set_to
from tiny_models import tiny_ngpt

from spherenet.layers import KVCache
from spherenet.models import NGPT, fold_for_inference, is_folded
from spherenet.models.inference import FoldedNGPTAttention, FoldedReLU2, FoldedSwiGLU, FrozenScale

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
    shape = dict(vocab_size=64, d_model=32, n_heads=4, d_mlp=48, max_seq_len=32)
    model = tiny_ngpt(seed, **shape, update=update, **overrides).to(dtype)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "weight" not in name:  # every Scale: random values around the stored ones
                p.mul_(torch.empty_like(p).uniform_(0.5, 1.5))
    return model


def _ids(seed: int = 1, batch: int = 2, length: int = 12) -> torch.Tensor:
    return torch.randint(0, 64, (batch, length), generator=torch.Generator().manual_seed(seed))


def _eval_logits(model, ids: torch.Tensor, **kwargs) -> torch.Tensor:
    model.eval()
    with torch.no_grad():
        return model(ids, **kwargs)


def _fresh(model: NGPT) -> NGPT:
    """A newly built model holding ``model``'s current weights."""
    twin = NGPT(model.config).to(next(model.parameters()).dtype)
    twin.load_state_dict({k: v.clone() for k, v in model.state_dict().items()})
    return twin


def _close(a: torch.Tensor, b: torch.Tensor) -> None:
    atol = 1e-12 if a.dtype == torch.float64 else 1e-6
    torch.testing.assert_close(a, b, rtol=0, atol=atol)


# ---------------------------------------------------------------------------------------------
# Eval mode is never stale

# one parameter of every kind: sphere matrices (attention, MLP in and out), scalings, embeddings
PARAMETERS = {
    "w_q": lambda m: m.blocks[0].attn.w_q.weight,
    "w_v": lambda m: m.blocks[1].attn.w_v.weight,
    "w_u": lambda m: m.blocks[0].mlp.w_u.weight,
    "w_o_mlp": lambda m: m.blocks[1].mlp.w_o.weight,
    "s_qk": lambda m: m.blocks[1].attn.s_qk.param,
    "s_v": lambda m: m.blocks[0].mlp.s_v.param,
    "alpha_attn": lambda m: m.blocks[0].residual_attn.alpha.param,
    "s_z": lambda m: m.s_z.param,
    "embed_in": lambda m: m.embed_in.weight,
    "embed_out": lambda m: m.embed_out.weight,
}


def _uneven(p: torch.Tensor) -> torch.Tensor:
    """Factors 0.25 .. 1.75 along ``p``'s last dimension: a uniform factor on a unit vector that
    a ``Norm`` follows (W_q, W_v, W_o) would leave the logits as they were."""
    return torch.linspace(0.25, 1.75, p.shape[-1], dtype=p.dtype)


def _reassign_at_the_same_address(p: torch.Tensor, forward) -> None:
    """``p.data = new`` twice over one piece of memory, a forward between: the second tensor is
    another object at the address the first had."""
    holder = p.detach().clone()
    p.data = holder
    forward()
    holder.mul_(_uneven(holder))
    p.data = holder.view_as(holder)


EDITS = {
    "data_mul": lambda p, forward: p.data.mul_(_uneven(p)),
    "data_add": lambda p, forward: p.data.add_(0.125),
    "data_copy": lambda p, forward: p.data.copy_(p.data.flip(0)),
    "data_index": lambda p, forward: p.data.__setitem__(0, p.data[-1] * 0.5 + 0.25),
    "numpy_view": lambda p, forward: p.data.numpy().__imul__(_uneven(p).numpy()),
    "data_reassign": _reassign_at_the_same_address,
}


@pytest.mark.parametrize("edit", sorted(EDITS))
@pytest.mark.parametrize("parameter", sorted(PARAMETERS))
def test_eval_logits_after_any_weight_edit_are_those_of_a_fresh_model(parameter, edit):
    model = _model(n_kv_heads=2)
    ids = _ids(batch=1)

    def logits(model):  # a prompt, and a single token: decoding, where values were once kept
        return torch.cat([_eval_logits(model, ids), _eval_logits(model, ids[:, :1])], dim=1)

    before = logits(model)  # a first eval forward, as a user's evaluation would run
    p = PARAMETERS[parameter](model)
    EDITS[edit](p, lambda: logits(model))
    after = logits(model)
    assert (after - before).abs().max() > 1e-4  # the edit changed the model
    torch.testing.assert_close(after, logits(_fresh(model)), rtol=0, atol=0)


# ---------------------------------------------------------------------------------------------
# The inference transform


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("update", ["lerp", "slerp", "riemannian"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_folded_logits_equal_the_models(update, variant, dtype):
    model = _model(update, dtype, **VARIANTS[variant])
    ids = _ids()
    folded = fold_for_inference(model)
    _close(_eval_logits(folded, ids), _eval_logits(model, ids))


def test_folding_replaces_the_modules_it_speeds_up_and_freezes_every_scaling():
    for variant, mlp_class in (("mha", FoldedSwiGLU), ("relu2", FoldedReLU2)):
        folded = fold_for_inference(_model(**VARIANTS[variant]))
        assert all(isinstance(b.attn, FoldedNGPTAttention) and isinstance(b.mlp, mlp_class) for b in folded.blocks)
        assert isinstance(folded.s_z, FrozenScale) and isinstance(folded.blocks[0].residual_mlp.alpha, FrozenScale)
        assert not any(p.requires_grad for p in folded.parameters()) and not folded.training
        assert is_folded(folded) and is_folded(folded.blocks[0])


@pytest.mark.parametrize("variant", ["mha", "gqa", "relu2", "mqa"])
def test_folded_kv_cached_decoding_equals_the_full_forward(variant):
    model = _model(**VARIANTS[variant])
    ids = _ids(length=10)
    reference = _eval_logits(model, ids)
    folded = fold_for_inference(model)
    for batch in (ids, ids[:1]):  # several rows, and one (a single decoded row)
        caches = [KVCache() for _ in folded.blocks]
        steps = [_eval_logits(folded, batch[:, :6], kv_caches=caches)]
        steps += [_eval_logits(folded, batch[:, t : t + 1], kv_caches=caches) for t in range(6, 10)]
        _close(torch.cat(steps, dim=1), reference[: len(batch)])


def test_a_folded_model_is_a_snapshot_and_the_original_stays_exact():
    model = _model()
    ids = _ids()
    folded = fold_for_inference(model)
    snapshot = _eval_logits(folded, ids)
    with torch.no_grad():
        model.blocks[0].mlp.w_u.weight.data.mul_(-1.0)
        model.s_z.param.data.add_(0.5)
    _close(_eval_logits(folded, ids), snapshot)  # the snapshot does not follow the original
    torch.testing.assert_close(_eval_logits(model, ids), _eval_logits(_fresh(model), ids), rtol=0, atol=0)
    _close(_eval_logits(fold_for_inference(model), ids), _eval_logits(model, ids))  # fold again after edits


def test_folding_in_place_converts_the_model_and_a_folded_model_is_not_folded_again():
    model = _model()
    ids = _ids()
    reference = _eval_logits(model, ids)
    folded = fold_for_inference(model, inplace=True)
    assert folded is model and isinstance(model.blocks[0].attn, FoldedNGPTAttention)
    _close(_eval_logits(model, ids), reference)
    with pytest.raises(ValueError, match="already folded"):
        fold_for_inference(model)


def test_a_folded_model_refuses_to_be_saved(tmp_path):
    folded = fold_for_inference(_model())
    with pytest.raises(ValueError, match="folded for inference"):
        folded.save_pretrained(tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_the_transformers_class_folds_too():
    from spherenet.hf.modeling import SpherenetNGPTForCausalLM

    model = _model(n_kv_heads=2)
    hf = fold_for_inference(SpherenetNGPTForCausalLM.from_spherenet(model))
    ids = _ids()
    with torch.no_grad():
        logits = hf(input_ids=ids).logits
        generated = hf.generate(ids[:1, :4], max_new_tokens=6, do_sample=False, eos_token_id=None, pad_token_id=0)
    _close(logits, _eval_logits(model, ids))
    own = model.eval().generate(ids[:1, :4], 6, temperature=0)
    assert torch.equal(generated, own)


def test_a_wrapped_linear_is_not_folded_past():
    """A LoRA wrapper (or any module re-defining a SphereLinear's forward) adds to the weight:
    folding must leave its module as it is (its scalings frozen), not read the plain weight."""
    from spherenet.layers import SphereLinear

    class Shifted(SphereLinear):
        def forward(self, x, out_scale=None):
            return super().forward(x, out_scale) + 0.5

    model = _model()
    ids = _ids()
    for block, (name, size) in zip(model.blocks, (("w_k", 32), ("w_u", 48))):
        owner = block.attn if name == "w_k" else block.mlp
        shifted = Shifted(32, size)
        shifted.load_state_dict(getattr(owner, name).state_dict())
        setattr(owner, name, shifted)
    folded = fold_for_inference(model)
    assert not isinstance(folded.blocks[0].attn, FoldedNGPTAttention) and isinstance(folded.blocks[0].mlp, FoldedSwiGLU)
    assert isinstance(folded.blocks[1].attn, FoldedNGPTAttention) and not isinstance(folded.blocks[1].mlp, FoldedSwiGLU)
    assert isinstance(folded.blocks[1].mlp.s_u, FrozenScale)
    _close(_eval_logits(folded, ids), _eval_logits(model, ids))


@pytest.mark.parametrize("implementation", ["reference", "torch"])
def test_folded_decoding_follows_the_kernel_choice(implementation):
    """The folded modules' calls go through the resolver: the kernels' setting is obeyed."""

    model = _model(**VARIANTS["gqa"])
    ids = _ids(length=10)
    with kernels_set_to(implementation):
        reference = _eval_logits(model, ids)
        folded = fold_for_inference(model)
        caches = [KVCache() for _ in folded.blocks]
        steps = [_eval_logits(folded, ids[:, :6], kv_caches=caches)]
        steps += [_eval_logits(folded, ids[:, t : t + 1], kv_caches=caches) for t in range(6, 10)]
    _close(torch.cat(steps, dim=1), reference)


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
        if eval_between:  # an eval forward between steps must not change training
            _eval_logits(model, ids)
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
