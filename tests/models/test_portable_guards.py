"""The sphere's guards in an export's own classes (spherenet/hf/portable/, what runs where spherenet
is not installed), as spherenet's classes have them: nGPT's sphere weights renormalized after every
step of any torch optimizer, a training forward that warns when they are off the sphere anyway,
save_pretrained that refuses them and writes sha256sums.json, and from_pretrained that checks the
files against it."""

import json
import shutil
import warnings

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from fresh_python import run_script  # noqa: E402

from spherenet.hf import SpherenetNGPTForCausalLM  # noqa: E402
from spherenet.hf.portable import modeling_spherenet as portable  # noqa: E402
from spherenet.io import INDEX_NAME, MANIFEST_NAME, PretrainedFileWarning  # noqa: E402
from spherenet.models import NGPT, NGPTConfig, PretrainedFileError, load_pretrained  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

VOCAB = 64
IDS = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(1))


def export(directory, **save_args):
    """A small nGPT saved by spherenet (the export layout, with its manifest); returns the model."""
    torch.manual_seed(0)
    model = NGPT(NGPTConfig(vocab_size=VOCAB, n_layers=2, d_model=16, n_heads=4, max_seq_len=32)).eval()
    model.save_pretrained(directory, **save_args)
    return model


def flip_a_byte(path):
    raw = bytearray(path.read_bytes())
    raw[-3] ^= 1
    path.write_bytes(bytes(raw))


def sphere_error(model) -> float:
    return max(float((w.detach().norm(dim=-1) - 1).abs().max()) for w in model.sphere_weights().values())


def off_sphere_warnings(caught) -> list[str]:
    return [str(w.message) for w in caught if "left the unit sphere" in str(w.message)]


def test_from_pretrained_checks_every_file_against_the_manifest(tmp_path):
    reference = export(tmp_path / "export")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a complete export loads without a word
        model = portable.SpherenetNGPTForCausalLM.from_pretrained(tmp_path / "export")
    torch.testing.assert_close(model(IDS).logits, reference(IDS), atol=1e-5, rtol=0)
    assert model.name_or_path == str(tmp_path / "export")  # absolute: what peft records as an adapter's base
    for name in ("model.safetensors", "config.json"):
        damaged = tmp_path / f"damaged-{name}"
        shutil.copytree(tmp_path / "export", damaged)
        flip_a_byte(damaged / name)
        with pytest.raises(ValueError, match=rf"{name} has sha256 .* \(contents altered\)") as info:
            portable.SpherenetNGPTForCausalLM.from_pretrained(damaged)
        assert "\n" not in str(info.value)
    sharded = tmp_path / "sharded"
    export(sharded, max_shard_size="20KB")
    shard = sorted(set(json.loads((sharded / INDEX_NAME).read_text())["weight_map"].values()))[1]
    flip_a_byte(sharded / shard)
    with pytest.raises(ValueError, match=rf"{shard} has sha256"):
        portable.SpherenetNGPTForCausalLM.from_pretrained(sharded)
    (tmp_path / "export" / MANIFEST_NAME).unlink()
    with pytest.warns(UserWarning, match=f"has no {MANIFEST_NAME}: its files cannot be checked for damage"):
        portable.SpherenetNGPTForCausalLM.from_pretrained(tmp_path / "export")


def test_save_pretrained_writes_the_export_layout_with_a_manifest_spherenet_checks(tmp_path, monkeypatch):
    reference = export(tmp_path / "export")
    model = portable.SpherenetNGPTForCausalLM.from_pretrained(tmp_path / "export")
    for saved, options in ((tmp_path / "saved", {}), (tmp_path / "sharded", {"max_shard_size": "20KB"})):
        model.save_pretrained(saved, **options)
        files = {p.name for p in saved.iterdir()}
        assert {"config.json", "configuration_spherenet.py", "modeling_spherenet.py", MANIFEST_NAME} <= files
        assert set(json.loads((saved / MANIFEST_NAME).read_text())["files"]) == files - {MANIFEST_NAME}
        with warnings.catch_warnings():
            warnings.simplefilter("error", PretrainedFileWarning)  # checked against the manifest
            torch.testing.assert_close(load_pretrained(saved)(IDS), reference(IDS), atol=0, rtol=0)
    assert (tmp_path / "sharded" / INDEX_NAME).is_file()
    pushed = []  # save_pretrained(push_to_hub=True): saved with the manifest, then pushed as push_to_hub does
    monkeypatch.setattr(type(model), "push_to_hub", lambda self, repo_id, **hub: pushed.append((repo_id, hub)))
    model.save_pretrained(tmp_path / "pushed", push_to_hub=True, repo_id="someone/ngpt", commit_message="tuned")
    assert (tmp_path / "pushed" / MANIFEST_NAME).is_file()
    assert pushed == [("someone/ngpt", {"token": None, "max_shard_size": "50GB", "commit_message": "tuned"})]
    flip_a_byte(tmp_path / "saved" / "model.safetensors")
    with pytest.raises(PretrainedFileError, match="model.safetensors has sha256"):
        load_pretrained(tmp_path / "saved")


def test_weights_off_the_sphere_are_warned_of_in_training_and_refused_on_save(tmp_path):
    export(tmp_path / "export")
    model = portable.SpherenetNGPTForCausalLM.from_pretrained(tmp_path / "export").train()
    with torch.no_grad():
        model.blocks[1].mlp.w_u.weight.mul_(1.5)  # changed by hand: no optimizer step renormalizes it
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3 * model.sphere_check_every):
            model(IDS, labels=IDS).loss.backward()
    found = off_sphere_warnings(caught)
    assert len(found) == 1 and "'blocks.1.mlp.w_u.weight'" in found[0], found
    with pytest.raises(ValueError) as info:
        model.save_pretrained(tmp_path / "saved")
    message = str(info.value)
    assert "\n" not in message and "1 of its 16 sphere weights have left the unit sphere" in message
    assert "model.normalize_sphere_weights_()" in message
    assert not (tmp_path / "saved").exists()
    model.normalize_sphere_weights_()
    assert sphere_error(model) < 1e-6
    model.save_pretrained(tmp_path / "saved")
    assert (tmp_path / "saved" / "model.safetensors").is_file()


def test_any_torch_optimizer_step_is_followed_by_the_normalization_in_both_classes(tmp_path):
    """The paper's method (Section 2.6): after every step of plain AdamW, the sphere weights of the
    export's class and of spherenet's are unit rows again, and the two train alike."""
    reference = export(tmp_path / "export")
    models = [
        portable.SpherenetNGPTForCausalLM.from_pretrained(tmp_path / "export").train(),
        SpherenetNGPTForCausalLM.from_pretrained(tmp_path / "export").train(),
    ]
    for model in models:
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(20):
                model(IDS, labels=IDS).loss.backward()
                optimizer.step()
                optimizer.zero_grad()
        assert off_sphere_warnings(caught) == []
        assert sphere_error(model) < 1e-5
    trained = [model.eval()(IDS).logits for model in models]
    assert (trained[0] - reference(IDS)).abs().max() > 0.1  # it did train
    torch.testing.assert_close(trained[0], trained[1], atol=1e-3, rtol=0)


# spherenet not importable: the export loaded the README's way, damaged, drifted by hand and saved
_GUARDS_WITHOUT_SPHERENET = """
import json, shutil, sys, warnings
import torch
from transformers import AutoModelForCausalLM

directory, ids = json.loads(sys.argv[1])
ids = torch.tensor(ids)
result = {}
damaged = directory + "-damaged"
shutil.copytree(directory, damaged)
raw = bytearray(open(damaged + "/model.safetensors", "rb").read())
raw[-3] ^= 1
open(damaged + "/model.safetensors", "wb").write(bytes(raw))
try:
    AutoModelForCausalLM.from_pretrained(damaged, trust_remote_code=True)
except ValueError as error:
    result["damaged"] = str(error)
model = AutoModelForCausalLM.from_pretrained(directory, trust_remote_code=True).train()
with torch.no_grad():
    model.embed_out.weight.mul_(1.5)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for _ in range(10):
        model(ids, labels=ids).loss.backward()
result["warned"] = [str(w.message) for w in caught if "sphere" in str(w.message)]
try:
    model.save_pretrained("refused")
except ValueError as error:
    result["refused"] = str(error)
model.normalize_sphere_weights_()
model.save_pretrained("saved")
with torch.no_grad():
    result["logits"] = model.eval()(ids).logits.tolist()
print("RESULT", json.dumps(result))
"""


def test_the_guards_hold_where_spherenet_is_not_installed(tmp_path):
    export(tmp_path / "export")
    out = run_script(_GUARDS_WITHOUT_SPHERENET, [str(tmp_path / "export"), IDS.tolist()], tmp_path / "run", False)
    assert "model.safetensors has sha256" in out.get("damaged", "")
    assert len(out["warned"]) == 1 and "'embed_out.weight'" in out["warned"][0]
    assert "cannot save" in out.get("refused", "") and not (tmp_path / "run" / "refused").exists()
    with warnings.catch_warnings():
        warnings.simplefilter("error", PretrainedFileWarning)  # written with its manifest
        saved = load_pretrained(tmp_path / "run" / "saved")
    torch.testing.assert_close(saved(IDS), torch.tensor(out["logits"]), atol=1e-5, rtol=0)
