"""spherenet.kernels.sphere_adam_: its reference (and its foreach passes) against Adam and the
retraction written out here in float64, for both second moments, both gradients and the
whole-matrix geometry; its options object and its refusals."""

from __future__ import annotations

import importlib.util
import math

import pytest
import torch

from spherenet.kernels.sphere_adam import SphereAdamOptions, sphere_adam_
from spherenet.manifolds import GeometryLists, MatrixSphere

LR, B1, B2, EPS = 2e-2, 0.9, 0.95, 1e-8


def written_out_step(x, g, m, v, t, second_moment, gradient):
    """One step of Adam on the unit sphere, row by row, in plain float64 torch (new tensors)."""
    u = g - (x * g).sum(-1, keepdim=True) * x if gradient == "riemannian" else g
    m = B1 * m + (1 - B1) * u
    v = B2 * v + (1 - B2) * ((u * u).sum(-1, keepdim=True) if second_moment == "row" else u * u)
    d = (m / (1 - B1**t)) / ((v / (1 - B2**t)).sqrt() + EPS)
    y = x - LR * d
    x = y / y.norm(dim=-1, keepdim=True)
    if second_moment == "row" and gradient == "riemannian":
        m = m - (x * m).sum(-1, keepdim=True) * x
    return x, m, v


def unit_rows(gen, *shape):
    x = torch.randn(*shape, generator=gen, dtype=torch.float64)
    return x / x.norm(dim=-1, keepdim=True)


@pytest.mark.parametrize("implementation", ["reference", "torch"])
@pytest.mark.parametrize("second_moment", ["element", "row"])
@pytest.mark.parametrize("gradient", ["euclidean", "riemannian"])
def test_reference_is_adam_then_the_retraction_written_out(second_moment, gradient, implementation):
    gen = torch.Generator().manual_seed(0)
    shapes = [(7, 12), (3, 2, 5), (1, 9)]
    xs = [unit_rows(gen, *s) for s in shapes]
    ms = [torch.zeros(s, dtype=torch.float64) for s in shapes]
    vs = [torch.zeros(s[:-1] + (1,) if second_moment == "row" else s, dtype=torch.float64) for s in shapes]
    steps = [torch.zeros((), dtype=torch.float32) for _ in shapes]
    want = [(x.clone(), m.clone(), v.clone()) for x, m, v in zip(xs, ms, vs)]
    for t in range(1, 26):
        gs = [torch.randn(s, generator=gen, dtype=torch.float64) for s in shapes]
        before = [g.clone() for g in gs]
        options = SphereAdamOptions(second_moment, gradient, implementation)
        sphere_adam_(xs, gs, ms, vs, steps, lr=LR, beta1=B1, beta2=B2, eps=EPS, options=options)
        want = [written_out_step(x, g, m, v, t, second_moment, gradient) for (x, m, v), g in zip(want, gs)]
        assert all(torch.equal(g, b) for g, b in zip(gs, before))  # gradients are read only
        assert [float(s) for s in steps] == [t] * len(shapes)
    for got, expected in zip(zip(xs, ms, vs), want):
        for a, b in zip(got, expected):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-13)
    assert max(float((x - w[0]).abs().max()) for x, w in zip(xs, want)) < 1e-13
    assert all(float((x.norm(dim=-1) - 1).abs().max()) < 1e-14 for x in xs)


@pytest.mark.parametrize("gradient", ["euclidean", "riemannian"])
def test_reference_steps_the_whole_matrix_sphere_through_its_operations(gradient):
    """AdamH: W <- R Normalize(W - lr R Normalize(d)), d Adam's direction on g (or on its tangent
    part g - <W, g> / <W, W> W), the Frobenius radius R kept."""
    gen = torch.Generator().manual_seed(1)
    sphere = MatrixSphere()
    ws = [
        3.0 * torch.randn(6, 4, generator=gen, dtype=torch.float64),
        torch.randn(5, generator=gen, dtype=torch.float64),
    ]
    states = [sphere.init_state(w) for w in ws]
    radii = [float(w.norm()) for w in ws]
    ms, vs = [torch.zeros_like(w) for w in ws], [torch.zeros_like(w) for w in ws]
    steps = [torch.zeros((), dtype=torch.float32) for _ in ws]
    want = [(w.clone(), m.clone(), v.clone()) for w, m, v in zip(ws, ms, vs)]
    for t in range(1, 11):
        gs = [torch.randn(w.shape, generator=gen, dtype=torch.float64) for w in ws]
        sphere_adam_(
            ws, gs, ms, vs, steps, lr=LR, beta1=B1, beta2=B2, eps=EPS,
            options=SphereAdamOptions(gradient=gradient), manifold=GeometryLists(sphere, states, ws),
        )  # fmt: skip  # the function's arguments in its order
        stepped = []
        for (w, m, v), g, radius in zip(want, gs, radii):
            u = g - (w * g).sum() / (w * w).sum() * w if gradient == "riemannian" else g
            m = B1 * m + (1 - B1) * u
            v = B2 * v + (1 - B2) * u * u
            d = (m / (1 - B1**t)) / ((v / (1 - B2**t)).sqrt() + EPS)
            y = w - LR * radius * d / d.norm()
            stepped.append((radius * y / y.norm(), m, v))
        want = stepped
    for got, expected in zip(zip(ws, ms, vs), want):
        for a, b in zip(got, expected):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-13)
    for w, radius in zip(ws, radii):
        assert math.isclose(float(w.norm()), radius, rel_tol=1e-14)


def test_options_are_checked_once_with_one_error_per_bad_value():
    assert SphereAdamOptions() == SphereAdamOptions("element", "euclidean", "auto")
    with pytest.raises(ValueError, match=r"^second_moment must be one of \('element', 'row'\), got 'column'$"):
        SphereAdamOptions(second_moment="column")
    with pytest.raises(ValueError, match=r"^gradient must be one of \('riemannian', 'euclidean'\), got 'paper'$"):
        SphereAdamOptions(gradient="paper")
    for bad in ("cuda", "foreach"):  # "foreach", once another name of "torch", is refused too
        with pytest.raises(ValueError, match=rf"^sphere_kernel \(the sphere-Adam implementation\) must be one of \('auto', 'reference', 'torch', 'native', 'triton'\), got '{bad}'$"):  # fmt: skip  # one pattern
            SphereAdamOptions(implementation=bad)
    with pytest.raises(Exception, match="cannot assign"):  # frozen: checked values stay checked
        SphereAdamOptions().gradient = "paper"


def test_refusals_name_the_problem():
    x = torch.nn.functional.normalize(torch.randn(3, 4), dim=-1)
    args = ([x], [torch.zeros_like(x)], [torch.zeros_like(x)], [torch.zeros_like(x)], [torch.zeros(())])
    scalars = dict(lr=LR, beta1=B1, beta2=B2, eps=EPS)
    with pytest.raises(TypeError, match="options must be a SphereAdamOptions, got dict"):
        sphere_adam_(*args, **scalars, options={"gradient": "riemannian"})
    with pytest.raises(ValueError, match="lists of unequal lengths"):
        sphere_adam_(*args[:4], [], **scalars)
    geometry = GeometryLists(MatrixSphere(), [{"radius": 1.0}], [x])
    for name in ("reference",) + (("triton",) if importlib.util.find_spec("triton") else ()):
        with pytest.raises(ValueError, match=f"the {name} implementation steps the unit sphere's rows only"):
            sphere_adam_(*args, **scalars, options=SphereAdamOptions(implementation=name), manifold=geometry)
