"""Adapters the Hugging Face way: an nGPT LoRA adapter saved with peft records its base
(``base_model_name_or_path``) and which of spherenet's LoRA layers it uses, and reloads through
transformers' ``model.load_adapter(dir)`` and peft's ``AutoPeftModelForCausalLM`` / ``PeftModel``
with the saved adapter's logits exactly."""

import json
import os

import pytest
import torch

peft = pytest.importorskip("peft")

from transformers import AutoModelForCausalLM  # noqa: E402

from spherenet.hf import SpherenetGPTForCausalLM, SpherenetNGPTForCausalLM  # noqa: E402
from spherenet.hf.lora import (  # noqa: E402
    PlainSphereLoraLinear,
    SphereLoraLinear,
    adapter_config,
    sphere_lora_config,
)
from spherenet.models import NGPT, NGPTConfig  # noqa: E402

VOCAB = 64


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    """A small nGPT saved as spherenet's export (what ``recipes.export`` writes the model as)."""
    torch.manual_seed(1)
    path = tmp_path_factory.mktemp("base") / "ngpt"
    NGPT(NGPTConfig(vocab_size=VOCAB, n_layers=2, d_model=32, n_heads=4, max_seq_len=32)).save_pretrained(path)
    return path


IDS = torch.randint(0, VOCAB, (2, 16), generator=torch.Generator().manual_seed(2))


def save_adapter(export, directory, sphere_aware=True):
    """An adapter of the export, with nonzero B (an effect to reload), saved; returns its logits."""
    base = SpherenetNGPTForCausalLM.from_pretrained(export)
    adapted = peft.get_peft_model(base, sphere_lora_config(base, r=4, lora_alpha=8, sphere_aware=sphere_aware))
    with torch.no_grad():
        for name, p in adapted.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.1, generator=torch.Generator().manual_seed(3))
    adapted.eval()
    logits = adapted(input_ids=IDS).logits.detach()
    adapted.save_pretrained(directory)
    return logits


def lora_layers(model) -> set[type]:
    return {type(m) for m in model.modules() if hasattr(m, "lora_A")}


def test_from_pretrained_records_the_path_and_the_adapter_its_base(export, tmp_path):
    model = SpherenetNGPTForCausalLM.from_pretrained(export)
    assert model.name_or_path == str(export) and model.config.name_or_path == str(export)
    save_adapter(export, tmp_path / "adapter", sphere_aware=False)
    saved = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert saved["base_model_name_or_path"] == str(export)
    assert saved["spherenet_lora"] == "plain"


@pytest.mark.parametrize("sphere_aware", [True, False])
def test_load_adapter_gives_the_saved_adapters_logits(export, tmp_path, sphere_aware):
    expected = save_adapter(export, tmp_path / "adapter", sphere_aware)
    model = SpherenetNGPTForCausalLM.from_pretrained(export)
    assert not torch.allclose(model(input_ids=IDS).logits, expected)  # the adapter matters
    model.load_adapter(tmp_path / "adapter")
    assert lora_layers(model) == {SphereLoraLinear if sphere_aware else PlainSphereLoraLinear}
    torch.testing.assert_close(model(input_ids=IDS).logits, expected, rtol=0, atol=0)


def test_an_adapter_that_does_not_record_its_layer_loads_as_sphere_aware(export, tmp_path):
    """An adapter saved before ``spherenet_lora`` was recorded: sphere_lora_config's default layer."""
    expected = save_adapter(export, tmp_path / "adapter", sphere_aware=True)
    config_file = tmp_path / "adapter" / "adapter_config.json"
    values = json.loads(config_file.read_text())
    del values["spherenet_lora"]
    config_file.write_text(json.dumps(values))
    model = SpherenetNGPTForCausalLM.from_pretrained(export)
    model.load_adapter(tmp_path / "adapter")
    assert lora_layers(model) == {SphereLoraLinear}
    torch.testing.assert_close(model(input_ids=IDS).logits, expected, rtol=0, atol=0)


@pytest.mark.parametrize(
    "task_type, how",
    [(None, {"import_allowlist": ["spherenet"]}), ("CAUSAL_LM", {"trust_remote_code": True})],
    ids=["class-recorded-by-peft", "causal-lm"],
)
def test_auto_peft_model_loads_the_recorded_base_with_the_adapters_config(export, tmp_path, task_type, how):
    """AutoPeftModelForCausalLM loads the base from the recorded path: with the class peft
    recorded (task_type None: peft asks for import_allowlist) or through AutoModelForCausalLM
    (task_type CAUSAL_LM); the adapter's layers come from ``config=adapter_config(dir)``."""
    base = SpherenetNGPTForCausalLM.from_pretrained(export)
    adapted = peft.get_peft_model(base, sphere_lora_config(base, r=4, lora_alpha=8, task_type=task_type))
    with torch.no_grad():
        for name, p in adapted.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.1, generator=torch.Generator().manual_seed(3))
    adapted.eval()
    expected = adapted(input_ids=IDS).logits.detach()
    adapter = tmp_path / "adapter"
    adapted.save_pretrained(adapter)
    # config= builds the layers; peft still reads the saved file itself for the base's path, as a
    # plain LoraConfig, and warns of spherenet_lora as a newer peft's field (the README says so)
    with pytest.warns(UserWarning, match=r"\['spherenet_lora'\] for class LoraConfig"):
        loaded = peft.AutoPeftModelForCausalLM.from_pretrained(adapter, config=adapter_config(adapter), **how)
    assert lora_layers(loaded) == {SphereLoraLinear}
    torch.testing.assert_close(loaded(input_ids=IDS).logits, expected, rtol=0, atol=0)
    again = peft.PeftModel.from_pretrained(
        SpherenetNGPTForCausalLM.from_pretrained(export), adapter, config=adapter_config(adapter)
    )
    torch.testing.assert_close(again(input_ids=IDS).logits, expected, rtol=0, atol=0)
    # without config= peft cannot know spherenet's layer: it refuses the SphereLinear by name
    with pytest.raises(ValueError, match="SphereLinear"), pytest.warns(UserWarning, match="spherenet_lora"):
        peft.AutoPeftModelForCausalLM.from_pretrained(adapter, **how)


def test_an_adapter_of_a_base_loaded_by_a_relative_path_loads_from_another_directory_offline(
    export, tmp_path, monkeypatch
):
    """peft records the base as the model's ``name_or_path``: the export's absolute path, however it
    was typed, so AutoPeftModelForCausalLM finds it from any working directory without the Hub."""
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # a miss fails now, not after retries
    monkeypatch.chdir(export.parent)
    expected = save_adapter(export.name, tmp_path / "adapter")  # the base typed as a relative path
    saved = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert saved["base_model_name_or_path"] == str(export)
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    adapter = os.path.relpath(tmp_path / "adapter")
    with pytest.warns(UserWarning, match="spherenet_lora"):  # peft's own read of the saved file (see above)
        loaded = peft.AutoPeftModelForCausalLM.from_pretrained(
            adapter, config=adapter_config(adapter), import_allowlist=["spherenet"]
        )
    torch.testing.assert_close(loaded(input_ids=IDS).logits, expected, rtol=0, atol=0)


def test_auto_model_from_pretrained_refuses_an_adapter_directory_in_one_line(export, tmp_path):
    save_adapter(export, tmp_path / "adapter")
    with pytest.raises(ValueError, match=r"holds a PEFT adapter.*PeftModel\.from_pretrained") as info:
        AutoModelForCausalLM.from_pretrained(tmp_path / "adapter")
    assert "\n" not in str(info.value)


def test_adapter_config_of_what_is_not_a_lora_adapter(tmp_path):
    assert adapter_config(tmp_path) is None  # no adapter_config.json
    (tmp_path / "adapter_config.json").write_text('{"peft_type": "IA3"}')
    assert adapter_config(tmp_path) is None
    (tmp_path / "adapter_config.json").write_text('{"peft_type": "LORA", "spherenet_lora": "round"}')
    with pytest.raises(ValueError, match=r"adapter_config\.json: spherenet_lora must be 'sphere-aware' or 'plain'"):
        adapter_config(tmp_path)


def test_a_gpt_adapter_still_loads_through_load_adapter(tmp_path):
    torch.manual_seed(0)
    from spherenet.models import GPT, GPTConfig

    SpherenetGPTForCausalLM.from_spherenet(
        GPT(GPTConfig(vocab_size=VOCAB, n_layers=2, d_model=32, n_heads=4, max_seq_len=32))
    ).save_pretrained(tmp_path / "gpt")
    base = SpherenetGPTForCausalLM.from_pretrained(tmp_path / "gpt")
    adapted = peft.get_peft_model(base, peft.LoraConfig(target_modules="all-linear", r=4))
    with torch.no_grad():
        for name, p in adapted.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.1, generator=torch.Generator().manual_seed(3))
    adapted.eval()
    expected = adapted(input_ids=IDS).logits.detach()
    adapted.save_pretrained(tmp_path / "adapter")
    model = SpherenetGPTForCausalLM.from_pretrained(tmp_path / "gpt")
    model.load_adapter(tmp_path / "adapter")
    torch.testing.assert_close(model(input_ids=IDS).logits, expected, rtol=0, atol=0)
