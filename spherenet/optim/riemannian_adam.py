"""Adam on the unit sphere, over lists of tensors, correct under FSDP2.

Equation numbers are those of Loshchilov et al., "nGPT" (2024). For a sphere parameter ``x``
(unit rows, the sphere dimension last) with Euclidean gradient ``g``, one step is

1. the gradient the moments see: ``gradient="euclidean"`` (default): ``u = g``;
   ``gradient="riemannian"``: ``u = g - <x, g> x``, the manifold's ``proju``, the projection
   onto the tangent space at ``x`` (the construction of Appendix A.3, eq. 24, applied to the
   weights);
2. Adam moments on ``u`` (eq. 22): ``m <- b1 m + (1-b1) u``, and either
   ``second_moment="element"``: ``v <- b2 v + (1-b2) u*u`` (one value per element, as
   ``torch.optim.Adam``), or ``second_moment="row"``: ``v <- b2 v + (1-b2) ||u||^2`` (one value
   per row, geoopt's ``RiemannianAdam`` on its ``Sphere``);
3. direction ``d = m_hat / (sqrt(v_hat) + eps)`` with bias corrections ``1 - b^t``;
4. the manifold's retraction ``retr``: ``x <- Norm(x - lr d)`` (Section 2.2.2 and eq. 25/26);
5. with ``"row"`` and ``"riemannian"`` only: ``transp`` of ``m`` to the new point by projection,
   ``m <- m - <x, m> x`` (geoopt's; see below for why not with ``"element"``).

**The paper's optimizer** (Section 2.6 step 2 and Table 3: Adam, then renormalize every sphere
row) is ``gradient="euclidean", second_moment="element"``: steps 1-4 are then
``torch.optim.Adam`` followed by ``Norm``, equal to ``build_optimizer(method="adam_normalize")``
to float rounding (tested: 50 float64 steps of ngpt-tiny, every parameter within 1e-12).

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

import math
import warnings

import torch
from torch import nn
from torch.optim import Optimizer
from torch.optim.adam import adam as _adam_functional

from ..manifolds import geometry_for
from . import _native, _row_kernels
from ._checks import (
    ModelWatch,
    check_betas,
    check_off_sphere,
    check_positive_float,
    ensure_on_sphere,
)
from ._row_kernels import TINY, RowOps, check_sphere_layout, local, waves
from .groups import EUCLIDEAN, SPHERE, _names_of, check_groups, describe, known_manifolds, param_groups
from .kernel_choice import SPHERE_KERNELS, resolve_sphere_kernel, split_fused, triton_status

__all__ = ["RiemannianAdam", "SECOND_MOMENTS", "GRADIENTS", "SPHERE_KERNELS", "resolve_sphere_kernel"]

SECOND_MOMENTS = ("element", "row")
GRADIENTS = ("riemannian", "euclidean")


class RiemannianAdam(Optimizer):
    """Adam on the unit sphere for declared sphere parameters, AdamW elsewhere.

    Args:
        params: an ``nn.Module`` (recommended: groups are built with
            :func:`spherenet.optim.param_groups` and the model is remembered for the checks
            below), or parameters / param groups. A group's ``"manifold"`` key (``"sphere"`` or
            ``"euclidean"``, default ``"euclidean"``) says how its parameters move; no tensor
            class is ever inspected to decide it.
        lr, betas, eps: as in ``torch.optim.Adam``.
        weight_decay: **decoupled** (AdamW: ``x <- x - lr * wd * x``) on Euclidean groups. With a
            module, it applies to Euclidean tensors with ``ndim >= 2`` only. On the sphere weight
            decay is meaningless (``Norm`` undoes it; an L2 term is normal to the sphere), so a
            sphere group gets ``weight_decay=0`` and a sphere group that sets anything else is
            rejected with ``ValueError``.
        second_moment: ``"element"`` (default) or ``"row"`` (geoopt's semantics); per group too.
        gradient: what the moments of a sphere parameter see; per group too. ``"euclidean"``
            (default): the raw gradient ``g``; ``"riemannian"``: the tangent projection
            ``g - <x, g> x``. With ``second_moment="element"`` ``"euclidean"`` is exactly the paper's
            optimizer, ``torch.optim.Adam`` then ``Norm`` (equal to ``method="adam_normalize"``
            of :func:`spherenet.optim.build_optimizer` to float rounding). See the module
            docstring for both and for how they differ.
        model: the model the groups come from, when ``params`` is not the model itself: every
            declared sphere parameter must then sit in a sphere group.
        off_sphere: what the first step does with sphere rows that are not unit: ``"project"``
            (normalize them, with a warning) or ``"error"``.
        fused: for Euclidean groups and sphere tensors on the foreach path, use torch's fused
            Adam kernel for the moment update: ``True``, ``False`` (the
            foreach kernel), or ``None``: fused wherever torch has a fused kernel for the tensor's
            device and dtype, foreach for the rest.
        check_model: at every step, check that the model's declared sphere parameters are
            still the ones this optimizer holds (a ``RuntimeError`` otherwise; see
            :class:`spherenet.optim._checks.ModelWatch` for what a step confirms).
        sphere_kernel: how sphere tensors are updated (all compute the same step, to float
            rounding; :mod:`spherenet.optim.kernel_choice`). ``"native"``: one fused C++ pass
            per row for contiguous CPU tensors (built on first use, see
            :mod:`spherenet.optim._native`; other tensors take the foreach path), a
            ``RuntimeError`` if it cannot be built. ``"triton"``: one Triton launch per dtype and row
            length over all of a group's sphere tensors (:mod:`spherenet.optim.triton_kernel`;
            CPU tensors only under ``TRITON_INTERPRET=1``).
            ``"foreach"``: ``torch._foreach_*`` passes over cache-sized blocks of rows (any
            device), the readable reference. ``"auto"`` (default): native for CPU tensors when
            it builds, Triton for CUDA tensors when Triton is installed (else foreach, with one
            warning), foreach elsewhere.

    Refusals (``ValueError`` unless said): a geoopt ``ManifoldParameter`` on a sphere in a
    Euclidean group; a declared sphere parameter of ``model`` in no sphere group; weight decay
    in a sphere group; a sphere tensor sharded along its last dimension; off-sphere rows at the
    first step with ``off_sphere="error"``; replaced model parameters (``RuntimeError``).

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
    ):
        check_positive_float("lr", lr, allow_zero=True)
        check_positive_float("eps", eps, allow_zero=True)
        check_positive_float("weight_decay", weight_decay, allow_zero=True)
        check_betas(betas)
        if second_moment not in SECOND_MOMENTS:
            raise ValueError(f"second_moment must be one of {SECOND_MOMENTS}, got {second_moment!r}")
        if gradient not in GRADIENTS:
            raise ValueError(f"gradient must be one of {GRADIENTS}, got {gradient!r}")
        check_off_sphere(off_sphere)
        if fused not in (None, True, False):
            raise ValueError(f"fused must be None, True or False, got {fused!r}")
        if sphere_kernel not in SPHERE_KERNELS:
            raise ValueError(f"sphere_kernel must be one of {SPHERE_KERNELS}, got {sphere_kernel!r}")
        if sphere_kernel == "native":
            available, reason = _native.native_status()
            if not available:
                raise RuntimeError(
                    f"RiemannianAdam(sphere_kernel='native'): the native kernel is unavailable: {reason}"
                )
        if sphere_kernel == "triton":
            available, reason = triton_status()
            if not available:
                raise RuntimeError(f"RiemannianAdam(sphere_kernel='triton'): {reason}")
        if isinstance(params, nn.Module):
            if model is not None and model is not params:
                raise ValueError("RiemannianAdam: got a module as params and a different model=")
            model = params
            params = param_groups(model, weight_decay)
        self.off_sphere = off_sphere
        self.sphere_kernel = sphere_kernel
        self._warned = set()  # the kernels "auto" could not use, each warned about once
        self._rows = RowOps()
        self.wave_bytes = _row_kernels.WAVE_BYTES  # row-block size of the sphere step (a tuning knob)
        self._watch = ModelWatch(model if check_model else None)
        defaults = dict(
            lr=lr,
            betas=tuple(betas),
            eps=eps,
            weight_decay=weight_decay,
            second_moment=second_moment,
            gradient=gradient,
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
        if "second_moment" in param_group and param_group["second_moment"] not in SECOND_MOMENTS:
            raise ValueError(f"second_moment must be one of {SECOND_MOMENTS}, got {param_group['second_moment']!r}")
        if "gradient" in param_group and param_group["gradient"] not in GRADIENTS:
            raise ValueError(f"gradient must be one of {GRADIENTS}, got {param_group['gradient']!r}")
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
        """``Optimizer.load_state_dict``, refusing a state whose groups lack an option this
        optimizer reads (written by an older spherenet) instead of stepping without it."""
        for i, group in enumerate(state_dict.get("param_groups", [])):
            missing = [key for key in ("manifold", "second_moment", "gradient") if key not in group]
            if missing:
                raise ValueError(
                    f"RiemannianAdam: param group {i} of the saved state has no {', '.join(map(repr, missing))} "
                    "(written by an older spherenet?); start the optimizer afresh"
                )
        super().load_state_dict(state_dict)

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
                if group["manifold"] == SPHERE:
                    self._sphere_step(group)
                elif group["manifold"] != EUCLIDEAN:
                    self._geometry_step(group)
                else:
                    self._euclidean_step(group)
        return loss

    def _gather(self, group: dict, row_v: bool):
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
                    f"{tuple(state['exp_avg_sq'].shape)}, but second_moment={group['second_moment']!r} needs "
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

    def _adam(self, group, xs, gs, ms, vs, steps, weight_decay: float, fused_flags=None) -> None:
        """Adam / AdamW (eq. 22, decoupled decay) through torch's own kernels, in place.
        Increments the ``steps`` tensors it is given."""
        b1, b2 = group["betas"]
        choice = split_fused(group["fused"], xs) if fused_flags is None else fused_flags
        for fused in (True, False):
            idx = [i for i, c in enumerate(choice) if c == fused]
            if not idx:
                continue
            pick = (lambda seq: seq) if len(idx) == len(xs) else (lambda seq: [seq[i] for i in idx])
            _adam_functional(
                pick(xs),
                pick(gs),
                pick(ms),
                pick(vs),
                [],
                pick(steps),
                foreach=not fused,
                fused=fused,
                amsgrad=False,
                beta1=b1,
                beta2=b2,
                lr=group["lr"],
                weight_decay=weight_decay,
                eps=group["eps"],
                maximize=False,
                decoupled_weight_decay=True,
            )

    def _euclidean_step(self, group: dict) -> None:
        _, xs, gs, ms, vs, steps, _ = self._gather(group, row_v=False)
        if xs:
            self._adam(group, xs, gs, ms, vs, steps, group["weight_decay"])

    def _sphere_step(self, group: dict) -> None:
        row_v = group["second_moment"] == "row"
        project = group["gradient"] == "riemannian"
        params, xs, gs, ms, vs, steps, new = self._gather(group, row_v)
        if not xs:
            return
        rows = self._rows
        if new:
            names = _names_of(self.param_groups)
            for i in new:
                check_sphere_layout(params[i], names.get(id(params[i]), f"of shape {tuple(params[i].shape)}"))
            ensure_on_sphere(
                rows, [params[i] for i in new], [xs[i] for i in new], names, self.off_sphere, "RiemannianAdam"
            )
        torch._foreach_add_(steps, 1)  # the step counter moves here, before any kernel, in every mode
        b1, b2 = (float(b) for b in group["betas"])
        same_device = len({s.device for s in steps}) == 1
        t = torch.stack(steps).tolist() if same_device else [float(s) for s in steps]  # one sync, not one per tensor
        step_sizes = [float(group["lr"]) / (1 - b1**k) for k in t]
        bias2_sqrts = [math.sqrt(1 - b2**k) for k in t]
        scalars = (b1, b2, float(group["eps"]), TINY[torch.float32], row_v, project)
        for kernel in ("native", "triton"):  # the fused kernels, each on the tensors it takes
            mask = self._kernel_mask(kernel, xs, gs, ms, vs)
            if any(mask):
                run = _native.sphere_adam_op() if kernel == "native" else _triton_kernel()
                run(*self._pick(mask, True, xs, gs, ms, vs, step_sizes, bias2_sqrts), *scalars)
                xs, gs, ms, vs, steps, step_sizes, bias2_sqrts = self._pick(
                    mask, False, xs, gs, ms, vs, steps, step_sizes, bias2_sqrts
                )
        if xs:
            self._foreach_sphere_step(group, xs, gs, ms, vs, steps, row_v, project)

    def _geometry_step(self, group: dict) -> None:
        """A registered geometry's group (:func:`spherenet.manifolds.register_geometry`): Adam's
        direction ``u = m_hat / (sqrt(v_hat) + eps)`` on the gradient (or, with
        ``gradient="riemannian"``, on the geometry's tangent projection of it), then the
        geometry's ``step_``. For the whole-matrix sphere that is AdamH,
        ``W <- R Normalize(W - lr R Normalize(u))`` with ``R`` kept in the state."""
        if group["second_moment"] == "row":
            raise ValueError(
                f"RiemannianAdam: second_moment='row' is for the row sphere; a {group['manifold']} group uses 'element'"
            )
        params, xs, gs, ms, vs, steps, _ = self._gather(group, row_v=False)
        if not xs:
            return
        geometry = geometry_for(group["manifold"])
        for p, x in zip(params, xs):
            if "geometry" not in self.state[p]:
                self.state[p].update(geometry.init_state(x, like=p), geometry=geometry.name)
        torch._foreach_add_(steps, 1)
        b1, b2 = (float(b) for b in group["betas"])
        lr, eps = float(group["lr"]), float(group["eps"])
        for p, x, g, m, v, step in zip(params, xs, gs, ms, vs, steps):
            if group["gradient"] == "riemannian":
                g = geometry.proju(x, g, like=p)
            m.lerp_(g, 1 - b1)
            v.mul_(b2).addcmul_(g, g, value=1 - b2)
            k = float(step)
            direction = (m / (1 - b1**k)) / ((v / (1 - b2**k)).sqrt_().add_(eps))
            geometry.step_(x, direction, lr, self.state[p], like=p)

    def _foreach_sphere_step(self, group, xs, gs, ms, vs, steps, row_v: bool, project: bool) -> None:
        """Steps 1-5 of the module docstring with ``torch._foreach_*`` passes, the readable
        reference kernel: the manifold's ``proju`` (step 1), Adam's moments and step (2-3), its
        ``retr`` (4) and ``transp`` by projection (5), one cache-sized block of rows at a time
        (see ``_row_kernels.waves``). ``steps`` have moved already."""
        rows = self._rows
        transport = row_v and project  # never with a per-element v (module docstring)
        if not row_v:
            fused = split_fused(group["fused"], xs)  # decided per parameter, not per chunk
        for idx, (wx, wg, wm, wv) in waves([xs, gs, ms, vs], self.wave_bytes):
            if project:
                wg = rows.copies(wg)  # p.grad is left as it is
                rows.proju_(wx, wg)  # 1. proju: u = g - <x, g> x
            if row_v:
                t = [float(steps[i]) for i in idx]
                b1, b2 = (float(b) for b in group["betas"])
                self._row_moments_and_step(group, wx, wg, wm, wv, [1 - b1**k for k in t], [1 - b2**k for k in t])
            else:
                # 2.-3. and x <- x - lr d, by torch's Adam kernel, which moves the counter it is
                # given before using it: it gets a copy of each counter set one step back.
                before = torch._foreach_sub([steps[i] for i in idx], 1)
                self._adam(group, wx, wg, wm, wv, before, 0.0, [fused[i] for i in idx])
            rows.retr_(wx)  # 4. retr: x <- Norm(x - lr d)
            if transport:
                rows.proju_(wx, wm)  # 5. transp: m projected to the tangent space at the new x

    @staticmethod
    def _pick(mask, keep: bool, *lists):
        return tuple([item for item, m in zip(lst, mask) if m == keep] for lst in lists)

    def _kernel_mask(self, kernel: str, xs, gs, ms, vs) -> list[bool]:
        """Per tensor: does ``kernel`` ("native" or "triton") update it? (Chosen for its device,
        a supported dtype, every tensor contiguous and of the parameter's dtype.) Under
        ``"auto"`` a kernel that cannot run is warned about once and left to foreach."""
        if kernel == "native":
            dtypes = _native.NATIVE_DTYPES
        else:  # float64 is stepped in float32 there: only when asked for by name
            dtypes = _TRITON_DTYPES if self.sphere_kernel == "triton" else _TRITON_DTYPES[1:]
        eligible = [
            resolve_sphere_kernel(self.sphere_kernel, x.device.type) == kernel
            and x.dtype in dtypes
            and all(t.is_contiguous() and t.dtype == x.dtype for t in (x, g, m, v))
            for x, g, m, v in zip(xs, gs, ms, vs)
        ]
        if not any(eligible) or self.sphere_kernel == kernel:
            return eligible  # an explicit choice was checked when the optimizer was built
        available, reason = _native.native_status() if kernel == "native" else triton_status()
        if available:
            return eligible
        if kernel not in self._warned:
            self._warned.add(kernel)
            warnings.warn(
                f"RiemannianAdam: the {kernel} sphere kernel is unavailable ({reason}); "
                "using the foreach kernels (same step, slower)",
                RuntimeWarning,
                stacklevel=6,  # the caller of optimizer.step()
            )
        return [False] * len(xs)

    def _row_moments_and_step(self, group, xs, gs, ms, vs, bc1, bc2) -> None:
        """Steps 2-3 with one second moment per row, in geoopt's order of operations (except
        ``||u||^2``, taken as the square of a norm)."""
        b1, b2 = (float(b) for b in group["betas"])
        lr, eps = float(group["lr"]), float(group["eps"])
        sq = self._rows.norms(gs)  # ||u|| per row (one pass; geoopt sums u*u: same to rounding)
        torch._foreach_mul_(sq, sq)
        torch._foreach_mul_(ms, b1)
        torch._foreach_add_(ms, gs, alpha=1 - b1)
        torch._foreach_mul_(vs, b2)
        torch._foreach_add_(vs, sq, alpha=1 - b2)
        # coef = -lr / (bc1 * (sqrt(v / bc2) + eps)), one value per row.
        coef = torch._foreach_div(vs, bc2)
        torch._foreach_sqrt_(coef)
        torch._foreach_add_(coef, eps)
        torch._foreach_mul_(coef, bc1)
        torch._foreach_reciprocal_(coef)
        torch._foreach_mul_(coef, -lr)
        torch._foreach_addcmul_(xs, ms, coef)


_TRITON_DTYPES = (torch.float64, torch.float32, torch.bfloat16, torch.float16)


def _triton_kernel():
    from .triton_kernel import sphere_adam_  # imports Triton: only when the kernel is used

    return sphere_adam_
