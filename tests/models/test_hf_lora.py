"""LoRA of spherenet's transformers models: "all-linear" adapts every attention and MLP
projection of nGPT and GPT, a few LoRA steps train on CPU, and merge_and_unload gives the
adapted model's logits (unit rows for the sphere-aware LoRA)."""

import pytest
import torch

peft = pytest.importorskip("peft")

from spherenet.hf import SpherenetGPTForCausalLM, SpherenetNGPTForCausalLM  # noqa: E402
from spherenet.hf.lora import (  # noqa: E402
    PlainSphereLoraLinear,
    SphereLoraLinear,
    all_linear_names,
    merged_state_dict,
    sphere_lora_config,
)
from spherenet.models import GPT, NGPT, GPTConfig, NGPTConfig  # noqa: E402

VOCAB = 64
PROJECTIONS = {f"blocks.{i}.attn.{w}" for i in range(2) for w in ("w_q", "w_k", "w_v", "w_o")} | {
    f"blocks.{i}.mlp.{w}" for i in range(2) for w in ("w_u", "w_v", "w_o")
}


def hf_model(cls, seed=0):
    torch.manual_seed(seed)
    config_class, hf_class = (
        (NGPTConfig, SpherenetNGPTForCausalLM) if cls is NGPT else (GPTConfig, SpherenetGPTForCausalLM)
    )
    model = cls(config_class(vocab_size=VOCAB, n_layers=2, d_model=32, n_heads=4, max_seq_len=32))
    return hf_class.from_spherenet(model)


def adapted_names(adapted) -> set[str]:
    return {n.removeprefix("base_model.model.") for n, m in adapted.named_modules() if hasattr(m, "lora_A")}


@pytest.mark.parametrize(
    "cls,sphere_aware,layer",
    [(NGPT, True, SphereLoraLinear), (NGPT, False, PlainSphereLoraLinear), (GPT, False, peft.tuners.lora.Linear)],
    ids=["ngpt-sphere", "ngpt-plain", "gpt"],
)
def test_all_linear_adapts_exactly_the_attention_and_mlp_projections(cls, sphere_aware, layer):
    model = hf_model(cls)
    assert set(all_linear_names(model)) == PROJECTIONS
    config = sphere_lora_config(model, r=4, sphere_aware=sphere_aware)
    adapted = peft.get_peft_model(model, config)
    assert adapted_names(adapted) == PROJECTIONS  # embed_out, the output layer, is left alone
    for name in PROJECTIONS:
        assert type(adapted.get_submodule(f"base_model.model.{name}")) is layer, name
    trainable = {n for n, p in adapted.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)


def test_peft_all_linear_sees_gpt_projections_and_sphere_lora_config_sees_ngpt_ones():
    """peft's own "all-linear" resolves nn.Linear only: the same set on GPT as sphere_lora_config."""
    adapted = peft.get_peft_model(hf_model(GPT), peft.LoraConfig(target_modules="all-linear", r=4))
    assert adapted_names(adapted) == PROJECTIONS


@pytest.mark.parametrize("cls,sphere_aware", [(NGPT, True), (NGPT, False), (GPT, False)])
def test_lora_steps_lower_the_loss_and_merge_to_equal_logits(cls, sphere_aware):
    model = hf_model(cls, seed=1)
    base = {n: p.detach().clone() for n, p in model.named_parameters()}
    adapted = peft.get_peft_model(model, sphere_lora_config(model, r=4, lora_alpha=8, sphere_aware=sphere_aware))
    ids = torch.randint(0, VOCAB, (4, 16), generator=torch.Generator().manual_seed(2))
    optimizer = torch.optim.AdamW([p for p in adapted.parameters() if p.requires_grad], lr=5e-2)
    losses = []
    for _ in range(8):
        loss = adapted(input_ids=ids, labels=ids).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.03, losses
    for name, p in adapted.get_base_model().named_parameters():
        if "lora_" not in name:  # the base weights are frozen
            torch.testing.assert_close(p, base[name.replace(".base_layer", "")], rtol=0, atol=0, msg=name)
    adapted.eval()
    expected = adapted(input_ids=ids).logits.detach()
    computed = merged_state_dict(adapted.get_base_model())  # without merging
    merged = adapted.merge_and_unload()
    assert computed.keys() == merged.state_dict().keys()
    for name, tensor in merged.state_dict().items():
        torch.testing.assert_close(computed[name], tensor.as_subclass(torch.Tensor), rtol=0, atol=1e-6, msg=name)
    assert type(merged) is type(model) and not any(hasattr(m, "lora_A") for m in merged.modules())
    torch.testing.assert_close(merged(ids).logits, expected, atol=1e-5, rtol=0)
    if cls is NGPT:
        norms = {n: w.norm(dim=-1) for n, w in merged.spherenet_model.sphere_weights().items()}
        off_sphere = {n for n, norm in norms.items() if not torch.allclose(norm, torch.ones_like(norm), atol=1e-5)}
        # the sphere-aware LoRA keeps every row unit; the plain one leaves the adapted ones off the sphere
        assert off_sphere == (set() if sphere_aware else {f"{n}.weight" for n in PROJECTIONS}), off_sphere


def test_sphere_lora_config_refuses_what_it_cannot_adapt():
    with pytest.raises(ValueError, match="no SphereLinear to adapt.*sphere_aware=False"):
        sphere_lora_config(hf_model(GPT))
    with pytest.raises(ValueError, match="target_modules must be 'all-linear' or a list of module names, got 'all'"):
        sphere_lora_config(hf_model(NGPT), target_modules="all")
    with pytest.raises(ValueError, match="lora_dropout must be 0"):
        model = hf_model(NGPT)
        peft.get_peft_model(model, sphere_lora_config(model, lora_dropout=0.1))


@pytest.mark.parametrize("sphere_aware", [True, False])
def test_a_saved_adapter_reloads_with_sphere_lora_config(tmp_path, sphere_aware):
    """peft saves the adapter's tensors and LoraConfig, not the registration of spherenet's LoRA
    layer: ``PeftModel.from_pretrained`` reloads an nGPT adapter given ``config=sphere_lora_config``
    (exactly: equal logits), and without it peft refuses the SphereLinear by name."""
    model = hf_model(NGPT, seed=1)
    adapted = peft.get_peft_model(model, sphere_lora_config(model, r=4, lora_alpha=8, sphere_aware=sphere_aware))
    with torch.no_grad():  # B starts at zero: give the adapter an effect to reload
        for name, p in adapted.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.1, generator=torch.Generator().manual_seed(3))
    ids = torch.randint(0, VOCAB, (2, 16), generator=torch.Generator().manual_seed(2))
    adapted.eval()
    expected = adapted(input_ids=ids).logits.detach()
    assert not torch.allclose(expected, hf_model(NGPT, seed=1)(input_ids=ids).logits)  # the adapter matters
    adapted.save_pretrained(tmp_path / "adapter")

    base = hf_model(NGPT, seed=1)
    config = sphere_lora_config(base, r=4, lora_alpha=8, sphere_aware=sphere_aware)
    again = peft.PeftModel.from_pretrained(base, tmp_path / "adapter", config=config)
    layer = SphereLoraLinear if sphere_aware else PlainSphereLoraLinear
    assert {type(m) for m in again.modules() if hasattr(m, "lora_A")} == {layer}
    again.eval()
    torch.testing.assert_close(again(input_ids=ids).logits, expected, rtol=0, atol=0)

    # peft rebuilds a plain LoraConfig, dropping spherenet_lora with a warning about a newer peft
    with pytest.raises(ValueError, match="SphereLinear"), pytest.warns(UserWarning, match="spherenet_lora"):
        peft.PeftModel.from_pretrained(hf_model(NGPT, seed=1), tmp_path / "adapter")
