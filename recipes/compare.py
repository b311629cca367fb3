"""Compare training variants on the same data and seeds: ``python -m recipes.compare``.

    python -m recipes.compare --variants gpt ngpt ngpt-slerp ngpt-riemannian --seeds 0 1 2 \\
        --out runs/compare data.source=../shared/data/tinyshakespeare/input.txt train.steps=500

Every variant is the base config (``--config``, default ``recipes/configs/default.toml``) plus
the shared overrides plus the variant's own. Built-in variants:

    gpt                   baseline GPT of the same size, AdamW (Table 3)
    ngpt (= ngpt-lerp)    nGPT, LERP update (eq. 10, 11), the paper's optimizer (RiemannianAdam,
                          Adam's moments on the raw gradient, then Norm; Section 2.6)
    ngpt-tangent          nGPT, RiemannianAdam with moments on the tangent-projected gradient
    ngpt-slerp            nGPT, SLERP update (eq. 6)
    ngpt-riemannian       nGPT, Riemannian update (eq. 24-26)
    ngpt-adam_normalize   nGPT, the paper's Adam followed by renormalization (Section 2.6)
    ngpt-row              nGPT, RiemannianAdam with geoopt's per-row second moment
    gpt-muon              GPT, torch.optim.Muon on the blocks' matrices, AdamW on the rest
    ngpt-muon             nGPT, SphericalMuon on the blocks' matrices, RiemannianAdam on the rest
    gpt-adamh             GPT, AdamH (Hyperball) on the blocks' matrices, AdamW on the rest
    gpt-muonh             GPT, MuonH (Hyperball) on the blocks' matrices, AdamW on the rest

and any ``name:key=value,key=value`` for your own (e.g. ``big:model.n_layers=8``). The size
comes from ``--size`` (tiny, cpu, small, base, 0.5b, 1b).

A fair comparison by default: each built-in variant trains at its own learning rate, the best
rate the project's studies found for that variant at that size, at the measured budget nearest
to ``train.steps`` (:data:`STUDIED_RATES`; the best rate moves with the budget), unless
``optim.lr=`` is given; a variant with no studied rate keeps the config's, and the tool says
which rate each variant gets and where it comes from. GPT's warmup (Table 3: 2000 steps) is
scaled to the run, 5% of ``train.steps`` and at most 2000, unless ``optim.warmup_steps=`` is
given; a warmup as long as the run is refused before the first run. Writes ``compare.json`` (every curve),
``compare.md`` (a table) and ``compare.png`` (validation loss against steps and tokens).

Shared overrides may stand anywhere on the command line (also after ``--seeds 0 1 2``); every
one is checked against the config before the first run. Each run is a ``recipes.train``
process; SIGTERM or Ctrl-C stops the running one (it saves a checkpoint) and then the tool
(see :mod:`recipes.subprocesses`). On a terminal a bar counts the runs done with an ETA (each
run's own output then goes to its ``train.log``); ``--no-progress`` turns it off.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

from recipes import subprocesses
from recipes.cli import prog
from recipes.progress import progress_bar
from recipes.train import DEFAULT_CONFIG, resolve_config
from spherenet.train.config import ConfigError, load_config, resolved

ROOT = Path(__file__).resolve().parents[1]  # where ``python -m recipes.train`` is importable from

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
}


# The best learning rate of each arm, by size and budget (steps of 4096 tokens), from the bracketed
# sweeps (seed 0) of the studies on the default corpus at context 256: the scaling study (100
# steps; benchmarks/results/scaling/default_corpus/scaling.md, where its "ngpt" rows are
# ngpt-tangent) and the budget study (100, 400, 1600 steps; benchmarks/results/budget/
# default_corpus/budget.md). ngpt and ngpt-adam_normalize are one optimizer (equal to float rounding).
STUDIED_RATES: dict[str, dict[str, dict[int, float]]] = {
    "gpt": {"tiny": {100: 1e-2, 400: 3e-3, 1600: 3e-3}, "cpu": {100: 1e-2}},
    "ngpt": {"tiny": {100: 3e-2, 400: 3e-2, 1600: 3e-2}, "cpu": {100: 3e-2}},
    "ngpt-tangent": {"tiny": {100: 1e-1}, "cpu": {100: 3e-2}},
    "gpt-muon": {"tiny": {100: 3e-2, 400: 3e-2, 1600: 1e-2}, "cpu": {100: 3e-2}},
    "ngpt-muon": {"tiny": {100: 3e-2}, "cpu": {100: 3e-2}},
    # optim.matrix_lr (the hidden matrices' angle per step), with optim.lr at GPT's rate above
    "gpt-adamh": {"tiny": {100: 1e-1, 400: 1e-1, 1600: 3e-2}, "cpu": {100: 3e-2}},
    "gpt-muonh": {"tiny": {100: 3e-1, 400: 1e-1, 1600: 3e-2}, "cpu": {100: 1e-1}},
}
# Variants that take another arm's rates: the same optimizer (the residual update does not move
# the best rate: the scaling study found one rate for LERP, SLERP and Riemannian at tiny@256).
RATE_OF = {"ngpt-lerp": "ngpt", "ngpt-adam_normalize": "ngpt", "ngpt-slerp": "ngpt", "ngpt-riemannian": "ngpt"}
# Variants whose studied rate is optim.matrix_lr (the hidden matrices' angle per step); their
# AdamW part takes the named arm's studied rate as optim.lr, as in the studies.
MATRIX_RATE_OF = {"gpt-adamh": "gpt", "gpt-muonh": "gpt"}
GPT_WARMUP_FRACTION, GPT_WARMUP_MAX = 0.05, 2000


def studied_rate(variant: str, size: str, steps: int) -> tuple[float, str] | None:
    """The studies' best rate for a built-in variant at ``size``, at the measured budget nearest
    to ``steps`` (in log steps), and a sentence saying where it comes from; None without one."""
    arm = RATE_OF.get(variant, variant)
    by_steps = STUDIED_RATES.get(arm, {}).get(size)
    if not by_steps:
        return None
    budget = min(by_steps, key=lambda b: (abs(math.log(b / steps)), b))
    via = f"{arm}'s, " if arm != variant else ""
    return by_steps[budget], f"{via}best bracketed rate of the studies at {size}, {budget} steps"


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


def check_warmups(config: str | Path, variants: list[tuple[str, list[str]]], shared: list[str]) -> None:
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
    return spec, [o.format(size=size) for o in BUILTIN[spec]]


# ``section.key=value`` (or ``model.scaling.field=value``); a variant spec (``name:key=value``)
# or a flag does not match.
OVERRIDE = re.compile(r"^[A-Za-z_]\w*\.[A-Za-z_]\w*(\.[A-Za-z_]\w*)?=")


def add_override_argument(parser: argparse.ArgumentParser, help: str) -> None:
    parser.add_argument("overrides", nargs="*", metavar="section.key=value", help=help)


def parse_args_with_overrides(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """``parser.parse_args`` for a tool that takes ``recipes.train`` overrides (a parser with
    :func:`add_override_argument`): every ``section.key=value`` is taken out first, wherever it
    stands (a list option such as ``--seeds 0 1`` would otherwise swallow it), and appended,
    in order, to ``args.overrides``."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args([a for a in argv if not OVERRIDE.match(a)])
    args.overrides = [*args.overrides, *(a for a in argv if OVERRIDE.match(a))]
    return args


def check_overrides(config: str | Path, *override_lists: list[str]) -> None:
    """Load ``config`` with each list of overrides as ``recipes.train`` will, so that a bad key
    or value stops the tool before its first run, with the trainer's message (exit status 2)."""
    for overrides in override_lists:
        try:
            load_config(config, overrides)
        except ConfigError as exc:
            print(f"error: {exc}", file=sys.stderr, flush=True)
            raise SystemExit(2) from None


def train_command(config: str | Path, overrides: list[str]) -> list[str]:
    """The ``recipes.train`` command line of one run."""
    return [sys.executable, "-m", "recipes.train", "--config", str(config), *overrides]


def train_env(**extra: str) -> dict[str, str]:
    """The environment of a training child: ours, with this checkout first on PYTHONPATH."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return dict(os.environ, PYTHONPATH=path, **extra)


def finished(run_dir: Path) -> bool:
    """The run's metrics end with its "done" event."""
    metrics = run_dir / "metrics.jsonl"
    return metrics.is_file() and '"event": "done"' in metrics.read_text()


def read_curve(run_dir: Path) -> dict:
    steps, vals, tokens, train = [], [], [], []
    per_token = None
    with (run_dir / "metrics.jsonl").open() as f:
        for line in f:
            r = json.loads(line)
            if "val_loss" in r and "step" in r and "tokens" in r:
                steps.append(r["step"])
                vals.append(r["val_loss"])
                tokens.append(r["tokens"])
            if "loss" in r and r.get("loss") is not None:
                train.append((r["step"], r["loss"]))
            if r.get("event") == "done":
                per_token = r.get("sphere_norm_error")
    return {"steps": steps, "val_loss": vals, "tokens": tokens, "train": train, "sphere_norm_error": per_token}


def steps_to_reach(curve: dict, target: float) -> float:
    """First evaluated step whose validation loss is <= ``target`` (inf when never)."""
    for s, v in zip(curve["steps"], curve["val_loss"]):
        if v is not None and v <= target:
            return s
    return math.inf


def summarize(results: dict[str, dict[int, dict]], baseline: str | None) -> tuple[list[dict], float | None]:
    """Per variant: best and final validation loss (mean, std over seeds) and, paired by seed
    against the baseline, the steps the variant needs to reach that seed's baseline best
    validation loss, and the speedup ``baseline steps / variant steps`` (mean, std over the
    seeds where the variant reaches it). The returned target is the mean of the per-seed
    targets, for display."""
    base = results.get(baseline) if baseline else None
    targets = {seed: min(c["val_loss"]) for seed, c in base.items()} if base else {}
    rows = []
    for name, by_seed in results.items():
        best = [min(c["val_loss"]) for c in by_seed.values()]
        final = [c["val_loss"][-1] for c in by_seed.values()]
        row = {
            "variant": name,
            "seeds": len(by_seed),
            "best_val": statistics.mean(best),
            "best_val_std": statistics.stdev(best) if len(best) > 1 else 0.0,
            "final_val": statistics.mean(final),
            "final_val_std": statistics.stdev(final) if len(final) > 1 else 0.0,
        }
        paired = [seed for seed in by_seed if seed in targets]
        if paired:
            reach = [steps_to_reach(by_seed[seed], targets[seed]) for seed in paired]
            base_steps = [steps_to_reach(base[seed], targets[seed]) for seed in paired]
            ratios = [b / r for b, r in zip(base_steps, reach) if math.isfinite(r)]
            row["steps_to_target"] = reach
            row["reached"] = f"{len(ratios)}/{len(paired)}"
            if ratios:
                row["speedup_vs_baseline"] = statistics.mean(ratios)
                row["speedup_std"] = statistics.stdev(ratios) if len(ratios) > 1 else 0.0
        rows.append(row)
    return rows, (statistics.mean(targets.values()) if targets else None)


def write_table(rows: list[dict], target: float | None, baseline: str | None, path: Path, notes=()) -> str:
    lines = [
        "| variant | seeds | best val loss | final val loss | steps to baseline's best (per seed) | reached | speedup (x) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        reach = r.get("steps_to_target")
        reach_s = ", ".join("never" if math.isinf(x) else str(int(x)) for x in reach) if reach else "-"
        speed = f"{r['speedup_vs_baseline']:.2f} ± {r['speedup_std']:.2f}" if "speedup_vs_baseline" in r else "-"
        lines.append(
            f"| {r['variant']} | {r['seeds']} | {r['best_val']:.4f} ± {r['best_val_std']:.4f} | "
            f"{r['final_val']:.4f} ± {r['final_val_std']:.4f} | {reach_s} | {r.get('reached', '-')} | {speed} |"
        )
    if target is not None:
        lines.append(
            f"\nTarget, per seed: that seed's {baseline} best validation loss (mean over seeds {target:.4f}); "
            f"speedup = {baseline}'s steps to it / the variant's, over the seeds that reach it."
        )
    if notes:
        lines.append("\nLearning rates: " + "; ".join(notes) + ".")
    text = "\n".join(lines) + "\n"
    path.write_text(text)
    return text


def plot(results: dict[str, dict[int, dict]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4), dpi=80)
    for i, (name, by_seed) in enumerate(results.items()):
        color = f"C{i}"
        for j, c in enumerate(by_seed.values()):
            label = name if j == 0 else None
            axes[0].plot(c["steps"], c["val_loss"], color=color, alpha=0.8, label=label)
            axes[1].plot([t / 1e6 for t in c["tokens"]], c["val_loss"], color=color, alpha=0.8, label=label)
    axes[0].set_xlabel("step")
    axes[1].set_xlabel("tokens (millions)")
    for ax in axes:
        ax.set_ylabel("validation loss")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def run_variants(args: argparse.Namespace, variants: list[tuple[str, list[str]]], out: Path) -> dict | int:
    """Every variant and seed as a ``recipes.train`` process, one after the other: the curves,
    or the exit status of the first run that failed. With a progress bar, each run's output
    goes to its ``train.log`` instead of the terminal."""
    results: dict[str, dict[int, dict]] = {name: {} for name, _ in variants}
    jobs = [(name, extra, seed) for name, extra in variants for seed in args.seeds]
    reused = {(name, seed) for name, _, seed in jobs if args.reuse and finished(out / name / f"seed{seed}")}
    bar = progress_bar(len(jobs), "runs", args.progress, initial=len(reused))
    try:
        for name, extra, seed in jobs:
            run_dir = out / name / f"seed{seed}"
            if (name, seed) not in reused:
                (run_dir / "metrics.jsonl").unlink(missing_ok=True)  # a fresh curve, not appended to an old one
                overrides = [*args.overrides, *extra, f"train.seed={seed}", f"train.out_dir={run_dir}",
                             "train.sample_tokens=0", "train.progress=false"]  # fmt: skip  # options beside their values
                command = [*train_command(args.config, overrides), "--overwrite"]  # a rerun starts afresh
                if bar is None:
                    print(f"== {name} seed {seed}", flush=True)
                    rc = subprocesses.run(command, env=train_env())
                else:
                    bar.set_postfix_str(f"{name} seed {seed}")
                    run_dir.mkdir(parents=True, exist_ok=True)
                    with (run_dir / "train.log").open("w") as log:
                        rc = subprocesses.run(command, env=train_env(), stdout=log, stderr=subprocess.STDOUT)
                    bar.update(1)
                if rc != 0:
                    where = f", see {run_dir / 'train.log'}" if bar is not None else ""
                    message = f"error: variant {name} seed {seed} failed (exit {rc}{where})"
                    (bar.write if bar is not None else print)(message, file=sys.stderr)
                    return rc
            results[name][seed] = read_curve(run_dir)
    finally:
        if bar is not None:
            bar.close()
    return results


def main(argv: list[str] | None = None) -> int:
    """Entry point: a bad config, variant or override is one ``error:`` line, exit code 2."""
    try:
        return compare(argv)
    except SystemExit as exc:
        if isinstance(exc.code, str):
            print(exc.code, file=sys.stderr, flush=True)
            return 2
        raise


def compare(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=prog("recipes.compare"), description=__doc__.split("\n\n")[0])
    p.add_argument("--variants", nargs="+", default=["gpt", "ngpt"])
    p.add_argument("--seeds", nargs="+", type=int, default=[0])
    p.add_argument("--size", default="cpu", help="preset size for built-in variants (tiny, cpu, small, base, 0.5b, 1b)")
    p.add_argument(
        "--config", default=str(DEFAULT_CONFIG), help="a TOML file or a shipped config's name (default: default)"
    )
    p.add_argument("--out", default="runs/compare")
    p.add_argument("--baseline", default="gpt", help="variant whose best val loss is the target (default gpt)")
    p.add_argument("--reuse", action="store_true", help="skip runs whose metrics already end with 'done'")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar (runs done / ETA)")
    add_override_argument(p, "applied to every variant")
    args = parse_args_with_overrides(p, argv)

    try:
        args.config = str(resolve_config(args.config))
    except ConfigError as exc:
        raise SystemExit(f"error: {exc}") from None
    out = Path(args.out)
    variants = [variant_overrides(v, args.size) for v in args.variants]
    names = [n for n, _ in variants]
    if len(set(names)) != len(names):
        raise SystemExit(f"error: duplicate variant names in {names}")
    check_overrides(args.config, *([*args.overrides, *extra] for _, extra in variants))
    steps = load_config(args.config, args.overrides).train.steps
    variants, notes = fair_defaults(variants, args.variants, args.size, args.overrides, steps)
    check_overrides(args.config, *([*args.overrides, *extra] for _, extra in variants))
    check_warmups(args.config, variants, args.overrides)
    for note in notes:
        print(note, flush=True)
    out.mkdir(parents=True, exist_ok=True)
    with subprocesses.stop_children_on_signals():
        results = run_variants(args, variants, out)
    if isinstance(results, int):
        return results  # a run failed
    baseline = args.baseline if args.baseline in results else None
    rows, target = summarize(results, baseline)
    (out / "compare.json").write_text(json.dumps({"rows": rows, "target": target, "curves": results}, indent=1))
    table = write_table(rows, target, baseline, out / "compare.md", notes)
    plot(results, out / "compare.png", f"{', '.join(names)}; seeds {args.seeds}")
    print(table)
    print(f"wrote {out / 'compare.md'}, {out / 'compare.png'}, {out / 'compare.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
