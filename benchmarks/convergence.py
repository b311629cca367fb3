"""Convergence study: steps nGPT needs to reach the baseline GPT's best validation loss.

    python benchmarks/convergence.py                 # the full study (~55 min on 2 CPU cores)
    python benchmarks/convergence.py --quick         # a smoke run of the pipeline (~2 min)
    python benchmarks/convergence.py --data my.txt data.text_unit=line   # trailing overrides

Two stages, every run a ``recipes.train`` run laid out exactly as ``recipes.compare`` lays
them out (``OUT/runs/<variant>/seed<N>``), so the final table is ``recipes.compare --reuse``:

1. learning-rate sweep, seed 0: GPT at every ``--lrs`` (warmup fixed at 5% of the steps), the
   nGPT variants at every ``--ngpt-lrs`` (the same grid extended upward, since every nGPT variant's
   best lr sat at 3e-2, the top of the GPT grid); each variant's best lr is the one with the lowest
   final validation loss;
2. each variant at its best lr for every ``--seeds`` (seed 0 reused from the sweep), then
   ``recipes.compare`` with the GPT variant as the baseline: best / final validation loss and,
   paired by seed, the steps to reach that seed's GPT best validation loss, how many seeds
   reach it and the ratio GPT steps / variant steps (mean ± std over the seeds that reach it).

Variants: ``gpt`` (AdamW), ``ngpt`` (LERP, RiemannianAdam), ``ngpt-slerp``, ``ngpt-riemannian``
(both RiemannianAdam) and ``ngpt-adam_normalize`` (LERP, Adam + renormalize).

Runs ``--jobs`` trainings at a time, each with ``OMP_NUM_THREADS=--threads`` under ``nice``.
Run directories and checkpoints stay in ``--out`` (default ``/tmp/convergence``); only the
small artifacts are written to ``--results`` (default ``benchmarks/results``; ``--quick``:
``OUT/results``): ``convergence.md``, ``convergence_sweep.md`` and ``convergence.png``.
``--reuse`` (default on) skips runs that already finished, so an interrupted study resumes; a run
interrupted half way continues from its last checkpoint when its settings are the same
(``recipes.train --resume``; runs of 1000+ steps checkpoint every 5%), else starts afresh.

``--data`` is a text file, ``stdlib`` or a Hub dataset, as ``data.source`` of ``recipes.train``
(default: tinyshakespeare when ``../shared/data`` has it, else the trainer's default corpus).
``section.key=value`` overrides, anywhere on the command line, go to every run after the
study's own (parsed and checked as ``recipes.compare`` does). SIGTERM or Ctrl-C stops the
running trainings with the study (see ``recipes.subprocesses``). On a terminal a bar per stage
counts the runs done with an ETA; ``--no-progress`` turns it off.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _machine import cpu_name  # noqa: E402  (benchmarks/ is on sys.path when a script runs)

from recipes import compare, subprocesses  # noqa: E402
from recipes.config_files import DEFAULT_CONFIG  # noqa: E402
from spherenet.checkpoint import CheckpointCorruptError, CheckpointManager  # noqa: E402
from spherenet.train.config import load_config  # noqa: E402
from spherenet.train.metrics import MetricsLog  # noqa: E402

TINYSHAKESPEARE = ROOT.parent / "shared" / "data" / "tinyshakespeare" / "input.txt"
VARIANTS = ["gpt", "ngpt", "ngpt-slerp", "ngpt-riemannian", "ngpt-adam_normalize"]
NGPT_LRS = [1e-3, 3e-3, 1e-2, 3e-2, 1e-1]


def lr_tag(lr: float) -> str:
    return f"{lr:.0e}".replace("e-0", "e-").replace("e+0", "e")


def variant_spec(base: str, lr: float, size: str, warmup: int) -> tuple[str, str]:
    """A ``recipes.compare`` custom variant: the built-in ``base`` at learning rate ``lr``."""
    _, items = compare.variant_overrides(base, size)
    items = [*items, f"optim.lr={lr:g}"]
    if base == "gpt":
        items.append(f"optim.warmup_steps={warmup}")
    name = f"{base}_lr{lr_tag(lr)}"
    return name, f"{name}:{','.join(items)}"


def data_source(data: str) -> str:
    """``--data`` as ``data.source``: a local file as an absolute path (the runs start elsewhere),
    anything else (``stdlib``, a Hub dataset) as given."""
    path = Path(data).expanduser()
    return str(path.resolve()) if path.exists() else data


def corpus_label(source: str) -> str:
    """What the results say the data was: ``parent/file`` for a local file, the dataset name
    for the Hub, "default corpus" for the trainer's default (the standard library's source)."""
    if source == "stdlib":
        return "default corpus (this Python's standard library source)"
    if source.startswith(("hf:", "hub:")):
        return source.split(":", 1)[1]
    path = Path(source)
    if path.is_absolute() or path.exists():
        return f"{path.parent.name}/{path.name}" if path.parent.name else path.name
    return source  # a bare Hub name or alias


def shared_config(args: argparse.Namespace):
    """The config every run shares (before its variant's overrides): the trailing overrides
    come after the study's own, so they win (e.g. a ``data.source`` over ``--data``)."""
    return load_config(DEFAULT_CONFIG, shared_overrides(args))


def shared_overrides(args: argparse.Namespace) -> list[str]:
    return [
        f"data.source={args.data}",
        "data.tokenizer=byte",
        f"data.cache_dir={args.out / 'data_cache'}",
        f"model.max_seq_len={args.block}",
        f"train.block_size={args.block}",
        f"train.batch_size={args.batch}",
        f"train.steps={args.steps}",
        f"train.eval_every={args.eval_every}",
        f"train.eval_batches={args.eval_batches}",
        f"train.checkpoint_every={checkpoint_every(args)}",
        f"train.log_every={args.eval_every}",
        *args.overrides,
    ]


#: Runs of this many steps or more checkpoint every :data:`CHECKPOINT_FRACTION` of their steps, so
#: that a restart continues them (:func:`resume_step`); shorter ones (minutes) only at their end.
LONG_RUN_STEPS = 1000
CHECKPOINT_FRACTION = 0.05


def checkpoint_every(args: argparse.Namespace) -> int:
    """``train.checkpoint_every``: ``args.checkpoint_every`` when set, else every 5% of a long run."""
    if getattr(args, "checkpoint_every", None):
        return args.checkpoint_every
    return max(1, round(CHECKPOINT_FRACTION * args.steps)) if args.steps >= LONG_RUN_STEPS else args.steps


def resume_step(run_dir: Path, steps: int) -> int | None:
    """The step of the newest sound checkpoint of an unfinished run in ``run_dir`` that was
    started for ``steps`` steps (its metrics' start event says so: ``recipes.train`` would resume
    another total with a recomputed schedule); None when there is none to continue. Whether the
    other settings match is ``recipes.train --resume``'s to judge: it refuses a differing one."""
    metrics = run_dir / "metrics.jsonl"
    if not (run_dir / "checkpoints").is_dir() or not metrics.is_file() or compare.finished(run_dir):
        return None
    starts = [r for r in MetricsLog.read(metrics) if r.get("event") == "start"]
    if not starts or (starts[0].get("config") or {}).get("train", {}).get("steps") != steps:
        return None
    try:
        found = CheckpointManager(run_dir / "checkpoints", keep_last=None).latest_verified()
    except CheckpointCorruptError:
        return None
    return found.step if found is not None and 0 < found.step < steps else None


def reused(args: argparse.Namespace, spec: str, seed: int) -> bool:
    """The run has finished before and ``--reuse`` (the default) keeps it."""
    name, _ = compare.variant_overrides(spec, args.size)
    return args.reuse and compare.finished(args.runs / name / f"seed{seed}")


def train_one(args: argparse.Namespace, spec: str, seed: int, say) -> tuple[str, int, int]:
    """One ``recipes.train`` run with the overrides ``recipes.compare`` would pass; ``say``
    prints its status line."""
    name, extra = compare.variant_overrides(spec, args.size)
    run_dir = args.runs / name / f"seed{seed}"
    if reused(args, spec, seed):
        return name, seed, 0
    run_dir.mkdir(parents=True, exist_ok=True)
    step = resume_step(run_dir, args.steps)
    if step is None:
        (run_dir / "metrics.jsonl").unlink(missing_ok=True)
    else:  # what was logged after the checkpoint is logged again by the resumed run
        kept = [r for r in MetricsLog.read(run_dir / "metrics.jsonl") if r.get("step", 0) <= step]
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in kept))
    cmd = [
        "nice", "-n", str(args.nice), sys.executable, "-m", "recipes.train", "--config", str(DEFAULT_CONFIG),
        *shared_overrides(args), *extra, f"train.seed={seed}", f"train.out_dir={run_dir}",
        "train.sample_tokens=0", "train.progress=false",
    ]  # fmt: skip  # options beside their values
    env = compare.train_env(OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads))
    # a rerun starts afresh (the old run moves aside) unless it continues a half-done run of this spec
    with (run_dir / "train.log").open("w" if step is None else "a") as log:
        rc = subprocesses.run(
            [*cmd, "--overwrite" if step is None else "--resume"],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    if step is not None and rc == 2:  # refused (other settings than the checkpoint's): start afresh
        say(f"  {name} seed {seed}: cannot continue from step {step} (see {run_dir / 'train.log'}); starting afresh")
        (run_dir / "metrics.jsonl").unlink(missing_ok=True)
        with (run_dir / "train.log").open("a") as log:
            rc = subprocesses.run([*cmd, "--overwrite"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    elif step is not None:
        say(f"  {name} seed {seed}: continued from step {step}")
    status = "ok" if rc == 0 else f"FAILED (exit {rc}, see {run_dir / 'train.log'})"
    say(f"  {name} seed {seed}: {status}")
    return name, seed, rc


def run_all(args: argparse.Namespace, jobs: list[tuple[str, int]], stage: str = "runs") -> dict[tuple[str, int], int]:
    finished_before = {job for job in jobs if reused(args, *job)}
    bar = compare.progress_bar(len(jobs), stage, args.progress, initial=len(finished_before))
    say = bar.write if bar is not None else lambda line: print(line, flush=True)
    results = {}
    try:
        # On SIGTERM/Ctrl-C, leaving the with-block waits for the workers, whose runs stop
        # (recipes.subprocesses); queued jobs raise without starting.
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            futures = {pool.submit(train_one, args, *job, say): job for job in jobs}
            for future in as_completed(futures):
                name, seed, rc = future.result()
                results[name, seed] = rc
                if bar is not None and futures[future] not in finished_before:
                    bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    return results


def sweep_table(args: argparse.Namespace, specs: dict[str, dict[float, tuple[str, str]]]) -> tuple[str, dict]:
    """Seed-0 final (best) validation loss per variant and lr; each variant's best lr."""
    lrs = sorted({lr for by_lr in specs.values() for lr in by_lr})
    lines = [
        "| variant | " + " | ".join(f"lr {lr:g}" for lr in lrs) + " | best lr |",
        "|---|" + "---|" * (len(lrs) + 1),
    ]
    best: dict[str, float] = {}
    for base, by_lr in specs.items():
        cells, finals = [], {}
        for lr in lrs:
            if lr not in by_lr:
                cells.append("not run")
                continue
            name, _ = by_lr[lr]
            run_dir = args.runs / name / f"seed{args.sweep_seed}"
            if not compare.finished(run_dir):
                cells.append("diverged / failed")
                continue
            c = compare.read_curve(run_dir)
            if not c["val_loss"] or c["val_loss"][-1] is None or not math.isfinite(c["val_loss"][-1]):
                cells.append("diverged (non-finite loss)")
                continue
            finals[lr] = c["val_loss"][-1]
            cells.append(f"{c['val_loss'][-1]:.4f} ({min(c['val_loss']):.4f})")
        if not finals:
            raise SystemExit(f"error: every sweep run of {base} failed")
        best[base] = min(finals, key=finals.get)
        cells[lrs.index(best[base])] = f"**{cells[lrs.index(best[base])]}**"
        own = sorted(by_lr)
        edge = " (edge of the sweep)" if len(own) > 1 and best[base] in (own[0], own[-1]) else ""
        lines.append(f"| {base} | " + " | ".join(cells) + f" | {best[base]:g}{edge} |")
    return "\n".join(lines) + "\n", best


def paired_table(args: argparse.Namespace, baseline: str) -> str:
    """Per seed: the lowest validation loss both GPT and the variant reach with that seed
    (GPT's best when the variant gets below it, else the variant's best), and the ratio
    GPT's steps to it / the variant's steps to it. Always defined, 1.0 for GPT itself."""
    import json
    import math
    import statistics

    curves = json.loads((args.runs / "compare.json").read_text())["curves"]
    base = curves[baseline]
    lines = [
        "| variant | seed | GPT best | variant best | common target | GPT steps | variant steps | ratio (x) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    summary = [
        "| variant | ratio GPT steps / variant steps, mean ± std (per seed) | variant reaches GPT's best |",
        "|---|---|---|",
    ]
    for name, by_seed in curves.items():
        ratios, reached = [], 0
        for seed, c in by_seed.items():
            b = base[seed]
            target = max(min(b["val_loss"]), min(c["val_loss"]))
            reached += min(c["val_loss"]) <= min(b["val_loss"])
            sb, sv = compare.steps_to_reach(b, target), compare.steps_to_reach(c, target)
            ratio = sb / sv if math.isfinite(sb) and math.isfinite(sv) else math.nan
            ratios.append(ratio)
            lines.append(
                f"| {name} | {seed} | {min(b['val_loss']):.4f} | {min(c['val_loss']):.4f} | {target:.4f} | "
                f"{sb:.0f} | {sv:.0f} | {ratio:.2f} |"
            )
        std = statistics.stdev(ratios) if len(ratios) > 1 else 0.0
        summary.append(
            f"| {name} | {statistics.mean(ratios):.2f} ± {std:.2f} ({', '.join(f'{r:.2f}' for r in ratios)}) "
            f"| {reached}/{len(by_seed)} seeds |"
        )
    return "\n".join(summary) + "\n\nPer seed:\n\n" + "\n".join(lines) + "\n"


def header(args: argparse.Namespace, argv: list[str]) -> str:
    cmd = "python benchmarks/convergence.py" + ("" if not argv else " " + " ".join(argv))
    overrides = f" Overrides for every run: `{' '.join(args.overrides)}`." if args.overrides else ""
    data = shared_config(args).data
    return (
        f"Command: `{cmd}`  \n"
        f"Machine: {os.cpu_count()} CPU cores ({cpu_name()}), torch CPU, {args.jobs} runs at a time x "
        f"{args.threads} thread(s); date {datetime.date.today().isoformat()}.  \n"
        f"Data: {corpus_label(data.source)}, tokenizer {data.tokenizer}. Model: `{args.size}` presets, context {args.block}, "
        f"batch {args.batch} x {args.block} tokens, {args.steps} steps, cosine to 0 (GPT: AdamW, weight decay 0.1, "
        f"warmup {args.warmup} steps; nGPT: no warmup, no weight decay); validation every {args.eval_every} steps "
        f"on {args.eval_batches} batches.{overrides}\n\n"
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="smoke run: 60 steps, 2 lrs, 2 seeds, results in OUT/results")
    p.add_argument("--variants", nargs="+", default=VARIANTS, choices=VARIANTS)
    p.add_argument("--lrs", nargs="+", type=float, default=[1e-3, 3e-3, 1e-2, 3e-2], help="GPT's lr grid")
    p.add_argument("--ngpt-lrs", nargs="+", type=float, default=NGPT_LRS, help="the nGPT variants' lr grid")
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--sweep-seed", type=int, default=0)
    p.add_argument("--size", default="tiny", help="model presets gpt-SIZE / ngpt-SIZE (tiny: d 64, 2 layers)")
    p.add_argument("--steps", type=int, default=800)
    p.add_argument("--warmup", type=int, default=None, help="GPT warmup steps (default 5%% of --steps)")
    p.add_argument("--block", type=int, default=64)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--eval-every", type=int, default=20)
    p.add_argument("--eval-batches", type=int, default=8)
    p.add_argument(
        "--data",
        default=None,
        help="data.source of every run: a text file, stdlib or a Hub dataset "
        "(default: tinyshakespeare when present, else the trainer's default corpus)",
    )
    p.add_argument("--out", type=Path, default=None, help="run directories (default /tmp/convergence[_quick])")
    p.add_argument("--results", type=Path, default=None, help="where the .md / .png go")
    p.add_argument("--jobs", type=int, default=2, help="trainings at a time")
    p.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS per training")
    p.add_argument("--nice", type=int, default=5)
    p.add_argument("--no-reuse", dest="reuse", action="store_false", help="re-run finished runs")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bars (runs done / ETA)")
    compare.add_override_argument(p, "recipes.train overrides for every run, after the study's own")
    if compare.parse_args_with_overrides(p, argv).quick:  # smaller defaults; explicit flags still win
        p.set_defaults(steps=60, eval_every=10, lrs=[3e-3, 1e-2], ngpt_lrs=[3e-3, 1e-2], seeds=[0, 1])
    args = compare.parse_args_with_overrides(p, argv)
    args.out = (args.out or Path("/tmp/convergence_quick" if args.quick else "/tmp/convergence")).resolve()
    args.results = (args.results or (args.out / "results" if args.quick else ROOT / "benchmarks" / "results")).resolve()
    args.warmup = max(1, round(0.05 * args.steps)) if args.warmup is None else args.warmup
    args.runs = args.out / "runs"
    if args.data is None:
        args.data = str(TINYSHAKESPEARE) if TINYSHAKESPEARE.is_file() else load_config(DEFAULT_CONFIG).data.source
    args.data = data_source(args.data)
    if "gpt" not in args.variants:
        raise SystemExit("error: the study needs the gpt baseline among --variants")
    if args.sweep_seed not in args.seeds:
        args.seeds = [args.sweep_seed, *args.seeds]

    grid = {b: args.lrs if b == "gpt" else args.ngpt_lrs for b in args.variants}
    specs = {b: {lr: variant_spec(b, lr, args.size, args.warmup) for lr in grid[b]} for b in args.variants}
    # Every run's overrides, checked as recipes.train will read them, before the first run.
    compare.check_overrides(
        DEFAULT_CONFIG,
        *(
            [*shared_overrides(args), *compare.variant_overrides(spec, args.size)[1]]
            for b in args.variants
            for _, spec in specs[b].values()
        ),
    )
    args.runs.mkdir(parents=True, exist_ok=True)
    args.results.mkdir(parents=True, exist_ok=True)
    print(f"data: {corpus_label(shared_config(args).data.source)}", flush=True)
    with subprocesses.stop_children_on_signals():
        return study(args, argv, specs)


def study(args: argparse.Namespace, argv: list[str], specs: dict[str, dict[float, tuple[str, str]]]) -> int:
    """Stage 1 (the lr sweep), stage 2 (the seeds), the tables and the plot."""
    sweep_jobs = [(spec, args.sweep_seed) for b in args.variants for _, spec in specs[b].values()]
    print(
        f"== stage 1: lr sweep, {len(sweep_jobs)} runs of {args.steps} steps, seed {args.sweep_seed} "
        "(finished ones reused)",
        flush=True,
    )
    run_all(args, sweep_jobs, "lr sweep")
    sweep_md, best = sweep_table(args, specs)
    print(sweep_md, flush=True)

    chosen = [specs[b][best[b]] for b in args.variants]
    seed_jobs = [(spec, s) for _, spec in chosen for s in args.seeds if s != args.sweep_seed]
    print(f"== stage 2: best lr, seeds {args.seeds}: {len(seed_jobs)} more runs (finished ones reused)", flush=True)
    rcs = run_all(args, seed_jobs, "seeds")
    if any(rcs.values()):
        print("error: some seed runs failed; see their train.log", file=sys.stderr)
        return 1

    baseline = chosen[args.variants.index("gpt")][0]
    rc = compare.main(
        [
            "--variants",
            *(spec for _, spec in chosen),
            "--seeds",
            *map(str, args.seeds),
            "--size",
            args.size,
            "--out",
            str(args.runs),
            "--reuse",
            "--baseline",
            baseline,
            *shared_overrides(args),
            *([] if args.progress else ["--no-progress"]),
        ]
    )
    if rc:
        return rc

    head = header(args, argv)
    (args.results / "convergence_sweep.md").write_text(
        "# Convergence study: learning-rate sweep\n\n"
        + head
        + f"Final validation loss (best over the run in parentheses), seed {args.sweep_seed}; bold: the lr "
        "with the lowest final validation loss, used for the seeds. GPT's grid: "
        + ", ".join(f"{lr:g}" for lr in args.lrs)
        + "; the nGPT variants': "
        + ", ".join(f"{lr:g}" for lr in args.ngpt_lrs)
        + ' ("not run": outside the variant\'s grid).\n\n'
        + sweep_md
    )
    table = (args.runs / "compare.md").read_text()
    (args.results / "convergence.md").write_text(
        "# Convergence study: steps to reach GPT's best validation loss\n\n"
        + head
        + "Each variant at its best lr from the sweep (`convergence_sweep.md`), seeds "
        + ", ".join(map(str, args.seeds))
        + ', paired by seed with the GPT run of the same seed. "steps to '
        "baseline's best\": the first evaluated step whose validation loss is at or below that seed's GPT best "
        "validation loss; reached: how many seeds get there; speedup: GPT's steps to that loss / the variant's "
        'steps, mean ± std over the seeds that reach it ("-" when none does).\n\n'
        + table
        + "\n## Paired by seed, common target\n\nDefined even when a variant never reaches GPT's best. "
        "The same seed's GPT run as the reference. Common target: the lowest validation "
        "loss both runs reach (GPT's best when the variant gets below it, else the variant's best); ratio: GPT's "
        "steps to that loss / the variant's steps to it (> 1: the variant is faster).\n\n"
        + paired_table(args, baseline)
    )
    shutil.copyfile(args.runs / "compare.png", args.results / "convergence.png")
    print(
        f"wrote {args.results / 'convergence.md'}, {args.results / 'convergence_sweep.md'}, "
        f"{args.results / 'convergence.png'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
