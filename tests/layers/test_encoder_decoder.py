"""Building your own model: attention masks (SDPA's convention, combined with the causal mask
and the KV cache), blocks with cross-attention and their positions, the spherical classifier
head, and the two worked examples of examples/, run here so that they cannot rot."""

from __future__ import annotations

import math
import runpy
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from spherenet.layers import KVCache, SphereClassifier
from spherenet.manifolds import named_sphere_parameters, normalize
from spherenet.models import (
    GPTAttention,
    GPTBlock,
    GPTConfig,
    GPTCrossBlock,
    NGPTAttention,
    NGPTBlock,
    NGPTConfig,
    NGPTCrossBlock,
)

ROOT = Path(__file__).resolve().parents[2]
D, HEADS = 16, 2


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def attention(kind: str, **kw):
    torch.manual_seed(0)
    cls = NGPTAttention if kind == "ngpt" else GPTAttention
    return cls(D, HEADS, **kw).double()


def reference_attention(module, x, allowed: torch.Tensor) -> torch.Tensor:
    """Softmax attention written out in float64 with an explicit (B, T, S) bool mask."""
    b, t, _ = x.shape
    q = module._split_heads(module.w_q(x))
    k = module._split_heads(module.w_k(x))
    v = module._split_heads(module.w_v(x))
    q, k = module._scale_q(module.rope(q)), module._scale_k(module.rope(k))
    scores = (q @ k.transpose(-1, -2)) * module.softmax_scale
    scores = scores.masked_fill(~allowed[:, None], -math.inf)
    out = scores.softmax(-1) @ v
    return module.w_o(out.transpose(1, 2).reshape(b, t, D))


@pytest.mark.parametrize("kind", ["ngpt", "gpt"])
@pytest.mark.parametrize("causal", [False, True])
def test_padding_mask_matches_the_written_out_attention(kind, causal):
    module = attention(kind, causal=causal)
    x = torch.randn(3, 7, D, generator=_gen(1), dtype=torch.float64)
    lengths = torch.tensor([7, 4, 2])
    real = torch.arange(7) < lengths[:, None]  # (B, S)
    allowed = real[:, None, :].expand(3, 7, 7)
    if causal:
        allowed = allowed & torch.ones(7, 7, dtype=torch.bool).tril()
    got = module(x, attn_mask=real[:, None, None, :])
    torch.testing.assert_close(got, reference_attention(module, x, allowed), rtol=1e-10, atol=1e-12)
    # the float convention: 0 where allowed, -inf where not
    additive = torch.zeros(3, 1, 1, 7, dtype=torch.float64).masked_fill(~real[:, None, None, :], -math.inf)
    torch.testing.assert_close(module(x, attn_mask=additive), got, rtol=1e-10, atol=1e-12)
    # what stands in a padded position changes nothing at the real ones
    noisy = x.clone()
    noisy[~real] = torch.randn(int((~real).sum()), D, generator=_gen(2), dtype=torch.float64)
    moved = module(noisy, attn_mask=real[:, None, None, :])
    torch.testing.assert_close(moved[real], got[real], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("kind", ["ngpt", "gpt"])
def test_mask_with_a_kv_cache_is_combined_with_the_bottom_right_causal_mask(kind):
    """Decoding in two chunks with a mask over all keys gives the single-call result."""
    module = attention(kind, causal=True)
    x = torch.randn(2, 6, D, generator=_gen(3), dtype=torch.float64)
    keep = torch.tensor([[True, False, True, True, True, True], [True, True, True, False, True, True]])
    full = module(x, attn_mask=keep[:, None, None, :])
    cache = KVCache()
    first = module(x[:, :4], cache=cache, attn_mask=keep[:, None, None, :4])
    second = module(x[:, 4:], cache=cache, attn_mask=keep[:, None, None, :])
    torch.testing.assert_close(torch.cat([first, second], dim=1), full, rtol=1e-10, atol=1e-12)


def test_bad_masks_are_refused_by_name():
    module = attention("ngpt")
    x = torch.randn(2, 5, D, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"attn_mask of shape \(2, 1, 1, 4\) does not broadcast to .* \(2, 2, 5, 5\)"):
        module(x, attn_mask=torch.ones(2, 1, 1, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="attn_mask must be a bool or float tensor, got torch.int64"):
        module(x, attn_mask=torch.ones(2, 1, 1, 5, dtype=torch.long))


def config(kind: str):
    return (NGPTConfig if kind == "ngpt" else GPTConfig)(vocab_size=8, n_layers=1, d_model=D, n_heads=HEADS, d_mlp=32)


def cross_block(kind: str, cross_positions: bool = False):
    torch.manual_seed(0)
    cls = NGPTCrossBlock if kind == "ngpt" else GPTCrossBlock
    return cls(config(kind), cross_positions=cross_positions).double()


def test_ngpt_cross_block_is_eq_10_three_times():
    """Self-attention, cross-attention and MLP, each an update of the unit hidden state (eq. 10,
    11, and eq. 10 with alpha_C for the cross-attention)."""
    block = cross_block("ngpt")
    h = normalize(torch.randn(2, 5, D, generator=_gen(4), dtype=torch.float64))
    ctx = normalize(torch.randn(2, 3, D, generator=_gen(5), dtype=torch.float64))
    step = lambda h, b, alpha: normalize(h + alpha * (b - h))  # noqa: E731  eq. 10, 11 (LERP)
    want = step(h, normalize(block.attn(h)), block.residual_attn.alpha())
    want = step(want, normalize(block.cross_attn(want, context=ctx)), block.residual_cross.alpha())
    want = step(want, normalize(block.mlp(want)), block.residual_mlp.alpha())
    got = block(h, context=ctx)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    assert (got.norm(dim=-1) - 1).abs().max() < 1e-12


@pytest.mark.parametrize("kind", ["ngpt", "gpt"])
def test_context_and_its_absence_are_checked(kind):
    block = cross_block(kind)
    h = torch.randn(2, 5, D, dtype=torch.float64)
    with pytest.raises(ValueError, match="has cross-attention: give it context="):
        block(h)
    plain = (NGPTBlock if kind == "ngpt" else GPTBlock)(config(kind)).double()
    with pytest.raises(TypeError, match="unexpected keyword argument 'context'"):  # decoder-only
        plain(h, context=h)


@pytest.mark.parametrize("kind", ["ngpt", "gpt"])
@pytest.mark.parametrize("cross_positions", [False, True])
def test_incremental_decoding_with_both_caches_matches_one_call(kind, cross_positions):
    """Token by token with a self-attention cache and a cross-attention cache: the queries of
    the cross-attention are at their true positions (query_offset), as in one call."""
    block = cross_block(kind, cross_positions)
    h = normalize(torch.randn(2, 6, D, generator=_gen(6), dtype=torch.float64))
    ctx = normalize(torch.randn(2, 4, D, generator=_gen(7), dtype=torch.float64))
    full = block(h, context=ctx)
    cache, cross_cache = KVCache(), KVCache()
    steps = [block(h[:, i : i + 1], cache=cache, context=ctx, cross_cache=cross_cache) for i in range(6)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-10, atol=1e-12)
    assert len(cross_cache) == 4  # the context's keys, computed once


def test_cross_positions_make_the_context_order_matter():
    """Without positions cross-attention is blind to the context's order; with them it is not."""
    h = normalize(torch.randn(1, 3, D, generator=_gen(8), dtype=torch.float64))
    ctx = normalize(torch.randn(1, 5, D, generator=_gen(9), dtype=torch.float64))
    flipped = ctx.flip(1)
    blind = cross_block("ngpt", cross_positions=False).cross_attn
    torch.testing.assert_close(blind(h, context=flipped), blind(h, context=ctx), rtol=1e-10, atol=1e-12)
    seeing = cross_block("ngpt", cross_positions=True).cross_attn
    assert (seeing(h, context=flipped) - seeing(h, context=ctx)).abs().max() > 1e-3


def test_sphere_classifier_gives_scaled_cosines_and_declares_its_class_vectors():
    torch.manual_seed(0)
    head = SphereClassifier(D, 5).double()
    x = torch.randn(4, D, generator=_gen(10), dtype=torch.float64) * 3
    with torch.no_grad():
        head.scale.param.mul_(torch.linspace(1, 2, 5, dtype=torch.float64))
    cos = normalize(x) @ head.weight.weight.t()
    torch.testing.assert_close(head(x), cos * head.scale(), rtol=1e-12, atol=1e-12)
    assert [name for name, _ in named_sphere_parameters(head)] == ["weight.weight"]
    unit_head = SphereClassifier(D, 5, normalize_input=False).double()
    unit = normalize(x)
    torch.testing.assert_close(unit_head(unit), unit_head(unit * 1.0), rtol=0, atol=0)
    assert not torch.allclose(unit_head(x), unit_head(unit))  # not normalized: x's length counts
    F.cross_entropy(head(x), torch.arange(4)).backward()
    assert head.scale.param.grad is not None and head.weight.weight.grad is not None


def example(name: str) -> dict:
    return runpy.run_path(str(ROOT / "examples" / f"{name}.py"))


@pytest.mark.slow
def test_worked_example_masked_encoder_classifier():
    result = example("encoder_classifier")["main"](steps=60)
    assert result["accuracy"] >= 0.95, result
    assert result["padding_effect"] < 1e-5, result  # the padding is invisible


@pytest.mark.slow
def test_worked_example_seq2seq():
    result = example("seq2seq")["main"](steps=80)
    assert result["token_accuracy"] >= 0.95, result
