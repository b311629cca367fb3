"""Muon on the unit sphere: orthogonalized momentum for matrices made of unit rows.

Muon (Jordan et al. 2024, "Muon: An optimizer for hidden layers in neural networks",
https://kellerjordan.github.io/posts/muon/) updates a hidden weight matrix by its momentum
with every singular value replaced by ~1: ``O = U V^T`` for the momentum ``U S V^T``,
approximated by a few Newton-Schulz iterations. Bernstein & Newhouse 2024 ("Old Optimizer,
New Norm: An Anthology", arXiv:2409.20325) derive this as steepest descent under the spectral
norm. Bernstein 2025 ("Modular Manifolds", Thinking Machines Lab) extends steepest descent to
weights constrained to a manifold: step in the tangent space, then retract.

:class:`SphericalMuon` does this for spherenet's sphere matrices: ``X`` of shape ``(A, B)``,
every row a unit vector (the sphere dimension last, as nGPT stores its weights), i.e. a point
of the product of ``A`` spheres. With gradient ``G``, momentum ``mu`` and learning rate ``lr``,
one step is (``P_X(Y) = Y - diag(<x_i, y_i>) X``, the row-wise projection onto the tangent
space at ``X``, eq. 24 of the nGPT paper's Appendix A.3 applied to each row):

1. Riemannian gradient, **before** the momentum: ``U = P_X(G)``;
2. momentum (an average, as ``torch.optim.Muon``): ``M <- mu M + (1 - mu) U``;
   Nesterov (default): ``N = (1 - mu) U + mu M``, else ``N = M``;
3. orthogonalization: ``O = NS(N)`` (:func:`zeropower_via_newton_schulz`);
4. tangent update (``project_update=True``, the default): ``O <- P_X(O)``;
5. retraction: ``X <- Norm(X - lr * s(A, B) * O)``, ``Norm`` row by row (Section 2.2.2);
6. transport of the momentum by projection: ``M <- P_X(M)`` at the new ``X``.

Why this order. The gradient is projected before the momentum, and the momentum is moved by
projection after each retraction, so that ``M`` and ``N`` stay tangent. That matters more for
Muon than for Adam: Newton-Schulz raises *every* nonzero singular value to ~1, so a small
normal component left in ``N`` would become an O(1) part of ``O``. Newton-Schulz mixes the rows
(``O = p(N N^T) N``), so ``O`` itself is not tangent; step 4 removes its normal part, which
would otherwise only change each row's step length after the retraction (``Norm`` rescales
``x - a (o_t + c x)`` by ``1 / (1 - a c)``, a row-dependent factor). With
``project_update=False`` the step is that of ``Riemannian(torch.optim.Muon(...))``.

Step size (``adjust_lr``), with ``(A, B)`` the matrix shape (rows, sphere dimension):

- ``"match_rms_adamw"`` (default): ``s = 0.2 * sqrt(max(A, B))`` (Liu et al. 2025, "Muon is
  Scalable for LLM Training", arXiv:2502.16982). For an exactly orthogonal ``O`` the
  update's RMS over elements is ``0.2 * lr``, AdamW's typical RMS, so the learning rates of the
  Adam recipes transfer; each row then moves ``0.2 * lr * sqrt(B)`` radians in RMS over rows,
  what element-wise Adam on the sphere moves it.
- ``"original"``: ``s = sqrt(max(1, A / B))`` (Jordan et al.): each row moves ``lr`` radians in
  RMS over rows (exactly ``lr`` for every row when ``A <= B``, ``O`` then having orthonormal
  rows).

Bound: ``|ΔX_ij| <= ||Δx_i|| <= lr * s * ||o_i|| <= lr * s * sigma_max(O)``, and the quintic
iteration keeps ``sigma_max(O) <= 1.2023`` (the maximum of ``a t + b t^3 + c t^5`` on [0, 1]),
so no element moves more than about ``1.21 * lr * s`` per step (plus rounding).

Newton-Schulz needs the whole matrix. Under FSDP2 (rows sharded over ranks) the Nesterov
direction is all-gathered (``DTensor.full_tensor()``), every rank orthogonalizes the full
matrix and keeps its own rows; all other stages are row-local. Steps 4-6 are one row op,
:func:`spherenet.kernels.sphere_muon_tail_` (one Triton pass where Triton is chosen, ``_foreach``
passes elsewhere). Embeddings, the output head and
vectors are not for Muon (Jordan et al.; Bernstein & Newhouse: their natural norms are not the
spectral norm): :func:`spherenet.optim.build_optimizer` sends them to (Riemannian) Adam.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.optim import Optimizer

from ..kernels.sphere_rows import RowOps, sphere_muon_tail_
from ..manifolds import geometry_for
from ._checks import check_off_sphere, check_positive_float, check_sphere_layout, ensure_on_sphere, is_dtensor, local
from .groups import EUCLIDEAN, SPHERE, _names_of, known_manifolds

__all__ = [
    "SphericalMuon",
    "zeropower_via_newton_schulz",
    "update_scale",
    "hidden_matrices",
    "OUTPUT_LAYER_ATTR",
    "NS_COEFFICIENTS",
    "NS_STEPS",
    "ADJUST_LR",
    "NS_DTYPES",
]

#: Quintic Newton-Schulz coefficients of Jordan et al. (2024), chosen for a steep slope at 0.
NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
NS_STEPS = 5
ADJUST_LR = ("match_rms_adamw", "original")
NS_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float64": torch.float64}


def zeropower_via_newton_schulz(
    matrix: torch.Tensor,
    steps: int = NS_STEPS,
    coefficients: tuple[float, float, float] = NS_COEFFICIENTS,
    eps: float = 1e-7,
    dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:
    """``~ U V^T`` for ``matrix = U S V^T``, by the quintic Newton-Schulz iteration of Jordan
    et al. (2024), computed in ``dtype`` and returned in it.

    The matrix is first divided by its Frobenius norm (clamped below by ``eps``), so that its
    spectral norm is at most 1; then ``steps`` times ``X <- a X + (b A + c A^2) X`` with
    ``A = X X^T``, on the orientation with the smaller Gram matrix. With the default
    coefficients the singular values end in roughly [0.68, 1.2], not at 1 (the iteration is
    tuned for speed; Jordan et al. report no loss from it).
    """
    if matrix.dim() != 2:
        raise ValueError(f"Newton-Schulz orthogonalizes matrices; got a tensor of shape {tuple(matrix.shape)}")
    a, b, c = coefficients
    x = matrix.to(dtype)
    tall = x.shape[0] > x.shape[1]
    if tall:
        x = x.mT
    x = x / x.norm().clamp(min=eps)
    for _ in range(steps):
        gram = x @ x.mT
        poly = torch.addmm(gram, gram, gram, beta=b, alpha=c)  # b A + c A^2
        x = torch.addmm(x, poly, x, beta=a)  # a X + (b A + c A^2) X
    return x.mT if tall else x


def update_scale(shape: tuple[int, ...] | torch.Size, adjust_lr: str) -> float:
    """The step-size factor ``s(A, B)`` of the module docstring for a matrix of ``shape``."""
    rows, cols = shape
    if adjust_lr == "match_rms_adamw":
        return 0.2 * math.sqrt(max(rows, cols))
    if adjust_lr == "original":
        return math.sqrt(max(1.0, rows / cols))
    raise ValueError(f"adjust_lr must be one of {ADJUST_LR}, got {adjust_lr!r}")


#: A module sets this class attribute to True to mark itself (and its submodules) as an output
#: layer, which Muon leaves to Adam: e.g. :class:`spherenet.layers.SphereClassifier`.
OUTPUT_LAYER_ATTR = "is_output_layer"


def hidden_matrices(model: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """The weights Muon orthogonalizes in ``model``, as ``(name, parameter)`` in
    ``named_parameters()`` order: every trainable 2-D parameter except

    - lookup tables: the parameters of a module with a ``num_embeddings`` attribute
      (``nn.Embedding``, :class:`spherenet.layers.SphereEmbedding`), whose rows are read, not
      multiplied;
    - output layers: the module ``model.get_output_embeddings()`` returns (the Hugging Face
      convention; nGPT's and GPT's ``embed_out``) and every module whose class sets
      ``is_output_layer = True`` (:class:`spherenet.layers.SphereClassifier`), with their
      submodules.

    Chosen by what a parameter is (its shape and its module), not by its name, so a model
    built from spherenet's layers under any attribute names groups the same way. Vectors
    (gains, scalings, biases) are 1-D and go to Adam too.
    """
    excluded: set[int] = set()

    def exclude(module: nn.Module) -> None:
        excluded.update(id(p) for p in module.parameters())

    output = getattr(model, "get_output_embeddings", None)
    if callable(output) and isinstance(output(), nn.Module):
        exclude(output())
    for module in model.modules():
        if hasattr(module, "num_embeddings") or getattr(type(module), OUTPUT_LAYER_ATTR, False):
            exclude(module)
    return [
        (name, p) for name, p in model.named_parameters() if p.requires_grad and p.dim() == 2 and id(p) not in excluded
    ]


def _check_coefficients(value) -> tuple[float, float, float]:
    try:
        a, b, c = (float(v) for v in value)
    except (TypeError, ValueError):
        raise ValueError(f"ns_coefficients must be three numbers (a, b, c), got {value!r}") from None
    if not all(math.isfinite(v) for v in (a, b, c)):
        raise ValueError(f"ns_coefficients must be finite, got {value!r}")
    return a, b, c


def _check_group_options(group: dict) -> None:
    if "lr" in group:
        check_positive_float("lr", group["lr"], allow_zero=True)
    if "eps" in group:
        check_positive_float("eps", group["eps"])
    if "momentum" in group:
        mu = group["momentum"]
        if isinstance(mu, bool) or not isinstance(mu, (int, float)) or not 0.0 <= mu < 1.0:
            raise ValueError(f"momentum must be in [0, 1), got {mu!r}")
    for key in ("nesterov", "project_update"):
        if key in group and not isinstance(group[key], bool):
            raise ValueError(f"{key} must be True or False, got {group[key]!r}")
    if "adjust_lr" in group and group["adjust_lr"] not in ADJUST_LR:
        raise ValueError(f"adjust_lr must be one of {ADJUST_LR}, got {group['adjust_lr']!r}")
    if "ns_steps" in group:
        n = group["ns_steps"]
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 100:
            raise ValueError(f"ns_steps must be an int in [1, 100], got {n!r}")
    if "ns_coefficients" in group:
        group["ns_coefficients"] = _check_coefficients(group["ns_coefficients"])
    if "ns_dtype" in group and group["ns_dtype"] not in NS_DTYPES:
        raise ValueError(f"ns_dtype must be one of {tuple(NS_DTYPES)}, got {group['ns_dtype']!r}")


class SphericalMuon(Optimizer):
    """Muon on matrices of unit rows (the module docstring gives the step exactly).

    Args:
        params: the sphere matrices (2-D, unit rows, sphere dimension last), or param groups.
            Every group is a sphere group (``"manifold": "sphere"``, the default); Euclidean
            matrices belong in ``torch.optim.Muon``.
        lr: learning rate; the step is ``lr * update_scale(shape, adjust_lr)`` times the
            orthogonalized momentum.
        momentum, nesterov: the momentum average ``mu`` (in [0, 1)) and Nesterov's look-ahead,
            as in ``torch.optim.Muon``.
        adjust_lr: ``"match_rms_adamw"`` (default, ``0.2 sqrt(max(A, B))``) or ``"original"``
            (``sqrt(max(1, A / B))``).
        project_update: project the orthogonalized update onto the tangent space before the
            retraction (default ``True``).
        ns_steps, ns_coefficients, eps: the Newton-Schulz iteration (5 steps, Jordan et al.'s
            coefficients, Frobenius normalization clamped at ``eps``).
        ns_dtype: ``"bfloat16"`` (default, as Jordan et al. and torch), ``"float32"`` or
            ``"float64"``: the precision of the iteration.
        off_sphere: ``"project"`` (normalize off-sphere rows at the first step, with a warning)
            or ``"error"``.

    Refusals (``ValueError``): a non-2-D parameter, a Euclidean group, weight decay (it has no
    meaning on the sphere: ``Norm`` undoes it), a matrix sharded along its sphere dimension,
    bad hyperparameters. State: ``"momentum_buffer"`` per matrix, tangent at the current point.
    ``torch.compile(optimizer.step)`` runs the step eagerly.
    """

    def __init__(
        self,
        params,
        lr: float = 1e-3,
        momentum: float = 0.95,
        nesterov: bool = True,
        *,
        adjust_lr: str = "match_rms_adamw",
        project_update: bool = True,
        ns_steps: int = NS_STEPS,
        ns_coefficients: tuple[float, float, float] = NS_COEFFICIENTS,
        ns_dtype: str = "bfloat16",
        eps: float = 1e-7,
        off_sphere: str = "project",
    ):
        if isinstance(params, torch.nn.Module):
            raise TypeError(
                "SphericalMuon takes the sphere matrices, not a module: embeddings and the output head "
                "are not for Muon. Use spherenet.optim.build_optimizer(model, 'spherical_muon', ...)."
            )
        check_off_sphere(off_sphere)
        defaults = dict(
            lr=lr,
            momentum=momentum,
            nesterov=nesterov,
            adjust_lr=adjust_lr,
            project_update=project_update,
            ns_steps=ns_steps,
            ns_coefficients=tuple(ns_coefficients) if isinstance(ns_coefficients, (list, tuple)) else ns_coefficients,
            ns_dtype=ns_dtype,
            eps=eps,
            manifold=SPHERE,
            weight_decay=0.0,
        )
        _check_group_options(defaults)
        self.off_sphere = off_sphere
        self._rows = RowOps()
        super().__init__(params, defaults)

    def add_param_group(self, param_group: dict) -> None:
        if not isinstance(param_group, dict):
            raise TypeError(f"param group must be a dict, got {type(param_group).__name__}")
        manifold = param_group.setdefault("manifold", SPHERE)
        if manifold == EUCLIDEAN or manifold not in known_manifolds():
            raise ValueError(
                f"SphericalMuon: param group manifold {manifold!r}; it steps matrices on the row sphere or on a "
                "registered geometry (e.g. the whole-matrix sphere), not Euclidean ones (use torch.optim.Muon)"
            )
        wd = param_group.get("weight_decay", 0.0)
        if wd:
            raise ValueError(
                f"SphericalMuon: weight_decay={wd!r}. Weight decay has no meaning on a sphere (Norm undoes "
                "it; an L2 term is normal to the sphere): use 0."
            )
        _check_group_options(param_group)
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        names = _names_of([group])
        for p in group["params"]:
            name = names.get(id(p), f"of shape {tuple(p.shape)}")
            if p.dim() != 2:
                raise ValueError(
                    f"SphericalMuon: parameter {name!r} has shape {tuple(p.shape)}; Muon orthogonalizes "
                    "2-D matrices (use RiemannianAdam for other sphere tensors)"
                )
            if manifold == SPHERE:
                check_sphere_layout(p, name)

    @torch.compiler.disable
    def step(self, closure=None):
        """One optimizer step (eager even under ``torch.compile``). Returns ``closure()``'s loss."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        with torch.no_grad():
            for group in self.param_groups:
                self._group_step(group)
        return loss

    def _group_step(self, group: dict) -> None:
        params, new = [], []
        for p in group["params"]:
            if p.grad is None:
                continue
            if p.grad.is_sparse:
                raise RuntimeError("SphericalMuon does not support sparse gradients")
            if p.grad.dtype != p.dtype:
                raise RuntimeError(f"gradient dtype {p.grad.dtype} differs from parameter dtype {p.dtype}")
            state = self.state[p]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                new.append(p)
            params.append(p)
        if not params:
            return
        if group["manifold"] != SPHERE:
            self._geometry_step(group, params)
            return
        rows = self._rows
        if new:
            ensure_on_sphere(
                new, [local(p) for p in new], _names_of(self.param_groups), self.off_sphere, "SphericalMuon"
            )
        mu, lr = float(group["momentum"]), float(group["lr"])
        ns_dtype = NS_DTYPES[group["ns_dtype"]]
        for p in params:
            x, m = local(p), local(self.state[p]["momentum_buffer"])
            u = local(p.grad).clone()
            rows.proju_([x], [u])  # 1. U = P_X(G); p.grad is left as it is
            m.lerp_(u, 1 - mu)  # 2. M <- mu M + (1 - mu) U
            n = u.lerp_(m, mu) if group["nesterov"] else m
            whole = _gather_rows(n, p) if is_dtensor(p) else n
            o = zeropower_via_newton_schulz(  # 3. O = NS(N), on the whole matrix
                whole, group["ns_steps"], group["ns_coefficients"], group["eps"], ns_dtype
            )
            if is_dtensor(p):
                o = _own_rows(o, p)
            o = o.to(x.dtype).contiguous()  # NS returns tall matrices transposed
            step_size = lr * update_scale(p.shape, group["adjust_lr"])
            # 4. O <- P_X(O); 5. X <- Norm(X - lr s O); 6. M <- P_X(M) at the new point
            sphere_muon_tail_([x], [o], [m], [step_size], project_update=group["project_update"])

    def _geometry_step(self, group: dict, params: list) -> None:
        """A registered geometry's group: Muon's orthogonalized momentum ``O`` of the raw
        gradient, then the geometry's ``step_``. For the whole-matrix sphere that is MuonH,
        ``W <- R Normalize(W - lr R Normalize(O))`` (``adjust_lr`` and ``project_update`` do not
        apply: the update's norm is fixed)."""
        geometry = geometry_for(group["manifold"])
        mu, lr = float(group["momentum"]), float(group["lr"])
        ns_dtype = NS_DTYPES[group["ns_dtype"]]
        for p in params:
            state = self.state[p]
            x, m = local(p), local(state["momentum_buffer"])
            if "geometry" not in state:
                state.update(geometry.init_state(x, like=p), geometry=geometry.name)
            g = local(p.grad)
            m.lerp_(g, 1 - mu)
            n = g.lerp(m, mu) if group["nesterov"] else m
            whole = _gather_rows(n, p) if is_dtensor(p) else n
            o = zeropower_via_newton_schulz(whole, group["ns_steps"], group["ns_coefficients"], group["eps"], ns_dtype)
            if is_dtensor(p):
                o = _own_rows(o, p)
            geometry.step_(x, o.to(x.dtype), lr, state, like=p)


def _gather_rows(local_rows: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """The full matrix whose local shard (laid out as the DTensor ``like``) is ``local_rows``."""
    from torch.distributed.tensor import DTensor

    return DTensor.from_local(
        local_rows, like.device_mesh, like.placements, run_check=False, shape=like.shape, stride=like.stride()
    ).full_tensor()


def _own_rows(full: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """This rank's shard of the replicated ``full``, laid out as the DTensor ``like`` (a local
    slice: going from replicated to sharded needs no communication)."""
    from torch.distributed.tensor import DTensor, Replicate

    mesh = like.device_mesh
    replicated = DTensor.from_local(full, mesh, [Replicate()] * mesh.ndim, run_check=False)
    return replicated.redistribute(mesh, like.placements).to_local()
