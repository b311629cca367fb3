"""The native CPU sphere-Adam kernel (spherenet/kernels/native/sphere_adam.cpp) and how
RiemannianAdam picks it: parity with a plain float64 PyTorch reference and with the foreach
path, geometry after every step, thread-count independence, fallbacks and refusals."""

from __future__ import annotations

import copy
import math
import os
import subprocess
import sys
import warnings

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from spherenet.kernels import native as _native
from spherenet.kernels.sphere_adam import SphereAdamOptions, sphere_adam_reference
from spherenet.layers import SphereLinear
from spherenet.models import from_preset
from spherenet.optim import RiemannianAdam, normalize_
from spherenet.optim.riemannian_adam import SPHERE_KERNELS

pytestmark = pytest.mark.skipif(
    _native.sphere_adam_op() is None, reason=f"native kernel unavailable: {_native.native_status()[1]}"
)
OP = _native.sphere_adam_op()


def reference_step(x, g, m, v, lr, b1, b2, eps, t, row_v, euclidean=False):
    """Step ``t`` of :func:`spherenet.kernels.sphere_adam.sphere_adam_reference` in float64, on
    copies: ``(x, m, v)`` after it. (The reference itself is checked against the equations written
    out in tests/kernels/test_kernels_sphere_adam.py.)"""
    x, g, m, v = (a.double().clone() for a in (x, g, m, v))
    options = SphereAdamOptions("row" if row_v else "element", "euclidean" if euclidean else "riemannian", "reference")
    sphere_adam_reference(
        [x], [g], [m], [v], [torch.tensor(t - 1.0)], lr=lr, beta1=b1, beta2=b2, eps=eps, options=options
    )
    return x, m, v


def random_state(rows, d, dtype, row_v, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.nn.functional.normalize(torch.randn(rows, d, generator=gen, dtype=torch.float64), dim=-1)
    g = torch.randn(rows, d, generator=gen, dtype=torch.float64)
    m = 0.1 * torch.randn(rows, d, generator=gen, dtype=torch.float64)
    m = m - (x * m).sum(-1, keepdim=True) * x  # a tangent first moment, as after a step
    v = torch.rand(rows, 1 if row_v else d, generator=gen, dtype=torch.float64)
    return [a.to(dtype).contiguous() for a in (x, g, m, v)]


def run_op(x, g, m, v, lr, b1, b2, eps, t, row_v, euclidean=False):
    OP([x], [g], [m], [v], [lr / (1 - b1**t)], [math.sqrt(1 - b2**t)], b1, b2, eps, 1e-30, row_v, not euclidean)


@given(
    rows=st.integers(0, 9),
    d=st.integers(2, 70),
    row_v=st.booleans(),
    euclidean=st.booleans(),
    t=st.integers(1, 50),
    lr=st.floats(1e-4, 0.3),
    seed=st.integers(0, 2**16),
)
def test_kernel_matches_float64_reference(rows, d, row_v, euclidean, t, lr, seed):
    b1, b2, eps = 0.9, 0.95, 1e-8
    x, g, m, v = random_state(rows, d, torch.float64, row_v, seed)
    g_before = g.clone()
    want_x, want_m, want_v = reference_step(x, g, m, v, lr, b1, b2, eps, t, row_v, euclidean)
    run_op(x, g, m, v, lr, b1, b2, eps, t, row_v, euclidean)
    assert torch.equal(g, g_before)  # gradients are read only
    torch.testing.assert_close(x, want_x, rtol=0, atol=1e-12)
    torch.testing.assert_close(m, want_m, rtol=0, atol=1e-12)
    torch.testing.assert_close(v, want_v, rtol=1e-12, atol=0)
    if rows:
        assert float((x.norm(dim=-1) - 1).abs().max()) <= 1e-14
        if row_v and not euclidean:
            assert float((x * m).sum(-1).abs().max()) <= 1e-14  # m is transported to the new point


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 2e-6), (torch.bfloat16, 2e-2), (torch.float16, 4e-3)])
@pytest.mark.parametrize("row_v", [False, True])
@pytest.mark.parametrize("euclidean", [False, True])
def test_kernel_low_precision_norms_and_reference(dtype, tol, row_v, euclidean):
    b1, b2, eps, lr, t = 0.9, 0.95, 1e-8, 0.05, 3
    x, g, m, v = random_state(64, 96, dtype, row_v, seed=1)
    want_x, want_m, _ = reference_step(x, g, m, v, lr, b1, b2, eps, t, row_v, euclidean)
    run_op(x, g, m, v, lr, b1, b2, eps, t, row_v, euclidean)
    err = float((x.double().norm(dim=-1) - 1).abs().max())
    # the retraction is computed in float32 and rounded once: within one rounding of unit
    assert err <= {torch.float32: 3e-7, torch.bfloat16: 4e-3, torch.float16: 1e-3}[dtype], err
    assert float((x.double() - want_x).abs().max()) <= tol
    assert float((m.double() - want_m).abs().max()) <= 10 * tol


@pytest.mark.parametrize("rows,d", [(0, 5), (1, 2), (3, 1000), (257, 31)])
def test_kernel_odd_shapes(rows, d):
    x, g, m, v = random_state(rows, d, torch.float32, False, seed=2)
    want_x, _, _ = reference_step(x, g, m, v, 1e-2, 0.9, 0.99, 1e-8, 1, False)
    run_op(x, g, m, v, 1e-2, 0.9, 0.99, 1e-8, 1, False)
    torch.testing.assert_close(x.double(), want_x, rtol=0, atol=2e-6)


def test_kernel_three_dim_tensor_is_rows_of_its_last_dim():
    x, g, m, v = random_state(12, 7, torch.float64, True, seed=3)
    want_x, want_m, want_v = reference_step(x, g, m, v, 0.1, 0.9, 0.95, 1e-8, 2, True)
    x3, g3, m3, v3 = x.view(3, 4, 7), g.view(3, 4, 7), m.view(3, 4, 7), v.view(3, 4, 1)
    run_op(x3, g3, m3, v3, 0.1, 0.9, 0.95, 1e-8, 2, True)
    torch.testing.assert_close(x, want_x, rtol=0, atol=1e-12)
    torch.testing.assert_close(m, want_m, rtol=0, atol=1e-12)
    torch.testing.assert_close(v, want_v, rtol=1e-12, atol=0)


def test_kernel_result_does_not_depend_on_thread_count():
    """Each row is computed whole by one thread, so 1 and 2 threads give identical bits."""
    before = torch.get_num_threads()
    results = []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            x, g, m, v = random_state(4096, 64, torch.float32, False, seed=4)
            run_op(x, g, m, v, 1e-3, 0.9, 0.95, 1e-8, 7, False)
            results.append((x, m, v))
    finally:
        torch.set_num_threads(before)
    assert all(torch.equal(a, b) for a, b in zip(*results))


@pytest.mark.parametrize("d", [5, 17, 40])
def test_kernel_eps_zero_with_a_short_last_chunk(d):
    """The lanes past the row's end hold 0/0 when eps = 0: they must stay out of the norms."""
    x, g, m, v = random_state(6, d, torch.float64, False, seed=5)
    want_x, want_m, want_v = reference_step(x, g, m, v, 0.05, 0.9, 0.95, 0.0, 4, False)
    run_op(x, g, m, v, 0.05, 0.9, 0.95, 0.0, 4, False)
    assert bool(torch.isfinite(x).all() and torch.isfinite(m).all())
    torch.testing.assert_close(x, want_x, rtol=0, atol=1e-12)
    torch.testing.assert_close(m, want_m, rtol=0, atol=1e-12)


@pytest.mark.parametrize("row_v", [False, True])
@pytest.mark.parametrize("euclidean", [False, True])
def test_kernel_row_does_not_depend_on_its_neighbours(row_v, euclidean):
    """Rows are pipelined (the last pass of a row reads the next row's <x, g>): stepping a
    tensor whole and stepping each row as its own tensor give identical bits."""
    whole = random_state(50, 40, torch.float32, row_v, seed=6)
    alone = [a.clone() for a in whole]
    run_op(*whole, 1e-2, 0.9, 0.95, 1e-8, 3, row_v, euclidean)
    for r in range(50):
        run_op(*(a[r : r + 1] for a in alone), 1e-2, 0.9, 0.95, 1e-8, 3, row_v, euclidean)
    assert all(torch.equal(a, b) for a, b in zip(whole, alone))


def test_kernel_mixed_dtypes_in_one_call():
    """One call may hold tensors of several dtypes (one parallel region steps them all)."""
    dtypes = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
    together = [random_state(9, 33, dtype, False, seed=7 + i) for i, dtype in enumerate(dtypes)]
    apart = [[a.clone() for a in state] for state in together]
    n = len(dtypes)
    OP(*([s[k] for s in together] for k in range(4)), [1e-2] * n, [0.5] * n, 0.9, 0.95, 1e-8, 1e-30, False, True)
    for state in apart:
        OP(*([a] for a in state), [1e-2], [0.5], 0.9, 0.95, 1e-8, 1e-30, False, True)
    for state_together, state_apart in zip(together, apart):
        assert all(torch.equal(a, b) for a, b in zip(state_together, state_apart))


def test_kernel_refuses_bad_lists():
    x, g, m, v = random_state(4, 8, torch.float32, False)
    with pytest.raises(RuntimeError, match="different lengths"):
        OP([x], [g, g], [m], [v], [1e-3], [1.0], 0.9, 0.95, 1e-8, 1e-30, False, True)
    with pytest.raises(RuntimeError, match=r"vs\[0\] has 32 elements, expected 4"):
        OP([x], [g], [m], [v], [1e-3], [1.0], 0.9, 0.95, 1e-8, 1e-30, True, True)  # row mode, element v
    with pytest.raises(RuntimeError, match=r"gs\[0\] has dtype Double"):
        OP([x], [g.double()], [m], [v], [1e-3], [1.0], 0.9, 0.95, 1e-8, 1e-30, False, True)
    with pytest.raises(RuntimeError, match=r"ms\[0\] is not contiguous"):
        mt = torch.zeros(8, 4).t()
        OP([x], [g], [mt], [v], [1e-3], [1.0], 0.9, 0.95, 1e-8, 1e-30, False, True)
    with pytest.raises(RuntimeError, match="unsupported operation"):  # x and m share memory
        OP([x], [g], [x], [v], [1e-3], [1.0], 0.9, 0.95, 1e-8, 1e-30, False, True)
    with pytest.raises(RuntimeError, match="must have size >= 2"):
        one = torch.ones(4, 1)
        OP([one], [one], [one], [one], [1e-3], [1.0], 0.9, 0.95, 1e-8, 1e-30, False, True)


# ---- RiemannianAdam with the native kernel ---------------------------------------------------


def ngpt(dtype):
    torch.manual_seed(0)
    model = from_preset("ngpt-tiny").to(dtype)
    normalize_(model)
    return model


def set_grads(models, seed, dtype):
    gen = torch.Generator().manual_seed(seed)
    for params in zip(*(m.parameters() for m in models)):
        grad = torch.randn(params[0].shape, generator=gen, dtype=torch.float64)
        for p in params:
            p.grad = grad.to(dtype)


@pytest.mark.parametrize("mode", ["element", "row"])
@pytest.mark.parametrize("gradient", ["riemannian", "euclidean"])
def test_native_and_foreach_take_the_same_steps_float64(mode, gradient):
    native, foreach = ngpt(torch.float64), ngpt(torch.float64)
    opts = [
        RiemannianAdam(m, lr=1e-2, second_moment=mode, gradient=gradient, sphere_kernel=k)
        for m, k in ((native, "native"), (foreach, "torch"))
    ]
    for step in range(20):
        set_grads([native, foreach], step, torch.float64)
        grads = [p.grad.clone() for p in native.parameters()]
        for opt in opts:
            opt.step()
        assert all(torch.equal(p.grad, g) for p, g in zip(native.parameters(), grads))  # p.grad untouched
        assert all(torch.equal(p.grad, g) for p, g in zip(foreach.parameters(), grads))
    for (name, a), b in zip(native.named_parameters(), foreach.parameters()):
        assert float((a - b).detach().abs().max()) <= 1e-12, name
    for a, b in zip(native.parameters(), foreach.parameters()):
        for key in ("exp_avg", "exp_avg_sq", "step"):
            torch.testing.assert_close(opts[0].state[a][key], opts[1].state[b][key], rtol=1e-11, atol=1e-13)


@pytest.mark.parametrize("mode,gradient", [("element", "riemannian"), ("row", "riemannian"), ("element", "euclidean")])
def test_native_float32_tracks_float64_as_closely_as_foreach(mode, gradient):
    """Over 50 steps both float32 paths stay within 1e-6 of the float64 run, with unit rows."""
    ref = ngpt(torch.float64)
    runs = {k: copy.deepcopy(ref).float() for k in ("native", "torch")}
    opt_ref = RiemannianAdam(ref, lr=1e-3, second_moment=mode, gradient=gradient, sphere_kernel="torch")
    opts = {
        k: RiemannianAdam(m, lr=1e-3, second_moment=mode, gradient=gradient, sphere_kernel=k) for k, m in runs.items()
    }
    for step in range(50):
        set_grads([ref], step, torch.float64)
        set_grads(list(runs.values()), step, torch.float32)
        opt_ref.step()
        for opt in opts.values():
            opt.step()
    for kind, model in runs.items():
        err = max(float((a.double() - b).detach().abs().max()) for a, b in zip(model.parameters(), ref.parameters()))
        assert err <= 1e-6, (kind, err)
        for name, p in model.named_parameters():
            if p.dim() == 2:
                assert float((p.detach().norm(dim=-1) - 1).abs().max()) <= 1e-6, (kind, name)


def test_non_contiguous_sphere_tensor_takes_the_foreach_path():
    """A parameter the kernel cannot take (a transposed view) is still updated, exactly like
    the foreach optimizer does it, while the others go through the kernel."""
    model = torch.nn.Module()
    model.a = SphereLinear(6, 5, sphere="in").double()
    model.b = SphereLinear(6, 5, sphere="in").double()
    # the declaration belongs to the attribute name, so it carries over to the new tensor
    model.b.weight = torch.nn.Parameter(model.b.weight.detach().t().contiguous().t())
    normalize_(model)
    assert not model.b.weight.is_contiguous()
    twin = copy.deepcopy(model)
    opt = RiemannianAdam(model, lr=0.05, sphere_kernel="native")
    ref = RiemannianAdam(twin, lr=0.05, sphere_kernel="torch")
    for step in range(5):
        set_grads([model, twin], step, torch.float64)
        opt.step()
        ref.step()
    for a, b in zip(model.parameters(), twin.parameters()):
        assert float((a - b).detach().abs().max()) <= 1e-12


def test_build_optimizer_passes_the_kernel_choice():
    from spherenet.optim import build_optimizer

    opt, _ = build_optimizer(ngpt(torch.float32), "riemannian_adam", lr=1e-3, total_steps=10, sphere_kernel="torch")
    assert opt.options.implementation == "torch"
    with pytest.raises(
        ValueError, match=r"sphere_kernel \(the sphere-Adam implementation\) must be one of .*got 'gpu'"
    ):
        build_optimizer(ngpt(torch.float32), "riemannian_adam", lr=1e-3, total_steps=10, sphere_kernel="gpu")


def test_sphere_kernel_option_is_checked():
    assert SPHERE_KERNELS == ("auto", "reference", "torch", "native", "triton")
    for bad in ("cuda", "foreach"):  # "foreach", once another name of "torch", is refused too
        with pytest.raises(
            ValueError, match=rf"sphere_kernel \(the sphere-Adam implementation\) must be one of .*got '{bad}'"
        ):
            RiemannianAdam(ngpt(torch.float32), sphere_kernel=bad)


def test_unavailable_kernel_native_refuses_auto_warns_once(monkeypatch):
    monkeypatch.setitem(_native._state, "tried", True)
    monkeypatch.setitem(_native._state, "op", None)
    monkeypatch.setitem(_native._state, "reason", "no compiler (test)")
    model = ngpt(torch.float32)
    with pytest.raises(RuntimeError, match=r"sphere_kernel='native'.*no compiler \(test\)"):
        RiemannianAdam(model, sphere_kernel="native")
    opt = RiemannianAdam(model, lr=1e-3)
    twin = copy.deepcopy(model)
    ref = RiemannianAdam(twin, lr=1e-3, sphere_kernel="torch")
    with pytest.warns(RuntimeWarning, match=r"native implementation is unavailable \(no compiler \(test\)\)"):
        set_grads([model, twin], 0, torch.float32)
        opt.step()
    ref.step()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the warning comes once per optimizer
        set_grads([model, twin], 1, torch.float32)
        opt.step()
    ref.step()  # the same two steps through the same (foreach) path
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), twin.parameters()))


@pytest.mark.slow
@pytest.mark.parametrize("kernels", ["torch", "reference"])
def test_torch_only_kernels_never_build_native(kernels, tmp_path):
    code = "from spherenet.kernels import native; ok, why = native.native_status(); print(ok); print(why)"
    build_root = tmp_path / "extensions"  # an empty extension cache: a build would write here
    build_root.mkdir()
    env = dict(os.environ, SPHERENET_KERNELS=kernels, TORCH_EXTENSIONS_DIR=str(build_root))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["False", f"disabled by SPHERENET_KERNELS={kernels}"]
    assert list(build_root.iterdir()) == []  # nothing built, not even a build folder made


_OTHER_ISA_CHECK = """
import math, sys, torch
sys.path.insert(0, "tests/optim")
from test_optim_native import random_state, reference_step
from spherenet.kernels import native as _native
from spherenet.kernels.sphere_adam import SphereAdamOptions, sphere_adam_reference
print(torch.backends.cpu.get_cpu_capability())
op = _native.sphere_adam_op()
assert op is not None, _native.native_status()[1]
worst = 0.0
for dtype, tol in ((torch.float64, 1e-12), (torch.float32, 2e-6), (torch.bfloat16, 2e-2)):
    for row_v in (False, True):
        for d in (7, 8, 33, 64):  # shorter and longer than a vector, with and without a tail
            x, g, m, v = random_state(11, d, dtype, row_v, seed=d)
            want_x, want_m, _ = reference_step(x, g, m, v, 0.05, 0.9, 0.95, 1e-8, 3, row_v)
            op([x], [g], [m], [v], [0.05 / (1 - 0.9**3)], [math.sqrt(1 - 0.95**3)], 0.9, 0.95, 1e-8, 1e-30, row_v, True)
            err = float((x.double() - want_x).abs().max())
            assert err <= tol, (dtype, row_v, d, err)
print("ok")
"""


@pytest.mark.slow
@pytest.mark.parametrize("capability", ["AVX2", "DEFAULT"])
def test_kernel_built_for_another_cpu_capability(capability, tmp_path):
    """The kernel is compiled per CPU capability (different Vectorized<T> widths, the portable
    DEFAULT one included): build it as torch's ATEN_CPU_CAPABILITY makes another machine pick,
    and check its steps against the float64 reference."""
    env = dict(os.environ, ATEN_CPU_CAPABILITY=capability.lower(), TORCH_EXTENSIONS_DIR=str(tmp_path))
    out = subprocess.run(
        [sys.executable, "-c", _OTHER_ISA_CHECK],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),  # the repository
    )
    if out.returncode == 0 and out.stdout.split() and out.stdout.split()[0] != capability:
        pytest.skip(f"this CPU cannot run {capability} code (torch picked {out.stdout.split()[0]})")
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == [capability, "ok"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("row_v", [False, True])
def test_gradient_normal_to_the_sphere_has_no_tangent_part(dtype, row_v):
    """g = 3x is normal to the sphere: its projection (and so m and v) is rounding noise. Adam
    would blow that noise up to a full step (m / sqrt(v) is ~1 at any scale), so eps = 1 here
    keeps the step at noise level too: x stays where it was."""
    x, _, _, _ = random_state(16, 40, dtype, row_v, seed=5)
    g = 3.0 * x
    m, v = torch.zeros_like(x), torch.zeros(16, 1 if row_v else 40, dtype=dtype)
    before = x.clone()
    run_op(x, g, m, v, 0.1, 0.9, 0.95, 1.0, 1, row_v)
    ulp = torch.finfo(dtype).eps
    assert float(m.abs().max()) <= 8 * ulp  # (1 - b1) u, u = 3x - <x, 3x> x ~ rounding
    assert float(v.abs().max()) <= (8 * ulp) ** 2 * (40 if row_v else 1)
    assert float((x - before).abs().max()) <= 4 * ulp


@pytest.mark.slow
def test_a_library_built_before_is_loaded_without_torchs_builder():
    """torch's builder holds a lock file in the build folder while it checks a build, and a
    process killed then leaves it behind: every later builder would wait on it forever. A
    library already built under this source's, flags' and torch's name is loaded directly."""
    ok, why = _native.native_status()  # builds it here if need be
    if not ok:
        pytest.skip(f"native kernel unavailable: {why}")
    code = (
        "import torch.utils.cpp_extension as builder\n"
        "def refuse(*args, **kwargs):\n"
        "    raise SystemExit('the builder was called')\n"
        "builder.load = refuse\n"
        "from spherenet.kernels import native as _native\n"
        "print(_native.native_status())\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "(True, None)"


def test_a_stale_build_lock_is_removed_and_a_fresh_one_kept(tmp_path):
    # torch's builder waits forever on a lock left by a killed build; the kernel's loader removes
    # one older than any build takes, and leaves a younger one to the build that holds it
    lock_file = tmp_path / "lock"
    lock_file.write_text("")
    written = lock_file.stat().st_mtime
    assert not _native._remove_stale_lock(tmp_path, now=written + 60)
    assert lock_file.exists()
    assert _native._remove_stale_lock(tmp_path, now=written + _native._STALE_LOCK_S + 1)
    assert not lock_file.exists()
    assert not _native._remove_stale_lock(tmp_path)  # no lock: nothing to do


_STALE_LOCK_BUILD = """
import os, time
import torch.utils.cpp_extension as builder
from pathlib import Path
from spherenet.kernels import native as _native
build_directory = Path(builder._get_build_directory(_native._module_name(_native.cpu_build_flags()), verbose=False))
build_directory.mkdir(parents=True, exist_ok=True)
lock_file = build_directory / "lock"
lock_file.write_text("")
an_hour_ago = time.time() - 3600
os.utime(lock_file, (an_hour_ago, an_hour_ago))
def build(*args, **kwargs):  # stands in for the compiler: report whether the lock is still there
    raise RuntimeError(f"lock present: {lock_file.exists()}")
builder.load = build
print(_native.native_status())
"""


def test_the_build_removes_a_stale_lock_before_calling_torchs_builder(tmp_path):
    # a fresh extension cache, so no library built before is found and the build path is taken
    env = {k: v for k, v in os.environ.items() if k != "SPHERENET_KERNELS"}
    env["TORCH_EXTENSIONS_DIR"] = str(tmp_path)
    done = subprocess.run(
        [sys.executable, "-c", _STALE_LOCK_BUILD], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "lock present: False" in done.stdout, done.stdout
    assert "removing" in done.stderr and "build lock left 60 minutes ago" in done.stderr, done.stderr[-2000:]
