"""nGPT (Loshchilov et al. 2024, "nGPT: Normalized Transformer with Representation Learning on the
Hypersphere") and its baseline GPT as transformers causal language models, needing torch and
transformers only: an export carries this file as ``modeling_spherenet.py`` with the two it imports
(relative imports, which transformers' remote code copies along), ``configuration_spherenet.py`` (the
configs) and ``guards_spherenet.py`` (the sphere's guards, as spherenet's classes have them), so that
``AutoModelForCausalLM.from_pretrained(export, trust_remote_code=True)`` loads it without spherenet.
Where spherenet is installed, it gives spherenet's own classes, whatever was imported first.

It computes what spherenet computes (its plain-torch formulas), with spherenet's module names (the
export's model.safetensors loads as it is). Top to bottom: the layers, the blocks, the two causal LM
classes.
"""

import math
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn
from transformers import DynamicCache, GenerationMixin, PreTrainedModel
from transformers.cache_utils import Cache
from transformers.modeling_outputs import CausalLMOutputWithPast

from .configuration_spherenet import SpherenetGPTConfig, SpherenetNGPTConfig, _SpherenetConfig, installed_spherenet
from .guards_spherenet import SphereGuards, keep_on_sphere

# ---- Layers: each computes in float32 at least where spherenet does, and returns the input's dtype ----


def _work(*tensors) -> torch.dtype:
    return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32


_PEEK_TRANSFORM = getattr(torch._C._functorch, "peek_interpreter_stack", None)


def _func_transform_active() -> bool:
    """Whether a ``torch.func`` transform (``vmap``, ``grad``, ...) is active, compiled or not."""
    return _PEEK_TRANSFORM is not None and _PEEK_TRANSFORM() is not None


def normalize(x: torch.Tensor) -> torch.Tensor:
    """``Norm(x) = x / ‖x‖`` over the last dimension (Table 1); a zero vector stays zero."""
    xw = x.to(_work(x))
    tiny = 1e-300 if xw.dtype == torch.float64 else 1e-30
    return (xw / xw.norm(dim=-1, keepdim=True).clamp_min(tiny)).to(x.dtype)


class Scale(nn.Module):
    """A scaling ``s`` stored at ``scale`` and used as ``s * init / scale`` (Section 2.5), ``|.|``
    when ``absolute``; ``mode="fixed"`` stores nothing and is the constant ``init``."""

    def __init__(self, size: int, spec: dict[str, Any], d_model: int):
        super().__init__()
        self.init, self.mode, self.absolute = float(spec["init"]), spec["mode"], spec["absolute"]
        self.scale = 1 / math.sqrt(d_model) if spec["scale"] is None else float(spec["scale"])
        if self.mode != "fixed":
            self.param = nn.Parameter(torch.full((size if self.mode == "vector" else 1,), self.scale))

    def forward(self, like: torch.Tensor) -> torch.Tensor:
        """The value, shape ``(size,)`` or ``(1,)``; a fixed one in ``like``'s dtype and device."""
        if self.mode == "fixed":  # spherenet holds it as a float32 buffer, cast with the model
            value = torch.full((1,), self.init, dtype=torch.float32).to(like)
        else:
            value = self.param * (self.init / self.scale)
        return value.abs() if self.absolute else value


class Linear(nn.Module):
    """``y = x W^T`` (no bias). ``transposed``: W is stored ``(in, out)``, as nGPT's W_o and
    W_o_mlp are (their unit vectors, along d_model, are the stored rows)."""

    def __init__(self, in_features: int, out_features: int, transposed: bool = False):
        super().__init__()
        self.transposed = transposed
        shape = (in_features, out_features) if transposed else (out_features, in_features)
        self.weight = nn.Parameter(torch.randn(shape) * 0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight.t() if self.transposed else self.weight)


def rotate(x: torch.Tensor, positions: torch.Tensor, base: float) -> torch.Tensor:
    """RoPE (Su et al. 2024) as spherenet applies it: pair ``i`` is the coordinates ``(i, i + d/2)``
    of a head (``x``: ``(B, H, T, d)``), turned by ``p * base^(-2i/d)`` at position ``p``
    (``positions``: ``(B, T)``); angles in float64 (float32 on MPS)."""
    angle_dtype = torch.float32 if positions.device.type == "mps" else torch.float64
    inv_freq = base ** (-torch.arange(x.shape[-1] // 2, dtype=angle_dtype, device=positions.device) * 2 / x.shape[-1])
    angles = (positions.to(angle_dtype)[..., None] * inv_freq)[:, None]  # (B, 1, T, d/2)
    work = _work(x)
    cos, sin = angles.cos().to(work), angles.sin().to(work)
    x1, x2 = x.to(work).chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).to(x.dtype)


class Attention(nn.Module):
    """Self-attention with RoPE and grouped-query heads (``n_kv_heads`` key/value heads, each
    serving ``n_heads / n_kv_heads`` query heads). nGPT (Section 2.3.2): unit-row W_q, W_k, W_v,
    W_o; after RoPE ``q <- Norm(q) s_qk``, ``k <- Norm(k) s_qk`` (eq. 15, 16; with grouped heads
    ``q <- Norm(q) s_qk^2``, ``k <- Norm(k)``, the same scores) and softmax scale ``sqrt(d_k)``.
    GPT: plain projections, softmax scale ``1/sqrt(d_k)`` (eq. 12-14)."""

    def __init__(self, config: _SpherenetConfig, ngpt: bool):
        super().__init__()
        c = self.config = config
        self.ngpt, self.grouped = ngpt, c.n_kv_heads < c.n_heads
        inner, kv_inner = c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim
        self.w_q = Linear(c.d_model, inner)
        self.w_k, self.w_v = Linear(c.d_model, kv_inner), Linear(c.d_model, kv_inner)
        self.w_o = Linear(inner, c.d_model, transposed=ngpt)
        self.softmax_scale = math.sqrt(c.head_dim) if ngpt else 1 / math.sqrt(c.head_dim)
        if ngpt:
            self.s_qk = Scale(inner, c.s_qk, c.d_model)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, h * d) -> (B, h, T, d)
        return x.unflatten(-1, (-1, self.config.head_dim)).transpose(1, 2)

    def _scale_qk(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        s_qk = self.s_qk(q)
        if s_qk.numel() > 1:
            s_qk = s_qk.view(self.config.n_heads, 1, self.config.head_dim)  # per head: (H, 1, d_k)
        qk_norm = normalize if self.config.qk_norm else (lambda x: x)
        if self.grouped:
            return qk_norm(q) * (s_qk * s_qk), qk_norm(k)
        return qk_norm(q) * s_qk, qk_norm(k) * s_qk

    def forward(self, x, positions, padding: torch.Tensor | None, cache: Cache | None, layer: int) -> torch.Tensor:
        q = rotate(self._heads(self.w_q(x)), positions, self.config.rope_base)
        k = rotate(self._heads(self.w_k(x)), positions, self.config.rope_base)
        v = self._heads(self.w_v(x))
        if self.ngpt:
            q, k = self._scale_qk(q, k)
        if cache is not None:
            k, v = cache.update(k, v, layer)
        n_queries, n_keys = q.shape[-2], k.shape[-2]
        mask, is_causal = padding, False
        if self.config.causal and n_queries > 1:
            if n_queries == n_keys and padding is None:
                is_causal = True  # square: SDPA's own causal mask is right
            else:  # the queries are the last n_queries positions: query i sees keys j <= i + n_keys - n_queries
                causal = torch.ones(n_queries, n_keys, dtype=torch.bool, device=x.device).tril(n_keys - n_queries)
                mask = causal if padding is None else padding & causal
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=is_causal, scale=self.softmax_scale, enable_gqa=self.grouped
        )
        return self.w_o(out.transpose(1, 2).flatten(2))


def _activation(x: torch.Tensor, gate: torch.Tensor | None) -> torch.Tensor:
    """``x * SiLU(gate)`` (SwiGLU, eq. 19) or, without a gate, ``ReLU(x)^2``; in float32 at least."""
    work = torch.promote_types(x.dtype, torch.float32)
    if gate is None:
        return F.relu(x.to(work)).square().to(x.dtype)
    return (x.to(work) * F.silu(gate.to(work))).to(torch.promote_types(x.dtype, gate.dtype))


class MLP(nn.Module):
    """SwiGLU ``(u SiLU(v)) W_o_mlp`` with ``u = h W_u``, ``v = h W_v`` (eq. 17-19), or ``ReLU(h W_u)^2 W_o_mlp``.
    nGPT (Section 2.4.2) scales ``u <- u s_u``, ``v <- v s_v sqrt(d_model)`` (eq. 20, 21), or
    ``u <- u s_uv sqrt(d_model)`` without a gate; its W_o_mlp is stored transposed."""

    def __init__(self, config: _SpherenetConfig, ngpt: bool):
        super().__init__()
        c = config
        self.ngpt, self.gated, self.sqrt_d = ngpt, c.mlp == "swiglu", math.sqrt(c.d_model)
        self.w_u = Linear(c.d_model, c.d_mlp)
        if self.gated:
            self.w_v = Linear(c.d_model, c.d_mlp)
        self.w_o = Linear(c.d_mlp, c.d_model, transposed=ngpt)
        if ngpt and self.gated:
            self.s_u, self.s_v = Scale(c.d_mlp, c.s_u, c.d_model), Scale(c.d_mlp, c.s_v, c.d_model)
        elif ngpt:
            self.s_uv = Scale(c.d_mlp, c.s_uv, c.d_model)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        u = self.w_u(h)
        if not self.gated:
            return self.w_o(_activation(u * (self.s_uv(h) * self.sqrt_d) if self.ngpt else u, None))
        v = self.w_v(h)
        if not self.ngpt:
            return self.w_o(u * F.silu(v))  # the baseline's, in the input's dtype
        return self.w_o(_activation(u * self.s_u(h), v * (self.s_v(h) * self.sqrt_d)))


def _slerp(a: torch.Tensor, b: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    """SLERP (eq. 6), ``cos(alpha theta) a + sin(alpha theta)/sin(theta) (b - (a.b) a)`` with ``theta`` the
    angle of a, b; for antipodal a, b towards the coordinate axis least aligned with ``a``. Not normalized."""
    theta = 2 * torch.atan2((a - b).norm(dim=-1, keepdim=True), (a + b).norm(dim=-1, keepdim=True))
    u = b - (a * b).sum(-1, keepdim=True) * a  # tangent at a, ‖u‖ = sin(theta)
    limit = 1e-12 if a.dtype == torch.float64 else 1e-5
    antipodal = (u.norm(dim=-1, keepdim=True) < limit) & (theta > math.pi / 2)
    theta_safe = torch.where(antipodal, torch.zeros_like(theta), theta)
    sinc = lambda x: torch.sinc(x / math.pi)  # noqa: E731  sin(x)/x, smooth at 0
    regular = torch.cos(alpha * theta) * a + alpha * sinc(alpha * theta_safe) / sinc(theta_safe) * u
    e = torch.zeros_like(a).scatter_(-1, a.abs().argmin(dim=-1, keepdim=True), 1.0)
    w = e - (a * e).sum(-1, keepdim=True) * a
    w = w / w.norm(dim=-1, keepdim=True).clamp_min(1e-300 if a.dtype == torch.float64 else 1e-30)
    return torch.where(antipodal, torch.cos(alpha * theta) * a + torch.sin(alpha * theta) * w, regular)


def residual_update(update: str, h: torch.Tensor, h_block: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    """nGPT's step of ``h`` towards the block's output, then ``Norm``: LERP ``h + alpha (h_block - h)``
    (eq. 10, 11), SLERP (eq. 6), or the Riemannian ``h - alpha (h (h . h_block) - h_block)`` (eq. 24-26)."""
    work = _work(h, h_block, alpha)
    a, b, alpha = h.to(work), h_block.to(work), alpha.to(work)
    if update == "lerp":
        moved = a + alpha * (b - a)
    elif update == "riemannian":
        moved = a - alpha * (a * (a * b).sum(-1, keepdim=True) - b)
    else:
        moved = _slerp(a, b, alpha)
    return normalize(moved).to(h.dtype)


class NGPTBlock(nn.Module):
    """``h <- Norm(h + alpha_A (Norm(ATTN(h)) - h))``, ``h <- Norm(h + alpha_M (Norm(MLP(h)) - h))``
    (eq. 10, 11; or the update ``config.update`` names)."""

    def __init__(self, config: SpherenetNGPTConfig):
        super().__init__()
        c = self.config = config
        self.attn = Attention(c, ngpt=True)
        self.residual_attn = nn.ModuleDict({"alpha": Scale(c.d_model, c.alpha_attn, c.d_model)})
        self.mlp = MLP(c, ngpt=True)
        self.residual_mlp = nn.ModuleDict({"alpha": Scale(c.d_model, c.alpha_mlp, c.d_model)})

    def forward(self, h, positions, padding, cache, layer):
        h_attn = normalize(self.attn(h, positions, padding, cache, layer))
        h = residual_update(self.config.update, h, h_attn, self.residual_attn["alpha"](h))
        h_mlp = normalize(self.mlp(h))
        return residual_update(self.config.update, h, h_mlp, self.residual_mlp["alpha"](h))


class GPTBlock(nn.Module):
    """Pre-norm: ``h <- h + ATTN(RMSNorm(h))``, ``h <- h + MLP(RMSNorm(h))`` (eq. 4, 5)."""

    def __init__(self, config: SpherenetGPTConfig):
        super().__init__()
        self.norm_attn = nn.RMSNorm(config.d_model, eps=config.norm_eps)
        self.attn = Attention(config, ngpt=False)
        self.norm_mlp = nn.RMSNorm(config.d_model, eps=config.norm_eps)
        self.mlp = MLP(config, ngpt=False)

    def forward(self, h, positions, padding, cache, layer):
        h = h + self.attn(self.norm_attn(h), positions, padding, cache, layer)
        return h + self.mlp(self.norm_mlp(h))


# ---- The causal language models ----


class _SpherenetForCausalLM(SphereGuards, PreTrainedModel, GenerationMixin):
    """``h = E_in[ids]``, the blocks, then ``logits(h)``, with transformers' inputs: a padding
    ``attention_mask`` (each row's positions counted from its first real token, so a left-padded
    row gives the logits of the row alone), ``position_ids``, a :class:`transformers.Cache`."""

    base_model_prefix = ""
    _supports_sdpa = True
    _input_embed_layer = "embed_in"  # get_input_embeddings
    block_class: ClassVar[type]

    def __init__(self, config):
        super().__init__(config)
        c = config
        if c.d_model is None or c.n_heads is None or c.vocab_size is None or c.n_layers is None:
            raise ValueError(f"{c.model_type} config: vocab_size, n_layers, d_model and n_heads are required")
        self.embed_in = nn.Embedding(c.vocab_size, c.d_model)
        self.blocks = nn.ModuleList(self.block_class(c) for _ in range(c.n_layers))  # the subclass adds the head

    def _init_weights(self, module) -> None:
        """Nothing: the weights are the export's (transformers' generic init fits neither model)."""

    def get_output_embeddings(self):
        return self.embed_out

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        use_cache: bool | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        past_key_values: Cache | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> CausalLMOutputWithPast:
        """``input_ids`` (B, T) or ``inputs_embeds``; ``attention_mask`` (B, cached + new; 1: a real token);
        ``position_ids`` (B, T); ``cache`` (or ``past_key_values``); ``labels``; ``logits_to_keep`` (0: all)."""
        c = self.config
        self._watch_sphere()
        if past_key_values is not None and cache is not None:
            raise ValueError("pass the cache as cache= or past_key_values=, not both")
        cache = past_key_values if cache is None else cache
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of input_ids and inputs_embeds")
        if kwargs.get("output_attentions"):
            raise ValueError("output_attentions is not supported: attention runs in fused SDPA, which keeps no weights")
        use_cache = c.use_cache if use_cache is None else use_cache
        if use_cache and cache is None:
            cache = DynamicCache(config=c)
        past = 0 if cache is None else cache.get_seq_length()
        if input_ids is not None:
            if input_ids.ndim != 2 or input_ids.dtype.is_floating_point or input_ids.shape[1] < 1:
                raise ValueError(f"input_ids must be integer ids of shape (batch, seq_len), got {input_ids.shape}")
            if not _func_transform_active():  # vmap has no batching rule for the assertion
                torch._assert_async(((input_ids >= 0) & (input_ids < c.vocab_size)).all(), "token id out of vocabulary")
        elif inputs_embeds.ndim != 3 or inputs_embeds.shape[-1] != c.d_model:
            raise ValueError(f"inputs_embeds must have shape (batch, seq_len, {c.d_model}), got {inputs_embeds.shape}")
        h = self.embed_in(input_ids) if input_ids is not None else inputs_embeds
        batch, n_new = h.shape[:2]
        if past + n_new > c.max_seq_len:
            raise ValueError(f"{past} cached + {n_new} new tokens exceed max_seq_len={c.max_seq_len}")

        padding = None  # SDPA's mask (B, 1, T, K): the real keys, and each query itself (no empty row)
        if attention_mask is not None:
            if attention_mask.shape != (batch, past + n_new):
                raise ValueError(
                    f"attention_mask must have shape (batch, cached + new tokens) = {(batch, past + n_new)}, "
                    f"got {tuple(attention_mask.shape)}"
                )
            if not bool(attention_mask.all()):
                keys = torch.arange(past + n_new, device=h.device)
                padding = attention_mask.bool()[:, None, None, :] | (keys[None, :] == keys[past:, None])
        if position_ids is None and attention_mask is not None:  # counted from each row's first real token
            position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)[:, -n_new:]
        elif position_ids is None:
            position_ids = torch.arange(past, past + n_new, device=h.device)[None, :]
        elif position_ids.ndim != 2 or position_ids.shape[-1] != n_new or position_ids.shape[0] not in (1, batch):
            raise ValueError(f"position_ids must have shape (batch, {n_new}), got {tuple(position_ids.shape)}")
        if position_ids.numel() and int(position_ids.max()) >= c.max_seq_len:
            raise ValueError(f"position {int(position_ids.max())} is past the context, max_seq_len={c.max_seq_len}")

        hidden_states = [h]
        for layer, block in enumerate(self.blocks):
            h = block(h, position_ids, padding, cache, layer)
            hidden_states.append(h)
        keep = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep  # 0: all
        logits = self.logits(h[:, keep, :])
        loss = None
        if labels is not None:
            loss = self.loss_function(logits=logits, labels=labels, vocab_size=c.vocab_size, **kwargs)
        output = CausalLMOutputWithPast(
            loss=loss,
            logits=logits,
            cache=cache if use_cache else None,
            hidden_states=tuple(hidden_states) if output_hidden_states else None,
        )
        return output.to_tuple() if return_dict is False else output


class SpherenetNGPTForCausalLM(_SpherenetForCausalLM):
    """nGPT: unit-row embeddings and blocks on the sphere; logits ``z = (E_out h) s_z`` (eq. 1, 3)."""

    config_class = SpherenetNGPTConfig
    block_class = NGPTBlock

    def __init__(self, config: SpherenetNGPTConfig):
        super().__init__(config)
        self.embed_out = Linear(config.d_model, config.vocab_size)
        self.s_z = Scale(config.vocab_size, config.s_z, config.d_model)
        self.post_init()
        keep_on_sphere(self)

    def sphere_weights(self) -> dict[str, torch.Tensor]:
        """E_input, E_output and every block's attention and MLP matrices, unit rows along the
        embedding dimension (Section 2.6; W_o and W_o_mlp are stored transposed for it)."""
        return {f"{name}.weight": m.weight for name, m in self.named_modules() if isinstance(m, (nn.Embedding, Linear))}

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        s_z = self.s_z(h)
        logits = self.embed_out(h) * s_z
        return logits.to(torch.promote_types(logits.dtype, s_z.dtype))


class SpherenetGPTForCausalLM(_SpherenetForCausalLM):
    """The baseline GPT: a final RMSNorm, then untied logits ``z = E_out h`` (eq. 1)."""

    config_class = SpherenetGPTConfig
    block_class = GPTBlock

    def __init__(self, config: SpherenetGPTConfig):
        super().__init__(config)
        self.norm_out = nn.RMSNorm(config.d_model, eps=config.norm_eps)
        self.embed_out = Linear(config.d_model, config.vocab_size)
        self.post_init()

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        return self.embed_out(self.norm_out(h))


SPHERENET_HF = installed_spherenet(say_why=True)
if SPHERENET_HF is not None:  # spherenet is installed: its classes, which every spherenet tool takes
    SpherenetNGPTForCausalLM = SPHERENET_HF.SpherenetNGPTForCausalLM
    SpherenetGPTForCausalLM = SPHERENET_HF.SpherenetGPTForCausalLM
