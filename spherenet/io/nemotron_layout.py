"""The tensors of the published Normalized-Nemotron layout and the files of its directory: which
parameter of an :class:`~spherenet.models.NGPT` each tensor is, in which shape
(:func:`layout_tensors`), and the view that turns one into the other (:func:`layout_view`).
Reading is :mod:`spherenet.io.nemotron_read`'s, writing :mod:`spherenet.io.nemotron_write`'s.
"""

from __future__ import annotations

import torch

__all__ = [
    "INDEX_NAME",
    "SPECIAL_TOKENS_MAP",
    "TOKENIZER_CONFIG",
    "TOKENIZER_FILES",
    "TOKENIZER_JSON",
    "layout_tensors",
    "layout_view",
]

INDEX_NAME = "model.safetensors.index.json"
TOKENIZER_JSON = "tokenizer.json"  # spherenet.data's name of it (io/ may not import data/)
TOKENIZER_CONFIG = "tokenizer_config.json"
SPECIAL_TOKENS_MAP = "special_tokens_map.json"
#: the tokenizer's files a directory of the layout holds for transformers' AutoTokenizer
TOKENIZER_FILES = (TOKENIZER_JSON, TOKENIZER_CONFIG, SPECIAL_TOKENS_MAP)


# how a layout tensor sits in NGPT's parameter: "same" (same shape), "transposed" (the layout's
# (d, n) is stored (n, d): unit columns become unit rows), "vector" (Linear(1, n) weight (n, 1) <-> (n,))
def layout_tensors(config) -> list[tuple[str, str, str, tuple[int, ...]]]:
    """``(layout name, NGPT parameter name, how, layout shape)`` of every tensor, in the layout's
    order, for ``config``: an NGPTConfig, or anything with its size fields as attributes."""
    c = config
    q, kv, d, mlp = c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim, c.d_model, c.d_mlp
    table = [("model.embed_tokens.weight", "embed_in.weight", "same", (c.vocab_size, d))]
    for i in range(c.n_layers):
        layer, block = f"model.layers.{i}.", f"blocks.{i}."
        table += [
            (layer + "self_attn.q_proj.weight", block + "attn.w_q.weight", "same", (q, d)),
            (layer + "self_attn.k_proj.weight", block + "attn.w_k.weight", "same", (kv, d)),
            (layer + "self_attn.v_proj.weight", block + "attn.w_v.weight", "same", (kv, d)),
            (layer + "self_attn.o_proj.weight", block + "attn.w_o.weight", "transposed", (d, q)),
            (layer + "self_attn.sqk.weight", block + "attn.s_qk.param", "vector", (q, 1)),
            (layer + "attn_alpha", block + "residual_attn.alpha.param", "same", (d,)),
            (layer + "mlp.up_proj.weight", block + "mlp.w_u.weight", "same", (mlp, d)),
            (layer + "mlp.down_proj.weight", block + "mlp.w_o.weight", "transposed", (d, mlp)),
            (layer + "mlp.suv.weight", block + "mlp.s_uv.param", "vector", (mlp, 1)),
            (layer + "mlp_alpha", block + "residual_mlp.alpha.param", "same", (d,)),
        ]
    table += [
        ("lm_head.weight", "embed_out.weight", "same", (c.vocab_size, d)),
        ("sz.weight", "s_z.param", "vector", (c.vocab_size, 1)),
    ]
    return table


def layout_view(parameter: torch.Tensor, how: str) -> torch.Tensor:
    """The parameter seen in the layout's shape (a view: writing to it fills the parameter)."""
    if how == "transposed":
        return parameter.t()
    if how == "vector":
        return parameter.unsqueeze(1)
    return parameter
