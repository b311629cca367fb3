"""Run configuration: TOML + overrides, every bad key or value named."""

import pytest

from spherenet.train.config import ConfigError, load_config, parse_override


def write(tmp_path, text):
    p = tmp_path / "c.toml"
    p.write_text(text)
    return p


def test_defaults_validate():
    cfg = load_config()
    assert cfg.model.preset == "ngpt-tiny" and cfg.optim.method == "riemannian_adam"


def test_toml_and_overrides(tmp_path):
    p = write(
        tmp_path, '[model]\npreset = "gpt-tiny"\nn_layers = 3\n[optim]\nmethod = "adamw"\nlr = 1\n[train]\nsteps = 7\n'
    )
    cfg = load_config(p, ["train.steps=9", "optim.lr=2e-3", "data.source=my.file.txt", "model.update=slerp"])
    assert cfg.model.preset == "gpt-tiny"
    assert cfg.model.overrides == {"n_layers": 3, "update": "slerp"}
    assert cfg.optim.lr == 2e-3 and isinstance(load_config(p).optim.lr, float)
    assert cfg.train.steps == 9
    assert cfg.data.source == "my.file.txt"
    assert cfg.to_dict()["model"] == {"preset": "gpt-tiny", "n_layers": 3, "update": "slerp"}


def test_parse_override_reads_toml_values():
    assert parse_override("train.compile=true") == ("train", "compile", True)
    assert parse_override("optim.lr=1e-3") == ("optim", "lr", 1e-3)
    assert parse_override('data.source="a b"') == ("data", "source", "a b")


@pytest.mark.parametrize(
    "override, message",
    [
        ("train.stepz=3", r"unknown config key train\.stepz"),
        ("bogus.x=1", r"unknown config section \[bogus\]"),
        ("train.steps=0", r"train\.steps must be > 0, got 0"),
        ("train.steps=ten", r"train\.steps must be an integer, got 'ten'"),
        ("optim.lr=-1", r"optim\.lr must be > 0"),
        ("optim.method=sgd", r"optim\.method = 'sgd' is not one of"),
        ("train.parallel=tp", r"train\.parallel = 'tp'"),
        ("train.compile=maybe", r"train\.compile must be true or false"),
        ("data.val_fraction=1.5", r"data\.val_fraction must be in \(0, 1\)"),
        ("steps=3", r"section\.key"),
        ("train.steps", r"section\.key=value"),
    ],
)
def test_bad_overrides_are_named(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, [override])


def test_bad_files(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "missing.toml")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(write(tmp_path, "[train\nsteps = 3"))
    with pytest.raises(ConfigError, match=r"unknown config key optim\.learning_rate"):
        load_config(write(tmp_path, "[optim]\nlearning_rate = 3"))
    with pytest.raises(ConfigError, match="must be a \\[section\\] table"):
        load_config(write(tmp_path, "steps = 3"))
