"""The squared-ReLU MLP without a gate (``mlp="relu2"``), nGPT's and the baseline's, against float64
references written from its equations, under every implementation of the op, and in the blocks."""

from __future__ import annotations

import math

import pytest
import torch
from kernel_setting import kernels_set_to
from tiny_models import tiny_config

from spherenet.layers import ScaleSpec
from spherenet.manifolds import normalize
from spherenet.models import GPTBlock, GPTReLU2MLP, NGPTBlock, NGPTConfig, NGPTReLU2MLP, gpt_mlp, ngpt_mlp


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def ngpt_relu2_reference(h, w_u, w_o_stored, s_uv):
    """u = (h W_u) * s_uv * sqrt(d_model) (W_u unit rows, (d_mlp, d)); out = max(u, 0)^2 W_o_mlp,
    W_o_mlp stored transposed (d_mlp, d)."""
    u = (h @ w_u.T) * s_uv * math.sqrt(h.shape[-1])
    return torch.where(u > 0, u * u, torch.zeros_like(u)) @ w_o_stored


@pytest.mark.parametrize("implementation", ["reference", "torch"])
def test_ngpt_relu2_mlp_matches_float64_reference(implementation):
    torch.manual_seed(0)
    d, d_mlp = 16, 36
    mlp = NGPTReLU2MLP(d, d_mlp, s_uv=ScaleSpec(init=0.7, scale=0.2)).double()
    with torch.no_grad():
        mlp.s_uv.param.mul_(1 + torch.rand(d_mlp, generator=_gen(1), dtype=torch.float64))
    assert set(dict(mlp.named_parameters())) == {"w_u.weight", "w_o.weight", "s_uv.param"}
    assert mlp.w_u.weight.shape == (d_mlp, d) and mlp.w_o.weight.shape == (d_mlp, d)
    h = normalize(torch.randn(3, 5, d, generator=_gen(2), dtype=torch.float64))
    s_uv = mlp.s_uv.param * (0.7 / 0.2)  # Section 2.5: stored at scale, used times init/scale
    expected = ngpt_relu2_reference(h, mlp.w_u.weight, mlp.w_o.weight, s_uv)
    with torch.no_grad(), kernels_set_to(implementation):
        out = mlp(h)
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-12)
    assert (h @ mlp.w_u.weight.T < 0).any()  # the ReLU cuts something here


def test_ngpt_relu2_mlp_under_triton_interpreter_matches_reference():
    pytest.importorskip("triton")
    torch.manual_seed(3)
    mlp = NGPTReLU2MLP(16, 24)
    h = normalize(torch.randn(2, 3, 16, generator=_gen(4)))
    with torch.no_grad():
        expected = ngpt_relu2_reference(h.double(), mlp.w_u.weight.double(), mlp.w_o.weight.double(), 1.0).float()
        with kernels_set_to("triton"):
            out = mlp(h)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_gpt_relu2_mlp_is_ungated_squared_relu():
    torch.manual_seed(5)
    mlp = GPTReLU2MLP(8, 12).double()
    h = torch.randn(4, 8, generator=_gen(6), dtype=torch.float64)
    u = h @ mlp.w_u.weight.T
    expected = torch.where(u > 0, u * u, torch.zeros_like(u)) @ mlp.w_o.weight.T
    with torch.no_grad():
        torch.testing.assert_close(mlp(h), expected, rtol=1e-10, atol=1e-12)
    assert set(dict(mlp.named_parameters())) == {"w_u.weight", "w_o.weight"}
    assert all(m.bias is None for m in (mlp.w_u, mlp.w_o))


def test_configs_pick_the_mlp():
    assert type(ngpt_mlp(tiny_config("ngpt"))).__name__ == "NGPTMLP"
    relu2 = ngpt_mlp(tiny_config("ngpt", mlp="relu2", s_uv={"init": 2.0}))
    assert isinstance(relu2, NGPTReLU2MLP) and relu2.s_uv.init == 2.0 and relu2.s_uv.scale == 1.0
    assert type(gpt_mlp(tiny_config("gpt"))).__name__ == "GPTMLP"
    assert isinstance(gpt_mlp(tiny_config("gpt", mlp="relu2")), GPTReLU2MLP)
    assert isinstance(NGPTBlock(tiny_config("ngpt", mlp="relu2")).mlp, NGPTReLU2MLP)
    assert isinstance(GPTBlock(tiny_config("gpt", mlp="relu2")).mlp, GPTReLU2MLP)
    with pytest.raises(ValueError, match=r"NGPTConfig\.s_uv\.scale"):
        tiny_config("ngpt", s_uv={"scale": 0.0})


def test_ngpt_block_with_relu2_follows_eq_11():
    """h <- Norm(h + alpha_M (Norm(MLP(h)) - h)) with the relu2 MLP (eq. 11)."""
    torch.manual_seed(7)
    config = NGPTConfig(vocab_size=8, n_layers=1, d_model=16, n_heads=4, n_kv_heads=1, head_dim=6, mlp="relu2")
    block = NGPTBlock(config).double()
    h = normalize(torch.randn(2, 5, 16, generator=_gen(8), dtype=torch.float64))
    with torch.no_grad():
        alpha_a, alpha_m = block.residual_attn.alpha(), block.residual_mlp.alpha()
        h1 = normalize(h + alpha_a * (normalize(block.attn(h)) - h))
        m = ngpt_relu2_reference(h1, block.mlp.w_u.weight, block.mlp.w_o.weight, block.mlp.s_uv())
        expected = normalize(h1 + alpha_m * (normalize(m) - h1))
        torch.testing.assert_close(block(h), expected, rtol=1e-10, atol=1e-12)
