"""Fine-tune an exported nGPT with transformers' Trainer, save it, and load it back.

    python examples/hf_trainer.py        # needs pip install "spherenet-torch[hf]"

An export is a directory in the Hugging Face layout (``config.json``, ``model.safetensors``,
the portable model code). ``python -m recipes.export runs/default exported/ngpt`` writes one
from a training run; here an untrained ``ngpt-tiny`` is exported, so that nothing needs a run
or a download. Importing :mod:`spherenet.hf` registers nGPT with ``AutoModelForCausalLM``.

Trainer's own AdamW knows nothing of the sphere: :class:`~spherenet.hf.SphereCallback`
renormalizes every declared sphere weight after each optimizer step (the paper's method,
Section 2.6), so the fine-tuned model is still an nGPT and ``save_pretrained`` accepts it. The
other way is spherenet's optimizer: ``Trainer(..., optimizers=build_optimizer(model, lr=...,
total_steps=...))``.
"""

from __future__ import annotations

import json.decoder
import string
import tempfile
import textwrap
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, Trainer, TrainingArguments

import spherenet.hf  # noqa: F401 - registers spherenet's classes with AutoModelForCausalLM
from spherenet.hf import SphereCallback
from spherenet.models import from_preset
from spherenet.optim import sphere_parameters

CONTEXT = 64


def windows(count: int, seed: int) -> torch.Tensor:
    """Byte windows of a few standard-library modules: a corpus with no download."""
    tokens = torch.tensor(list(b"".join(Path(m.__file__).read_bytes() for m in (textwrap, string, json.decoder))))
    start = torch.randint(0, len(tokens) - CONTEXT, (count,), generator=torch.Generator().manual_seed(seed))
    return torch.stack([tokens[s : s + CONTEXT] for s in start.tolist()])


def held_out_loss(model, batch: torch.Tensor) -> float:
    model.eval()
    with torch.no_grad():
        return model(input_ids=batch, labels=batch).loss.item()  # labels shift inside, as in transformers


def main(steps: int = 40, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    with tempfile.TemporaryDirectory() as tmp:
        export, finetuned = Path(tmp) / "export", Path(tmp) / "finetuned"
        from_preset("ngpt-tiny", max_seq_len=CONTEXT).save_pretrained(export)  # an export

        model = AutoModelForCausalLM.from_pretrained(export)  # SpherenetNGPTForCausalLM
        train = [{"input_ids": row, "labels": row} for row in windows(512, seed)]
        val = windows(64, seed + 1)
        before = held_out_loss(model, val)
        args = TrainingArguments(
            Path(tmp) / "trainer",
            max_steps=steps,
            per_device_train_batch_size=8,
            learning_rate=1e-2,
            save_strategy="no",
            logging_steps=10,
            report_to=[],
            dataloader_pin_memory=False,  # no accelerator here: nothing to pin
        )
        Trainer(model=model, args=args, train_dataset=train, callbacks=[SphereCallback()]).train()
        after = held_out_loss(model, val)
        model.save_pretrained(finetuned)  # refused if a sphere weight had left the sphere

        loaded = AutoModelForCausalLM.from_pretrained(finetuned)
        same = held_out_loss(loaded, val)
        drift = max((p.norm(dim=-1) - 1).abs().max().item() for p in sphere_parameters(loaded))
    print(f"held-out loss: {before:.3f} before, {after:.3f} after {steps} steps, {same:.3f} loaded back")
    print(f"largest |row norm - 1| of the loaded model: {drift:.1e}")
    return {"before": before, "after": after, "loaded": same, "drift": drift}


if __name__ == "__main__":
    main()
