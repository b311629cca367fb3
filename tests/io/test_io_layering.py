"""spherenet.io on its own: it saves and loads what a model is made of (names, config fields,
state dict, sphere weights) without a model class; the models' methods are thin calls into it."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from spherenet.io import (
    PretrainedContents,
    PretrainedFileError,
    config_from_dict,
    open_pretrained,
    save_pretrained,
    to_normalized_nemotron,
)
from spherenet.manifolds import declare_sphere, named_sphere_parameters
from spherenet.models import NGPT, from_preset


@pytest.fixture(autouse=True)
def safetensors_installed():
    pytest.importorskip("safetensors.torch")


def files(directory):
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def test_the_method_and_the_function_write_the_same_files(tmp_path):
    model = from_preset("ngpt-tiny")
    model.save_pretrained(tmp_path / "method", max_shard_size="20KB")
    save_pretrained(tmp_path / "function", model.pretrained_contents(), max_shard_size="20KB")
    assert files(tmp_path / "method") == files(tmp_path / "function")
    assert any(name.startswith("model-00001-of-") for name in files(tmp_path / "method"))


@dataclasses.dataclass
class TinyConfig:
    width: int = 4


class Unregistered(nn.Module):
    """A module of one sphere weight that no registry knows: io saves and loads it all the same."""

    def __init__(self, config: TinyConfig):
        super().__init__()
        self.config = config
        self.weight = nn.Parameter(torch.nn.functional.normalize(torch.randn(3, config.width), dim=-1))
        declare_sphere(self, "weight")


def test_io_saves_and_loads_a_module_it_knows_only_as_dicts(tmp_path):
    module = Unregistered(TinyConfig())
    contents = PretrainedContents(
        "Unregistered",
        "Unregistered",
        "unregistered",
        dataclasses.asdict(module.config),
        module.state_dict(),
        dict(named_sphere_parameters(module)),
    )
    save_pretrained(tmp_path, contents)
    saved = open_pretrained(tmp_path)
    fields = saved.config_fields("spherenet-unregistered", {})
    loaded = saved.load_into(Unregistered(config_from_dict(TinyConfig, fields, "config.json")))
    assert torch.equal(loaded.weight, module.weight) and not loaded.training
    with pytest.raises(PretrainedFileError, match="load it with the class that saved it.from_pretrained"):
        saved.config_fields("spherenet-ngpt", {"spherenet-ngpt": NGPT})


def test_off_sphere_contents_are_refused_before_anything_is_written(tmp_path):
    module = Unregistered(TinyConfig())
    with torch.no_grad():
        module.weight.mul_(2)
    contents = PretrainedContents(
        "Unregistered", "Unregistered", "unregistered", {}, module.state_dict(), dict(named_sphere_parameters(module))
    )
    with pytest.raises(PretrainedFileError, match="cannot save Unregistered: 1 of its 1 sphere weights"):
        save_pretrained(tmp_path / "out", contents)
    assert not (tmp_path / "out").exists()


def test_the_nemotron_writer_refuses_a_model_that_is_not_an_ngpt(tmp_path):
    with pytest.raises(ValueError, match="the layout holds an NGPT, not a GPT"):
        to_normalized_nemotron(from_preset("gpt-tiny"), tmp_path)
