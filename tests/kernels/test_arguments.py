"""The public ops' arguments: a mismatch is a ValueError naming the op and the shapes under every
implementation (checked before one is chosen), and the broadcasting the ops define still runs."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_setting import kernels_set_to

from spherenet import kernels
from spherenet.kernels.layer_ops import normalized_update

IMPLEMENTATIONS = ["reference", "torch"]


def normal(*shape):
    return torch.nn.functional.normalize(torch.randn(*shape, dtype=torch.float64), dim=-1)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("update", ["lerp", "slerp", "riemannian"])
def test_a_residual_update_names_mismatched_shapes(implementation, update):
    h, alpha = normal(2, 3, 4), torch.full((4,), 0.1, dtype=torch.float64)
    with kernels_set_to(implementation):
        with pytest.raises(
            ValueError, match=rf"residual_update\('{update}'\): h has shape \(2, 3, 4\) and h_block \(2, 3, 5\)"
        ):
            kernels.residual_update(update, h, normal(2, 3, 5), alpha)
        with pytest.raises(ValueError, match=r"alpha has shape \(5,\), which does not broadcast"):
            kernels.residual_update(update, h, normal(2, 3, 4), torch.full((5,), 0.1, dtype=torch.float64))
        with pytest.raises(ValueError, match=rf"normalized_update\('{update}'\): .*h_block \(2, 5\)"):
            normalized_update(update, normal(2, 4), torch.randn(2, 5, dtype=torch.float64), alpha)


@pytest.mark.parametrize("op", [kernels.residual_update, normalized_update])
def test_an_unknown_update_is_named(op):
    with pytest.raises(ValueError, match=r"unknown update 'lerpp'; expected one of lerp, slerp, riemannian"):
        op("lerpp", normal(2, 4), normal(2, 4), 0.1)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_the_layer_ops_name_mismatched_shapes(implementation):
    x = torch.randn(2, 3, 4)
    with kernels_set_to(implementation):
        with pytest.raises(ValueError, match=r"swiglu: shapes u \(2, 3, 4\) and v \(2, 3, 5\) do not broadcast"):
            kernels.swiglu(x, torch.randn(2, 3, 5))
        with pytest.raises(ValueError, match=r"qk_normalize: shapes x \(2, 3, 4\) and s_qk \(5,\) do not broadcast"):
            kernels.qk_normalize(x, torch.ones(5))
        with pytest.raises(ValueError, match=r"qk_normalize: shapes x"):  # without the Norm too
            kernels.qk_normalize(x, torch.ones(5), qk_norm=False)
        with pytest.raises(ValueError, match=r"scaled_linear: input has shape \(2, 3, 4\) and weight \(6, 5\)"):
            kernels.scaled_linear(x, torch.randn(6, 5), torch.ones(6))
        with pytest.raises(ValueError, match=r"scaled_linear: weight has shape \(6, 4, 1\)"):
            kernels.scaled_linear(x, torch.randn(6, 4, 1), torch.ones(6))
        with pytest.raises(ValueError, match=r"scaled_linear: scale has shape \(4,\); expected \(6,\)"):
            kernels.scaled_linear(x, torch.randn(6, 4), torch.ones(4))


def test_the_broadcasting_the_ops_define_still_runs():
    """What the references broadcast runs through every implementation, with their values."""
    h, block = normal(2, 3, 4), normal(3, 4)  # leading dimensions broadcast
    for update in ("lerp", "slerp", "riemannian"):
        for alpha in (0.1, torch.tensor(0.1, dtype=torch.float64), torch.full((1, 1, 4), 0.1, dtype=torch.float64)):
            with kernels_set_to("reference"):
                expected = kernels.residual_update(update, h, block, alpha)
            torch.testing.assert_close(kernels.residual_update(update, h, block, alpha), expected)
    x = torch.randn(2, 3, 4)
    torch.testing.assert_close(kernels.swiglu(x, torch.randn(1, 3, 1)).shape, x.shape)
    torch.testing.assert_close(kernels.qk_normalize(x, torch.ones(3, 1)), kernels.normalize(x))
    weight = torch.randn(6, 4)
    torch.testing.assert_close(kernels.scaled_linear(x, weight, torch.tensor(2.0)), 2 * (x @ weight.T))


def test_the_optimizer_ops_name_mismatched_lists():
    params = [normal(3, 4).float()]
    moments = dict(exp_avgs=[torch.zeros(3, 4)], exp_avg_sqs=[torch.zeros(3, 4)], steps=[torch.zeros(())])
    hyper = dict(lr=0.1, beta1=0.9, beta2=0.99, eps=1e-8)

    def adam(grads, **changed):
        lists = {**moments, **changed}
        kernels.sphere_adam_(params, grads, lists["exp_avgs"], lists["exp_avg_sqs"], lists["steps"], **hyper)

    with pytest.raises(ValueError, match=r"sphere_adam_: grads\[0\] has shape \(3, 5\), params\[0\] \(3, 4\)"):
        adam([torch.randn(3, 5)])
    with pytest.raises(ValueError, match=r"sphere_adam_: exp_avgs\[0\] has shape \(4, 3\)"):
        adam([torch.randn(3, 4)], exp_avgs=[torch.zeros(4, 3)])
    with pytest.raises(ValueError, match=r"sphere_adam_: lists of unequal lengths \(params 1, grads 0, "):
        adam([])
    with pytest.raises(ValueError, match=r"sphere_muon_tail_: updates\[0\] has shape \(3, 5\), xs\[0\] \(3, 4\)"):
        kernels.sphere_muon_tail_(params, [torch.randn(3, 5)], [torch.zeros(3, 4)], [0.1], project_update=True)
    with pytest.raises(ValueError, match=r"sphere_muon_tail_: lists of unequal lengths \(xs 1, updates 1, ms 1, step"):
        kernels.sphere_muon_tail_(params, [torch.randn(3, 4)], [torch.zeros(3, 4)], [], project_update=True)
    before = params[0].clone()
    kernels.sphere_muon_tail_(params, [torch.randn(3, 4)], [torch.zeros(3, 4)], [0.1], project_update=True)
    assert not torch.equal(params[0], before)  # the right lists still step


def test_a_failure_the_shapes_do_not_cause_keeps_its_own_error():
    """The checks run after an implementation fails and re-raise its error when the shapes fit."""
    x, weight = torch.ones(2, 4, dtype=torch.int64), torch.randn(3, 4)
    with pytest.raises(RuntimeError, match="same dtype"):
        kernels.scaled_linear(x, weight, torch.ones(3))


def test_an_alpha_that_would_grow_the_points_is_refused_by_every_implementation():
    """The definitions refuse an alpha broadcasting past the points' shape; the fused functions
    would return the larger shape without failing, so the ops check an alpha of more than one
    dimension before running."""
    h, block, alpha = normal(3, 4), normal(3, 4), torch.full((1, 1, 4), 0.1, dtype=torch.float64)
    for implementation in IMPLEMENTATIONS:
        for update in ("lerp", "slerp", "riemannian"):
            with kernels_set_to(implementation):
                for op in (kernels.residual_update, normalized_update):
                    with pytest.raises(ValueError, match=r"alpha has shape \(1, 1, 4\), which does not broadcast"):
                        op(update, h, block, alpha)


_dims = st.lists(st.integers(1, 3), min_size=0, max_size=2)


@settings(max_examples=60, deadline=None)
@given(
    h_lead=_dims,
    block_lead=_dims,
    alpha_shape=st.sampled_from([(), (1,), (4,), (3,), (1, 4), (2, 1), (1, 1, 4), (3, 4)]),
    update=st.sampled_from(["lerp", "slerp", "riemannian"]),
)
def test_the_implementations_accept_the_same_shapes_with_the_same_values(h_lead, block_lead, alpha_shape, update):
    """For any shapes, the reference and the fused function both run, with the same values and
    gradients, or both refuse with a ValueError."""
    h = normal(*h_lead, 4).requires_grad_()
    block = normal(*block_lead, 4).requires_grad_()
    alpha = torch.full(alpha_shape, 0.2, dtype=torch.float64, requires_grad=True)
    results = []
    for implementation in IMPLEMENTATIONS:
        with kernels_set_to(implementation):
            try:
                out = kernels.residual_update(update, h, block, alpha)
            except ValueError:
                results.append(None)
                continue
        results.append((out, *torch.autograd.grad(out.sum(), (h, block, alpha))))
    reference, fused = results
    assert (reference is None) == (fused is None), (h.shape, block.shape, alpha.shape)
    if reference is not None:
        for got, expected in zip(fused, reference):
            torch.testing.assert_close(got, expected)


@settings(max_examples=40, deadline=None)
@given(
    first_lead=_dims,
    second_shape=st.sampled_from([(), (1,), (4,), (5,), (1, 4), (3, 1), (2, 1, 4), (2, 3, 4)]),
    op=st.sampled_from(["swiglu", "qk_normalize"]),
)
def test_swiglu_and_qk_accept_the_same_shapes_in_every_implementation(first_lead, second_shape, op):
    """u and the gate v, or x and s_qk: what the reference broadcasts, the fused function takes with
    the same values and gradients; what it refuses, every implementation names."""
    first = torch.randn(*first_lead, 4, dtype=torch.float64, requires_grad=True)
    second = (1 + torch.rand(second_shape, dtype=torch.float64)).requires_grad_()
    results = []
    for implementation in IMPLEMENTATIONS:
        with kernels_set_to(implementation):
            try:
                out = getattr(kernels, op)(first, second)
            except ValueError:
                results.append(None)
                continue
        results.append((out, *torch.autograd.grad(out.sum(), (first, second))))
    reference, fused = results
    assert (reference is None) == (fused is None), (first.shape, second.shape)
    if reference is not None:
        for got, expected in zip(fused, reference):
            torch.testing.assert_close(got, expected)
