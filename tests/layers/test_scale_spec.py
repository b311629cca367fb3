"""ScaleSpec (Section 2.5), NGPTConfig's scalings, and the flat keys of earlier versions refused by name."""

from __future__ import annotations

import dataclasses
import json
import math
import re

import pytest
import torch

from spherenet.layers import Scale, ScaleSpec
from spherenet.layers.config import ALPHA, S_QK, S_U, S_V
from spherenet.models import NGPT, NGPTConfig, from_preset, load_pretrained, preset_config
from spherenet.train.config import ConfigError, load_config, parse_override

SIZES = dict(vocab_size=32, n_layers=2, d_model=16, n_heads=2)

# NGPTConfig as dataclasses.asdict wrote it before the scalings were ScaleSpecs (a checkpoint's
# model.json, state.pt's model_config, config.json): no longer loaded, and refused by name.
OLD_FLAT = {
    **SIZES, "d_mlp": 64, "max_seq_len": 1024, "rope_base": 10000.0, "causal": True, "update": "lerp",
    "alpha_init": 0.1, "alpha_scale": None, "alpha_abs": False, "alpha_mode": "scalar",
    "qk_norm": True, "s_qk_mode": "vector", "s_qk_init": 2.0, "s_qk_scale": 0.5,
    "s_uv_mode": "vector", "s_uv_init": 1.5, "s_uv_scale": 1.0,
    "s_z_mode": "fixed", "s_z_init": 3.0, "s_z_scale": None,
}  # fmt: skip  # grouped as the old config declared them
NEW = dict(
    alpha_attn=ScaleSpec(0.1, mode="scalar"),
    alpha_mlp=ScaleSpec(0.1, mode="scalar"),
    s_qk=ScaleSpec(2.0, scale=0.5),
    s_u=ScaleSpec(1.5, scale=1.0),
    s_v=ScaleSpec(1.5, scale=1.0),
    s_z=ScaleSpec(3.0, mode="fixed"),
)


def logits(model: NGPT) -> torch.Tensor:
    ids = torch.randint(0, model.config.vocab_size, (2, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        return model(ids)


def test_spec_round_trips_and_fills_from_its_base():
    spec = ScaleSpec(0.05, mode="scalar", absolute=True)
    assert ScaleSpec.from_dict(spec.to_dict()) == spec
    assert spec.to_dict() == {"init": 0.05, "scale": None, "mode": "scalar", "absolute": True}
    assert ScaleSpec.from_dict({"init": 0.2}, base=spec) == ScaleSpec(0.2, mode="scalar", absolute=True)
    assert ScaleSpec(1).init == 1.0 and isinstance(ScaleSpec(1).init, float)
    assert ScaleSpec(1.0).stored_scale(64) == pytest.approx(1 / 8) and ScaleSpec(1.0, 2.0).stored_scale(64) == 2.0


@pytest.mark.parametrize(
    "values, message",
    [
        ({"init": math.inf}, r"ScaleSpec\.init must be a finite number, got inf"),
        ({"init": True}, r"ScaleSpec\.init must be a finite number, got True"),
        ({"init": 1.0, "scale": 0.0}, r"ScaleSpec\.scale must be a finite number > 0 or None"),
        ({"init": 1.0, "mode": "matrix"}, r"ScaleSpec\.mode must be one of .* got 'matrix'"),
        ({"init": 1.0, "absolute": "yes"}, r"ScaleSpec\.absolute must be True or False, got 'yes'"),
    ],
)
def test_bad_spec_names_the_field(values, message):
    with pytest.raises(ValueError, match=message):
        ScaleSpec(**values)
    with pytest.raises(ValueError, match=message.replace("ScaleSpec", "where")):
        ScaleSpec.from_dict(values, where="where")


def test_from_dict_refuses_unknown_fields_and_a_missing_init():
    with pytest.raises(ValueError, match=r"x has unknown field\(s\) 'initial'; valid: init, scale, mode, absolute"):
        ScaleSpec.from_dict({"initial": 1.0}, where="x")
    with pytest.raises(ValueError, match="x needs an 'init' value"):
        ScaleSpec.from_dict({"mode": "scalar"}, where="x")


def test_scale_from_spec_uses_init_over_scale_and_the_absolute_value():
    s = Scale.from_spec(4, ScaleSpec(-0.05, absolute=True), d_model=16)
    assert s.scale == pytest.approx(0.25)  # None: 1/sqrt(d_model), whatever the size
    torch.testing.assert_close(s.param.detach(), torch.full((4,), 0.25))  # stored at s_scale
    torch.testing.assert_close(s().detach(), torch.full((4,), 0.05))  # used at |s_init|
    fixed = Scale.from_spec(4, ScaleSpec(-2.0, mode="fixed"), d_model=16)
    assert fixed.param is None and fixed().item() == -2.0
    with pytest.raises(TypeError, match="expects a ScaleSpec"):
        Scale.from_spec(4, {"init": 1.0}, d_model=16)


def test_config_defaults_are_the_papers():
    c = NGPTConfig(**SIZES)
    assert c.alpha_attn == c.alpha_mlp == ScaleSpec(0.05, absolute=True)  # Section 2.6 step 3, App. A.2
    assert c.s_qk == c.s_z == ScaleSpec(1.0)  # steps 4, 6: scale 1/sqrt(d_model)
    assert c.s_u == c.s_v == ScaleSpec(1.0, scale=1.0)  # step 5


def test_config_takes_a_partial_dict_over_the_default():
    c = NGPTConfig(**SIZES, alpha_mlp={"init": 0.2}, s_z={"mode": "scalar"})
    assert c.alpha_mlp == ScaleSpec(0.2, absolute=True) and c.alpha_attn == ScaleSpec(0.05, absolute=True)
    assert c.s_z == ScaleSpec(1.0, mode="scalar")
    assert NGPTConfig(**dataclasses.asdict(c)) == c  # asdict -> dicts -> the same config


def test_flat_keywords_are_refused_by_name():
    with pytest.raises(TypeError, match="unexpected keyword argument 'alpha_init'"):
        NGPTConfig(**SIZES, alpha_init=0.1)
    with pytest.raises(ValueError, match="unknown override\\(s\\) 's_qk_mode' for preset 'ngpt-tiny'"):
        preset_config("ngpt-tiny", s_qk_mode="scalar")


def test_old_flat_config_dict_is_refused_naming_its_fields():
    """A config dict saved with the flat keys (model.json, state.pt) fails with a message that
    names where it came from and every field this version does not know."""
    with pytest.raises(ValueError) as info:
        NGPT.config_from_dict(OLD_FLAT, "run/model.json")
    message = str(info.value)
    assert message.startswith("run/model.json has field(s) 'alpha_abs', 'alpha_init', 'alpha_mode'")
    assert "NGPTConfig does not know" in message and "valid fields:" in message and "alpha_attn" in message
    assert NGPT.config_from_dict(dataclasses.asdict(NGPTConfig(**SIZES, **NEW)), "x") == NGPTConfig(**SIZES, **NEW)


def test_config_json_with_flat_keys_is_refused(tmp_path):
    pytest.importorskip("safetensors.torch")
    from spherenet.io import PretrainedFileWarning
    from spherenet.models import PretrainedFileError

    model = from_preset("ngpt-tiny", **NEW).eval()
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["alpha_attn"] == {"init": 0.1, "scale": None, "mode": "scalar", "absolute": False}
    old = {k: v for k, v in saved.items() if k not in NEW}
    old.update({k: v for k, v in OLD_FLAT.items() if k not in SIZES and k not in old})
    (tmp_path / "config.json").write_text(json.dumps(old))
    (tmp_path / "sha256sums.json").unlink()  # that version wrote no manifest
    with (
        pytest.warns(PretrainedFileWarning, match="has no sha256sums.json"),
        pytest.raises(
            PretrainedFileError, match=re.escape(str(tmp_path / "config.json")) + " has field\\(s\\) 'alpha_abs'"
        ),
    ):
        load_pretrained(tmp_path)


def test_toml_tables_dotted_keys_and_overrides_merge(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(
        '[model]\npreset = "ngpt-tiny"\nalpha_attn = {init = 0.1, mode = "scalar"}\ns_qk.init = 2.0\n'
        '[model.s_z]\nmode = "fixed"\n'
    )
    cfg = load_config(path, ["model.alpha_attn.init=0.3", "model.s_u.scale=2"])
    assert cfg.model.overrides == {
        "alpha_attn": {"init": 0.3, "mode": "scalar"},
        "s_qk": {"init": 2.0},
        "s_z": {"mode": "fixed"},
        "s_u": {"scale": 2},
    }
    c = preset_config(cfg.model.preset, **cfg.model.overrides)
    assert c.alpha_attn == ScaleSpec(0.3, mode="scalar", absolute=True) and c.s_u == ScaleSpec(1.0, scale=2.0)
    assert c.s_qk == ScaleSpec(2.0) and c.s_z == ScaleSpec(1.0, mode="fixed")
    assert parse_override("model.s_qk.mode=scalar") == ("model", "s_qk.mode", "scalar")


def test_flat_keys_in_toml_are_refused_when_the_model_is_built(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[model]\npreset = "ngpt-tiny"\nalpha_init = 0.1\n')
    cfg = load_config(path, [])
    with pytest.raises(ValueError, match="unknown override\\(s\\) 'alpha_init'"):
        preset_config(cfg.model.preset, **cfg.model.overrides)


@pytest.mark.parametrize(
    "override, message",
    [
        ("model.alpha_attn.init.x=1", r"'model\.alpha_attn\.init\.x' must be section\.key"),
        ("optim.lr.x=1", r"'optim\.lr\.x' must be section\.key"),
        ("model..init=1", r"must be section\.key"),
    ],
)
def test_bad_nested_overrides_are_named(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, [override])


def test_layer_keywords_of_earlier_versions_are_refused():
    from spherenet.models import NGPTMLP, NGPTAttention, NGPTBlock

    config = NGPTConfig(**SIZES)
    for build, keyword in [
        (lambda: NGPTAttention(16, 2, s_qk_init=2.0), "s_qk_init"),
        (lambda: NGPTMLP(16, 32, s_uv_mode="fixed"), "s_uv_mode"),
        (lambda: NGPTBlock(config, alpha_init=0.1), "alpha_init"),
        (lambda: NGPTBlock(config, attention={"qk_norm": False}), "attention"),
    ]:
        with pytest.raises(TypeError, match=f"unexpected keyword argument '{keyword}'"):
            build()
    with pytest.raises(TypeError, match="NGPTBlock takes an NGPTConfig, got 16"):
        NGPTBlock(16, 2)  # the sizes as arguments, as earlier versions took them


def test_block_takes_each_scaling_from_the_config():
    """NGPTBlock's scalings and options reach the part that uses them."""
    from spherenet.models import NGPTBlock

    config = NGPTConfig(
        **SIZES,
        alpha_attn=dataclasses.replace(ALPHA, init=0.1),
        alpha_mlp=dataclasses.replace(ALPHA, init=0.2, mode="scalar"),
        qk_norm=False,
        s_qk=dataclasses.replace(S_QK, mode="scalar"),
        s_u=dataclasses.replace(S_U, init=0.5),
        s_v=dataclasses.replace(S_V, mode="fixed"),
    )
    block = NGPTBlock(config)
    assert block.residual_attn.alpha.init == 0.1 and block.residual_attn.alpha.mode == "vector"
    assert block.residual_mlp.alpha.init == 0.2 and block.residual_mlp.alpha.mode == "scalar"
    assert block.attn.qk_norm is False and block.attn.s_qk.mode == "scalar"
    assert block.mlp.s_u.init == 0.5 and block.mlp.s_v.mode == "fixed"
