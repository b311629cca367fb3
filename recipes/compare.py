"""Compare training variants on the same data and seeds: ``python -m recipes.compare``.

    python -m recipes.compare --variants gpt ngpt ngpt-slerp ngpt-riemannian --seeds 0 1 2 \\
        --size tiny --out runs/compare train.steps=500

Every variant is the base config (``--config``, default ``recipes/configs/default.toml``, which
trains on the embedded default corpus) plus the shared overrides plus the variant's own: a
built-in one (``--help`` lists them, one line each; :mod:`recipes.compare_variants`) or any
``name:key=value,key=value`` of your own (e.g. ``big:model.n_layers=8``). The size comes from
``--size`` (tiny, cpu, small, base, 0.5b, 1b).

A fair comparison by default: each built-in variant trains at its own learning rate, the best
rate the project's studies found for that variant at that size, at the measured budget nearest
to ``train.steps`` (the best rate moves with the budget), unless ``optim.lr=`` is given; a
variant with no studied rate keeps the config's, and the tool says which rate each variant gets
and where it comes from. The studies trained 4,096 tokens a step at context 256; the tool says
so when a run trains otherwise. GPT's warmup (Table 3: 2000 steps) is scaled to the run, 5% of
``train.steps`` and at most 2000, unless ``optim.warmup_steps=`` is given; a warmup as long as
the run is refused before the first run.

Every run validates at least 10 times, and at its last step, so that each curve can be drawn
(``train.eval_every`` set to a tenth of ``train.steps`` where the config validates less often),
unless ``train.eval_every=`` is given; a curve of 3 points or fewer is flagged in the table and
on stdout. Writes ``compare.json`` (every curve), ``compare.md`` (a table) and ``compare.png``
(validation loss against steps and tokens; these in :mod:`recipes.compare_results`).

Shared overrides may stand anywhere on the command line (also after ``--seeds 0 1 2``); every
one, and every data path (``data.source``, a tokenizer file, ``train.init_from``), is checked
before the first run. Each run is a ``recipes.train`` process; SIGTERM or Ctrl-C stops the
running one (it saves a checkpoint) and then the tool (see :mod:`recipes.subprocesses`). On a
terminal a bar counts the runs done with an ETA (each run's own output then goes to its
``train.log``); ``--no-progress`` turns it off.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

from recipes import subprocesses
from recipes.cli import prog
from recipes.compare_results import (  # noqa: F401 - figure: recipes.compare's name too
    FEW_POINTS,
    MIN_VALIDATIONS,
    few_point_runs,
    few_points_advice,
    figure,
    finished,
    plot,
    read_curve,
    steps_to_reach,
    summarize,
    validation_points,
    write_table,
)
from recipes.compare_variants import (
    BUILTIN,
    check_warmups,
    fair_defaults,
    rate_context_note,
    variant_overrides,
    variants_help,
)
from recipes.progress import progress_bar
from recipes.run_data import source_kind
from recipes.train import DEFAULT_CONFIG, resolve_config
from spherenet.data import DataError, resolve_source
from spherenet.train.config import ConfigError, load_config

__all__ = [  # the studies name built-in variants through this module
    "BUILTIN",
    "add_override_argument",
    "check_data_paths",
    "check_overrides",
    "finished",
    "main",
    "parse_args_with_overrides",
    "read_curve",
    "steps_to_reach",
    "summarize",
    "train_env",
    "variant_overrides",
]

ROOT = Path(__file__).resolve().parents[1]  # where ``python -m recipes.train`` is importable from
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*$")  # owner/name, as recipes.train reads init_from

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


def validation_defaults(config: str | Path, variants: list[tuple[str, list[str]]], shared: list[str]):
    """Each variant's overrides with ``train.eval_every`` set so that the run validates at least
    :data:`MIN_VALIDATIONS` times (``recipes.train`` also validates at the last step), unless the
    shared overrides or the variant's own set it or the config already validates that often; and
    one line per distinct outcome: how often each variant validates, and a warning with what to
    do for one given so few points that its curve cannot be read."""
    given = {o.split("=", 1)[0] for o in shared}
    out, lines = [], {}
    for name, extra in variants:
        cfg = load_config(config, [*shared, *extra])
        steps, every = cfg.train.steps, cfg.train.eval_every
        chosen = "train.eval_every" in given | {o.split("=", 1)[0] for o in extra}
        if not chosen and every > max(1, steps // MIN_VALIDATIONS):
            every = max(1, steps // MIN_VALIDATIONS)
            extra = [*extra, f"train.eval_every={every}"]
        points = validation_points(steps, every)
        if points <= FEW_POINTS:
            line = f"warning: {few_points_advice(points, steps)}"
        else:
            source = "train.eval_every from the command line" if chosen else "train.eval_every= to choose"
            line = f"validation every {every} steps and at step {steps}: {points} points a run ({source})"
        lines.setdefault(line, []).append(name)
        out.append((name, extra))
    return out, [f"{', '.join(names)}: {line}" for line, names in lines.items()]


def check_data_paths(config: str | Path, variants: list[tuple[str, list[str]]], shared: list[str]) -> None:
    """Every data path a run will read (``data.source``, a tokenizer file in ``data.tokenizer``,
    ``train.init_from``) as the shared overrides and each variant's set it, checked before the
    first run: a missing or unreadable one is one ``error:`` line (exit status 2)."""
    seen = set()
    for name, extra in [(None, []), *variants]:
        cfg = load_config(config, [*shared, *extra])
        for key, value in (
            ("data.source", cfg.data.source),
            ("data.tokenizer", cfg.data.tokenizer),
            ("train.init_from", cfg.train.init_from),
        ):
            checked = (key, value, cfg.data.format if key == "data.source" else None)  # the format reads the file
            if checked in seen:
                continue
            seen.add(checked)
            problem = _data_path_problem(key, value, cfg)
            if problem is not None:
                where = f"variant {name}: " if name is not None else ""
                raise SystemExit(f"error: {where}{key}={value}: {problem}")


def _data_path_problem(key: str, value: str, cfg) -> str | None:
    """What is wrong with one data path, the way ``recipes.train`` will read it; None when sound."""
    if key == "data.source":
        try:
            resolve_source(value, kind=source_kind(cfg), text_field=cfg.data.text_field, text_unit=cfg.data.text_unit)
        except DataError as exc:
            return str(exc)
        return None
    if key == "data.tokenizer":
        kind, _, arg = value.partition(":")
        path = Path(arg).expanduser()
        local = arg.startswith((".", "/", "~")) or arg.endswith(".json")  # else a vocabulary size or Hub id
        if kind in ("bpe", "hf") and local and not path.exists():
            return f"no tokenizer file {path}"
        return None
    path = Path(value).expanduser()
    if value and not path.exists() and (value.startswith((".", "/", "~")) or not HUB_ID.match(value)):
        return f"no run directory, checkpoint or exported model at {path} (and it is not a Hub id like 'owner/name')"
    return None


def train_command(config: str | Path, overrides: list[str]) -> list[str]:
    """The ``recipes.train`` command line of one run."""
    return [sys.executable, "-m", "recipes.train", "--config", str(config), *overrides]


def train_env(**extra: str) -> dict[str, str]:
    """The environment of a training child: ours, with this checkout first on PYTHONPATH."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return dict(os.environ, PYTHONPATH=path, **extra)


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
    p = argparse.ArgumentParser(
        prog=prog("recipes.compare"),
        description=__doc__.split("\n\n")[0],
        epilog=variants_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--variants", nargs="+", default=["gpt", "ngpt"], help="built-in names (below) or name:key=value,..."
    )
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
    chosen, notes = fair_defaults(variants, args.variants, args.size, args.overrides, steps)
    studied = {
        name
        for (name, extra), (_, before) in zip(chosen, variants)
        if any(o.startswith(("optim.lr=", "optim.matrix_lr=")) for o in extra[len(before) :])
    }
    variants, validations = validation_defaults(args.config, chosen, args.overrides)
    check_overrides(args.config, *([*args.overrides, *extra] for _, extra in variants))
    check_warmups(args.config, variants, args.overrides)
    check_data_paths(args.config, variants, args.overrides)
    context_note = rate_context_note(args.config, variants, args.overrides, studied)
    remarks = [context_note] if context_note else []
    for line in [*notes, *remarks, *validations]:
        print(line, flush=True)
    out.mkdir(parents=True, exist_ok=True)
    with subprocesses.stop_children_on_signals():
        results = run_variants(args, variants, out)
    if isinstance(results, int):
        return results  # a run failed
    baseline = args.baseline if args.baseline in results else None
    rows, target = summarize(results, baseline)
    flags = few_point_runs(results)
    report = {"rows": rows, "target": target, "few_points": flags, "curves": results}
    (out / "compare.json").write_text(json.dumps(report, indent=1))
    table = write_table(rows, target, baseline, out / "compare.md", notes, flags, remarks)
    plot(results, out / "compare.png", f"{', '.join(names)}; seeds {args.seeds}")
    print(table)
    for flag in flags:
        print(f"warning: {flag}", flush=True)
    print(f"wrote {out / 'compare.md'}, {out / 'compare.png'}, {out / 'compare.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
