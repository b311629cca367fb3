"""The compare variants of the model options: ngpt-gqa (half the heads as key/value heads) and
ngpt-relu2 (the squared-ReLU MLP at the SwiGLU MLP's weight count), built from TOML overrides."""

from __future__ import annotations

import pytest
import torch

from recipes import compare_variants
from spherenet.models import model_from_config
from spherenet.train.config import load_config, model_config, resolved


def _model(overrides):
    with torch.device("meta"):
        return model_from_config(model_config(load_config(None, overrides)))


@pytest.mark.parametrize("size, heads, d_mlp", [("tiny", 4, 256), ("base", 12, 3072)])
def test_model_option_variants_halve_the_kv_heads_and_keep_the_mlp_weights(size, heads, d_mlp):
    name, gqa = compare_variants.variant_overrides("ngpt-gqa", size)
    assert name == "ngpt-gqa" and f"model.n_kv_heads={heads // 2}" in gqa
    _, relu2 = compare_variants.variant_overrides("ngpt-relu2", size)
    assert "model.mlp=relu2" in relu2 and f"model.d_mlp={3 * d_mlp // 2}" in relu2
    _, plain = compare_variants.variant_overrides("ngpt", size)
    if size != "tiny":
        return
    base, grouped, squared = _model(plain), _model(gqa), _model(relu2)
    assert grouped.config.n_kv_heads == 2 and grouped.blocks[0].attn.w_k.weight.shape == (32, 64)
    mlp_weights = [
        sum(p.numel() for n, p in m.blocks[0].mlp.named_parameters() if p.ndim == 2) for m in (base, squared)
    ]
    assert mlp_weights[0] == mlp_weights[1] == 3 * 64 * 256
    assert (
        compare_variants.studied_rate("ngpt-relu2", "tiny", 100)[0]
        == compare_variants.studied_rate("ngpt", "tiny", 100)[0]
    )


def test_model_options_are_train_overrides_and_survive_resolving():
    cfg = load_config(None, ["model.n_kv_heads=2", "model.head_dim=8", "model.mlp=relu2", "model.s_uv.init=0.5"])
    model = model_config(cfg)
    assert (model.n_kv_heads, model.head_dim, model.mlp, model.s_uv.init) == (2, 8, "relu2", 0.5)
    again = resolved(resolved(cfg))
    assert model_config(again) == model
    with pytest.raises(ValueError, match="n_kv_heads = 3 does not divide n_heads = 4"):
        model_config(load_config(None, ["model.n_kv_heads=3"]))
