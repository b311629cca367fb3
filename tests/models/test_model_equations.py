"""The whole models against the paper's equations in float64: nGPT's logits (eq. 1, 3, with s_z
parametrized as in Section 2.5) over unit input embeddings and its blocks, with no final
normalization; the baseline's pre-norm blocks (eq. 4, 5) with RMSNorm written out, its final
RMSNorm and its untied logits (eq. 1); the training loss (eq. 2); the Riemannian residual update
(eq. 24-26) at a finite step, outside the Triton tests. The blocks' own parts have their
references in test_model_parts.py."""

from __future__ import annotations

import torch
from kernel_setting import kernels_set_to
from model_references import randomize_scales, unit
from tiny_models import tiny_gpt, tiny_ngpt

from spherenet import kernels
from spherenet.manifolds import riemannian_update
from spherenet.train.step import lm_loss

VOCAB = 13  # the tiny models with a vocabulary of no power of two


def ids(seed: int = 0) -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, 7), generator=torch.Generator().manual_seed(seed))


def test_ngpt_logits_are_eq_1_and_3_over_unit_embeddings_and_the_blocks():
    model = tiny_ngpt(0, vocab_size=VOCAB).double()
    config = model.config
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
    model = tiny_gpt(1, vocab_size=VOCAB, norm_eps=1e-6).double()
    randomize_scales(model)  # the RMSNorm gains away from 1
    tokens = ids(1)
    with torch.no_grad():
        h = model.embed_in.weight[tokens]
        for block in model.blocks:
            h = h + block.attn(rms_norm(h, block.norm_attn.weight, 1e-6))  # eq. 4
            h = h + block.mlp(rms_norm(h, block.norm_mlp.weight, 1e-6))  # eq. 5
        expected = rms_norm(h, model.norm_out.weight, 1e-6) @ model.embed_out.weight.T  # final RMSNorm, eq. 1
        torch.testing.assert_close(model(tokens), expected, rtol=1e-12, atol=1e-12)


def test_lm_loss_is_eq_2_averaged_over_every_position():
    g = torch.Generator().manual_seed(2)
    logits = 3 * torch.randn(2, 5, 11, generator=g, dtype=torch.float64)
    targets = torch.randint(0, 11, (2, 5), generator=g)
    z_y = logits.gather(-1, targets[..., None])[..., 0]
    expected = -(z_y - logits.exp().sum(-1).log()).mean()  # -log P(y_i | x_<i), eq. 2
    torch.testing.assert_close(lm_loss(logits, targets).double(), expected, rtol=1e-6, atol=1e-6)


def test_riemannian_update_is_eq_24_26_at_a_finite_step():
    h, h_block = unit(3, 4, 16, seed=3), unit(3, 4, 16, seed=4)
    alpha = torch.rand(16, generator=torch.Generator().manual_seed(5), dtype=torch.float64)  # a diagonal B
    g_proj = h * (h * h_block).sum(-1, keepdim=True) - h_block  # eq. 24
    step = h - alpha * g_proj
    expected = step / step.norm(dim=-1, keepdim=True)  # eq. 25, 26
    torch.testing.assert_close(riemannian_update(h, h_block, alpha), expected, rtol=1e-12, atol=1e-12)
    for implementation in ("reference", "torch"):
        with kernels_set_to(implementation):
            out = kernels.residual_update("riemannian", h, h_block, alpha)
        torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)
