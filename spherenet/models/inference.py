"""Inference speed as a transform of a trained model: :func:`fold_for_inference`.

nGPT's equations (``models/ngpt.py``) compute every scaling from its stored value at every call
(``s * (init / scale)``, Section 2.5) and run ``W_q``, ``W_k``, ``W_v`` and ``W_u``, ``W_v``
(the gate) as separate matrix products. That is exact and cheap in training, where the
parameters change every step; decoding one token at a time it is call overhead. The transform
returns a model that computes the same logits (to float rounding) with:

- every scaling evaluated once and held as a constant (:class:`FrozenScale`): ``alpha_A``,
  ``alpha_M`` (eq. 10, 11), ``s_qk`` (eq. 15, 16), ``s_z`` (eq. 3);
- one matrix product for q, k and v (``[W_q; W_k; W_v]``), and RoPE and ``Norm(.) * s_qk`` over
  the query and key heads in one call (:class:`FoldedNGPTAttention`);
- one matrix product for ``u`` and ``v`` with their scalings folded into the weight
  (``[W_u s_u; W_v s_v sqrt(d_model)]``, eq. 20, 21), and ``W_o_mlp`` in the contiguous
  ``(d_model, d_mlp)`` layout that a matrix-vector product streams fastest
  (:class:`FoldedSwiGLU`, :class:`FoldedReLU2`).

The result is a snapshot: a copy (or, with ``inplace=True``, the model itself, converted) whose
weights no longer follow the original's. Nothing is cached behind the original's back, so no
edit of the original (an optimizer step, ``p.data.mul_``, a numpy view) can make the snapshot's
logits stale: they are the logits of the weights it was folded from, and the original's eval
forward always computes its current weights' logits. Fold again after changing the model.
Modules wrapped by an adapter (LoRA) are left unfolded (their scalings still frozen). A
folded model is for inference only: it cannot be trained or saved.
"""

from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F
from torch import nn

from .. import kernels
from ..layers import Scale, SphereLinear
from ..layers.attention import Attention
from .ngpt import NGPTMLP, NGPTAttention, NGPTReLU2MLP

__all__ = ["fold_for_inference", "is_folded", "FrozenScale", "FoldedNGPTAttention", "FoldedSwiGLU", "FoldedReLU2"]

FOLDED = "folded_for_inference"  # the attribute that marks a folded model


def is_plain(linear: nn.Module) -> bool:
    """Whether ``linear`` computes ``x W`` from its own ``weight`` alone, so that folding may
    read the weight: a :class:`SphereLinear` not wrapped (a LoRA wrapper adds its update to the
    weight) and not re-defined."""
    return isinstance(linear, SphereLinear) and type(linear).forward is SphereLinear.forward


class FrozenScale(nn.Module):
    """A :class:`~spherenet.layers.Scale`'s effective value, evaluated once: ``forward()``
    returns it, shape ``(size,)`` or ``(1,)``, as the scale did."""

    def __init__(self, scale: Scale):
        super().__init__()
        with torch.no_grad():
            self.register_buffer("value", scale().detach().clone())

    @property
    def source(self) -> torch.Tensor:
        return self.value

    def effective(self) -> torch.Tensor:
        return self.value

    def forward(self) -> torch.Tensor:
        return self.value

    def extra_repr(self) -> str:
        return f"size={self.value.numel()}"


class FoldedNGPTAttention(Attention):
    """:class:`~spherenet.models.ngpt.NGPTAttention` with ``[W_q; W_k; W_v]`` as one weight and
    the queries' and keys' factors of eq. 15, 16 as one ``(n_heads + n_kv_heads, 1, d_k)``
    tensor (ones for grouped keys, whose ``s_qk`` is on the queries). RoPE, the masks, SDPA and
    ``W_o`` are :class:`~spherenet.layers.attention.Attention`'s, as in the unfolded model."""

    def __init__(self, attn: NGPTAttention):
        super().__init__(
            attn.d_model, attn.n_heads, attn.rope, attn.rope.base, attn.causal, attn.n_kv_heads, attn.head_dim
        )
        self.softmax_scale, self.qk_norm = attn.softmax_scale, attn.qk_norm
        self.w_o = attn.w_o
        with torch.no_grad():
            self.register_buffer("qkv_weight", torch.cat([attn.w_q.matrix(), attn.w_k.matrix(), attn.w_v.matrix()]))
            q_scale, k_scale = attn._qk_scales()
            d = self.head_dim
            q_rows = torch.broadcast_to(q_scale, (self.n_heads, 1, d))
            k_rows = torch.ones_like(q_rows[:1]) if k_scale is None else k_scale
            self.register_buffer("qk_scales", torch.cat((q_rows, torch.broadcast_to(k_rows, (self.n_kv_heads, 1, d)))))

    def _project(self, x: torch.Tensor, offset: int, positions: torch.Tensor | None):
        heads, kv_heads = self.n_heads, self.n_kv_heads
        qkv = F.linear(x, self.qkv_weight).unflatten(-1, (heads + 2 * kv_heads, self.head_dim)).transpose(1, 2)
        qk = self.rope(qkv[:, : heads + kv_heads], offset, positions)
        if x.dtype == self.qk_scales.dtype:  # q and k in one call
            q, k = kernels.qk_normalize(qk, self.qk_scales, self.qk_norm).split((heads, kv_heads), dim=1)
        else:  # e.g. autocast: each as the unfolded model scales it, so that k keeps its dtype
            q, k = qk.split((heads, kv_heads), dim=1)
            q_scale, k_scale = self.qk_scales.split((heads, kv_heads))
            q = kernels.qk_normalize(q, q_scale, self.qk_norm)
            if not self.grouped:
                k = kernels.qk_normalize(k, k_scale, self.qk_norm)
            elif self.qk_norm:
                k = kernels.normalize(k)
        return q, k, qkv[:, heads + kv_heads :]


class _FoldedMLP(nn.Module):
    """An nGPT MLP's up projection with its scalings folded in and ``W_o_mlp`` as a contiguous
    ``(d_model, d_mlp)`` matrix (or the original ``w_o`` module when an adapter wraps it)."""

    def __init__(self, mlp: nn.Module, up_weight: torch.Tensor):
        super().__init__()
        self.d_model, self.d_mlp = mlp.d_model, mlp.d_mlp
        self.register_buffer("up_weight", up_weight)
        if is_plain(mlp.w_o):
            self.register_buffer("down_weight", mlp.w_o.matrix().detach().contiguous())
            self.w_o = None
        else:
            self.w_o = mlp.w_o

    def _up(self, h: torch.Tensor) -> torch.Tensor:
        if h.shape[-1] != self.d_model:
            raise ValueError(
                f"{type(self).__name__} expected input with last dimension {self.d_model}, got shape {tuple(h.shape)}"
            )
        return F.linear(h, self.up_weight)

    def _down(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.down_weight) if self.w_o is None else self.w_o(x)


class FoldedSwiGLU(_FoldedMLP):
    """:class:`~spherenet.models.ngpt.NGPTMLP` as ``u, v = h [W_u s_u; W_v s_v sqrt(d_model)]``
    (eq. 20, 21 in one product), then ``(u * SiLU(v)) W_o_mlp``."""

    def __init__(self, mlp: NGPTMLP):
        with torch.no_grad():
            v_scale = mlp.s_v() * math.sqrt(mlp.d_model)
            up = torch.cat((mlp.w_u.scaled_matrix(mlp.s_u()), mlp.w_v.scaled_matrix(v_scale)))
        super().__init__(mlp, up)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        u, v = self._up(h).chunk(2, dim=-1)
        return self._down(kernels.swiglu(u, v))


class FoldedReLU2(_FoldedMLP):
    """:class:`~spherenet.models.ngpt.NGPTReLU2MLP` as ``ReLU(h W_u s_uv sqrt(d_model))^2 W_o_mlp``."""

    def __init__(self, mlp: NGPTReLU2MLP):
        with torch.no_grad():
            up = mlp.w_u.scaled_matrix(mlp.s_uv() * math.sqrt(mlp.d_model))
        super().__init__(mlp, up)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self._down(kernels.relu2(self._up(h)))


def _folded(module: nn.Module) -> nn.Module | None:
    """The folded replacement of ``module``, or None where it stays (an exact type match only:
    a subclass, such as the encoder-decoder's cross-attention, computes something else)."""
    kind = type(module)
    if kind is NGPTAttention and all(is_plain(w) for w in (module.w_q, module.w_k, module.w_v)):
        return FoldedNGPTAttention(module)
    if kind is NGPTMLP and is_plain(module.w_u) and is_plain(module.w_v):
        return FoldedSwiGLU(module)
    if kind is NGPTReLU2MLP and is_plain(module.w_u):
        return FoldedReLU2(module)
    if isinstance(module, Scale):
        return FrozenScale(module)
    return None


def _replace_children(module: nn.Module) -> None:
    for name, child in list(module.named_children()):
        new = _folded(child)
        if new is None:
            _replace_children(child)
        else:
            _replace_children(new)  # e.g. the unfolded w_o a folded MLP keeps
            setattr(module, name, new)


def fold_for_inference(model: nn.Module, *, inplace: bool = False) -> nn.Module:
    """``model`` (an :class:`~spherenet.models.NGPT`, a transformers class wrapping one, or any
    module holding nGPT layers) folded for inference, in eval mode, without gradients: a deep
    copy, or ``model`` itself with ``inplace=True`` (no second copy of the weights in memory;
    the model can no longer be trained). See the module's docstring for what is folded.
    Its logits equal the unfolded model's to float rounding."""
    if is_folded(model):
        raise ValueError("this model is already folded for inference; fold the model it came from")
    folded = model if inplace else copy.deepcopy(model)
    _replace_children(folded)
    folded.requires_grad_(False)
    folded.eval()
    for module in folded.modules():
        module.__dict__[FOLDED] = True
    return folded


def is_folded(model: nn.Module) -> bool:
    """Whether ``model`` came from :func:`fold_for_inference` (it cannot be trained or saved)."""
    return bool(model.__dict__.get(FOLDED, False))
