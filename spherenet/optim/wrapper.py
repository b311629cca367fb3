"""Make any torch optimizer Riemannian on the unit sphere: project, step, retract, transport.

For every sphere parameter ``x`` (Appendix A.3 of the nGPT paper, applied to the weights):

1. before the base step, the gradient is projected onto the tangent space at ``x``:
   ``g <- g - <x, g> x`` (eq. 24);
2. the base optimizer steps as it would in Euclidean space;
3. the parameter is retracted, ``x <- Norm(x)`` (eq. 25/26: ``Norm`` is the retraction);
4. the base optimizer's state is moved to the new point: vector-like tensors (first moments,
   momentum buffers, previous gradients) are projected onto the new tangent space, point-like
   tensors (averaged or slow weights) are normalized, magnitude-like tensors (second moments,
   accumulators of squares) are left alone. A same-shaped state tensor under a key not known
   to be one of the three is refused, since guessing wrong would corrupt it silently.

   Exception: when the state also holds a per-element magnitude (Adam's ``exp_avg_sq``,
   Adagrad's ``sum``, ...), vector states are *not* projected. The projection adds
   ``-<x, m> x_i`` to every coordinate, unrelated to that coordinate's magnitude, which breaks
   the element-wise bound ``|m_i| <~ sqrt(v_i)`` that keeps Adam's step small (an element whose
   past gradients were tiny would take a step of many ``lr``); the normal part left in ``m`` is
   removed by the retraction instead. This is :class:`RiemannianAdam`'s rule for
   ``second_moment="element"``; its module docstring gives the derivation.
"""

from __future__ import annotations

from typing import Iterable

import torch
from torch import nn
from torch.optim import Optimizer

from ..kernels.sphere_rows import RowOps, waves
from ..manifolds import declared_on_geometries, geometry_for
from ._checks import ModelWatch, check_off_sphere, check_sphere_layout, ensure_on_sphere, local
from .groups import (
    EUCLIDEAN,
    SPHERE,
    _names_of,
    check_groups,
    describe,
    known_manifolds,
    named_sphere_parameters,
)

__all__ = ["Riemannian", "VECTOR_STATES", "POINT_STATES", "MAGNITUDE_STATES"]

#: State keys holding tangent vectors (transported by projection after the step).
VECTOR_STATES = frozenset(
    {
        "exp_avg",  # Adam, AdamW, NAdam, RAdam, Adamax, Lamb, AdaBelief, AdaBound, DiffGrad, ...
        "momentum_buffer",  # SGD, RMSprop(momentum), AccSGD, AggMo, LARS, QHM, SGDW
        "momentum",  # SGDP
        "grad_avg",  # RMSprop(centered)
        "previous_grad",  # DiffGrad
        "prev",  # Rprop
        "exp_avg_grad",  # Apollo
        "update",  # Apollo
        "grad_buffer",  # PID
        "i_buffer",  # PID
        "d_buffer",  # PID
        "s",  # MADGRAD (sum of gradients)
    }
)
#: State keys holding points of the parameter's space (normalized after the step).
POINT_STATES = frozenset({"ax", "slow_param", "x0"})
#: State keys holding per-element magnitudes (left alone).
MAGNITUDE_STATES = frozenset(
    {
        "exp_avg_sq",
        "max_exp_avg_sq",
        "exp_avg_var",
        "max_exp_avg_var",
        "exp_inf",  # Adamax
        "sum",  # Adagrad
        "square_avg",  # RMSprop, Adadelta
        "acc_delta",  # Adadelta
        "step_size",  # Rprop
        "exp_hessian_diag_sq",  # AdaHessian
        "exp_avg_lr",  # AdaMod
        "grad_sum_sq",  # MADGRAD
        "approx_hessian",  # Apollo
        "eta",  # ASGD
        "mu",  # ASGD
    }
)


def _listed(params) -> list:
    return [params] if isinstance(params, torch.Tensor) else list(params)


def _tensor(p) -> torch.Tensor:
    """A group entry: a tensor, or a ``(name, tensor)`` pair as torch accepts."""
    return p[1] if isinstance(p, tuple) else p


class Riemannian(Optimizer):
    """Wrap ``base`` (any ``torch.optim.Optimizer``: Adam, SGD with momentum, torch-optimizer's
    Lamb or AdaBelief, ...) so that its sphere parameters stay on the unit sphere.

    Args:
        base: the optimizer to wrap. ``param_groups``, ``state``, ``state_dict()`` and
            ``load_state_dict()`` are the base's own (shared, not copied), so LR schedulers and
            checkpoints see one optimizer.
        model_or_groups: which parameters lie on the sphere. An ``nn.Module``: its declared
            sphere parameters (:func:`spherenet.optim.named_sphere_parameters`), which must all
            be in ``base`` (and the model is watched for replaced parameters at every step). Or
            param groups with a ``"manifold"`` key. ``None``: the ``"manifold"`` keys of the
            base's own groups (build the base from :func:`spherenet.optim.param_groups`).
        off_sphere: ``"project"`` (warn and normalize) or ``"error"`` for rows that are not
            unit at the first step.
        vector_states, point_states, magnitude_states: extra state keys for optimizers not
            covered by :data:`VECTOR_STATES`, :data:`POINT_STATES`, :data:`MAGNITUDE_STATES`.

    Refusals (``ValueError``): a sphere parameter not held by ``base``; a sphere parameter in
    a group with nonzero ``weight_decay`` (decay is meaningless on the sphere and an L2 term
    would leak a normal component into the moments); a geoopt ``ManifoldParameter`` on a
    sphere that is not known as a sphere parameter; a same-shaped state tensor under an
    unclassified key (``RuntimeError`` at the first step). Sphere gradients are projected in
    place. ``torch.compile(optimizer.step)`` runs the step eagerly.
    """

    def __init__(
        self,
        base: Optimizer,
        model_or_groups: nn.Module | Iterable[dict] | None = None,
        *,
        off_sphere: str = "project",
        vector_states: Iterable[str] = (),
        point_states: Iterable[str] = (),
        magnitude_states: Iterable[str] = (),
        check_model: bool = True,
    ):
        if not isinstance(base, Optimizer):
            raise TypeError(f"Riemannian wraps a torch.optim.Optimizer, got {type(base).__name__}")
        if isinstance(base, Riemannian):
            raise ValueError("Riemannian: the base optimizer is already Riemannian")
        check_off_sphere(off_sphere)
        self.base = base
        self.off_sphere = off_sphere
        self.vector_states = VECTOR_STATES | frozenset(vector_states)
        self.point_states = POINT_STATES | frozenset(point_states)
        self.magnitude_states = MAGNITUDE_STATES | frozenset(magnitude_states)
        clash = (
            (self.vector_states & self.point_states)
            | (self.vector_states & self.magnitude_states)
            | (self.point_states & self.magnitude_states)
        )
        if clash:
            raise ValueError(f"Riemannian: state keys classified twice: {sorted(clash)}")
        self._rows = RowOps()

        model = model_or_groups if isinstance(model_or_groups, nn.Module) else None
        held = {id(p): p for g in base.param_groups for p in g["params"]}
        names = _names_of(base.param_groups)
        if model is not None:
            sphere = named_sphere_parameters(model)
            for name, p in sphere:
                if id(p) not in held:
                    raise ValueError(
                        f"Riemannian: the model's sphere parameter {name!r} is not in the base optimizer "
                        "(built before fully_shard / load_state_dict(assign=True)?)"
                    )
            sphere_ids = {id(p) for _, p in sphere}
            geometry_of = {id(p): manifold.name for _, p, manifold in declared_on_geometries(model)}
            for name, p, _ in declared_on_geometries(model):
                if id(p) not in held:
                    raise ValueError(f"Riemannian: the model's parameter {name!r} (on a geometry) is not in the base")
            for g in base.param_groups:  # a group the user marked counts too
                if g.get("manifold") == SPHERE:
                    sphere_ids |= {id(p) for p in g["params"]}
                elif g.get("manifold", EUCLIDEAN) != EUCLIDEAN:
                    geometry_of.update({id(p): g["manifold"] for p in g["params"]})
        else:
            groups = base.param_groups if model_or_groups is None else list(model_or_groups)
            for g in groups:
                if g.get("manifold", EUCLIDEAN) not in known_manifolds():
                    raise ValueError(
                        f"Riemannian: group manifold must be one of {known_manifolds()}, got {g['manifold']!r}"
                    )
            sphere_ids = {id(_tensor(p)) for g in groups if g.get("manifold") == SPHERE for p in _listed(g["params"])}
            geometry_of = {
                id(_tensor(p)): g["manifold"]
                for g in groups
                if g.get("manifold", EUCLIDEAN) not in (SPHERE, EUCLIDEAN)
                for p in _listed(g["params"])
            }
            for i in sphere_ids | set(geometry_of):
                if i not in held:
                    raise ValueError("Riemannian: a parameter of a sphere group is not in the base optimizer")
        # Refuse a ManifoldParameter on the sphere that is not known as a sphere parameter.
        check_groups(
            [
                {"params": [p for p in held.values() if id(p) in sphere_ids], "manifold": SPHERE},
                {"params": [p for p in held.values() if id(p) not in sphere_ids], "manifold": EUCLIDEAN},
            ],
            None,
            "Riemannian",
            names=names,
        )
        for g in base.param_groups:
            wd = g.get("weight_decay", 0) or 0
            if wd != 0 and any(id(p) in sphere_ids or id(p) in geometry_of for p in g["params"]):
                first = next(p for p in g["params"] if id(p) in sphere_ids or id(p) in geometry_of)
                raise ValueError(
                    f"Riemannian: sphere parameter {describe(first, names)} is in a param group with "
                    f"weight_decay={wd!r}. Weight decay has no meaning on the sphere; put the sphere parameters "
                    "in their own group with weight_decay=0 (spherenet.optim.param_groups(model) does)."
                )
        for p in held.values():
            if id(p) in sphere_ids:
                check_sphere_layout(p, names.get(id(p), f"of shape {tuple(p.shape)}"))
        self._sphere_ids = sphere_ids
        self._geometry_of = {i: name for i, name in geometry_of.items() if i not in sphere_ids}
        self._watch = ModelWatch(model if check_model else None)
        self._started: set[int] = set()

        # Share, do not copy: the base's groups, state and defaults are this optimizer's.
        self._wrapped = False
        super().__init__([torch.empty(0)], dict(base.defaults))
        self._wrapped = True
        self.param_groups = base.param_groups
        self.state = base.state
        self.defaults = base.defaults

    # ---- delegation ------------------------------------------------------------------------

    def state_dict(self):
        return self.base.state_dict()

    def load_state_dict(self, state_dict) -> None:
        self.base.load_state_dict(state_dict)
        self.param_groups = self.base.param_groups
        self.state = self.base.state

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.base.zero_grad(set_to_none=set_to_none)

    def add_param_group(self, param_group: dict) -> None:
        if not self._wrapped:  # Optimizer.__init__'s placeholder group
            return super().add_param_group(param_group)
        manifold = param_group.get("manifold", EUCLIDEAN)
        if manifold != EUCLIDEAN:
            if manifold not in known_manifolds():
                raise ValueError(f"Riemannian: group manifold must be one of {known_manifolds()}, got {manifold!r}")
            if param_group.get("weight_decay", 0):
                raise ValueError(f"Riemannian: weight decay in a {manifold} param group")
            ids = {id(_tensor(p)) for p in _listed(param_group["params"])}
            if manifold == SPHERE:
                self._sphere_ids |= ids
            else:  # a registered geometry steps it, as for the groups given at construction
                self._geometry_of.update(dict.fromkeys(ids, manifold))
        self.base.add_param_group(param_group)
        self.param_groups = self.base.param_groups

    def __repr__(self) -> str:
        return f"Riemannian({self.base!r})"

    # ---- step --------------------------------------------------------------------------------

    def _sphere(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        ps = [p for g in self.param_groups for p in g["params"] if id(p) in self._sphere_ids]
        return ps, [local(p) for p in ps]

    def _project_grads(self) -> None:
        ps, xs = self._sphere()
        keep = [(x, local(p.grad)) for p, x in zip(ps, xs) if p.grad is not None]
        with torch.no_grad():
            self._rows.proju_([x for x, _ in keep], [g for _, g in keep])

    @torch.compiler.disable
    def step(self, closure=None):
        """Project sphere gradients, run ``base.step``, retract, move the state. Eager under
        ``torch.compile``. Returns the closure's loss."""
        self._watch.check(self._marked_groups(), "Riemannian")
        ps, xs = self._sphere()
        new = [i for i, p in enumerate(ps) if id(p) not in self._started and p.grad is not None]
        if new:
            with torch.no_grad():
                ensure_on_sphere(
                    [ps[i] for i in new],
                    [xs[i] for i in new],
                    _names_of(self.param_groups),
                    self.off_sphere,
                    "Riemannian",
                    stacklevel=5,
                )
        before = self._geometry_points()
        if closure is not None:

            def projected_closure():
                loss = closure()
                self._project_grads()
                return loss

            loss = self.base.step(projected_closure)
        else:
            self._project_grads()
            loss = self.base.step()
        with torch.no_grad():
            self._retract_and_move_state(ps, xs)
            self._geometry_updates(before)
        self._started.update(id(ps[i]) for i in new)
        return loss

    def _geometry_points(self) -> list[tuple[torch.Tensor, torch.Tensor, float]]:
        """(parameter, a copy of its local values, the group's lr) for each parameter on a
        registered geometry with a gradient, taken before the base step."""
        out = []
        with torch.no_grad():
            for g in self.param_groups:
                for p in g["params"]:
                    if id(p) in self._geometry_of and p.grad is not None:
                        out.append((p, local(p).clone(), float(g["lr"])))
        return out

    def _geometry_updates(self, before) -> None:
        """Around the base step, for a parameter on a registered geometry: with ``D`` what the
        base moved it by, the geometry's ``step_`` from where it was, in the base's direction
        ``u = -D / lr`` (for the whole-matrix sphere ``W <- R Normalize(W_before - lr R
        Normalize(u))``); the geometry's constants (the radius) are kept in the base's state."""
        for p, x_before, lr in before:
            geometry = geometry_for(self._geometry_of[id(p)])
            state = self.base.state[p]
            if "geometry" not in state:
                state.update(geometry.init_state(x_before, like=p), geometry=geometry.name)
            if lr == 0:
                continue
            x = local(p)
            direction = (x_before - x).div_(lr)  # the base's own direction: it moved by -lr * direction
            x.copy_(x_before)
            geometry.step_(x, direction, lr, state, like=p)

    def _marked_groups(self) -> list[dict]:
        held = [p for g in self.param_groups for p in g["params"] if id(p) in self._sphere_ids]
        return [{"params": held, "manifold": SPHERE}]

    def _retract_and_move_state(self, ps: list[torch.Tensor], xs: list[torch.Tensor]) -> None:
        """Retract every sphere parameter and move its state, wave by wave (see
        :func:`spherenet.kernels.sphere_rows.waves`): the first vector state of a parameter is
        projected while the parameter's rows are still in cache after the retraction."""
        vectors: list[list[torch.Tensor]] = []  # per parameter, its vector-like state tensors
        points: list[torch.Tensor] = []
        names = None
        for p in ps:
            vec = []
            elementwise_magnitude = False
            state = self.base.state.get(p) or {}
            for key, value in state.items():
                if not isinstance(value, torch.Tensor) or value.shape != p.shape or not value.is_floating_point():
                    continue
                if key in self.vector_states:
                    vec.append(local(value))
                elif key in self.point_states:
                    points.append(local(value))
                elif key in self.magnitude_states:
                    elementwise_magnitude = True
                else:
                    names = names if names is not None else _names_of(self.param_groups)
                    raise RuntimeError(
                        f"Riemannian: {type(self.base).__name__} keeps a state tensor {key!r} shaped like the sphere "
                        f"parameter {describe(p, names)}, and it is not known whether it is a vector (to project "
                        "onto the new tangent space), a point (to normalize) or a magnitude (to keep). Classify "
                        f"it: Riemannian(..., vector_states={{{key!r}}}) / point_states= / magnitude_states=."
                    )
            # With a per-element magnitude, projecting would unbound the step (module docstring, 4.).
            vectors.append([] if elementwise_magnitude else vec)
        rows = self._rows
        with_vec = [i for i, v in enumerate(vectors) if v]
        bare = [xs[i] for i, v in enumerate(vectors) if not v]
        for _, (wx, wt) in waves([[xs[i] for i in with_vec], [vectors[i][0] for i in with_vec]]):
            rows.retr_(wx)
            rows.proju_(wx, wt)
        for _, (wx,) in waves([bare]):
            rows.retr_(wx)
        extra = [(xs[i], t) for i in with_vec for t in vectors[i][1:]]
        if extra:
            rows.proju_([x for x, _ in extra], [t for _, t in extra])
        rows.retr_(points)
