"""Grouped-query attention (``n_kv_heads``) and a free head size (``head_dim``), nGPT's and the
baseline's: float64 references written from the equations (explicit rotation matrices, explicit
per-head loops, masks and softmax), the KV cache of the key/value heads, and the config checks.
"""

from __future__ import annotations

import math

import pytest
import torch

from spherenet.layers import KVCache
from spherenet.manifolds import normalize
from spherenet.models import GPTAttention, GPTConfig, NGPTAttention, NGPTConfig

D, HEADS = 16, 4


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def rotation(position: int, head_dim: int, base: float = 10000.0) -> torch.Tensor:
    """RoPE as an explicit rotation matrix: pair i = coordinates (i, i + d/2), angle position * base^(-2i/d)."""
    half = head_dim // 2
    R = torch.zeros(head_dim, head_dim, dtype=torch.float64)
    for i in range(half):
        c, s = math.cos(position * base ** (-2 * i / head_dim)), math.sin(position * base ** (-2 * i / head_dim))
        R[i, i], R[i, i + half], R[i + half, i], R[i + half, i + half] = c, -s, s, c
    return R


def attention_reference(x, wq, wk, wv, wo, n_heads, n_kv_heads, head_dim, *, s_qk=None, qk_norm=True, mask=None):
    """Causal attention over ``x`` (B, T, d) in float64. ``wq`` (H*dk, d), ``wk``, ``wv`` (KV*dk, d)
    and ``wo`` (d, H*dk) in torch's (out, in) convention. Query head j reads key/value head
    j // (H / KV). With ``s_qk`` (effective, H*dk values): nGPT, the score of eq. 15, 16 is
    sum_i Norm(q)_i s_i Norm(k)_i s_i, softmax scale sqrt(d_k); without: the baseline, q.k / sqrt(d_k).
    ``mask``: (B, T) bool, False = a key no query may see."""
    B, T, _ = x.shape
    group = n_heads // n_kv_heads
    out = torch.zeros(B, T, wo.shape[0], dtype=torch.float64)
    for b in range(B):
        heads = []
        for j in range(n_heads):
            g = j // group
            rows_q, rows_kv = slice(j * head_dim, (j + 1) * head_dim), slice(g * head_dim, (g + 1) * head_dim)
            q, k, v = x[b] @ wq[rows_q].T, x[b] @ wk[rows_kv].T, x[b] @ wv[rows_kv].T
            q = torch.stack([rotation(t, head_dim) @ q[t] for t in range(T)])
            k = torch.stack([rotation(t, head_dim) @ k[t] for t in range(T)])
            if s_qk is None:
                scores = (q @ k.T) / math.sqrt(head_dim)
            else:
                if qk_norm:
                    q, k = q / q.norm(dim=-1, keepdim=True), k / k.norm(dim=-1, keepdim=True)
                s = s_qk[rows_q]
                scores = math.sqrt(head_dim) * ((q * s) @ (k * s).T)
            blocked = torch.ones(T, T).triu(1).bool()
            if mask is not None:
                blocked = blocked | ~mask[b][None, :]
            scores = scores.masked_fill(blocked, float("-inf"))
            heads.append(torch.softmax(scores, dim=-1) @ v)
        out[b] = torch.cat(heads, dim=-1) @ wo.T
    return out


def ngpt_attention(n_kv_heads, head_dim=None, qk_norm=True, seed=0) -> NGPTAttention:
    torch.manual_seed(seed)
    attn = NGPTAttention(D, HEADS, n_kv_heads=n_kv_heads, head_dim=head_dim, qk_norm=qk_norm).double()
    with torch.no_grad():  # s_qk away from its constant init, per element
        attn.s_qk.param.mul_(1 + torch.rand(attn.s_qk.param.shape, generator=_gen(seed + 1), dtype=torch.float64))
    return attn


def ngpt_reference(attn: NGPTAttention, x, **kw):
    return attention_reference(
        x,
        attn.w_q.weight,
        attn.w_k.weight,
        attn.w_v.weight,
        attn.w_o.weight.T,  # stored transposed: (H*dk, d)
        attn.n_heads,
        attn.n_kv_heads,
        attn.head_dim,
        s_qk=attn.s_qk(),
        qk_norm=attn.qk_norm,
        **kw,
    )


def gpt_reference(attn: GPTAttention, x, **kw):
    weights = (attn.w_q.weight, attn.w_k.weight, attn.w_v.weight, attn.w_o.weight)
    return attention_reference(x, *weights, attn.n_heads, attn.n_kv_heads, attn.head_dim, **kw)


KV_HEADS = pytest.mark.parametrize("n_kv_heads", [1, 2, HEADS])
HEAD_DIMS = pytest.mark.parametrize("head_dim", [None, 6], ids=["d_over_h", "head_dim6"])


@KV_HEADS
@HEAD_DIMS
@pytest.mark.parametrize("qk_norm", [True, False])
def test_ngpt_grouped_attention_matches_float64_reference(n_kv_heads, head_dim, qk_norm):
    attn = ngpt_attention(n_kv_heads, head_dim, qk_norm)
    hd = head_dim or D // HEADS
    assert attn.w_q.weight.shape == (HEADS * hd, D) and attn.w_k.weight.shape == (n_kv_heads * hd, D)
    assert attn.w_v.weight.shape == (n_kv_heads * hd, D) and attn.w_o.weight.shape == (HEADS * hd, D)
    assert attn.s_qk.param.shape == (HEADS * hd,)
    x = normalize(torch.randn(2, 6, D, generator=_gen(3), dtype=torch.float64))
    with torch.no_grad():
        torch.testing.assert_close(attn(x), ngpt_reference(attn, x), rtol=1e-10, atol=1e-12)


@KV_HEADS
@HEAD_DIMS
def test_gpt_grouped_attention_matches_float64_reference(n_kv_heads, head_dim):
    torch.manual_seed(4)
    attn = GPTAttention(D, HEADS, n_kv_heads=n_kv_heads, head_dim=head_dim).double()
    x = torch.randn(2, 6, D, generator=_gen(5), dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(attn(x), gpt_reference(attn, x), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("kind", ["ngpt", "gpt"])
def test_grouped_attention_with_padding_mask_matches_reference(kind):
    attn = ngpt_attention(2, 6) if kind == "ngpt" else GPTAttention(D, HEADS, n_kv_heads=2, head_dim=6).double()
    x = normalize(torch.randn(2, 5, D, generator=_gen(6), dtype=torch.float64))
    keep = torch.tensor([[False, False, True, True, True], [True, True, True, True, True]])
    # a padded row's queries at the padding see themselves (never an empty row); compare the real ones
    attn_mask = keep[:, None, None, :] | torch.eye(5, dtype=torch.bool)[None, None]
    reference = ngpt_reference if kind == "ngpt" else gpt_reference
    with torch.no_grad():
        out, expected = attn(x, attn_mask=attn_mask), reference(attn, x, mask=keep)
    torch.testing.assert_close(out[0, 2:], expected[0, 2:], rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(out[1], expected[1], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("kind", ["ngpt", "gpt"])
def test_grouped_attention_equals_full_attention_with_repeated_key_value_weights(kind):
    """A key/value head shared by a group is the same as each query head having a copy of it."""
    cls = NGPTAttention if kind == "ngpt" else GPTAttention
    torch.manual_seed(7)
    grouped = cls(D, HEADS, n_kv_heads=2, head_dim=6).double()
    full = cls(D, HEADS, head_dim=6).double()
    with torch.no_grad():
        for name, p in full.named_parameters():
            source = dict(grouped.named_parameters())[name]
            if name in ("w_k.weight", "w_v.weight"):  # head j of the copy is head j // 2 of the group
                source = source.reshape(2, 6, D).repeat_interleave(2, dim=0).reshape(HEADS * 6, D)
            p.copy_(source * (1 + torch.rand(p.shape, dtype=p.dtype)) if p.ndim == 1 else source)
        if kind == "ngpt":
            grouped.s_qk.param.copy_(full.s_qk.param)
    x = normalize(torch.randn(2, 7, D, generator=_gen(8), dtype=torch.float64))
    with torch.no_grad():
        torch.testing.assert_close(grouped(x), full(x), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("cls", [NGPTAttention, GPTAttention])
@KV_HEADS
def test_kv_cache_holds_the_key_value_heads_and_matches_the_full_pass(cls, n_kv_heads):
    """Prefill, a chunk after an offset, then single tokens: the full pass's outputs; the cache
    holds (B, n_kv_heads, T, head_dim)."""
    torch.manual_seed(9)
    attn = cls(D, HEADS, n_kv_heads=n_kv_heads, head_dim=6).double()
    x = normalize(torch.randn(2, 9, D, generator=_gen(10), dtype=torch.float64))
    cache = KVCache()
    with torch.no_grad():
        full = attn(x)
        pieces = [attn(x[:, :3], cache=cache), attn(x[:, 3:7], cache=cache)]
        pieces += [attn(x[:, t : t + 1], cache=cache) for t in (7, 8)]
    assert cache.keys.shape == cache.values.shape == (2, n_kv_heads, 9, 6)
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, rtol=1e-10, atol=1e-12)


def test_ngpt_s_qk_sits_on_both_sides_without_groups_and_squared_on_queries_with_them():
    """eq. 15, 16 (k <- Norm(k) s_qk) kept for n_kv_heads == n_heads; keys shared by a group are
    Norm(k) alone, and the queries carry s_qk squared."""
    x = normalize(torch.randn(1, 5, D, generator=_gen(11), dtype=torch.float64))
    for n_kv_heads in (HEADS, 2):
        attn = ngpt_attention(n_kv_heads)
        cache = KVCache()
        with torch.no_grad():
            attn(x, cache=cache)
            k = attn.rope(attn._split_heads(attn.w_k(x)))
            q = attn.rope(attn._split_heads(attn.w_q(x)))
        s = attn.s_qk().reshape(HEADS, 1, 4)
        if n_kv_heads == HEADS:
            torch.testing.assert_close(cache.keys, normalize(k) * s, rtol=1e-12, atol=1e-14)
            torch.testing.assert_close(attn._scale_q(q), normalize(q) * s, rtol=1e-12, atol=1e-14)
        else:
            torch.testing.assert_close(cache.keys, normalize(k), rtol=1e-12, atol=1e-14)
            torch.testing.assert_close(attn._scale_q(q), normalize(q) * s**2, rtol=1e-12, atol=1e-14)


def test_default_heads_build_the_same_attention_bit_for_bit():
    """n_kv_heads = n_heads and head_dim = d_model / n_heads, given or not: one code path."""
    x = normalize(torch.randn(2, 6, D, generator=_gen(12), dtype=torch.float32))
    outs = []
    for kw in ({}, {"n_kv_heads": HEADS, "head_dim": D // HEADS}):
        torch.manual_seed(13)
        attn = NGPTAttention(D, HEADS, **kw)
        assert not attn.grouped
        with torch.no_grad():
            outs.append(attn(x))
    assert torch.equal(outs[0], outs[1])


def test_attention_rejects_bad_heads_by_name():
    with pytest.raises(ValueError, match="n_kv_heads=3 does not divide n_heads=4"):
        NGPTAttention(D, HEADS, n_kv_heads=3)
    with pytest.raises(ValueError, match="n_kv_heads must be a positive int"):
        GPTAttention(D, HEADS, n_kv_heads=0)
    with pytest.raises(ValueError, match="head_dim must be a positive int"):
        NGPTAttention(D, HEADS, head_dim=0)
    assert NGPTAttention(30, 4, head_dim=8).w_q.weight.shape == (32, 30)  # d_model need not divide


# ------------------------------------------------------------------------------- the configs


@pytest.mark.parametrize("config_class", [NGPTConfig, GPTConfig])
def test_config_resolves_heads_and_head_dim(config_class):
    c = config_class(vocab_size=8, n_layers=1, d_model=64, n_heads=8)
    assert (c.n_kv_heads, c.head_dim, c.mlp) == (8, 8, "swiglu")
    c = config_class(vocab_size=8, n_layers=1, d_model=60, n_heads=8, n_kv_heads=2, head_dim=16, mlp="relu2")
    assert (c.n_kv_heads, c.head_dim, c.mlp) == (2, 16, "relu2")


@pytest.mark.parametrize("config_class", [NGPTConfig, GPTConfig])
@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(n_kv_heads=3), r"\.n_kv_heads = 3 does not divide n_heads = 4"),
        (dict(n_kv_heads=0), r"\.n_kv_heads must be a positive int"),
        (dict(n_kv_heads=2.0), r"\.n_kv_heads must be a positive int"),
        (dict(head_dim=7), r"\.head_dim = 7 is odd"),
        (dict(head_dim=-2), r"\.head_dim must be a positive int"),
        (dict(d_model=30), r"d_model=30 is not divisible by n_heads=4 \(or set head_dim\)"),
        (dict(mlp="gelu"), r"\.mlp must be one of \('swiglu', 'relu2'\), got 'gelu'"),
    ],
)
def test_config_errors_name_the_field(config_class, fields, message):
    values = dict(vocab_size=8, n_layers=1, d_model=32, n_heads=4) | fields
    with pytest.raises(ValueError, match=config_class.__name__ + message if message[0] == "\\" else message):
        config_class(**values)
