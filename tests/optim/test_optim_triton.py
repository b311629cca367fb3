"""The Triton sphere-Adam kernel (spherenet.kernels.sphere_rows_triton) against the float64
reference step (spherenet.kernels.sphere_adam.sphere_adam_reference) over many steps in every
mode, and against the native CPU kernel of the same signature. Without a GPU it runs under
Triton's interpreter (tests/conftest.py), in float32: the interpreter has no bf16 arithmetic."""

from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("triton")

from spherenet.kernels import sphere_rows_triton as triton_kernel  # noqa: E402
from spherenet.kernels.sphere_adam import SphereAdamOptions, sphere_adam_reference  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
MODES = [(row_v, euclidean) for row_v in (False, True) for euclidean in (True, False)]
IDS = ["element-euclidean", "element-riemannian", "row-euclidean", "row-riemannian"]
LR, BETAS, EPS, TINY = 1e-2, (0.9, 0.95), 1e-8, 1e-30


def reference_step(x, g, m, v, t, row_v, euclidean, lr=LR):
    """Step ``t`` of ``sphere_adam_reference``, in place (with ``row_v``, ``v`` of shape ``x.shape[:-1]``)."""
    options = SphereAdamOptions("row" if row_v else "element", "euclidean" if euclidean else "riemannian", "reference")
    lists = [x], [g], [m], [v[..., None] if row_v else v], [torch.tensor(t - 1.0)]
    sphere_adam_reference(*lists, lr=lr, beta1=BETAS[0], beta2=BETAS[1], eps=EPS, options=options)


def kernel_step(x, g, m, v, t, row_v, euclidean, kernel=triton_kernel.sphere_adam_rows_):
    b1, b2 = BETAS
    kernel([x], [g], [m], [v], [LR / (1 - b1**t)], [math.sqrt(1 - b2**t)], b1, b2, EPS, TINY, row_v, not euclidean)


def start(rows: int, d: int, row_v: bool, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, d, generator=gen, dtype=torch.float64)
    x /= x.norm(dim=-1, keepdim=True)
    m = torch.zeros_like(x)
    v = torch.zeros(rows, dtype=torch.float64) if row_v else torch.zeros_like(x)
    return x, m, v, gen


@pytest.mark.parametrize("row_v, euclidean", MODES, ids=IDS)
@pytest.mark.parametrize("rows, d", [(37, 48), (5, 130)])
def test_many_steps_match_the_float64_reference(row_v, euclidean, rows, d):
    ref = start(rows, d, row_v)
    x, m, v, gen = ref
    got = [t.float().to(DEVICE) for t in (x, m, v)]
    for t in range(1, 31):
        # gradients with a radial part, rows that go quiet and wake (tiny v, then large u)
        g = torch.randn(rows, d, generator=gen, dtype=torch.float64) + 0.5 * x
        g[: rows // 3] *= 1e-3 if t % 10 < 5 else 1.0
        reference_step(x, g, m, v, t, row_v, euclidean)
        kernel_step(*got[:1], g.float().to(DEVICE), *got[1:], t, row_v, euclidean)
    torch.testing.assert_close(got[0].double().cpu(), x, rtol=0, atol=2e-5)
    torch.testing.assert_close(got[1].double().cpu(), m, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(got[2].double().cpu(), v, rtol=1e-4, atol=1e-10)
    assert (got[0].norm(dim=-1) - 1).abs().max().item() < 1e-6  # on the sphere to fp32 rounding


@pytest.mark.parametrize("row_v, euclidean", MODES, ids=IDS)
def test_matches_the_native_cpu_kernel(row_v, euclidean):
    from spherenet.kernels import native as _native

    op = _native.sphere_adam_op()
    if op is None or DEVICE != "cpu":
        pytest.skip("the native CPU kernel is not available here")
    x, m, v, gen = start(9, 64, row_v, seed=1)
    ours = [t.float() for t in (x, m, v)]
    native = [t.float() for t in (x, m, v)]
    for t in range(1, 11):
        g = torch.randn(9, 64, generator=gen).float()
        kernel_step(ours[0], g, ours[1], ours[2], t, row_v, euclidean)
        kernel_step(native[0], g, native[1], native[2], t, row_v, euclidean, kernel=op)
    for a, b in zip(ours, native):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("row_v, euclidean", MODES, ids=IDS)
def test_largest_one_step_move_is_bounded_like_adams(row_v, euclidean):
    """No element moves more than 3 lr in one step (element v: Adam's bound plus the row's
    rescaling by Norm), no row more than 3 lr in norm (row v: the bound is on rows), even when
    quiet rows wake."""
    x, m, v, gen = (t.float().to(DEVICE) if torch.is_tensor(t) else t for t in start(16, 32, row_v, seed=2))
    for t in range(1, 41):
        g = torch.randn(16, 32, generator=gen).float().to(DEVICE)
        if t < 30:
            g[:4] *= 1e-6  # quiet rows, then a burst
        before = x.clone()
        kernel_step(x, g, m, v, t, row_v, euclidean)
        step = x - before
        move = step.norm(dim=-1).max().item() if row_v else step.abs().max().item()
        assert move <= 3 * LR, (t, move)


@pytest.mark.parametrize("row_v, euclidean", MODES, ids=IDS)
def test_one_call_over_many_shapes_steps_each_tensor_as_alone(row_v, euclidean, monkeypatch):
    """Tensors of several shapes and row lengths in one call (a model's sphere matrices): each
    stepped as the float64 reference steps it alone, with its own step size; one launch per
    row length."""
    shapes = [(37, 48), (5, 48), (2, 3, 48), (1, 48), (9, 130), (64, 130), (0, 48)]
    refs = [start(shape[0] if len(shape) == 2 else shape[0] * shape[1], shape[-1], row_v, seed=i) for i, shape in enumerate(shapes)]  # fmt: skip  # one start per shape
    refs = [(x.reshape(shape), m.reshape(shape), v.reshape(shape[:-1]) if row_v else v.reshape(shape), gen) for (x, m, v, gen), shape in zip(refs, shapes)]  # fmt: skip  # one reshape per state
    got = [[t.float().to(DEVICE) for t in ref[:3]] for ref in refs]
    launches = []
    kernel = triton_kernel._sphere_adam_rows

    class Counting:
        def __getitem__(self, grid):
            launches.append(grid)
            return kernel[grid]

    monkeypatch.setattr(triton_kernel, "_sphere_adam_rows", Counting())
    b1, b2 = BETAS
    for t in range(1, 6):
        grads = [torch.randn(ref[0].shape, generator=ref[3], dtype=torch.float64) for ref in refs]
        lrs = [LR * (i + 1) / len(refs) for i in range(len(refs))]  # each tensor its own step size
        for (x, m, v, _), g, lr in zip(refs, grads, lrs):
            if x.numel():
                reference_step(x, g, m, v, t, row_v, euclidean, lr)
        triton_kernel.sphere_adam_rows_(
            [a[0] for a in got], [g.float().to(DEVICE) for g in grads], [a[1] for a in got], [a[2] for a in got],
            [lr / (1 - b1**t) for lr in lrs], [math.sqrt(1 - b2**t)] * len(refs), b1, b2, EPS, TINY, row_v, not euclidean,
        )  # fmt: skip  # the kernel's argument order
    assert len(launches) == 5 * 2  # two row lengths, five steps
    for shape, ref, ours in zip(shapes, refs, got):
        assert ours[0].shape == shape
        torch.testing.assert_close(ours[0].double().cpu(), ref[0], rtol=0, atol=2e-5, msg=str(shape))
        torch.testing.assert_close(ours[1].double().cpu(), ref[1], rtol=1e-4, atol=1e-6, msg=str(shape))
        torch.testing.assert_close(ours[2].double().cpu(), ref[2], rtol=1e-4, atol=1e-10, msg=str(shape))


@pytest.mark.parametrize("row_v, euclidean", MODES, ids=IDS)
def test_bf16_parameters_and_states_are_stepped_in_fp32_and_stored_once(row_v, euclidean):
    """bf16 parameter, gradient and states: the kernel loads them into fp32, steps and stores
    each once, so the result is the fp32 step from the same bf16 values, within one bf16 unit in
    the last place (the interpreter truncates on the store, a GPU rounds to nearest)."""
    x, m, v, gen = start(12, 40, row_v, seed=3)
    bf16 = [t.bfloat16().to(DEVICE) for t in (x, m, v)]
    fp32 = [t.float() for t in bf16]
    for t in range(1, 4):
        g = torch.randn(12, 40, generator=gen).bfloat16().to(DEVICE)
        kernel_step(bf16[0], g, bf16[1], bf16[2], t, row_v, euclidean)
        kernel_step(fp32[0], g.float(), fp32[1], fp32[2], t, row_v, euclidean)
        ulp = 2.0 ** (torch.frexp(fp32[0].abs())[1].float() - 8)  # one bf16 ulp at each element
        assert ((bf16[0].float() - fp32[0]).abs() <= ulp).all(), t
        fp32 = [a.float() for a in bf16]  # go on from the stored bf16 values
    assert all(a.dtype == torch.bfloat16 for a in bf16)


def test_states_of_another_dtype_or_unequal_lists_are_refused():
    x, m, v, _ = start(4, 16, False)
    x, m = x.float(), m.float()
    with pytest.raises(
        ValueError, match=r"the exp_avg_sq of shape \(4, 16\) is torch.float64 on cpu, its parameter torch.float32"
    ):
        kernel_step(x, torch.zeros_like(x), m, v, 1, False, True)
    with pytest.raises(ValueError, match=r"lists of unequal lengths \[1, 1, 1, 1, 2, 1\]"):
        triton_kernel.sphere_adam_rows_([x], [x], [m], [m], [LR, LR], [1.0], 0.9, 0.95, EPS, TINY, False, False)


def test_non_contiguous_state_is_refused():
    x, m, v, _ = start(4, 16, False)
    x, m, v = x.float(), m.float(), v.float().t().contiguous().t()
    with pytest.raises(ValueError, match=r"the exp_avg_sq of shape \(4, 16\) is not contiguous"):
        kernel_step(x, torch.zeros_like(x), m, v, 1, False, True)


# --------------------------------------------------------------------------------- through the optimizer


def _trained(kernel: str, second_moment: str, gradient: str, steps: int = 8):
    from spherenet.models import preset_config
    from spherenet.models.ngpt import NGPT
    from spherenet.optim import RiemannianAdam

    torch.manual_seed(0)
    model = NGPT(preset_config("ngpt-tiny", vocab_size=64, n_layers=1, max_seq_len=16)).to(DEVICE)
    opt = RiemannianAdam(model, lr=1e-2, second_moment=second_moment, gradient=gradient, sphere_kernel=kernel)
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
        ids = torch.randint(0, 64, (4, 16), generator=gen).to(DEVICE)
        loss = torch.nn.functional.cross_entropy(model(ids).flatten(0, 1), ids.roll(-1, 1).flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model, opt


@pytest.mark.parametrize("second_moment, gradient", [("element", "euclidean"), ("element", "riemannian"), ("row", "riemannian")])  # fmt: skip  # one case per mode
def test_riemannian_adam_with_the_triton_kernel_matches_foreach(second_moment, gradient):
    triton_model, triton_opt = _trained("triton", second_moment, gradient)
    foreach_model, foreach_opt = _trained("torch", second_moment, gradient)
    for (name, a), b in zip(triton_model.named_parameters(), foreach_model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=2e-5, msg=name)
    steps = {float(s["step"]) for s in triton_opt.state.values()}
    assert steps == {8.0}  # the counter moved once per step, as foreach's
    assert steps == {float(s["step"]) for s in foreach_opt.state.values()}


@pytest.mark.slow
def test_spherenet_kernels_triton_makes_auto_pick_the_triton_kernel():
    import subprocess
    import sys

    code = (
        "from spherenet.kernels.resolve import resolve; from spherenet.kernels.sphere_adam import SPHERE_ADAM as op; "
        "print(resolve(op, None, 'cpu'), resolve(op, None, 'cuda'), resolve(op, 'native', 'cpu'))"
    )
    import os

    for setting, want in (
        ("triton", "triton triton native"),
        ("torch", "torch torch native"),
        ("", "native triton native"),
    ):
        env = dict(os.environ, SPHERENET_KERNELS=setting)
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        assert out.stdout.split() == want.split(), setting


def test_cpu_tensors_without_the_interpreter_are_refused(monkeypatch):
    if DEVICE == "cuda":
        pytest.skip("the check is for CPU tensors")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    x, m, v, _ = start(4, 16, False)
    x, m, v = x.float(), m.float(), v.float()
    with pytest.raises(RuntimeError, match="CPU tensors need TRITON_INTERPRET=1"):
        kernel_step(x, torch.zeros_like(x), m, v, 1, False, True)


@pytest.mark.parametrize("rows, d", [(2, 7), (37, 64), (130, 33)])
def test_normalize_rows_matches_the_float64_reference(rows, d):
    g = torch.Generator().manual_seed(rows * d)
    x64 = (
        torch.randn(rows, d, generator=g, dtype=torch.float64)
        * torch.logspace(-3, 3, rows, dtype=torch.float64)[:, None]
    )
    x64[0] = 0.0  # a zero row has no direction: it stays zero
    x = x64.float().to(DEVICE)
    triton_kernel.normalize_rows_triton_([x])
    want = x64.float().double()
    want = want / want.norm(dim=-1, keepdim=True).clamp_min(1e-30)
    assert torch.equal(x[0].cpu(), torch.zeros(d))
    assert (x.cpu().double() - want).abs().max() < 1e-6
    assert ((x[1:].cpu().double().norm(dim=-1) - 1).abs().max()) < 1e-6


def test_normalize_hook_takes_the_triton_kernel_where_the_optimizer_does(monkeypatch):
    """``adam_normalize``'s tail (normalize_) on the Triton kernel under SPHERENET_KERNELS=triton,
    equal to the _foreach path's result."""
    from spherenet.kernels import resolve as kernel_choice
    from spherenet.models import from_preset
    from spherenet.optim import normalize_

    model = from_preset("ngpt-tiny").to(DEVICE)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.5).add_(0.01)  # off the sphere
    reference = from_preset("ngpt-tiny").to(DEVICE)
    reference.load_state_dict(model.state_dict())
    calls = []
    real = triton_kernel.normalize_rows_triton_
    monkeypatch.setattr(triton_kernel, "normalize_rows_triton_", lambda xs, *a: calls.append(len(xs)) or real(xs, *a))
    monkeypatch.setattr(kernel_choice, "_setting", "triton")
    assert normalize_(model) == len(model.sphere_weights())
    assert calls == [len(model.sphere_weights())]  # every sphere tensor in the kernel
    monkeypatch.setattr(kernel_choice, "_setting", "torch")
    normalize_(reference)
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        assert torch.allclose(p, q, atol=1e-6), name


# --------------------------------------------------------------------------------- SphericalMuon's tail


@pytest.mark.parametrize("project_update", [True, False])
@pytest.mark.parametrize("rows, d", [(37, 48), (3, 130)])
def test_muon_tail_matches_the_float64_reference(project_update, rows, d):
    """Steps 4-6 of SphericalMuon (project O, step, Norm, project M at the new point) in one
    pass, against those steps written out in float64."""
    gen = torch.Generator().manual_seed(rows + d)
    x = torch.randn(rows, d, generator=gen, dtype=torch.float64)
    x /= x.norm(dim=-1, keepdim=True)
    o = torch.randn(rows, d, generator=gen, dtype=torch.float64) / math.sqrt(d)
    m = torch.randn(rows, d, generator=gen, dtype=torch.float64)
    step = 0.05
    got = [t.float().to(DEVICE) for t in (x, o, m)]
    triton_kernel.sphere_muon_tail_triton_([got[0]], [got[1]], [got[2]], [step], project_update)
    if project_update:
        o = o - (x * o).sum(-1, keepdim=True) * x
    y = x - step * o
    x = y / y.norm(dim=-1, keepdim=True)
    m = m - (x * m).sum(-1, keepdim=True) * x
    torch.testing.assert_close(got[0].double().cpu(), x, rtol=0, atol=1e-6)
    torch.testing.assert_close(got[2].double().cpu(), m, rtol=1e-5, atol=1e-6)
    assert ((got[0].cpu().double() * got[2].cpu().double()).sum(-1).abs().max()) < 1e-5  # M tangent at the new x


def test_spherical_muon_takes_the_triton_tail_under_spherenet_kernels_triton(monkeypatch):
    """SphericalMuon with the Triton tail equals its foreach path over several steps, and the
    tail ran once per matrix per step."""
    from spherenet.kernels import resolve as kernel_choice
    from spherenet.models import from_preset
    from spherenet.optim import SphericalMuon

    def trained(environment: str, calls: list):
        monkeypatch.setattr(kernel_choice, "_setting", environment)
        torch.manual_seed(0)
        model = from_preset("ngpt-tiny", vocab_size=64, n_layers=1, max_seq_len=16).to(DEVICE)
        matrices = [p for n, p in model.named_parameters() if p.dim() == 2 and "embed" not in n and "head" not in n]  # fmt: skip  # the blocks' matrices
        opt = SphericalMuon(matrices, lr=0.02, ns_dtype="float32")  # bf16 would amplify rounding
        gen = torch.Generator().manual_seed(1)
        for _ in range(4):
            ids = torch.randint(0, 64, (4, 16), generator=gen).to(DEVICE)
            loss = torch.nn.functional.cross_entropy(model(ids).flatten(0, 1), ids.roll(-1, 1).flatten())
            opt.zero_grad()
            loss.backward()
            opt.step()
        return model, len(matrices)

    calls = []
    real = triton_kernel.sphere_muon_tail_triton_
    monkeypatch.setattr(triton_kernel, "sphere_muon_tail_triton_", lambda *a: calls.append(1) or real(*a))
    triton_model, n_matrices = trained("triton", calls)
    assert len(calls) == 4 * n_matrices
    foreach_model, _ = trained("torch", calls)
    assert len(calls) == 4 * n_matrices  # the plain path took no Triton tail
    for (name, a), b in zip(triton_model.named_parameters(), foreach_model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=2e-5, msg=name)


def test_work_items_are_built_once_per_set_of_row_counts_and_name_every_block():
    triton_kernel._work_items.cache_clear()
    work = triton_kernel._work_items(torch.device("cpu"), 4, (9, 1, 0, 4))
    assert work.tolist() == [[0, 0], [0, 1], [0, 2], [1, 0], [3, 0]]  # (tensor, block of rows)
    x, m, v, _ = start(9, 16, False)
    xs = [x.float().to(DEVICE)]
    args = ([torch.zeros_like(xs[0])], [m.float().to(DEVICE)], [v.float().to(DEVICE)], [LR], [1.0])
    for _ in range(3):
        triton_kernel.sphere_adam_rows_(xs, *args, *BETAS, EPS, TINY, False, False)
    assert triton_kernel._work_items.cache_info().misses == 2  # the call above and the first step


def test_launcher_says_aligned_only_when_every_row_starts_on_16_bytes(monkeypatch):
    """The kernel's wide loads rest on the launcher's word (tests/kernels/test_triton_compile.py): a
    tensor that starts off a 16-byte boundary, or rows of a length that leaves one, must be
    launched as unaligned, and is stepped as the float64 reference steps it either way."""
    seen = []
    kernel = triton_kernel._sphere_adam_rows

    class Recording:
        def __getitem__(self, grid):
            def launch(*args, **meta):
                seen.append(meta["ALIGNED"])
                return kernel[grid](*args, **meta)

            return launch

    monkeypatch.setattr(triton_kernel, "_sphere_adam_rows", Recording())
    for offset, d, aligned in ((0, 16, True), (1, 16, False), (0, 18, False)):
        x, m, v, gen = start(5, d, False)
        storage = torch.zeros(offset + x.numel(), dtype=torch.float32, device=DEVICE)
        ours = storage[offset:].view(5, d)  # data_ptr() 4 * offset bytes past the allocation
        ours.copy_(x)
        got_m, got_v = m.float().to(DEVICE), v.float().to(DEVICE)
        g = torch.randn(5, d, generator=gen, dtype=torch.float64)
        reference_step(x, g, m, v, 1, False, True)
        kernel_step(ours, g.float().to(DEVICE), got_m, got_v, 1, False, True)
        assert seen[-1] is aligned, (offset, d)
        torch.testing.assert_close(ours.double().cpu(), x, rtol=0, atol=2e-6)


def test_auto_leaves_float64_parameters_to_the_float64_foreach_step(monkeypatch):
    """The Triton kernel computes in float32: under "auto" (the CUDA default, and every device's
    with SPHERENET_KERNELS=triton) float64 parameters take the foreach path and keep float64
    precision; asking for sphere_kernel="triton" by name still steps them there, in float32."""
    from spherenet.kernels import resolve as kernel_choice
    from spherenet.manifolds import declare_sphere
    from spherenet.optim.riemannian_adam import RiemannianAdam

    monkeypatch.setattr(kernel_choice, "_setting", "triton")  # "auto" picks Triton on CPU too
    layer = torch.nn.Linear(16, 12, bias=False).double()
    declare_sphere(layer, "weight")
    with torch.no_grad():
        layer.weight.copy_(layer.weight / layer.weight.norm(dim=-1, keepdim=True))
    start_weight = layer.weight.detach().clone()
    results = {}
    for kernel in ("auto", "triton", "torch"):
        with torch.no_grad():
            layer.weight.copy_(start_weight)
        opt = RiemannianAdam(layer, lr=1e-2, sphere_kernel=kernel)
        layer.weight.grad = torch.linspace(-1, 1, 16 * 12, dtype=torch.float64).reshape(12, 16)
        opt.step()
        results[kernel] = layer.weight.detach().clone()
    assert torch.equal(results["auto"], results["torch"])
    assert not torch.equal(results["triton"], results["torch"])  # stepped in float32
    torch.testing.assert_close(results["triton"], results["torch"], rtol=0, atol=1e-6)
