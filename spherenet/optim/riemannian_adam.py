"""Adam on the unit sphere, over lists of tensors, correct under FSDP2.

Equation numbers are those of Loshchilov et al., "nGPT" (2024). The step itself (step count,
moments on the gradient or its tangent projection, bias correction, step, retraction, and with a
per-row second moment the transport of ``m``) is :func:`spherenet.kernels.sphere_adam_`, written
once there in that order; this optimizer keeps the state and the group policy and calls it for
the row sphere and for every registered geometry (the whole-matrix sphere: AdamH).

**The paper's optimizer** (Section 2.6 step 2 and Table 3: Adam, then renormalize every sphere
row) is ``gradient="euclidean", second_moment="element"``: the step is then
``torch.optim.Adam`` followed by ``Norm``, equal to ``build_optimizer(method="adam_normalize")``
to float rounding (tested over 50 float64 steps of ngpt-tiny).

**How ``gradient="riemannian"`` departs from it.** The moments see only the tangent part of each
gradient: the radial part ``<x, g> x``, which ``Norm`` would remove from the step, neither
enters ``m`` nor inflates ``v``. With a per-element ``v`` that changes which elements take a
full step (at the first step ``d = sign(u)`` instead of ``sign(g)``); docs/paper.md gives the
measured distance between the two. ``second_moment="row"`` departs further: it scales whole
rows, so learning rates do not transfer: with ``"element"`` each row turns by about
``lr * sqrt(d)`` radians per step, with ``"row"`` by about ``lr``.

**Why every step is bounded, and why ``m`` is not transported with a per-element ``v``.**
Adam's step is bounded element by element because ``m_i = (1-b1) sum_k b1^(t-k) u_k,i`` and
``v_i = (1-b2) sum_k b2^(t-k) u_k,i^2`` are sums over the same values ``u_k,i``: by
Cauchy-Schwarz ``|m_hat_i| / sqrt(v_hat_i) <= B_t = (1-b1) sqrt((1-b2^t) S_t) / ((1-b1^t)
sqrt(1-b2))`` with ``S_t = sum_{j<t} (b1^2/b2)^j`` (``B_1 = 1``; 1.46 at t = 40 and 7.3 in the
limit for betas (0.9, 0.999); at most 1.17 for (0.9, 0.95)). A map applied to ``m`` keeps the
bound only if it never makes ``|m_i|`` larger relative to that coordinate's own ``sqrt(v_i)``.
Projection transport adds ``-<x, m> x_i`` to every coordinate, unrelated to ``v_i``, so an
element whose past gradients were tiny (in an embedding row used now and then) took single
steps of many lr (docs/paper.md gives the figures). So with a per-element ``v``, ``m`` is left as it
is: a sum of tangent vectors at recent points, whose normal part at the new point is of order
lr, and the retraction removes the normal part of the step (``Norm(x - lr d) = x - lr (d -
<x, d> x) + O(lr^2)``). With a per-row ``v`` the bound is on norms (``||m_hat|| / sqrt(v_hat) <=
B_t``, the same argument with ``||u_k||``), and the projection never increases ``||m||``: the
transport is kept there. In every mode an element then moves at most about
``lr (|d_i| + |x_i| |<x, d>|)``, Adam's bound plus the rescaling of the row by ``Norm`` that
the paper's method has too.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import nn
from torch.optim import Optimizer
from torch.optim.adam import adam as _adam_functional

from ..kernels.sphere_adam import GRADIENTS, IMPLEMENTATIONS, SECOND_MOMENTS, SphereAdamOptions, sphere_adam_
from ..manifolds import GeometryLists, geometry_for
from ._checks import (
    ModelWatch,
    check_betas,
    check_off_sphere,
    check_positive_float,
    check_sphere_layout,
    ensure_on_sphere,
    local,
)
from .groups import EUCLIDEAN, SPHERE, _names_of, check_groups, describe, known_manifolds, param_groups, split_fused

__all__ = ["RiemannianAdam", "SphereAdamOptions", "SECOND_MOMENTS", "GRADIENTS", "SPHERE_KERNELS"]

#: The values of ``sphere_kernel``: :attr:`SphereAdamOptions.implementation`'s.
SPHERE_KERNELS = IMPLEMENTATIONS
#: The keys a param group may not carry: the options are the optimizer's, one for all its groups.
_OPTION_KEYS = ("second_moment", "gradient", "sphere_kernel", "options")


class RiemannianAdam(Optimizer):
    """Adam on the unit sphere for declared sphere parameters, AdamW elsewhere.

    Args:
        params: an ``nn.Module`` (recommended: groups are built with
            :func:`spherenet.optim.param_groups` and the model is remembered for the checks
            below), or parameters / param groups. A group's ``"manifold"`` key (``"sphere"``, a
            registered geometry such as ``"matrix_sphere"``, or ``"euclidean"``, the default)
            says how its parameters move; no tensor class is ever inspected to decide it.
        lr, betas, eps: as in ``torch.optim.Adam``.
        weight_decay: **decoupled** (AdamW: ``x <- x - lr * wd * x``) on Euclidean groups. With a
            module, it applies to Euclidean tensors with ``ndim >= 2`` only. On the sphere weight
            decay is meaningless (``Norm`` undoes it; an L2 term is normal to the sphere), so a
            sphere group gets ``weight_decay=0`` and a sphere group that sets anything else is
            rejected with ``ValueError``.
        second_moment: ``"element"`` (default) or ``"row"`` (geoopt's semantics; the row sphere
            only: a group of a registered geometry is refused with it).
        gradient: what the moments of a sphere parameter see. ``"euclidean"``
            (default): the raw gradient ``g``; ``"riemannian"``: the tangent projection
            ``g - <x, g> x``. With ``second_moment="element"`` ``"euclidean"`` is exactly the paper's
            optimizer, ``torch.optim.Adam`` then ``Norm`` (equal to ``method="adam_normalize"``
            of :func:`spherenet.optim.build_optimizer` to float rounding). See the module
            docstring for both and for how they differ.
        model: the model the groups come from, when ``params`` is not the model itself: every
            declared sphere parameter must then sit in a sphere group.
        off_sphere: what the first step does with sphere rows that are not unit: ``"project"``
            (normalize them, with a warning) or ``"error"``.
        fused: for Euclidean groups, torch's fused Adam kernel: ``True``, ``False`` (the foreach
            kernel), or ``None``: fused wherever torch has a fused kernel for the tensor's device
            and dtype, foreach for the rest.
        check_model: at every step, check that the model's declared sphere parameters are
            still the ones this optimizer holds (a ``RuntimeError`` otherwise; see
            :class:`spherenet.optim._checks.ModelWatch` for what a step confirms).
        sphere_kernel: the implementation of :func:`spherenet.kernels.sphere_adam_` for the row
            sphere (all compute the same step, to float rounding): ``"native"`` (fused C++, CPU
            tensors; a ``RuntimeError`` if it cannot be built), ``"triton"`` (CUDA, or CPU under
            ``TRITON_INTERPRET=1``), ``"torch"`` (``torch._foreach_*`` passes, any device),
            ``"reference"`` (the step written out, one parameter at a time: slow, for checking)
            or ``"auto"`` (default: native on CPU, Triton on CUDA, ``"torch"`` elsewhere and for
            tensors the others cannot take). Registered geometries always take ``"torch"``.
        options: a :class:`spherenet.kernels.sphere_adam.SphereAdamOptions` instead of
            ``second_moment``, ``gradient`` and ``sphere_kernel``, which only build one (giving
            both is a ``ValueError``). It applies to every group and is handed to
            :func:`spherenet.kernels.sphere_adam_` as it is (:attr:`options`); a param group
            carrying its own ``"second_moment"``, ``"gradient"``, ``"sphere_kernel"`` or
            ``"options"`` is refused: for two settings, two optimizers
            (:class:`spherenet.optim.CombinedOptimizer`).

    Refusals (``ValueError`` unless said): a param group with options of its own (above); a
    geoopt ``ManifoldParameter`` on a sphere in a Euclidean group; a declared sphere parameter of
    ``model`` in no sphere group; weight decay in a sphere group; ``second_moment="row"`` with a
    registered geometry's group; a sphere tensor sharded along its last dimension; off-sphere
    rows at the first step with ``off_sphere="error"``; replaced model parameters
    (``RuntimeError``).

    The step leaves ``p.grad`` as it is (geoopt overwrites it with the Riemannian gradient).
    ``torch.compile(optimizer.step)`` runs the step eagerly (it is excluded from tracing), so
    the retraction is never lost.
    """

    def __init__(
        self,
        params,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        *,
        second_moment: str = "element",
        gradient: str = "euclidean",
        model: nn.Module | None = None,
        off_sphere: str = "project",
        fused: bool | None = None,
        check_model: bool = True,
        sphere_kernel: str = "auto",
        options: SphereAdamOptions | None = None,
    ):
        check_positive_float("lr", lr, allow_zero=True)
        check_positive_float("eps", eps, allow_zero=True)
        check_positive_float("weight_decay", weight_decay, allow_zero=True)
        check_betas(betas)
        #: The one options object of every sphere-Adam step; a registered geometry's steps take
        #: its copy with the ``"torch"`` implementation, the one that steps another manifold.
        self.options = sphere_adam_options(options, second_moment, gradient, sphere_kernel, type(self).__name__)
        self._geometry_options = replace(self.options, implementation="torch")
        check_off_sphere(off_sphere)
        if fused not in (None, True, False):
            raise ValueError(f"fused must be None, True or False, got {fused!r}")
        if isinstance(params, nn.Module):
            if model is not None and model is not params:
                raise ValueError("RiemannianAdam: got a module as params and a different model=")
            model = params
            params = param_groups(model, weight_decay)
        self.off_sphere = off_sphere
        self._watch = ModelWatch(model if check_model else None)
        defaults = dict(
            lr=lr,
            betas=tuple(betas),
            eps=eps,
            weight_decay=weight_decay,
            manifold=EUCLIDEAN,
            fused=fused,
        )
        super().__init__(params, defaults)
        check_groups(self.param_groups, model, type(self).__name__)

    # -- groups -----------------------------------------------------------------------------

    def add_param_group(self, param_group: dict) -> None:
        if not isinstance(param_group, dict):
            raise TypeError(f"param group must be a dict, got {type(param_group).__name__}")
        manifold = param_group.get("manifold", self.defaults["manifold"])
        if manifold not in known_manifolds():
            raise ValueError(f"RiemannianAdam: group manifold must be one of {known_manifolds()}, got {manifold!r}")
        if manifold != EUCLIDEAN:
            wd = param_group.setdefault("weight_decay", 0.0)
            if wd != 0:
                raise ValueError(
                    f"RiemannianAdam: weight_decay={wd!r} in a {manifold} param group. Weight decay has no meaning "
                    "on a sphere (Norm undoes it; an L2 term is normal to the sphere): use 0 there."
                )
        own = [key for key in _OPTION_KEYS if key in param_group]
        if own:
            raise ValueError(
                f"RiemannianAdam: a param group with {', '.join(map(repr, own))}: the options (options=, or "
                "second_moment=, gradient=, sphere_kernel=) are the optimizer's, for all its groups; for another "
                "setting use another RiemannianAdam (CombinedOptimizer steps several as one)"
            )
        if manifold not in (EUCLIDEAN, SPHERE) and self.options.row_second_moment:
            raise ValueError(
                f"RiemannianAdam: second_moment='row' is for the row sphere; a {manifold} group uses 'element'"
            )
        for key in ("lr", "eps", "weight_decay"):
            if key in param_group:
                check_positive_float(key, param_group[key], allow_zero=True)
        if "betas" in param_group:
            check_betas(param_group["betas"])
        super().add_param_group(param_group)
        if manifold == SPHERE:
            group = self.param_groups[-1]
            names = _names_of([group])
            for p in group["params"]:
                check_sphere_layout(p, names.get(id(p), f"of shape {tuple(p.shape)}"))

    def load_state_dict(self, state_dict: dict) -> None:
        """``Optimizer.load_state_dict``, refusing a state whose groups lack the ``"manifold"`` this
        optimizer reads (written by an older spherenet) instead of stepping without it, and a
        state whose groups record options (as spherenet wrote them before the options were the
        optimizer's alone) other than :attr:`options`; those records are not loaded."""
        groups = []
        for i, group in enumerate(state_dict.get("param_groups", [])):
            if "manifold" not in group:
                raise ValueError(
                    f"RiemannianAdam: param group {i} of the saved state has no 'manifold' (written by an older "
                    "spherenet?); start the optimizer afresh"
                )
            recorded = {key: group[key] for key in ("second_moment", "gradient") if key in group}
            other = {key: value for key, value in recorded.items() if value != getattr(self.options, key)}
            if other:
                given = ", ".join(f"{key}={value!r}" for key, value in other.items())
                raise ValueError(
                    f"RiemannianAdam: param group {i} of the saved state was stepped with {given}, this optimizer "
                    f"has {self.options}; build it with the state's options"
                )
            groups.append({key: value for key, value in group.items() if key not in recorded})
        super().load_state_dict({**state_dict, "param_groups": groups})

    # -- step -------------------------------------------------------------------------------

    @torch.compiler.disable
    def step(self, closure=None):
        """One optimizer step (eager even under ``torch.compile``). Returns ``closure()``'s loss."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._watch.check(self.param_groups, type(self).__name__)
        with torch.no_grad():
            for group in self.param_groups:
                if group["manifold"] == EUCLIDEAN:
                    self._euclidean_step(group)
                    continue
                lists, manifold = self._manifold_lists(group)
                if lists[0]:
                    b1, b2 = group["betas"]
                    options = self.options if manifold is None else self._geometry_options
                    sphere_adam_(
                        *lists, lr=group["lr"], beta1=b1, beta2=b2, eps=group["eps"], options=options, manifold=manifold
                    )  # fmt: skip  # sphere_adam_'s arguments in its order
        return loss

    def _gather(self, group: dict, row_v: bool):
        """The parameters of ``group`` with a gradient, their local tensors and state (created
        at the first step), and the positions of those whose state was just created."""
        params, xs, gs, ms, vs, steps, new = [], [], [], [], [], [], []
        names = None
        for p in group["params"]:
            g = p.grad
            if g is None:
                continue
            if g.is_sparse:
                raise RuntimeError("RiemannianAdam does not support sparse gradients")
            if g.dtype != p.dtype:
                raise RuntimeError(f"gradient dtype {g.dtype} differs from parameter dtype {p.dtype}")
            state = self.state[p]
            v_shape = p.shape[:-1] + (1,) if row_v else p.shape
            if len(state) == 0:
                state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                like = p[..., :1] if row_v else p
                state["exp_avg_sq"] = torch.zeros_like(like, memory_format=torch.contiguous_format)
                new.append(len(xs))
            elif state["exp_avg_sq"].shape != v_shape:
                names = names if names is not None else _names_of(self.param_groups)
                raise ValueError(
                    f"RiemannianAdam: parameter {describe(p, names)} has exp_avg_sq of shape "
                    f"{tuple(state['exp_avg_sq'].shape)}, but second_moment={self.options.second_moment!r} needs "
                    f"{tuple(v_shape)} (a state saved with the other second moment?)"
                )
            step = state["step"]
            if step.device != p.device or step.dtype != torch.float32:
                state["step"] = step = step.to(device=p.device, dtype=torch.float32)
            params.append(p)
            xs.append(local(p))
            gs.append(local(g))
            ms.append(local(state["exp_avg"]))
            vs.append(local(state["exp_avg_sq"]))
            steps.append(step)
        return params, xs, gs, ms, vs, steps, new

    def _euclidean_step(self, group: dict) -> None:
        """Adam / AdamW (eq. 22, decoupled decay) through torch's own kernels, in place."""
        _, xs, gs, ms, vs, steps, _ = self._gather(group, row_v=False)
        choice = split_fused(group["fused"], xs)
        for fused in (True, False):
            idx = [i for i, c in enumerate(choice) if c == fused]
            if idx:
                _adam_functional(
                    *([lst[i] for i in idx] for lst in (xs, gs, ms, vs)),
                    [],
                    [steps[i] for i in idx],
                    foreach=not fused,
                    fused=fused,
                    amsgrad=False,
                    beta1=group["betas"][0],
                    beta2=group["betas"][1],
                    lr=group["lr"],
                    weight_decay=group["weight_decay"],
                    eps=group["eps"],
                    maximize=False,
                    decoupled_weight_decay=True,
                )

    def _manifold_lists(self, group: dict):
        """The lists :func:`spherenet.kernels.sphere_adam_` steps for a row-sphere group or a
        registered geometry's (for the whole-matrix sphere that is AdamH,
        ``W <- R Normalize(W - lr R Normalize(d))`` with Adam's direction ``d`` and ``R`` kept in
        the state), after the first step's checks; and the manifold (``None``: the row sphere)."""
        on_sphere = group["manifold"] == SPHERE
        params, xs, gs, ms, vs, steps, new = self._gather(group, row_v=self.options.row_second_moment)
        manifold = None
        if on_sphere and new:
            names = _names_of(self.param_groups)
            for i in new:
                check_sphere_layout(params[i], names.get(id(params[i]), f"of shape {tuple(params[i].shape)}"))
            ensure_on_sphere([params[i] for i in new], [xs[i] for i in new], names, self.off_sphere, "RiemannianAdam")
        elif not on_sphere:
            geometry = geometry_for(group["manifold"])
            for p, x in zip(params, xs):
                if "geometry" not in self.state[p]:
                    self.state[p].update(geometry.init_state(x, like=p), geometry=geometry.name)
            manifold = GeometryLists(geometry, [self.state[p] for p in params], params)
        return (xs, gs, ms, vs, steps), manifold


def sphere_adam_options(
    options, second_moment: str, gradient: str, sphere_kernel: str, owner: str
) -> SphereAdamOptions:
    """``options``, or the one the keywords build; both at once is a ``ValueError``."""
    keywords = {"second_moment": second_moment, "gradient": gradient, "sphere_kernel": sphere_kernel}
    if options is None:
        return SphereAdamOptions(second_moment=second_moment, gradient=gradient, implementation=sphere_kernel)
    if not isinstance(options, SphereAdamOptions):
        raise TypeError(f"{owner}: options must be a SphereAdamOptions, got {type(options).__name__}")
    given = [key for key, value in keywords.items() if value != _KEYWORD_DEFAULTS[key]]
    if given:
        raise ValueError(f"{owner}: got options= and {', '.join(given)}=; give the options object alone")
    return options


_KEYWORD_DEFAULTS = {"second_moment": "element", "gradient": "euclidean", "sphere_kernel": "auto"}
