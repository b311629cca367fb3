"""CUDA checks: what only a GPU can show (CUDA kernels, bf16 autocast, torch.compile on GPU).

Every test here skips on a machine without CUDA (CI has none); run them where a GPU is at hand:
``python -m pytest -q tests/kernels/test_cuda.py``.
"""

import copy

import pytest
import torch
from kernel_setting import kernels_set_to

from spherenet.models import from_preset
from spherenet.optim import RiemannianAdam, build_optimizer
from spherenet.optim.groups import named_sphere_parameters
from spherenet.train.step import lm_loss

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

FAMILIES = ("ngpt", "gpt")


def _batch(vocab: int, device, batch: int = 4, length: int = 64, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (batch, length + 1), generator=g)
    return ids[:, :-1].to(device), ids[:, 1:].to(device)


def _max_row_error(model) -> float:
    return max(float((p.detach().float().norm(dim=-1) - 1).abs().max()) for _, p in named_sphere_parameters(model))


@pytest.mark.parametrize("family", FAMILIES)
def test_cuda_forward_backward_matches_cpu_float64(family):
    torch.manual_seed(0)
    reference = from_preset(f"{family}-tiny").double()
    model = copy.deepcopy(reference).float().cuda()
    x, y = _batch(reference.config.vocab_size, "cpu")
    loss_ref = lm_loss(reference(x), y)
    loss_ref.backward()
    loss = lm_loss(model(x.cuda()), y.cuda())
    loss.backward()
    assert abs(loss.item() - loss_ref.item()) < 1e-4
    for (name, p_ref), (_, p) in zip(reference.named_parameters(), model.named_parameters()):
        scale = p_ref.grad.abs().max().item() + 1e-12
        err = (p.grad.double().cpu() - p_ref.grad).abs().max().item()
        assert err <= 1e-3 * scale + 1e-6, f"{name}: grad differs by {err:.3g} (scale {scale:.3g})"


@pytest.mark.parametrize("gradient_mode", ["element", "row"])
def test_cuda_riemannian_adam_matches_cpu(gradient_mode):
    """The sphere step on CUDA (foreach path) equals the CPU step (native kernel) to float32 rounding."""
    torch.manual_seed(0)
    cpu_model = from_preset("ngpt-tiny")
    cuda_model = copy.deepcopy(cpu_model).cuda()
    opts = [RiemannianAdam(m, lr=1e-2, second_moment=gradient_mode) for m in (cpu_model, cuda_model)]
    for step in range(10):
        x, y = _batch(cpu_model.config.vocab_size, "cpu", seed=step)
        for model, opt, device in zip((cpu_model, cuda_model), opts, ("cpu", "cuda")):
            opt.zero_grad()
            lm_loss(model(x.to(device)), y.to(device)).backward()
            opt.step()
    for (name, a), (_, b) in zip(cpu_model.named_parameters(), cuda_model.named_parameters()):
        err = (a.detach() - b.detach().cpu()).abs().max().item()
        assert err < 1e-4, f"{name}: CPU and CUDA steps differ by {err:.3g}"
    assert _max_row_error(cuda_model) < 1e-6


@pytest.mark.parametrize("family", FAMILIES)
def test_cuda_bf16_autocast_training_stays_on_sphere(family):
    torch.manual_seed(0)
    model = from_preset(f"{family}-tiny").cuda()
    method = "riemannian_adam" if family == "ngpt" else "adamw"
    optimizer, _ = build_optimizer(model, method=method, lr=3e-3, total_steps=100, warmup_steps=0)
    losses = []
    for step in range(30):
        x, y = _batch(model.config.vocab_size, "cuda", seed=step % 3)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = lm_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert all(torch.isfinite(torch.tensor(losses)))
    assert losses[-1] < losses[0]
    if family == "ngpt":
        assert _max_row_error(model) < 1e-5


@pytest.mark.parametrize("family", FAMILIES)
def test_cuda_compiled_matches_eager(family):
    torch.manual_seed(0)
    model = from_preset(f"{family}-tiny").cuda()
    compiled = torch.compile(copy.deepcopy(model), fullgraph=True)
    x, y = _batch(model.config.vocab_size, "cuda")
    eager_loss = lm_loss(model(x), y)
    compiled_loss = lm_loss(compiled(x), y)
    eager_loss.backward()
    compiled_loss.backward()
    assert abs(eager_loss.item() - compiled_loss.item()) < 1e-4
    for (name, a), (_, b) in zip(model.named_parameters(), compiled.named_parameters()):
        err = (a.grad - b.grad).abs().max().item()
        assert err < 1e-3 * (a.grad.abs().max().item() + 1e-12) + 1e-6, f"{name}: {err:.3g}"


@pytest.mark.parametrize("family", FAMILIES)
def test_cuda_forward_makes_no_host_sync(family):
    """A training forward must not wait for the GPU (no ``.item()``, no host-side id check)."""
    model = from_preset(f"{family}-tiny").cuda()
    x, _ = _batch(model.config.vocab_size, "cuda")
    model(x)  # warm up lazily built buffers (RoPE tables)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        model(x)
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.parametrize("second_moment", ["element", "row"])
@pytest.mark.parametrize("gradient", ["riemannian", "euclidean"])
def test_cuda_triton_sphere_kernel_matches_foreach(second_moment, gradient):
    """The Triton sphere step, the default on CUDA, equals the foreach path."""
    torch.manual_seed(0)
    models = [from_preset("ngpt-tiny").cuda() for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    opts = [
        RiemannianAdam(m, lr=1e-2, second_moment=second_moment, gradient=gradient, sphere_kernel=kernel)
        for m, kernel in zip(models, ("triton", "torch"))
    ]
    for step in range(10):
        x, y = _batch(models[0].config.vocab_size, "cuda", seed=step)
        for model, opt in zip(models, opts):
            opt.zero_grad()
            lm_loss(model(x), y).backward()
            opt.step()
    for (name, a), (_, b) in zip(models[0].named_parameters(), models[1].named_parameters()):
        err = (a.detach() - b.detach()).abs().max().item()
        assert err < 1e-5, f"{name}: triton and foreach differ by {err:.3g}"
    assert _max_row_error(models[0]) < 1e-6


@pytest.mark.parametrize("second_moment", ["element", "row"])
def test_cuda_triton_sphere_kernel_steps_bf16_parameters_in_fp32(second_moment):
    """bf16 parameters and states: the Triton kernel computes in fp32 and rounds once per store,
    so after a step it is within bf16 rounding of the same step taken in fp32 from the same
    values, and its rows stay on the sphere to bf16 rounding."""
    torch.manual_seed(0)
    bf16 = from_preset("ngpt-tiny").cuda().to(torch.bfloat16)
    fp32 = from_preset("ngpt-tiny").cuda()
    fp32.load_state_dict({k: v.float() for k, v in bf16.state_dict().items()})
    opts = [RiemannianAdam(m, lr=1e-2, second_moment=second_moment, sphere_kernel="triton") for m in (bf16, fp32)]
    x, y = _batch(bf16.config.vocab_size, "cuda")
    for model, opt in zip((bf16, fp32), opts):
        lm_loss(model(x), y).backward()
    for a, b in zip(bf16.parameters(), fp32.parameters()):
        b.grad = a.grad.float()  # the same gradient for both
    for opt in opts:
        opt.step()
    for (name, a), b in zip(bf16.named_parameters(), fp32.parameters()):
        err = (a.detach().float() - b.detach()).abs().max().item()
        assert err <= 2 * 2**-8 * b.detach().abs().max().item() + 1e-6, f"{name}: {err:.3g}"
    assert _max_row_error(bf16) < 2e-2


@pytest.mark.parametrize("update", ["lerp", "slerp", "riemannian"])
def test_cuda_triton_layer_kernels_under_bf16_autocast_match_the_default(update):
    """nGPT's element-wise operations as Triton kernels (bf16 activations, fp32 arithmetic)
    against the default fused torch functions, loss and gradients, under bf16 autocast, eager
    and compiled."""

    torch.manual_seed(0)
    model = from_preset("ngpt-tiny", update=update).cuda()
    x, y = _batch(model.config.vocab_size, "cuda")

    def loss_and_grads(implementation, runner):
        model.zero_grad()
        with kernels_set_to(implementation), torch.autocast("cuda", dtype=torch.bfloat16):
            loss = lm_loss(runner(x), y)
        loss.backward()
        return loss.item(), [p.grad.clone() for p in model.parameters()]

    want_loss, want = loss_and_grads("torch", model)
    for runner in (model, torch.compile(model, fullgraph=True)):
        loss, grads = loss_and_grads("triton", runner)
        assert abs(loss - want_loss) < 2e-2 * abs(want_loss)
        for (name, _), g, w in zip(model.named_parameters(), grads, want):
            err = (g - w).abs().max().item()
            assert err < 5e-2 * w.abs().max().item() + 1e-5, f"{name}: {err:.3g}"


def test_cuda_spherical_muon_triton_tail_matches_foreach():
    """SphericalMuon's tail (steps 4-6) by Triton, the CUDA default, against the foreach passes."""
    from spherenet.optim import SphericalMuon

    results = []
    for environment in ("triton", "torch"):
        with kernels_set_to(environment):
            torch.manual_seed(0)
            model = from_preset("ngpt-tiny").cuda()
            matrices = [p for n, p in model.named_parameters() if n.startswith("blocks.") and p.dim() == 2]
            opt = SphericalMuon(matrices, lr=0.02, ns_dtype="float32")
            for step in range(5):
                x, y = _batch(model.config.vocab_size, "cuda", seed=step)
                opt.zero_grad()
                lm_loss(model(x), y).backward()
                opt.step()
        results.append(model)
    for (name, a), b in zip(results[0].named_parameters(), results[1].parameters()):
        err = (a.detach() - b.detach()).abs().max().item()
        assert err < 1e-4, f"{name}: triton and foreach differ by {err:.3g}"
