"""Training-mode values, bitwise, against those recorded in ``recorded_values.json``: the logits
(fp32 and fp64) and every gradient of each model variant, the transformers classes' logits and
gradients, and five optimizer steps of every optimizer option. A reorganization of the model or
optimizer code must leave each digest as it was.

A digest depends on the CPU's kernels (a matmul sums in another order on another instruction
set), so the values are checked where they were recorded: the file names the CPU and torch
version, and elsewhere the test skips saying so. Record again (only after a change meant to
move the values, said in the CHANGELOG) with ``python tests/models/test_recorded_values.py``.
"""

from __future__ import annotations

import hashlib
import json
import platform
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from spherenet.models import GPT, NGPT, GPTConfig, NGPTConfig
from spherenet.optim import build_optimizer

RECORDED = Path(__file__).with_name("recorded_values.json")
SHAPE = dict(vocab_size=64, n_layers=2, d_model=32, n_heads=4, max_seq_len=32)

MODELS = {
    **{f"ngpt-{u}": (NGPTConfig, dict(update=u)) for u in ("lerp", "slerp", "riemannian")},
    **{f"ngpt-{u}-gqa": (NGPTConfig, dict(update=u, n_kv_heads=2)) for u in ("lerp", "slerp", "riemannian")},
    **{f"ngpt-{u}-relu2": (NGPTConfig, dict(update=u, mlp="relu2")) for u in ("lerp", "slerp", "riemannian")},
    "ngpt-lerp-no-qk-norm": (NGPTConfig, dict(qk_norm=False)),
    "gpt": (GPTConfig, {}),
    "gpt-gqa": (GPTConfig, dict(n_kv_heads=2)),
    "gpt-relu2": (GPTConfig, dict(mlp="relu2")),
}

#: (model, build_optimizer keywords) per optimizer option
OPTIMIZERS = {
    **{
        f"riemannian_adam-{m}-{g}-{k}": ("ngpt-lerp", dict(second_moment=m, gradient=g, sphere_kernel=k))
        for m in ("element", "row")
        for g in ("euclidean", "riemannian")
        for k in ("auto", "torch", "reference")
    },
    "adam_normalize": ("ngpt-lerp", dict(method="adam_normalize")),
    "spherical_muon": ("ngpt-lerp", dict(method="spherical_muon")),
    "adamw": ("gpt", dict(method="adamw", warmup_steps=1)),
    "muon": ("gpt", dict(method="muon", warmup_steps=1)),
    "adamh": ("gpt", dict(method="adamh", warmup_steps=1)),
    "muonh": ("gpt", dict(method="muonh", warmup_steps=1)),
}


def platform_key() -> str:
    """What a digest depends on besides the code: the CPU's instruction set and model, torch."""
    model = ""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        model = next((ln.split(":", 1)[1].strip() for ln in cpuinfo.read_text().splitlines() if ln.startswith("model name")), "")  # fmt: skip  # one lookup
    return f"{platform.machine()} {model or platform.processor()} {torch.backends.cpu.get_cpu_capability()} torch {torch.__version__}"


def _model(name: str, dtype=torch.float32):
    cls, fields = MODELS[name]
    torch.manual_seed(0)
    model = (NGPT if cls is NGPTConfig else GPT)(cls(**SHAPE, **fields))
    return model.to(dtype).train()


def _ids(seed: int) -> torch.Tensor:
    return torch.randint(0, SHAPE["vocab_size"], (2, 17), generator=torch.Generator().manual_seed(seed))


def _update(digest, tensor: torch.Tensor) -> None:
    digest.update(tensor.detach().contiguous().cpu().numpy().tobytes())


def forward_digest(name: str) -> str:
    """The fp32 and fp64 logits and every fp32 gradient of one forward and backward."""
    digest = hashlib.sha256()
    ids = _ids(1)
    for dtype in (torch.float32, torch.float64):
        model = _model(name, dtype)
        logits = model(ids[:, :-1])
        _update(digest, logits)
        if dtype == torch.float32:
            F.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten()).backward()
            for pname, p in sorted(model.named_parameters()):
                digest.update(pname.encode())
                _update(digest, p.grad)
    return digest.hexdigest()


def transformers_digest(name: str) -> str:
    """The transformers class of ``name``'s model: logits, loss and every gradient."""
    from spherenet.hf import SpherenetGPTForCausalLM, SpherenetNGPTForCausalLM

    cls, fields = MODELS[name]
    hf_class = SpherenetNGPTForCausalLM if cls is NGPTConfig else SpherenetGPTForCausalLM
    torch.manual_seed(0)
    model = hf_class(hf_class.config_class(**SHAPE, **fields)).train()
    ids = _ids(2)
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    digest = hashlib.sha256()
    _update(digest, out.logits)
    _update(digest, out.loss)
    for pname, p in sorted(model.named_parameters()):
        digest.update(pname.encode())
        _update(digest, p.grad)
    return digest.hexdigest()


def optimizer_digest(option: str) -> str:
    """Five steps of ``option``: each loss, then every parameter and optimizer state tensor."""
    model_name, keywords = OPTIMIZERS[option]
    model = _model(model_name)
    optimizer, scheduler = build_optimizer(model, lr=0.01, total_steps=10, **keywords)
    digest = hashlib.sha256()
    for step in range(5):
        ids = _ids(10 + step)
        optimizer.zero_grad()
        loss = F.cross_entropy(model(ids[:, :-1]).flatten(0, 1), ids[:, 1:].flatten())
        loss.backward()
        optimizer.step()
        scheduler.step()
        digest.update(float(loss.detach()).hex().encode())
    for pname, p in sorted(model.named_parameters()):
        digest.update(pname.encode())
        _update(digest, p)
    return digest.hexdigest()


CASES = {
    **{f"forward {n}": (forward_digest, n) for n in MODELS},
    **{f"transformers {n}": (transformers_digest, n) for n in ("ngpt-lerp", "ngpt-riemannian-gqa", "gpt")},
    **{f"optimizer {o}": (optimizer_digest, o) for o in OPTIMIZERS},
}


def compute(case: str) -> str:
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # a matmul's rounding depends on the thread count
    try:
        fn, arg = CASES[case]
        return fn(arg)
    finally:
        torch.set_num_threads(before)


@pytest.fixture(scope="module")
def recorded() -> dict:
    data = json.loads(RECORDED.read_text())
    if data["platform"] != platform_key():
        pytest.skip(f"values recorded on {data['platform']!r}, this is {platform_key()!r}")
    return data["values"]


@pytest.mark.parametrize("case", sorted(CASES))
def test_values_are_bitwise_those_recorded(case, recorded):
    assert case in recorded, f"no recorded value for {case!r}: record with python {__file__}"
    assert compute(case) == recorded[case], f"{case}: the values changed"


if __name__ == "__main__":
    values = {case: compute(case) for case in sorted(CASES)}
    RECORDED.write_text(json.dumps({"platform": platform_key(), "values": values}, indent=1) + "\n")
    print(f"wrote {len(values)} values to {RECORDED}", file=sys.stderr)
