"""Layers shared by nGPT and the baseline: RoPE, residual updates, RMSNorm (their attention, MLP and
blocks are tested in tests/models/test_model_parts.py).

References are written here from the paper's equations, in float64, independently of the
layers' code paths (explicit rotation matrices, explicit masks and softmax).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from model_references import rotation_matrix, unit
from tiny_models import layer_config

from spherenet import kernels
from spherenet.layers import RMSNorm, RotaryEmbedding, Scale, ScaleSpec
from spherenet.manifolds import angle, normalize
from spherenet.models import NGPTBlock

SETTINGS = settings(max_examples=15, deadline=None)


# ------------------------------------------------------------------------------------- RoPE


@SETTINGS
@given(head_dim=st.sampled_from([2, 4, 8, 16]), offset=st.integers(0, 5000), seed=st.integers(0, 1000))
def test_rope_is_a_rotation_that_keeps_norms(head_dim, offset, seed):
    rope = RotaryEmbedding(head_dim)
    x = torch.randn(2, 3, 5, head_dim, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    y = rope(x, offset)
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1), rtol=1e-12, atol=1e-12)
    assert not torch.allclose(y, x) or offset == 0


@pytest.mark.parametrize("offset", [0, 1, 7, 300, 4095])
def test_rope_matches_explicit_rotation_matrix(offset):
    head_dim, T = 8, 6
    rope = RotaryEmbedding(head_dim, initial_length=4)  # the table must be extended
    x = torch.randn(T, head_dim, dtype=torch.float64, generator=torch.Generator().manual_seed(offset))
    expected = torch.stack([rotation_matrix(offset + t, head_dim) @ x[t] for t in range(T)])
    torch.testing.assert_close(rope(x, offset), expected, rtol=0, atol=1e-12)
    # The float32 path (what models run) agrees to float32 precision.
    torch.testing.assert_close(rope(x.float(), offset), expected.float(), rtol=0, atol=2e-6)


def test_rope_position_zero_is_identity_and_positions_advance():
    rope = RotaryEmbedding(4)
    x = torch.randn(3, 4, dtype=torch.float64)
    torch.testing.assert_close(rope(x[:1], 0), x[:1])
    # Row t of one call at offset 0 equals a single-row call at offset t (KV-cache decoding).
    full = rope(x, 0)
    for t in range(3):
        torch.testing.assert_close(rope(x[t : t + 1], t), full[t : t + 1])


@SETTINGS
@given(p=st.integers(0, 3000), q_pos=st.integers(0, 3000), shift=st.integers(0, 3000), seed=st.integers(0, 100))
def test_rope_dot_product_depends_only_on_relative_offset(p, q_pos, shift, seed):
    head_dim = 16
    rope = RotaryEmbedding(head_dim)
    g = torch.Generator().manual_seed(seed)
    q, k = (
        torch.randn(1, head_dim, dtype=torch.float64, generator=g),
        torch.randn(1, head_dim, dtype=torch.float64, generator=g),
    )
    dot = (rope(q, p) * rope(k, q_pos)).sum()
    dot_shifted = (rope(q, p + shift) * rope(k, q_pos + shift)).sum()
    # Explicitly: <R(p) q, R(p') k> = <q, R(p' - p) k>.
    dot_relative = (q * (k @ rotation_matrix(q_pos - p, head_dim).T)).sum()
    torch.testing.assert_close(dot, dot_shifted, rtol=0, atol=1e-9)
    torch.testing.assert_close(dot, dot_relative, rtol=0, atol=1e-9)


def test_rope_extends_past_its_table_consistently():
    rope = RotaryEmbedding(8, initial_length=16)
    x = torch.randn(1, 1, 40, 8)
    short = rope(x[..., :10, :], 0)  # builds a short table
    long = rope(x, 0)  # longer than the table: recomputed
    torch.testing.assert_close(long[..., :10, :], short)
    torch.testing.assert_close(rope(x[..., 35:, :], 35), long[..., 35:, :])


def test_rope_rejects_odd_head_dim():
    with pytest.raises(ValueError, match="7"):
        RotaryEmbedding(7)


# ----------------------------------------------------------------------------- residual update


def _update(update, spec, dim):
    """The hidden-state update of the blocks, ``h <- update(h, h_block; alpha)``, with alpha a
    :class:`Scale` of ``spec``."""
    alpha = Scale.from_spec(dim, spec, dim).double()
    return lambda h, h_block: kernels.residual_update(update, h, h_block, alpha())


def _residual(update, alpha, dim, alpha_abs=True):
    """The update with a fixed (scalar) alpha."""
    return _update(update, ScaleSpec(alpha, mode="fixed", absolute=alpha_abs), dim)


def test_residual_alpha_parametrization():
    block = NGPTBlock(layer_config(d_model=64, n_heads=4))
    for alpha in (block.residual_attn.alpha, block.residual_mlp.alpha):
        assert alpha.param.shape == (64,)
        torch.testing.assert_close(alpha.param.detach(), torch.full((64,), 1 / 8.0))  # stored at 1/sqrt(d)
        torch.testing.assert_close(alpha().detach(), torch.full((64,), 0.05))  # used at alpha_init


def test_residual_three_updates_differ_and_stay_unit():
    dim = 16
    h, h_block = unit(4, dim, seed=1), unit(4, dim, seed=2)
    outs = {u: _update(u, ScaleSpec(0.3, absolute=True), dim)(h, h_block) for u in ("lerp", "slerp", "riemannian")}
    for out in outs.values():
        torch.testing.assert_close(out.norm(dim=-1), torch.ones(4, dtype=torch.float64))
    names = list(outs)
    for i in range(3):
        for j in range(i + 1, 3):
            assert (outs[names[i]] - outs[names[j]]).abs().max() > 1e-3, (names[i], names[j])
    # The paper's lerp, eq. 10 (vector alpha), written out:
    alpha = torch.full((dim,), 0.3, dtype=torch.float64)
    torch.testing.assert_close(outs["lerp"], normalize(h + alpha * (h_block - h)))


@SETTINGS
@given(seed=st.integers(0, 10_000))
def test_lerp_and_riemannian_agree_to_second_order_in_alpha(seed):
    dim = 8
    h, h_block = unit(3, dim, seed=seed), unit(3, dim, seed=seed + 1)
    gaps = []
    for alpha in (1e-2, 5e-3):
        lerp_out = _residual("lerp", alpha, dim)(h, h_block)
        riem_out = _residual("riemannian", alpha, dim)(h, h_block)
        gaps.append((lerp_out - riem_out).norm(dim=-1))
        # First order is the same step: both moved about alpha*sin(theta), the gap is far smaller.
        assert (gaps[-1] < 10 * alpha**2).all()
    ratio = gaps[0] / gaps[1]  # halving alpha quarters an O(alpha^2) gap
    assert ((ratio > 3.5) & (ratio < 4.5)).all(), ratio


@SETTINGS
@given(seed=st.integers(0, 10_000))
def test_slerp_moves_theta_over_sin_theta_faster_than_lerp(seed):
    dim, alpha = 8, 2.0**-13  # exact in float32 (a fixed Scale stores its value in float32)
    h, h_block = unit(3, dim, seed=seed), unit(3, dim, seed=seed + 1)
    theta = angle(h, h_block)
    step_slerp = angle(h, _residual("slerp", alpha, dim)(h, h_block))
    step_lerp = angle(h, _residual("lerp", alpha, dim)(h, h_block))
    step_riem = angle(h, _residual("riemannian", alpha, dim)(h, h_block))
    torch.testing.assert_close(step_slerp, alpha * theta, rtol=1e-9, atol=0)  # exact geodesic
    torch.testing.assert_close(step_slerp / step_lerp, theta / torch.sin(theta), rtol=1e-3, atol=0)
    torch.testing.assert_close(step_riem / step_lerp, torch.ones_like(theta), rtol=1e-3, atol=0)
    assert (step_slerp > step_lerp).all()


def test_residual_alpha_abs_option():
    dim = 16
    h, h_block = unit(2, dim, seed=3), unit(2, dim, seed=4)
    toward = _residual("lerp", 0.2, dim)(h, h_block)
    abs_of_negative = _residual("lerp", -0.2, dim, alpha_abs=True)(h, h_block)
    unconstrained = _residual("lerp", -0.2, dim, alpha_abs=False)(h, h_block)
    torch.testing.assert_close(abs_of_negative, toward)
    # Unconstrained negative alpha steps away from h_block.
    assert (angle(unconstrained, h_block) > angle(h, h_block)).all()
    assert (angle(toward, h_block) < angle(h, h_block)).all()


def test_residual_rejects_unknown_update():
    with pytest.raises(ValueError, match="NGPTConfig.update must be one of .* got 'geodesic'"):
        layer_config(update="geodesic")


# ------------------------------------------------------------------------------ norm


def test_rmsnorm_formula_and_gain():
    norm = RMSNorm(6, eps=1e-5).double()
    with torch.no_grad():
        norm.weight.copy_(torch.arange(1, 7, dtype=torch.float64))
    x = torch.randn(3, 6, dtype=torch.float64)
    expected = x / torch.sqrt((x**2).mean(-1, keepdim=True) + 1e-5) * norm.weight
    torch.testing.assert_close(norm(x), expected)
