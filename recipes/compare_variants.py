"""The variants ``recipes.compare`` knows by name, and the learning rate and warmup each gets.

Every built-in variant is a list of ``recipes.train`` overrides (:data:`BUILTIN`), described in
one line each (:data:`DESCRIPTIONS`, which ``--help`` lists). Each trains at the best rate the
project's studies found for it (:data:`STUDIED_RATES`), at the budget nearest to the run's; the
studies trained :data:`STUDIED_TOKENS_PER_STEP` tokens a step at context :data:`STUDIED_CONTEXT`,
and :func:`rate_context_note` says so when a run trains otherwise.
"""

from __future__ import annotations

import math

from spherenet.models.presets import preset_config
from spherenet.train.config import load_config, resolved

BUILTIN = {
    "gpt": ["model.preset=gpt-{size}", "optim.method=adamw"],
    "ngpt": [
        "model.preset=ngpt-{size}",
        "model.update=lerp",
        "optim.method=riemannian_adam",
        "optim.gradient=euclidean",
    ],
    "ngpt-lerp": [
        "model.preset=ngpt-{size}",
        "model.update=lerp",
        "optim.method=riemannian_adam",
        "optim.gradient=euclidean",
    ],
    "ngpt-tangent": [
        "model.preset=ngpt-{size}",
        "model.update=lerp",
        "optim.method=riemannian_adam",
        "optim.gradient=riemannian",
    ],
    "ngpt-slerp": ["model.preset=ngpt-{size}", "model.update=slerp", "optim.method=riemannian_adam"],
    "ngpt-riemannian": ["model.preset=ngpt-{size}", "model.update=riemannian", "optim.method=riemannian_adam"],
    "ngpt-adam_normalize": ["model.preset=ngpt-{size}", "model.update=lerp", "optim.method=adam_normalize"],
    "ngpt-row": ["model.preset=ngpt-{size}", "optim.method=riemannian_adam", "optim.second_moment=row"],
    "gpt-muon": ["model.preset=gpt-{size}", "optim.method=muon"],
    "ngpt-muon": ["model.preset=ngpt-{size}", "model.update=lerp", "optim.method=spherical_muon"],
    "gpt-adamh": ["model.preset=gpt-{size}", "optim.method=adamh"],
    "gpt-muonh": ["model.preset=gpt-{size}", "optim.method=muonh"],
    "ngpt-gqa": [
        "model.preset=ngpt-{size}",
        "model.update=lerp",
        "optim.method=riemannian_adam",
        "optim.gradient=euclidean",
        "model.n_kv_heads={half_heads}",
    ],
    "ngpt-relu2": [
        "model.preset=ngpt-{size}",
        "model.update=lerp",
        "optim.method=riemannian_adam",
        "optim.gradient=euclidean",
        "model.mlp=relu2",
        "model.d_mlp={relu2_d_mlp}",
    ],
}

DESCRIPTIONS = {
    "gpt": "baseline GPT of the same size, AdamW (Table 3)",
    "ngpt": "nGPT, LERP update (eq. 10, 11), the paper's optimizer (Adam, then Norm; Section 2.6)",
    "ngpt-lerp": "the same as ngpt",
    "ngpt-tangent": "nGPT, RiemannianAdam with moments on the tangent-projected gradient",
    "ngpt-slerp": "nGPT, SLERP update (eq. 6)",
    "ngpt-riemannian": "nGPT, Riemannian update (eq. 24-26)",
    "ngpt-adam_normalize": "nGPT, the paper's Adam followed by renormalization (Section 2.6)",
    "ngpt-row": "nGPT, RiemannianAdam with geoopt's per-row second moment",
    "gpt-muon": "GPT, torch.optim.Muon on the blocks' matrices, AdamW on the rest",
    "ngpt-muon": "nGPT, SphericalMuon on the blocks' matrices, RiemannianAdam on the rest",
    "gpt-adamh": "GPT, AdamH (Hyperball) on the blocks' matrices, AdamW on the rest",
    "gpt-muonh": "GPT, MuonH (Hyperball) on the blocks' matrices, AdamW on the rest",
    "ngpt-gqa": "nGPT with grouped-query attention: n_heads / 2 key/value heads (s_qk squared on the queries)",
    "ngpt-relu2": "nGPT with the squared-ReLU MLP (no gate, s_uv) at 1.5x d_mlp: the SwiGLU MLP's weight count",
}

# The tokens a step and the context of every study run behind STUDIED_RATES (16 sequences of 256).
STUDIED_TOKENS_PER_STEP, STUDIED_CONTEXT = 4096, 256

# The best learning rate of each arm, by size and budget (steps of 4096 tokens at context 256),
# as the studies on the default corpus picked it (a bracketed sweep on seed 0; a runner-up within
# the tie margin run on every seed, the better mean picked): the budget study at tiny (100, 400,
# 1600 steps; benchmarks/results/budget/default_corpus/steps*/picks.jsonl) and at cpu (677 steps;
# benchmarks/results/budget/default_corpus_cpu; nGPT at 2707 too), and the scaling study at cpu, 100 steps
# (benchmarks/results/scaling/default_corpus/scaling.md, where its "ngpt" rows are ngpt-tangent).
# ngpt and ngpt-adam_normalize are one optimizer (equal to float rounding).
STUDIED_RATES: dict[str, dict[str, dict[int, float]]] = {
    "gpt": {"tiny": {100: 1e-2, 400: 3e-3, 1600: 1e-2}, "cpu": {100: 1e-2, 677: 3e-3}},
    "ngpt": {"tiny": {100: 3e-2, 400: 3e-2, 1600: 1e-2}, "cpu": {100: 3e-2, 677: 1e-2, 2707: 1e-2}},
    "ngpt-tangent": {"tiny": {100: 3e-2, 400: 3e-2, 1600: 1e-2}, "cpu": {100: 3e-2}},
    "gpt-muon": {"tiny": {100: 3e-2, 400: 3e-2, 1600: 1e-2}, "cpu": {100: 3e-2}},
    "ngpt-muon": {"tiny": {100: 3e-2}, "cpu": {100: 3e-2}},
    # optim.matrix_lr (the hidden matrices' angle per step), with optim.lr at GPT's rate above
    "gpt-adamh": {"tiny": {100: 1e-1, 400: 1e-1, 1600: 3e-2}, "cpu": {100: 3e-2}},
    "gpt-muonh": {"tiny": {100: 3e-1, 400: 1e-1, 1600: 3e-2}, "cpu": {100: 1e-1}},
}
# Variants that take another arm's rates: the same optimizer (the residual update does not move
# the best rate: the budget study picked one rate for LERP, SLERP and Riemannian at tiny@256 at
# every budget).
# The model options (ngpt-gqa, ngpt-relu2) take ngpt's rates too: not swept for them.
RATE_OF = {
    "ngpt-lerp": "ngpt",
    "ngpt-adam_normalize": "ngpt",
    "ngpt-slerp": "ngpt",
    "ngpt-riemannian": "ngpt",
    "ngpt-gqa": "ngpt",
    "ngpt-relu2": "ngpt",
}
# Variants whose studied rate is optim.matrix_lr (the hidden matrices' angle per step); their
# AdamW part takes the named arm's studied rate as optim.lr, as in the studies.
MATRIX_RATE_OF = {"gpt-adamh": "gpt", "gpt-muonh": "gpt"}
GPT_WARMUP_FRACTION, GPT_WARMUP_MAX = 0.05, 2000


def variants_help() -> str:
    """The built-in variants, one line each, for ``--help``."""
    width = max(map(len, BUILTIN)) + 2
    lines = [f"  {name:<{width}}{DESCRIPTIONS[name]}" for name in BUILTIN]
    own = f"  {'name:key=value,...':<{width}}your own: the config plus these overrides"
    return "built-in variants (--variants):\n" + "\n".join([*lines, own])


def studied_rate(variant: str, size: str, steps: int) -> tuple[float, str] | None:
    """The studies' best rate for a built-in variant at ``size``, at the measured budget nearest
    to ``steps`` (in log steps), and a sentence saying where it comes from; None without one."""
    arm = RATE_OF.get(variant, variant)
    by_steps = STUDIED_RATES.get(arm, {}).get(size)
    if not by_steps:
        return None
    budget = min(by_steps, key=lambda b: (abs(math.log(b / steps)), b))
    via = f"{arm}'s, " if arm != variant else ""
    where = f"{budget} steps of {STUDIED_TOKENS_PER_STEP:,} tokens at context {STUDIED_CONTEXT}"
    return by_steps[budget], f"{via}best bracketed rate of the studies at {size}, {where}"


def fair_defaults(variants: list[tuple[str, list[str]]], specs: list[str], size: str, shared: list[str], steps: int):
    """Each built-in variant's overrides with its studied rate and, for GPT, a warmup scaled to
    ``steps``, unless the shared overrides (or a custom variant's own) set them; and one line per
    variant saying what it got."""
    given = {o.split("=", 1)[0] for o in shared}
    out, notes = [], []
    for (name, extra), spec in zip(variants, specs):
        own = {o.split("=", 1)[0] for o in extra}
        extra = list(extra)
        builtin = ":" not in spec
        if builtin and name in MATRIX_RATE_OF:
            notes.append(_matrix_rate_defaults(name, size, steps, given | own, extra))
        elif "optim.lr" in given | own:
            notes.append(f"{name}: lr from the command line")
        elif builtin and (rate := studied_rate(name, size, steps)) is not None:
            extra.append(f"optim.lr={rate[0]:g}")
            notes.append(f"{name}: lr {rate[0]:g} ({rate[1]})")
        else:
            notes.append(f"{name}: lr of the config (no studied rate for {name} at size {size})")
        if builtin and name.startswith("gpt") and "optim.warmup_steps" not in given | own:
            warmup = min(GPT_WARMUP_MAX, max(1, round(GPT_WARMUP_FRACTION * steps)))
            extra.append(f"optim.warmup_steps={warmup}")
            notes[-1] += f"; warmup {warmup} steps (5% of {steps}, at most {GPT_WARMUP_MAX})"
        out.append((name, extra))
    return out, notes


def _matrix_rate_defaults(name: str, size: str, steps: int, given: set[str], extra: list[str]) -> str:
    """A Hyperball variant's two rates (appended to ``extra`` unless given): ``optim.lr`` (its
    AdamW part) at the base arm's studied rate, ``optim.matrix_lr`` at its own; the note says so."""
    parts = []
    for key, arm in (("optim.lr", MATRIX_RATE_OF[name]), ("optim.matrix_lr", name)):
        label = "AdamW lr" if key == "optim.lr" else "matrix_lr"
        if key in given:
            parts.append(f"{label} from the command line")
        elif (rate := studied_rate(arm, size, steps)) is not None:
            extra.append(f"{key}={rate[0]:g}")
            via = f"{arm}'s " if arm != name else ""
            parts.append(f"{label} {rate[0]:g} ({via}{rate[1]})")
        else:
            parts.append(f"{label} of the config (no studied rate for {arm} at size {size})")
    return f"{name}: " + "; ".join(parts)


def rate_context_note(
    config, variants: list[tuple[str, list[str]]], shared: list[str], studied: set[str]
) -> str | None:
    """A note when a variant that took a studied rate (``studied``: their names) trains another
    number of tokens a step or another context than the studies did; None when all match."""
    differ = {}
    for name, extra in variants:
        if name not in studied:
            continue
        cfg = load_config(config, [*shared, *extra])
        context = cfg.train.block_size or cfg.model.overrides.get("max_seq_len")
        context = context or preset_config(cfg.model.preset).max_seq_len
        tokens = cfg.train.batch_size * context
        if (tokens, context) != (STUDIED_TOKENS_PER_STEP, STUDIED_CONTEXT):
            differ.setdefault((tokens, context, cfg.train.batch_size), []).append(name)
    if not differ:
        return None
    runs = "; ".join(
        f"{', '.join(names)} train{'s' if len(names) == 1 else ''} {tokens:,} tokens a step at context {context} "
        f"({batch} sequences)"
        for (tokens, context, batch), names in differ.items()
    )
    return (
        f"note: the studied rates were found at {STUDIED_TOKENS_PER_STEP:,} tokens a step at context "
        f"{STUDIED_CONTEXT} ({STUDIED_TOKENS_PER_STEP // STUDIED_CONTEXT} sequences); {runs}: the best rate may "
        f"differ (set train.batch_size and model.max_seq_len to match the studies, or optim.lr= to choose)"
    )


def check_warmups(config, variants: list[tuple[str, list[str]]], shared: list[str]) -> None:
    """A warmup as long as the run is refused before the first run, in the CLI's spelling."""
    for name, extra in variants:
        cfg = load_config(config, [*shared, *extra])
        warmup = resolved(cfg).optim.warmup_steps  # unset: the method's default (GPT's: GPT_WARMUP_MAX)
        if warmup >= cfg.train.steps:
            raise SystemExit(
                f"error: variant {name}: optim.warmup_steps={warmup} must be < train.steps={cfg.train.steps}; "
                f"pass optim.warmup_steps=N with N < {cfg.train.steps}"
            )


def variant_overrides(spec: str, size: str) -> tuple[str, list[str]]:
    """``"ngpt-slerp"`` or ``"name:key=value,key=value"`` -> (name, overrides)."""
    if ":" in spec:
        name, _, rest = spec.partition(":")
        items = [kv for kv in rest.split(",") if kv]
        if not name or not items or any("=" not in kv for kv in items):
            raise SystemExit(f"error: variant {spec!r} must be name:section.key=value[,section.key=value...]")
        return name, items
    if spec not in BUILTIN:
        raise SystemExit(f"error: unknown variant {spec!r} (built-in: {', '.join(BUILTIN)}; or name:key=value,...)")
    overrides = BUILTIN[spec]
    fields = {"size": size}
    if any("{half_heads}" in o or "{relu2_d_mlp}" in o for o in overrides):
        fields.update(_shape_fields(size))
    return spec, [o.format(**fields) for o in overrides]


def _shape_fields(size: str) -> dict[str, int]:
    """What the model-option variants' overrides name: half the preset's heads (ngpt-gqa) and
    1.5 times its d_mlp (ngpt-relu2: two matrices of d x 1.5 d_mlp hold as many weights as
    SwiGLU's three of d x d_mlp)."""
    try:
        config = preset_config(f"ngpt-{size}")
    except ValueError as exc:
        raise SystemExit(f"error: --size {size!r}: {exc}") from None
    return {"half_heads": max(1, config.n_heads // 2), "relu2_d_mlp": 3 * config.d_mlp // 2}
