"""The whole models against the paper's equations in float64: nGPT's logits (eq. 1, 3, with s_z
parametrized as in Section 2.5) over unit input embeddings and its blocks, with no final
normalization; the baseline's pre-norm blocks (eq. 4, 5) with RMSNorm written out, its final
RMSNorm and its untied logits (eq. 1). The blocks' own parts have their references in
test_model_parts.py."""

from __future__ import annotations

import torch
from model_references import randomize_scales

from spherenet.layers import GPTConfig, NGPTConfig
from spherenet.models import GPT, NGPT

SIZES = dict(vocab_size=13, n_layers=2, d_model=16, n_heads=2, d_mlp=24, max_seq_len=16)


def ids(seed: int = 0) -> torch.Tensor:
    return torch.randint(0, SIZES["vocab_size"], (2, 7), generator=torch.Generator().manual_seed(seed))


def test_ngpt_logits_are_eq_1_and_3_over_unit_embeddings_and_the_blocks():
    torch.manual_seed(0)
    config = NGPTConfig(**SIZES)
    model = NGPT(config).double()
    randomize_scales(model)  # s_z (and the other scalings) away from their constant init
    tokens = ids()
    with torch.no_grad():
        h = model.embed_in.weight[tokens]  # E_input rows, unit (Section 2.1), no scaling
        for block in model.blocks:
            h = block(h)
        # Section 2.5: stored s_z times s_z,init / s_z,scale (init 1, scale 1/sqrt(d_model))
        s_z = model.s_z.param * (config.s_z.init * config.d_model**0.5)
        expected = (h @ model.embed_out.weight.T) * s_z  # eq. 1 (E_output (V, d), unit rows), eq. 3
        torch.testing.assert_close(model(tokens), expected, rtol=1e-12, atol=1e-12)


def rms_norm(x: torch.Tensor, gain: torch.Tensor, eps: float) -> torch.Tensor:
    """Each vector to norm sqrt(d), then times the gain (Section 2.2.1)."""
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * gain


def test_gpt_blocks_are_eq_4_5_and_logits_eq_1_after_the_final_rmsnorm():
    torch.manual_seed(1)
    config = GPTConfig(**SIZES, norm_eps=1e-6)
    model = GPT(config).double()
    randomize_scales(model)  # the RMSNorm gains away from 1
    tokens = ids(1)
    with torch.no_grad():
        h = model.embed_in.weight[tokens]
        for block in model.blocks:
            h = h + block.attn(rms_norm(h, block.norm_attn.weight, 1e-6))  # eq. 4
            h = h + block.mlp(rms_norm(h, block.norm_mlp.weight, 1e-6))  # eq. 5
        expected = rms_norm(h, model.norm_out.weight, 1e-6) @ model.embed_out.weight.T  # final RMSNorm, eq. 1
        torch.testing.assert_close(model(tokens), expected, rtol=1e-12, atol=1e-12)
