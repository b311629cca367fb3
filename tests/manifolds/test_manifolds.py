"""Geometry on the unit sphere: spherenet.manifolds.

Properties are checked with hypothesis over dimensions, seeds and interpolation weights; the
identities are those of Section 2.2.2 and Appendix A.3 of the nGPT paper and of
../shared/design/ngpt.md, section 2.
"""

import math

import geoopt
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from spherenet.manifolds import (
    Sphere,
    angle,
    lerp,
    normalize,
    point_tolerance,
    riemannian_update,
    slerp,
    tangent,
)

UPDATES = {"lerp": lerp, "slerp": slerp, "riemannian": riemannian_update}

dims = st.integers(min_value=2, max_value=48)
seeds = st.integers(min_value=0, max_value=2**31 - 1)
alphas = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)


def points(d, n=1, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return Sphere().random_point(n, d, dtype=dtype, generator=g)


def at_angle(a, theta, seed=1):
    """A unit vector at angle ``theta`` from each row of ``a`` (float64)."""
    g = torch.Generator().manual_seed(seed)
    w = normalize(tangent(a, torch.randn(a.shape, dtype=a.dtype, generator=g)))
    return math.cos(theta) * a + math.sin(theta) * w


def slerp_textbook(a, b, alpha):
    """Eq. 6 literally, in float64, for theta away from 0 and pi."""
    a, b = a.double(), b.double()
    theta = torch.arccos((a * b).sum(-1, keepdim=True).clamp(-1, 1))
    return (torch.sin((1 - alpha) * theta) * a + torch.sin(alpha * theta) * b) / torch.sin(theta)


# --- unit norm ------------------------------------------------------------------------------


@given(d=dims, seed=seeds, alpha=alphas, name=st.sampled_from(sorted(UPDATES)))
def test_updates_have_unit_norm_scalar_alpha(d, seed, alpha, name):
    a, b = points(d, 5, seed, torch.float32), points(d, 5, seed + 1, torch.float32)
    out = UPDATES[name](a, b, alpha)
    assert out.dtype == torch.float32
    assert (out.norm(dim=-1) - 1).abs().max() < 1e-6


@given(d=dims, seed=seeds, name=st.sampled_from(sorted(UPDATES)))
def test_updates_have_unit_norm_vector_alpha(d, seed, name):
    a, b = points(d, 5, seed, torch.float32), points(d, 5, seed + 1, torch.float32)
    alpha = torch.rand(d, generator=torch.Generator().manual_seed(seed))  # per-dimension
    out = UPDATES[name](a, b, alpha)
    assert out.shape == a.shape
    assert (out.norm(dim=-1) - 1).abs().max() < 1e-6


@pytest.mark.parametrize("name", sorted(UPDATES))
def test_updates_broadcast_leading_dims(name):
    a = points(16, 6, 0, torch.float32).reshape(2, 3, 16)
    b = points(16, 6, 1, torch.float32).reshape(2, 3, 16)
    alpha = torch.full((2, 3, 1), 0.3)
    out = UPDATES[name](a, b, alpha)
    assert out.shape == (2, 3, 16)
    assert torch.allclose(out, UPDATES[name](a, b, 0.3), atol=1e-6)


@pytest.mark.parametrize("name", sorted(UPDATES))
@pytest.mark.parametrize(
    "a_shape, b_shape, alpha_shape, needle",
    [
        ((4, 8), (4, 7), None, "a has shape (4, 8) and b (4, 7)"),
        ((4, 8), (3, 8), None, "a has shape (4, 8) and b (3, 8)"),
        ((), (4, 8), None, "a has shape () and b (4, 8)"),
        ((4, 8), (4, 8), (5,), "alpha has shape (5,), which does not broadcast to the points' (4, 8)"),
        ((4, 8), (4, 8), (2, 4, 8), "alpha has shape (2, 4, 8)"),  # would change the result's shape
    ],
)
def test_updates_name_shapes_that_do_not_fit(name, a_shape, b_shape, alpha_shape, needle):
    alpha = 0.3 if alpha_shape is None else torch.full(alpha_shape, 0.3)
    with pytest.raises(ValueError, match=f"^{UPDATES[name].__name__}: ") as raised:
        UPDATES[name](torch.ones(a_shape), torch.ones(b_shape), alpha)
    assert needle in str(raised.value)


def test_tangent_and_angle_name_shapes_that_do_not_fit():
    with pytest.raises(ValueError, match=r"^tangent: a has shape \(4, 8\) and u \(8, 4\)"):
        tangent(torch.ones(4, 8), torch.ones(8, 4))
    with pytest.raises(ValueError, match=r"^angle: a has shape \(3,\) and b \(2,\)"):
        angle(torch.ones(3), torch.ones(2))
    # a single point against a batch still broadcasts
    assert angle(torch.ones(8), torch.ones(4, 8)).shape == (4,)


# --- slerp: endpoints and the geodesic ------------------------------------------------------


@given(d=dims, seed=seeds)
def test_slerp_endpoints(d, seed):
    a, b = points(d, 4, seed), points(d, 4, seed + 7)
    assert torch.allclose(slerp(a, b, 0.0), a, atol=1e-12)
    assert torch.allclose(slerp(a, b, 1.0), b, atol=1e-12)


@given(d=dims, seed=seeds, alpha=alphas, theta=st.floats(min_value=1e-3, max_value=math.pi - 1e-3))
def test_slerp_lies_on_geodesic(d, seed, alpha, theta):
    a = points(d, 3, seed)
    b = at_angle(a, theta, seed + 1)
    s = slerp(a, b, alpha)
    assert torch.allclose(angle(a, s), torch.full((3,), alpha * theta, dtype=torch.float64), atol=1e-9)
    assert torch.allclose(angle(s, b), torch.full((3,), (1 - alpha) * theta, dtype=torch.float64), atol=1e-9)


@given(d=dims, seed=seeds, alpha=alphas, theta=st.floats(min_value=0.05, max_value=math.pi - 0.05))
def test_slerp_float32_matches_float64_textbook(d, seed, alpha, theta):
    a = points(d, 3, seed)
    b = at_angle(a, theta, seed + 1)
    out32 = slerp(a.float(), b.float(), alpha)
    assert torch.allclose(out32.double(), slerp_textbook(a, b, alpha), atol=2e-6)


def test_slerp_vector_alpha_is_per_dimension_then_retracted():
    a, b = points(8, 2, 3), points(8, 2, 4)
    alpha = torch.linspace(0.1, 0.9, 8, dtype=torch.float64)
    theta = torch.arccos((a * b).sum(-1, keepdim=True))
    raw = (torch.sin((1 - alpha) * theta) * a + torch.sin(alpha * theta) * b) / torch.sin(theta)
    assert torch.allclose(slerp(a, b, alpha), raw / raw.norm(dim=-1, keepdim=True), atol=1e-12)


def test_slerp_equal_points_returns_the_point():
    a = points(32, 4, 0, torch.float32)
    for alpha in (0.0, 0.3, 1.0):
        assert torch.allclose(slerp(a, a.clone(), alpha), a, atol=1e-7)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_slerp_antipodal_is_a_half_great_circle(dtype):
    """a == -b: no unique geodesic; spherenet rotates towards a fixed tangent direction."""
    a = points(16, 4, 0, dtype)
    b = -a
    for alpha in (0.0, 0.25, 0.5, 1.0):
        s = slerp(a, b, alpha)
        assert torch.isfinite(s).all()
        assert (s.norm(dim=-1) - 1).abs().max() < 1e-6
        assert torch.allclose(angle(a, s).double(), torch.full((4,), alpha * math.pi, dtype=torch.float64), atol=2e-3)
    assert torch.allclose(slerp(a, b, 1.0), b, atol=1e-6)
    # deterministic: the same path every time
    assert torch.equal(slerp(a, b, 0.5), slerp(a, b, 0.5))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_slerp_rows_are_the_same_whether_or_not_another_row_is_antipodal(dtype):
    """A batch with no antipodal row skips that branch; its rows' values and gradients are those
    the full two-branch evaluation gives them, bit for bit."""
    a, b = points(8, 6, 0, dtype), points(8, 6, 1, dtype)
    alpha = torch.linspace(0.05, 0.4, 8, dtype=dtype)
    b_mixed = torch.cat([b, -a[:1]])  # one antipodal row forces the full evaluation
    a_mixed = torch.cat([a, a[:1]])
    results = []
    for x, y in ((a, b), (a_mixed, b_mixed)):
        x, y, w = x.clone().requires_grad_(), y.clone().requires_grad_(), alpha.clone().requires_grad_()
        out = slerp(x, y, w)
        (out[:6] * torch.arange(1.0, 9.0, dtype=dtype)).sum().backward()
        results.append((out[:6].detach(), x.grad[:6], y.grad[:6]))
    for skipped, full in zip(*results):
        assert torch.equal(skipped, full)


@pytest.mark.parametrize("gap", [1e-2, 1e-4])
def test_slerp_near_pi_stays_on_geodesic(gap):
    a = points(16, 3, 5)
    b = at_angle(a, math.pi - gap, 6)
    s = slerp(a, b, 0.5)
    assert torch.allclose(angle(a, s), torch.full((3,), (math.pi - gap) / 2, dtype=torch.float64), atol=1e-8)


# --- first-order behaviour: LERP, Riemannian, SLERP ------------------------------------------


@given(d=dims, seed=seeds, theta=st.floats(min_value=0.1, max_value=2.8))
def test_lerp_and_riemannian_agree_to_first_order(d, seed, theta):
    a = points(d, 2, seed)
    b = at_angle(a, theta, seed + 1)
    diffs = []
    for alpha in (1e-2, 5e-3, 2.5e-3):
        diffs.append((lerp(a, b, alpha) - riemannian_update(a, b, alpha)).norm(dim=-1).max().item())
    # O(alpha^2): halving alpha divides the gap by ~4
    assert diffs[0] / diffs[1] == pytest.approx(4.0, rel=0.05)
    assert diffs[1] / diffs[2] == pytest.approx(4.0, rel=0.05)


@given(d=dims, seed=seeds, theta=st.floats(min_value=0.1, max_value=2.8))
def test_slerp_same_direction_theta_over_sin_theta_faster(d, seed, theta):
    a = points(d, 2, seed)
    b = at_angle(a, theta, seed + 1)
    h = 1e-6
    v_lerp = (lerp(a, b, h) - a) / h
    v_riem = (riemannian_update(a, b, h) - a) / h
    v_slerp = (slerp(a, b, h) - a) / h
    u = b - (a * b).sum(-1, keepdim=True) * a  # the tangent direction, length sin(theta)
    assert torch.allclose(v_lerp, u, atol=1e-5)
    assert torch.allclose(v_riem, u, atol=1e-5)
    assert torch.allclose(v_slerp, u * theta / math.sin(theta), atol=1e-5)


def test_three_updates_coincide_as_theta_goes_to_zero():
    a = points(32, 3, 11)
    b = at_angle(a, 1e-4, 12)
    outs = [f(a, b, 0.4) for f in UPDATES.values()]
    for o in outs[1:]:
        assert (o - outs[0]).abs().max() < 1e-10


# --- tangent projection and the Riemannian direction ----------------------------------------


@given(d=dims, seed=seeds)
def test_tangent_is_orthogonal_and_idempotent(d, seed):
    a = points(d, 4, seed)
    u = torch.randn(4, d, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    t = tangent(a, u)
    assert (t * a).sum(-1).abs().max() < 1e-12
    assert torch.allclose(tangent(a, t), t, atol=1e-12)


@given(d=dims, seed=seeds, theta=st.floats(min_value=0.05, max_value=3.0))
def test_riemannian_step_direction_is_tangent(d, seed, theta):
    """eq. 24: g = a (a.b) - b is a - b projected onto the tangent space at a."""
    a = points(d, 3, seed)
    b = at_angle(a, theta, seed + 1)
    g = a * (a * b).sum(-1, keepdim=True) - b
    assert (g * a).sum(-1).abs().max() < 1e-12
    assert torch.allclose(g, tangent(a, a - b), atol=1e-12)
    h = 1e-7
    step = (riemannian_update(a, b, h) - a) / h
    assert torch.allclose(step, -g, atol=1e-5)
    assert (step * a).sum(-1).abs().max() < 1e-5


# --- angle -----------------------------------------------------------------------------------


@given(d=dims, seed=seeds, theta=st.floats(min_value=0.0, max_value=math.pi))
def test_angle_recovers_construction(d, seed, theta):
    a = points(d, 3, seed)
    b = at_angle(a, theta, seed + 1)
    assert torch.allclose(angle(a, b), torch.full((3,), theta, dtype=torch.float64), atol=1e-9)
    assert angle(a, b, keepdim=True).shape == (3, 1)


def test_angle_is_accurate_near_zero_in_float32():
    a = points(64, 2, 0)
    b = at_angle(a, 1e-4, 1)
    # arccos(a.b) in float32 loses this angle entirely (a.b rounds to 1); atan2 keeps it
    assert torch.allclose(angle(a.float(), b.float()).double(), torch.full((2,), 1e-4, dtype=torch.float64), rtol=1e-2)


# --- numerics: finite forward/backward in every dtype, at a == b and a == -b ---------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("name", sorted(UPDATES) + ["angle"])
@pytest.mark.parametrize("relation", ["equal", "antipodal", "generic"])
def test_finite_forward_and_backward(dtype, name, relation):
    a0 = points(16, 3, 0, torch.float64)
    b0 = {"equal": a0.clone(), "antipodal": -a0, "generic": points(16, 3, 1, torch.float64)}[relation]
    a = a0.to(dtype).requires_grad_(True)
    b = b0.to(dtype).requires_grad_(True)
    alpha = torch.full((16,), 0.3, dtype=dtype, requires_grad=True)
    out = angle(a, b) if name == "angle" else UPDATES[name](a, b, alpha)
    assert out.dtype == dtype
    assert torch.isfinite(out).all()
    (out.float() * torch.linspace(-1, 1, out.numel()).reshape(out.shape)).sum().backward()
    for t in (a, b) if name == "angle" else (a, b, alpha):
        assert t.grad is not None and torch.isfinite(t.grad).all(), f"{name} grad not finite"


@pytest.mark.parametrize("name", sorted(UPDATES))
def test_bfloat16_close_to_float64(name):
    a, b = points(64, 4, 0), points(64, 4, 1)
    ref = UPDATES[name](a, b, 0.2)
    out = UPDATES[name](a.bfloat16(), b.bfloat16(), 0.2)
    assert out.dtype == torch.bfloat16
    assert (out.double() - ref).abs().max() < 1e-2


@given(d=dims, seed=seeds, alpha=alphas, theta=st.floats(min_value=0.0, max_value=math.pi - 0.1))
def test_float32_matches_float64_reference(d, seed, alpha, theta):
    # Away from pi: near antipodal points every update is ill-conditioned (LERP's midpoint
    # (a+b)/2 has norm cos(theta/2), so float32 rounding is amplified ~1/cos(theta/2)); the
    # near-pi behaviour has its own tests above.
    a = points(d, 3, seed)
    b = at_angle(a, theta, seed + 1)
    for f in UPDATES.values():
        assert torch.allclose(f(a.float(), b.float(), alpha).double(), f(a, b, alpha), atol=1e-6)
    ref_lerp = a + alpha * (b - a)
    ref_lerp = ref_lerp / ref_lerp.norm(dim=-1, keepdim=True)
    assert torch.allclose(lerp(a, b, alpha), ref_lerp, atol=1e-12)


def test_gradcheck_float64_generic_points():
    a, b = points(6, 2, 0), points(6, 2, 1)
    for f in UPDATES.values():
        assert torch.autograd.gradcheck(
            lambda x, y, t: f(normalize(x), normalize(y), t),
            (
                a.clone().requires_grad_(),
                b.clone().requires_grad_(),
                torch.full((6,), 0.3, dtype=torch.float64, requires_grad=True),
            ),
        )


def test_normalize_zero_vector_is_zero_not_nan():
    x = torch.zeros(2, 5, requires_grad=True)
    y = normalize(x)
    assert torch.equal(y, torch.zeros(2, 5))
    y.sum().backward()
    assert torch.isfinite(x.grad).all()


# --- Sphere: geoopt compatibility and the additions -----------------------------------------


def test_sphere_matches_geoopt_on_shared_operations():
    ours, ref = Sphere(), geoopt.manifolds.Sphere()
    g = torch.Generator().manual_seed(0)
    x = ours.projx(torch.randn(5, 12, dtype=torch.float64, generator=g))
    y = ours.projx(torch.randn(5, 12, dtype=torch.float64, generator=g))
    u = ours.proju(x, torch.randn(5, 12, dtype=torch.float64, generator=g))
    v = torch.randn(5, 12, dtype=torch.float64, generator=g)
    assert isinstance(ours, geoopt.manifolds.Sphere)
    assert torch.equal(ours.projx(v), ref.projx(v))
    assert torch.equal(ours.proju(x, v), ref.proju(x, v))
    assert torch.equal(ours.egrad2rgrad(x, v), ref.egrad2rgrad(x, v))
    assert torch.equal(ours.retr(x, u), ref.retr(x, u))
    assert torch.equal(ours.expmap(x, u), ref.expmap(x, u))
    assert torch.equal(ours.transp(x, y, u), ref.transp(x, y, u))
    assert torch.equal(ours.inner(x, u, u), ref.inner(x, u, u))
    assert torch.equal(ours.dist(x, y), ref.dist(x, y))
    # and with spherenet's own functions
    assert torch.allclose(ours.proju(x, v), tangent(x, v), atol=1e-14)
    assert torch.allclose(ours.dist(x, y), angle(x, y), atol=1e-7)


def test_geoopt_optimizer_accepts_our_sphere():
    p = geoopt.ManifoldParameter(Sphere().random_point(4, 8), manifold=Sphere())
    opt = geoopt.optim.RiemannianSGD([p], lr=0.1)
    (p[:, 0].sum()).backward()
    opt.step()
    assert Sphere().is_on_sphere(p, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_random_point(dtype):
    x = Sphere().random_point(3, 4, 16, dtype=dtype, generator=torch.Generator().manual_seed(0))
    assert x.shape == (3, 4, 16) and x.dtype == dtype and type(x) is torch.Tensor
    assert Sphere().is_on_sphere(x)
    y = Sphere().random_point((3, 4, 16), dtype=dtype, generator=torch.Generator().manual_seed(0))
    assert torch.equal(x, y)


def test_random_point_rejects_bad_shape():
    with pytest.raises(ValueError, match="last dimension"):
        Sphere().random_point(3, 0)
    with pytest.raises(ValueError, match="last dimension"):
        Sphere().random_point()


def test_point_check_tolerance_suits_dtype():
    x = Sphere().random_point(8, 256, dtype=torch.float64)
    assert Sphere().is_on_sphere(x.bfloat16())  # rounding to bf16 is within its tolerance
    assert point_tolerance(torch.bfloat16) > point_tolerance(torch.float32) > point_tolerance(torch.float64)
    assert not Sphere().is_on_sphere(x * 1.001)
    with pytest.raises(ValueError, match=r"W_q of shape \(8, 256\).*max \|norm - 1\|"):
        Sphere().assert_on_sphere(x * 1.001, name="W_q")
    with pytest.raises(ValueError):
        Sphere().assert_on_sphere(torch.full((2, 4), float("nan")))
    Sphere().assert_on_sphere(x)  # no error
