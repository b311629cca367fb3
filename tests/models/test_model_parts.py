"""nGPT's and the baseline's own parts (spherenet.models.ngpt, spherenet.models.gpt): attention,
cross-attention, MLP and blocks, each against a reference written from the paper's equations in
float64, independently of the code paths (explicit masks and softmax).
"""

from __future__ import annotations

import math

import pytest
import torch
from model_references import randomize_scales, rotation_matrix, unit
from tiny_models import layer_config

from spherenet.layers import KVCache, ScaleSpec
from spherenet.manifolds import normalize
from spherenet.models import (
    GPTMLP,
    NGPTMLP,
    GPTAttention,
    GPTBlock,
    GPTConfig,
    GPTCrossAttention,
    NGPTAttention,
    NGPTBlock,
    NGPTCrossAttention,
)

# ------------------------------------------------------------------------------- attention


def ngpt_attention_reference(attn: NGPTAttention, x: torch.Tensor, causal=True, qk_norm=True) -> torch.Tensor:
    """eq. 12 (with unit-row weights), RoPE, eq. 15, 16, eq. 13 with scale sqrt(d_k), eq. 14."""
    B, T, d = x.shape
    H, dk = attn.n_heads, d // attn.n_heads
    Wq, Wk, Wv = attn.w_q.weight, attn.w_k.weight, attn.w_v.weight  # (d_out, d_model), unit rows
    Wo = attn.w_o.weight  # stored transposed: (H*d_k, d_model), unit rows
    s_qk = attn.s_qk().expand(d)
    out = torch.zeros(B, T, d, dtype=torch.float64)
    for b in range(B):
        heads = []
        for hd in range(H):
            cols = slice(hd * dk, (hd + 1) * dk)
            q = x[b] @ Wq[cols].T  # (T, d_k)
            k = x[b] @ Wk[cols].T
            v = x[b] @ Wv[cols].T
            q = torch.stack([rotation_matrix(t, dk) @ q[t] for t in range(T)])
            k = torch.stack([rotation_matrix(t, dk) @ k[t] for t in range(T)])
            if qk_norm:
                q = q / q.norm(dim=-1, keepdim=True)
                k = k / k.norm(dim=-1, keepdim=True)
            q, k = q * s_qk[cols], k * s_qk[cols]
            scores = math.sqrt(dk) * (q @ k.T)
            if causal:
                scores = scores.masked_fill(torch.ones(T, T).triu(1).bool(), float("-inf"))
            heads.append(torch.softmax(scores, dim=-1) @ v)
        out[b] = torch.cat(heads, dim=-1) @ Wo
    return out


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("qk_norm", [True, False])
def test_ngpt_attention_matches_float64_reference(causal, qk_norm):
    torch.manual_seed(0)
    attn = NGPTAttention(16, 4, causal=causal, qk_norm=qk_norm).double()
    randomize_scales(attn)
    x = unit(2, 7, 16, seed=5)
    with torch.no_grad():
        torch.testing.assert_close(attn(x), ngpt_attention_reference(attn, x, causal, qk_norm), rtol=1e-10, atol=1e-12)


def test_ngpt_attention_softmax_scale_is_sqrt_dk():
    attn = NGPTAttention(32, 2)
    assert attn.softmax_scale == pytest.approx(math.sqrt(16))
    assert GPTAttention(32, 2).softmax_scale == pytest.approx(1 / math.sqrt(16))


def test_gpt_attention_matches_float64_reference():
    torch.manual_seed(0)
    attn = GPTAttention(16, 2).double()
    x = torch.randn(1, 5, 16, dtype=torch.float64)
    dk, T = 8, 5
    heads = []
    for hd in range(2):
        cols = slice(hd * dk, (hd + 1) * dk)
        q, k, v = (x[0] @ w.weight[cols].T for w in (attn.w_q, attn.w_k, attn.w_v))
        q = torch.stack([rotation_matrix(t, dk) @ q[t] for t in range(T)])
        k = torch.stack([rotation_matrix(t, dk) @ k[t] for t in range(T)])
        scores = (q @ k.T) / math.sqrt(dk)
        scores = scores.masked_fill(torch.ones(T, T).triu(1).bool(), float("-inf"))
        heads.append(torch.softmax(scores, -1) @ v)
    expected = torch.cat(heads, -1) @ attn.w_o.weight.T
    with torch.no_grad():
        torch.testing.assert_close(attn(x)[0], expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("cls", [NGPTAttention, GPTAttention])
def test_attention_kv_cache_matches_full_sequence(cls):
    """Prefill, a multi-token chunk after an offset (where a top-left causal mask would be
    wrong), then single tokens: the same outputs as one full causal pass."""
    torch.manual_seed(1)
    attn = cls(16, 2).double()
    x = unit(2, 9, 16, seed=6)
    with torch.no_grad():
        full = attn(x)
        cache = KVCache()
        pieces = [attn(x[:, :3], cache=cache), attn(x[:, 3:7], cache=cache)]
        pieces += [attn(x[:, t : t + 1], cache=cache) for t in (7, 8)]
    assert cache.length == 9
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("cls", [NGPTAttention, GPTAttention])
def test_attention_causal_masks_the_future_and_noncausal_sees_it(cls):
    torch.manual_seed(2)
    attn = cls(16, 2).double()
    x = unit(1, 6, 16, seed=7)
    x2 = x.clone()
    x2[:, 4] = unit(16, seed=8)  # change token 4
    with torch.no_grad():
        causal_a, causal_b = attn(x), attn(x2)
        free_a, free_b = attn(x, causal=False), attn(x2, causal=False)
    torch.testing.assert_close(causal_a[:, :4], causal_b[:, :4], rtol=0, atol=0)
    assert (causal_a[:, 4] - causal_b[:, 4]).abs().max() > 1e-6
    assert (free_a[:, :4] - free_b[:, :4]).abs().amax(dim=-1).min() > 1e-8  # every earlier token sees it


@pytest.mark.parametrize("cls", [NGPTCrossAttention, GPTCrossAttention])
def test_cross_attention(cls):
    torch.manual_seed(3)
    attn = cls(16, 4).double()
    x, context = unit(2, 5, 16, seed=9), unit(2, 11, 16, seed=10)
    with torch.no_grad():
        out = attn(x, context=context)
        assert out.shape == (2, 5, 16)
        other = attn(x, context=unit(2, 11, 16, seed=11))
        assert (out - other).abs().max() > 1e-6  # the output reads the context
        # No mask and no RoPE: permuting the context tokens changes nothing.
        torch.testing.assert_close(attn(x, context=context.flip(1)), out, rtol=1e-10, atol=1e-12)
        # The cache stores the context's keys/values once and reuses them.
        cache = KVCache()
        first = attn(x[:, :2], context=context, cache=cache)
        second = attn(x[:, 2:], context=context[:, :1], cache=cache)  # cached: this context is unused
        assert cache.length == 11
        torch.testing.assert_close(torch.cat([first, second], 1), out, rtol=1e-10, atol=1e-12)
    assert attn.causal is False  # a cross-attention never masks the context
    with pytest.raises(ValueError, match="give context="):
        attn(x)


def test_ngpt_cross_attention_matches_reference():
    """Cross-attention per the same equations, without RoPE and without a mask."""
    torch.manual_seed(4)
    attn = NGPTCrossAttention(8, 2).double()
    randomize_scales(attn)
    x, ctx = unit(1, 3, 8, seed=12), unit(1, 4, 8, seed=13)
    dk, s_qk = 4, attn.s_qk()
    heads = []
    for hd in range(2):
        cols = slice(hd * dk, (hd + 1) * dk)
        q = normalize(x[0] @ attn.w_q.weight[cols].T) * s_qk[cols]
        k = normalize(ctx[0] @ attn.w_k.weight[cols].T) * s_qk[cols]
        v = ctx[0] @ attn.w_v.weight[cols].T
        heads.append(torch.softmax(math.sqrt(dk) * q @ k.T, -1) @ v)
    expected = torch.cat(heads, -1) @ attn.w_o.weight
    with torch.no_grad():
        torch.testing.assert_close(attn(x, context=ctx)[0], expected, rtol=1e-10, atol=1e-12)


def test_attention_rejects_bad_heads():
    with pytest.raises(ValueError, match="n_heads=3"):
        NGPTAttention(16, 3)


# ------------------------------------------------------------------------------------- MLP


def test_ngpt_mlp_matches_float64_reference():
    torch.manual_seed(5)
    d, d_mlp = 16, 24
    mlp = NGPTMLP(d, d_mlp).double()
    randomize_scales(mlp)
    h = unit(3, 4, d, seed=14)
    u = (h @ mlp.w_u.weight.T) * mlp.s_u()  # eq. 17 with unit rows, eq. 20
    v = (h @ mlp.w_v.weight.T) * mlp.s_v() * math.sqrt(d)  # eq. 21
    expected = (u * v * torch.sigmoid(v)) @ mlp.w_o.weight  # eq. 18, 19; W_o_mlp stored (d_mlp, d)
    with torch.no_grad():
        torch.testing.assert_close(mlp(h), expected, rtol=1e-10, atol=1e-12)
    assert mlp.w_o.weight.shape == (d_mlp, d)


def test_gpt_mlp_is_swiglu():
    torch.manual_seed(6)
    mlp = GPTMLP(8, 12).double()
    h = torch.randn(2, 8, dtype=torch.float64)
    u, v = h @ mlp.w_u.weight.T, h @ mlp.w_v.weight.T
    expected = (u * v * torch.sigmoid(v)) @ mlp.w_o.weight.T
    with torch.no_grad():
        torch.testing.assert_close(mlp(h), expected)
    assert all(m.bias is None for m in (mlp.w_u, mlp.w_v, mlp.w_o))


# ------------------------------------------------------------------------------------ blocks


def test_ngpt_block_keeps_hidden_state_unit():
    torch.manual_seed(7)
    for update in ("lerp", "slerp", "riemannian"):
        block = NGPTBlock(layer_config(update=update, alpha_attn=ScaleSpec(0.5), alpha_mlp=ScaleSpec(0.5)))
        h = unit(2, 6, 16, dtype=torch.float32, seed=15)
        out = block(h)
        torch.testing.assert_close(out.norm(dim=-1), torch.ones(2, 6), rtol=0, atol=1e-5)
        assert (out - h).abs().max() > 1e-3


def test_ngpt_block_equations():
    """eq. 10, 11 spelled out with the block's own attention and MLP."""
    torch.manual_seed(8)
    block = NGPTBlock(layer_config()).double()
    randomize_scales(block)
    h = unit(1, 5, 16, seed=16)
    with torch.no_grad():
        alpha_a = block.residual_attn.alpha().abs()
        alpha_m = block.residual_mlp.alpha().abs()
        h1 = normalize(h + alpha_a * (normalize(block.attn(h)) - h))
        expected = normalize(h1 + alpha_m * (normalize(block.mlp(h1)) - h1))
        torch.testing.assert_close(block(h), expected)


def test_gpt_block_is_prenorm_with_raw_residual():
    """With both output projections zeroed, a pre-norm block is the identity. (The bug
    ``x = norm(x) + attn(norm(x))`` would return norm(x) instead.)"""
    block = GPTBlock(GPTConfig(vocab_size=8, n_layers=1, d_model=16, n_heads=2, d_mlp=32))
    with torch.no_grad():
        block.attn.w_o.weight.zero_()
        block.mlp.w_o.weight.zero_()
    h = 3.0 * torch.randn(2, 4, 16)
    torch.testing.assert_close(block(h), h, rtol=0, atol=0)
