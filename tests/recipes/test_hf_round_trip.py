"""A user's round trip between spherenet and the Hugging Face world: an nGPT trained with
recipes.train and exported, fine-tuned with transformers' Trainer where spherenet is not installed
(the export's own classes, Trainer's defaults, checkpoints on the way), saved, then loaded and
sampled by spherenet."""

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("accelerate", reason="transformers.Trainer needs accelerate")

from corpora import write_paragraphs  # noqa: E402
from fresh_python import run_script  # noqa: E402

from recipes import export, sample  # noqa: E402
from recipes.train import cli as train_cli  # noqa: E402
from spherenet.models import load_pretrained  # noqa: E402

# torch and transformers only: the export loaded, fine-tuned and saved as transformers' users do
_FINE_TUNE = """
import json, sys, warnings
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, Trainer, TrainingArguments

exported, text, prompt = json.loads(sys.argv[1])
model = AutoModelForCausalLM.from_pretrained(exported, trust_remote_code=True)
tokenizer = AutoTokenizer.from_pretrained(exported, trust_remote_code=True)
ids = tokenizer(text, return_tensors="pt").input_ids[0]
data = [{"input_ids": ids[i : i + 32], "labels": ids[i : i + 32]} for i in range(0, 32 * 16, 32)]
args = TrainingArguments(
    "fine-tune", max_steps=20, per_device_train_batch_size=4, learning_rate=1e-2, save_steps=10,
    logging_steps=10, report_to=[], use_cpu=True, disable_tqdm=True,
)
trainer = Trainer(model=model, args=args, train_dataset=data, processing_class=tokenizer)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    trainer.train()
trainer.save_model("tuned")
probe = tokenizer(prompt, return_tensors="pt").input_ids
with torch.no_grad():
    logits = model.eval()(probe).logits
    greedy = model.generate(probe, max_new_tokens=12, do_sample=False)
print("RESULT", json.dumps({
    "class": type(model).__module__.rpartition(".")[2] + "." + type(model).__name__,
    "losses": [entry["loss"] for entry in trainer.state.log_history if "loss" in entry],
    "sphere": max(float((w.norm(dim=-1) - 1).abs().max()) for w in model.sphere_weights().values()),
    "warned": [str(w.message) for w in caught if "sphere" in str(w.message)],
    "logits": logits.tolist(),
    "greedy": tokenizer.decode(greedy[0]),
}))
"""


@pytest.mark.slow
def test_trained_exported_fine_tuned_without_spherenet_then_sampled_by_spherenet(tmp_path, capsys):
    corpus = write_paragraphs(tmp_path / "c.txt", "the sphere keeps every row of the matrix at unit length", 300, 0)
    run = tmp_path / "run"
    options = ["model.preset=ngpt-tiny", "model.max_seq_len=64", "train.batch_size=4", "train.steps=3"]
    options += ["train.eval_every=3", "train.eval_batches=1", "train.sample_tokens=0", "train.progress=false"]
    assert train_cli([*options, f"train.out_dir={run}", f"data.source={corpus}", f"data.cache_dir={tmp_path}"]) == 0
    assert export.main([str(run), str(tmp_path / "export")]) == 0
    prompt = "the sphere"
    text = corpus.read_text()
    out = run_script(_FINE_TUNE, [str(tmp_path / "export"), text, prompt], tmp_path / "elsewhere", spherenet=False)
    assert out["class"] == "modeling_spherenet.SpherenetNGPTForCausalLM"
    assert len(out["losses"]) == 2 and out["losses"][-1] < out["losses"][0], out["losses"]
    assert out["sphere"] < 1e-5 and out["warned"] == []  # Trainer's defaults: on the sphere after every step
    tuned = tmp_path / "elsewhere" / "tuned"
    assert (tmp_path / "elsewhere" / "fine-tune" / "checkpoint-10" / "sha256sums.json").is_file()
    model = load_pretrained(tuned)  # checked against the manifest the export's class wrote
    probe = torch.tensor([list(prompt.encode())])
    with torch.no_grad():
        torch.testing.assert_close(model(probe), torch.tensor(out["logits"]), atol=1e-5, rtol=0)
    capsys.readouterr()
    assert sample.main([str(tuned), "--prompt", prompt, "--tokens", "12", "--temperature", "0"]) == 0
    assert capsys.readouterr().out.strip() == out["greedy"].strip()  # spherenet greedy: the same tokens
