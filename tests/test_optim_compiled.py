"""RiemannianAdam(sphere_kernel="compiled"): the sphere step as one torch.compile'd function
(spherenet/optim/compiled_kernel.py). Parity with a plain float64 reference and with the
native and foreach kernels, unit rows in bf16, no recompilation across steps, the kernel
choice, fallbacks and state interchange.

Compiling costs seconds per graph on CPU: every test here uses rows of length 64 (ngpt-tiny's
only row length), so the float64 graphs (one per mode) are compiled once and shared."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from test_optim_native import ngpt, reference_step, set_grads  # tests/ is on sys.path under pytest
from torch._dynamo.utils import counters

from spherenet.optim import RiemannianAdam, _native, compiled_kernel, riemannian_adam
from spherenet.optim.riemannian_adam import resolve_sphere_kernel

MODES = [("element", "riemannian"), ("element", "euclidean"), ("row", "riemannian"), ("row", "euclidean")]
needs_native = pytest.mark.skipif(_native.sphere_adam_op() is None, reason="native kernel unavailable")


def max_diff(a, b):
    return max(float((p.double() - q.double()).detach().abs().max()) for p, q in zip(a.parameters(), b.parameters()))


@pytest.mark.slow
@pytest.mark.parametrize("mode,gradient", MODES)
def test_compiled_step_matches_float64_reference(mode, gradient):
    row_v, euclidean = mode == "row", gradient == "euclidean"
    gen = torch.Generator().manual_seed(1)
    x = torch.nn.functional.normalize(torch.randn(37, 64, generator=gen, dtype=torch.float64), dim=-1)
    g = torch.randn(37, 64, generator=gen, dtype=torch.float64)
    m = 0.1 * torch.randn(37, 64, generator=gen, dtype=torch.float64)
    v = torch.rand(37, 1 if row_v else 64, generator=gen, dtype=torch.float64)
    g_before = g.clone()
    for t in (1, 7):  # the step count as the optimizer holds it: before the step (element), after (row)
        held = torch.tensor(float(t if row_v else t - 1))
        want = reference_step(x, g, m, v, 0.05, 0.9, 0.95, 1e-8, t, row_v, euclidean)
        step_size, inv_b2 = (s[0] for s in compiled_kernel.step_scalars([held], 0.05, 0.9, 0.95, row_v))
        compiled_kernel.sphere_adam_(x, g, m, v, step_size, inv_b2, 0.9, 0.95, 1e-8, row_v, not euclidean)
        for got, expected in zip((x, m, v), want):
            torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    assert torch.equal(g, g_before)


@pytest.mark.slow
@needs_native
@pytest.mark.parametrize("mode,gradient", MODES)
def test_compiled_native_foreach_same_steps_float64(mode, gradient):
    models = {k: ngpt(torch.float64) for k in ("compiled", "native", "foreach")}
    opts = {
        k: RiemannianAdam(m, lr=1e-2, second_moment=mode, gradient=gradient, sphere_kernel=k) for k, m in models.items()
    }
    for step in range(10):
        set_grads(list(models.values()), step, torch.float64)
        for opt in opts.values():
            opt.step()
    assert max_diff(models["compiled"], models["foreach"]) <= 1e-12
    assert max_diff(models["compiled"], models["native"]) <= 1e-12


@pytest.mark.slow
@needs_native
def test_compiled_native_foreach_same_steps_float32():
    models = {k: ngpt(torch.float32) for k in ("compiled", "native", "foreach")}
    opts = {k: RiemannianAdam(m, lr=1e-3, sphere_kernel=k) for k, m in models.items()}
    for step in range(10):
        set_grads(list(models.values()), step, torch.float32)
        for opt in opts.values():
            opt.step()
    assert max_diff(models["compiled"], models["foreach"]) <= 1e-6
    assert max_diff(models["compiled"], models["native"]) <= 1e-6


@pytest.mark.slow
def test_bf16_rows_stay_unit():
    model = ngpt(torch.bfloat16)
    opt = RiemannianAdam(model, lr=1e-2, sphere_kernel="compiled")
    for step in range(50):
        set_grads([model], step, torch.bfloat16)
        opt.step()
    for name, p in model.named_parameters():
        if p.dim() == 2:
            err = float((p.detach().double().norm(dim=-1) - 1).abs().max())
            assert err <= 4e-3, (name, err)  # one bf16 rounding of a unit row (2^-8)


@pytest.mark.slow
def test_no_recompilation_across_steps_and_lr_changes():
    model = ngpt(torch.float64)
    opt = RiemannianAdam(model, lr=1e-2, sphere_kernel="compiled")
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0 / (1 + step))
    set_grads([model], 0, torch.float64)
    opt.step()  # compiles (or reuses) the graph of this mode
    schedule.step()
    graphs, frames = counters["stats"]["unique_graphs"], dict(counters["frames"])
    for step in range(1, 8):
        set_grads([model], step, torch.float64)
        opt.step()
        schedule.step()
    assert opt.param_groups[0]["lr"] < 1.5e-3  # the schedule did change lr at every step
    assert counters["stats"]["unique_graphs"] == graphs
    assert dict(counters["frames"]) == frames  # no frame was compiled again


@pytest.mark.slow
@needs_native
def test_state_dict_interchangeable_with_other_kernels():
    a, b = ngpt(torch.float64), ngpt(torch.float64)
    first = RiemannianAdam(a, lr=1e-2, sphere_kernel="compiled")
    other = RiemannianAdam(b, lr=1e-2, sphere_kernel="native")
    for step in range(3):
        set_grads([a, b], step, torch.float64)
        first.step()
        other.step()
    # swap: the compiled optimizer resumes the native one's state and the other way round
    resumed_native = RiemannianAdam(a, lr=1e-2, sphere_kernel="native")
    resumed_native.load_state_dict(first.state_dict())
    resumed_compiled = RiemannianAdam(b, lr=1e-2, sphere_kernel="compiled")
    resumed_compiled.load_state_dict(other.state_dict())
    for step in range(3, 6):
        set_grads([a, b], step, torch.float64)
        resumed_native.step()
        resumed_compiled.step()
    assert max_diff(a, b) <= 1e-12


def test_auto_picks_compiled_on_cuda_native_on_cpu():
    assert resolve_sphere_kernel("auto", "cuda") == "compiled"
    assert resolve_sphere_kernel("auto", "cpu") == "native"
    assert resolve_sphere_kernel("auto", "mps") == "foreach"
    assert resolve_sphere_kernel("compiled", "cpu") == "compiled"
    assert resolve_sphere_kernel("native", "cuda") == "foreach"
    opt = RiemannianAdam(ngpt(torch.float32), lr=1e-3)  # auto on CPU tensors: never the compiled kernel
    ps = opt.param_groups[0]["params"]
    assert not any(opt._compiled_mask(ps, ps, ps, ps))


def test_unavailable_compile_refuses_explicit_choice(monkeypatch):
    monkeypatch.setattr(compiled_kernel, "compiled_status", lambda: (False, "no torch.compile (test)"))
    with pytest.raises(RuntimeError, match=r"sphere_kernel='compiled'.*no torch.compile \(test\)"):
        RiemannianAdam(ngpt(torch.float32), sphere_kernel="compiled")


def _failing_compile(*args, **kwargs):
    raise RuntimeError("no C++ compiler (test)")


def test_compile_failure_raises_for_explicit_choice(monkeypatch):
    monkeypatch.setattr(compiled_kernel, "sphere_adam_", _failing_compile)
    model = ngpt(torch.float32)
    opt = RiemannianAdam(model, lr=1e-3, sphere_kernel="compiled")
    set_grads([model], 0, torch.float32)
    with pytest.raises(RuntimeError, match=r"sphere_kernel='compiled'.*no C\+\+ compiler \(test\)"):
        opt.step()


def test_compile_failure_under_auto_warns_once_and_falls_back(monkeypatch):
    monkeypatch.setattr(compiled_kernel, "sphere_adam_", _failing_compile)
    # these CPU tensors stand for CUDA ones: "auto" asks for the compiled kernel
    monkeypatch.setattr(riemannian_adam, "resolve_sphere_kernel", lambda choice, device_type: "compiled")
    model = ngpt(torch.float32)
    twin = copy.deepcopy(model)
    opt = RiemannianAdam(model, lr=1e-3)
    ref = RiemannianAdam(twin, lr=1e-3, sphere_kernel="foreach")
    set_grads([model, twin], 0, torch.float32)
    with pytest.warns(RuntimeWarning, match=r"compiled sphere kernel is unavailable \(torch.compile failed"):
        opt.step()
    ref.step()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per optimizer
        set_grads([model, twin], 1, torch.float32)
        opt.step()
    ref.step()
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), twin.parameters()))


def test_build_optimizer_and_run_config_accept_compiled():
    from spherenet.optim import build_optimizer
    from spherenet.train.config import _CHOICES

    opt, _ = build_optimizer(ngpt(torch.float32), "riemannian_adam", lr=1e-3, total_steps=10, sphere_kernel="compiled")
    assert opt.sphere_kernel == "compiled"
    assert "compiled" in _CHOICES[("optim", "sphere_kernel")]
