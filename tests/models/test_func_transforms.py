"""torch.func's transforms over the models: per-sample gradients with ``vmap(grad(...))`` and
forward-mode ``jvp``. Under a transform every op runs its plain-torch reference (the fused
autograd functions declare no rules for the transforms), with the values of the fused path."""

import pytest
import torch
import torch.nn.functional as F
from tiny_models import tiny_model
from torch.func import functional_call, grad, jvp, vmap
from torch.nn.attention import SDPBackend, sdpa_kernel

from spherenet import kernels, manifolds
from spherenet.kernels import layer_ops
from spherenet.kernels.layer_ops import NORMALIZE


# torch's own notice that SDPA has no batching rule under vmap (it loops over the batch)
@pytest.mark.filterwarnings("ignore:There is a performance drop:UserWarning")
@pytest.mark.parametrize("kind, update", [("ngpt", "lerp"), ("ngpt", "slerp"), ("ngpt", "riemannian"), ("gpt", None)])
def test_per_sample_gradients_by_vmap_equal_autograd_on_each_sample(kind, update):
    model = tiny_model(kind, **({"update": update} if update else {}))
    params = {name: p.detach() for name, p in model.named_parameters()}
    ids = torch.randint(0, 32, (3, 8), generator=torch.Generator().manual_seed(1))

    def loss(p, x):
        return F.cross_entropy(functional_call(model, p, (x[None],)).flatten(0, 1), x)

    per_sample = vmap(grad(loss), in_dims=(None, 0))(params, ids)
    for i in range(len(ids)):
        model.zero_grad()
        loss(dict(model.named_parameters()), ids[i]).backward()  # eager: the fused functions
        for name, p in model.named_parameters():
            torch.testing.assert_close(per_sample[name][i], p.grad, rtol=1e-4, atol=1e-6)


@pytest.mark.slow  # compiles a model's per-sample gradient
@pytest.mark.filterwarnings("ignore:There is a performance drop:UserWarning")
@pytest.mark.parametrize("kind, update", [("ngpt", "slerp"), ("gpt", None)])
def test_compiled_per_sample_gradients_equal_eager_ones(kind, update):
    """torch.compile traces the transforms itself: the vocabulary assertion (no batching rule)
    stands aside and every op takes its plain-torch reference there too."""
    model = tiny_model(kind, **({"update": update} if update else {}))
    params = {name: p.detach() for name, p in model.named_parameters()}
    ids = torch.randint(0, 32, (3, 8), generator=torch.Generator().manual_seed(1))

    def loss(p, x):
        return F.cross_entropy(functional_call(model, p, (x[None],)).flatten(0, 1), x)

    per_sample = vmap(grad(loss), in_dims=(None, 0))
    compiled = torch.compile(per_sample, fullgraph=True)(params, ids)
    eager = per_sample(params, ids)
    for name in params:
        torch.testing.assert_close(compiled[name], eager[name], rtol=1e-4, atol=1e-6)


def test_forward_mode_jvp_of_ngpt_matches_a_central_difference():
    """Forward mode through attention needs SDPA's math backend (torch's CPU flash kernel has no
    forward-mode derivative)."""
    model = tiny_model("ngpt", update="slerp").double()
    params = {name: p.detach() for name, p in model.named_parameters()}
    tangents = {name: torch.randn_like(p) for name, p in params.items()}
    ids = torch.randint(0, 32, (1, 8), generator=torch.Generator().manual_seed(2))

    def logits(p):
        return functional_call(model, p, (ids,))

    with sdpa_kernel(SDPBackend.MATH):
        _, derivative = jvp(logits, (params,), (tangents,))
    step = 1e-6
    plus = logits({k: v + step * tangents[k] for k, v in params.items()})
    minus = logits({k: v - step * tangents[k] for k, v in params.items()})
    torch.testing.assert_close(derivative, (plus - minus) / (2 * step), rtol=1e-5, atol=1e-7)


def test_every_op_resolves_to_its_reference_inside_a_transform_only():
    x = torch.randn(2, 3, 4)
    seen = []

    def record(t):
        seen.append(kernels.resolve.resolve(NORMALIZE, None, "cpu", (t,)))
        seen.append(kernels.resolve.resolve(layer_ops.UPDATES["slerp"], None, "cpu", (t, t, t)))
        return t

    record(x)
    vmap(record)(x)
    grad(lambda t: record(t).sum())(x)
    assert seen == ["torch", "torch", "reference", "reference", "reference", "reference"]


def test_slerp_under_vmap_keeps_its_antipodal_rows():
    """The definition skips its antipodal branch on CPU when no row needs it, a host read that a
    transform forbids; under vmap it computes both branches, with the same values."""
    a = manifolds.normalize(torch.randn(4, 8, dtype=torch.float64))
    b = manifolds.normalize(torch.randn(4, 8, dtype=torch.float64))
    b[1] = -a[1]  # antipodal
    alpha = torch.tensor([0.3], dtype=torch.float64)
    torch.testing.assert_close(vmap(manifolds.slerp, in_dims=(0, 0, None))(a, b, alpha), manifolds.slerp(a, b, alpha))
