"""Run configuration: TOML + overrides, every bad key or value named."""

import pytest

from spherenet.train.config import ConfigError, load_config, parse_override, resolved


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


@pytest.mark.parametrize(
    "method,weight_decay,warmup",
    [("riemannian_adam", 0.0, 0), ("spherical_muon", 0.0, 0), ("adamw", 0.1, 2000), ("adamh", 0.1, 2000)],
)
def test_resolved_fills_every_unset_key_with_what_the_run_uses(method, weight_decay, warmup):
    preset = "gpt-tiny" if method in ("adamw", "adamh") else "ngpt-tiny"
    cfg = load_config(None, [f"model.preset={preset}", f"optim.method={method}", "optim.lr=0.02"])
    assert (cfg.optim.weight_decay, cfg.optim.warmup_steps, cfg.optim.muon_lr, cfg.optim.matrix_lr) == (None,) * 4
    full = resolved(cfg)
    assert (full.optim.weight_decay, full.optim.warmup_steps) == (weight_decay, warmup)  # Table 3
    assert full.optim.muon_lr == full.optim.matrix_lr == 0.02  # optim.lr
    assert full.train.block_size == 128  # the preset's max_seq_len
    assert full.model.overrides["d_model"] == 64 and "vocab_size" not in full.model.overrides  # the data's
    assert resolved(full) == full
    assert cfg.optim.weight_decay is None  # cfg itself is left as given


def test_a_set_key_is_kept_and_vocab_size_only_when_given():
    cfg = load_config(
        None, ["optim.warmup_steps=7", "optim.matrix_lr=0.5", "model.vocab_size=300", "train.block_size=64"]
    )
    full = resolved(cfg)
    assert (full.optim.warmup_steps, full.optim.matrix_lr, full.train.block_size) == (7, 0.5, 64)
    assert full.model.overrides["vocab_size"] == 300
