"""Scaling study: where does nGPT pay off? Speedup over GPT against context length, model size
and optimizer.

    nice python benchmarks/scaling.py                       # the map on tinyshakespeare (hours on 2 CPU cores)
    nice python benchmarks/scaling.py --data stdlib         # the same on the default corpus
    python benchmarks/scaling.py --quick                    # a smoke run of the pipeline (minutes)
    python benchmarks/scaling.py --points tiny@256 --arms gpt ngpt train.steps=200   # a part, overrides

The map is a list of points ``SIZE@CONTEXT`` (model presets ``gpt-SIZE`` / ``ngpt-SIZE``; the
default: context 64, 256 and 1024 at ``tiny``, and ``cpu`` at 256, so two sizes at one context).
Every point trains every arm with the same tokens per step (``--tokens-per-step``, the batch is
that over the context) and the same number of steps, so the arms and the points see equal tokens.

For each arm at each point:

1. learning-rate sweep, seed ``--sweep-seed``: a grid of 3 rates a factor 3 apart around the
   arm's start (``--gpt-lr`` for the GPT arms, ``--ngpt-lr`` for nGPT's); while the lowest final
   validation loss sits at an edge of the grid, the grid grows by a factor 3 past that edge (at
   most ``--max-extend`` times), so that the chosen rate is bracketed;
2. the best rate for every ``--seeds``; when the runner-up's final loss on the sweep seed is
   within ``--tie-margin`` nats of the best's (default 0.02, the small end of the seed spreads the
   tiny studies saw, std 0.004-0.12 over seeds: one seed cannot order two such rates), the
   runner-up runs on every seed too and the lower mean final loss over the seeds is the chosen
   rate. When the tie's winner sits at an edge of the rates tried, the sweep grows one step past
   it and the rule runs again, so that the chosen rate is bracketed there too. The decision is
   recorded in ``RESULTS/picks.jsonl`` (the candidates, their means, the rates tried, the pick),
   so that the report and a resumed study read the same rate; a ledger written before the rule
   (or before ties were bracketed) gets the runs it lacks on its next start.

The metrics are ``benchmarks/convergence.py``'s: per seed, the common target (the lowest
validation loss both GPT and the arm reach), and the ratio GPT's steps to it / the arm's steps
to it (> 1: the arm is faster), mean ± std over the seeds; and the final validation loss at equal
tokens.

Arms: ``gpt`` (AdamW), ``ngpt-adam_normalize`` (the paper's Adam then renormalize),
``ngpt`` (the default RiemannianAdam), ``gpt-muon`` (torch.optim.Muon on the hidden matrices),
``ngpt-muon`` (SphericalMuon), ``gpt-adamh`` and ``gpt-muonh`` (Hyperball: the hidden matrices
on whole-matrix spheres); and at ``--update-point`` the residual updates ``ngpt`` (LERP),
``ngpt-slerp`` and ``ngpt-riemannian``. A Muon arm's sweep moves ``optim.lr``, which sets the
AdamW / RiemannianAdam rate and the Muon rate together (``optim.muon_lr`` unset: with the
RMS-matching step the rates transfer). A Hyperball arm's sweep moves ``optim.matrix_lr`` (an
angle per step, a scale of its own), with its AdamW part at GPT's best rate at the point, so
GPT's sweep runs first.

Resumable: every finished run is appended as one JSON line (its validation curve) to
``RESULTS/runs.jsonl``, and a run found there is not trained again, so a study committed to the
repository resumes on a fresh machine. ``RESULTS`` defaults to
``benchmarks/results/scaling/<corpus>/`` (``--quick``: ``OUT/results``); the tables
(``scaling.md``) and the plots (``speedup_context.png``, ``speedup_params.png``) are rewritten
after every run, so they always show what is done. Run directories are scratch in ``--out``; a
run found there half done (its checkpoints, the same spec) continues from its last checkpoint
(``convergence.train_one``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import shlex
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import convergence  # noqa: E402  (benchmarks/ is on sys.path)
from _machine import portable_command  # noqa: E402
from scaling_ledger import (  # noqa: E402
    BASELINE,
    TIE_MARGIN,
    UPDATE_ARMS,
    Ledger,
    Point,
    arms_at,
    candidates,
    chosen,
    decide,
    final_loss,
    lr_grid,
    next_lr,
    parameters,
)
from scaling_report import write_results  # noqa: E402
from study_places import Places, go_ahead  # noqa: E402

from recipes import compare, subprocesses  # noqa: E402
from recipes.config_files import DEFAULT_CONFIG  # noqa: E402

#: Arms whose sweep moves ``optim.matrix_lr`` (the hidden matrices' angle per step), with
#: ``optim.lr`` (the AdamW part: embeddings, head, gains) at the best rate of the named arm at the
#: same point and budget; that arm's sweep runs first.
MATRIX_RATE_ARMS = {"gpt-adamh": "gpt", "gpt-muonh": "gpt"}
AHEAD_HELP = (
    "while a sweep runs, a place no other run asks for trains the seed runs of its best rate so far "
    "(at most --jobs - 1 at once; the rule may not need them)"
)
#: Where a matrix-rate sweep starts: an AdamW step of lr on a matrix of init std 0.02 turns it by
#: about lr / 0.02, so GPT's rates (0.003-0.01) correspond to angles of about 0.15-0.5.
MATRIX_START_LR = 0.1
OPTIMIZER_ARMS = ["gpt", "ngpt-adam_normalize", "ngpt", "gpt-muon", "ngpt-muon", "gpt-adamh", "gpt-muonh"]
DEFAULT_POINTS = ["tiny@64", "tiny@256", "tiny@1024", "cpu@256"]


class Study:
    """The sweeps and seeds of every point, run through ``convergence.train_one`` and recorded
    in the ledger. ``bar``: a progress bar to count on (a study of several ledgers shares one);
    by default the study makes its own. ``places``: shared with other studies running at once
    (default: its own, ``--jobs`` of them)."""

    def __init__(self, args: argparse.Namespace, bar=None, places: Places | None = None):
        self.args = args
        self.ledger = Ledger(args.results / "runs.jsonl")
        self.started = time.monotonic()
        self.done_now = 0
        self.places = places or Places(args.jobs)
        self.lock, self.failed = self.places.lock, self.places.failed
        # runs done / planned, with an ETA (a sweep that grows past its edge adds to the plan)
        seeds = len([sd for sd in args.seeds if sd != args.sweep_seed])
        planned = sum(len(args.grid or [0, 0, 0]) + seeds for pt in args.points for _ in arms_at(args, pt))
        done = sum(1 for key in self.ledger.rows if key[0] in {str(pt) for pt in args.points})
        if bar is None:
            bar = compare.progress_bar(max(planned, done), "scaling study", enabled=args.progress, initial=done)
        self.bar = bar
        self.tie_margin = getattr(args, "tie_margin", TIE_MARGIN)
        self.under_way: set[tuple[str, str, float, int]] = set()  # runs training now, by ledger key
        self.changed = threading.Condition()  # a run began or ended, or a sweep ended

    def point_args(self, point: Point) -> argparse.Namespace:
        """The namespace ``convergence.train_one`` reads, for one point."""
        a = self.args
        return argparse.Namespace(
            data=a.data,
            out=a.out,
            block=point.context,
            batch=max(1, a.tokens_per_step // point.context),
            steps=a.steps,
            eval_every=a.eval_every,
            eval_batches=a.eval_batches,
            overrides=[f"model.max_seq_len={point.context}", *a.overrides],
            size=point.size,
            runs=a.out / "runs" / str(point),
            reuse=False,
            nice=a.nice,
            threads=a.threads,
        )

    def base_lr(self, point: Point, arm: str) -> float | None:
        """For a :data:`MATRIX_RATE_ARMS` arm, the AdamW part's rate: the best rate of the arm it
        names at this point (its sweep ran first); None for the other arms."""
        if arm not in MATRIX_RATE_ARMS:
            return None
        lr, _ = chosen(self.ledger, str(point), MATRIX_RATE_ARMS[arm], self.args.sweep_seed, self.tie_margin)
        if lr is None:
            raise SystemExit(
                f"error: {arm} at {point} takes {MATRIX_RATE_ARMS[arm]}'s best rate for its AdamW part, and "
                f"{MATRIX_RATE_ARMS[arm]} has no sweep there: add {MATRIX_RATE_ARMS[arm]} to --arms"
            )
        return lr

    def spec(self, point: Point, arm: str, lr: float, base: float | None = None) -> str:
        """The run's variant spec; ``base``: the AdamW part's rate of a matrix-rate arm (default:
        :meth:`base_lr`)."""
        _, items = compare.variant_overrides(arm, point.size)
        base = self.base_lr(point, arm) if base is None and arm in MATRIX_RATE_ARMS else base
        items = (
            [*items, f"optim.lr={lr:g}"] if base is None else [*items, f"optim.lr={base:g}", f"optim.matrix_lr={lr:g}"]
        )
        if arm.startswith("gpt"):
            items.append(f"optim.warmup_steps={max(1, round(0.05 * self.args.steps))}")
        return f"{arm}_lr{convergence.lr_tag(lr)}:{','.join(items)}"

    def run(self, point: Point, arm: str, lr: float, seed: int) -> dict:
        """One training (or its ledger line when it already ran, or when the same run, gone
        ahead, ends). None starts once a run has failed: the study stops when the runs under
        way end."""
        key = (str(point), arm, float(lr), seed)
        with self.changed:
            self.changed.wait_for(lambda: key not in self.under_way)
            row = self.ledger.get(point, arm, lr, seed)
            if row is not None:
                return row
            self.under_way.add(key)
        try:
            with self.places.place(self.args.steps):  # one of --jobs, shared by every study running
                return self.train(point, arm, lr, seed)
        finally:
            self.ended(key)

    def ended(self, key: tuple[str, str, float, int]) -> None:
        with self.changed:
            self.under_way.discard(key)
            self.changed.notify_all()

    def train(self, point: Point, arm: str, lr: float, seed: int) -> dict:
        """Train one run in the place the caller holds, and add its line to the ledger."""
        pargs = self.point_args(point)
        spec = self.spec(point, arm, lr)
        say = self.bar.write if self.bar is not None else lambda line: print(line, flush=True)
        if self.failed.is_set():
            raise SystemExit(f"error: {arm} lr {lr:g} seed {seed} at {point} not started: another run failed")
        began = time.monotonic()
        name, _, rc = convergence.train_one(pargs, spec, seed, say)
        wall_s = time.monotonic() - began
        run_dir = pargs.runs / name / f"seed{seed}"
        curve = compare.read_curve(run_dir) if (run_dir / "metrics.jsonl").is_file() else {}
        row = {
            "point": str(point),
            "arm": arm,
            "lr": lr,
            "seed": seed,
            "finished": compare.finished(run_dir),
            "exit": rc,
            "steps": curve.get("steps", []),
            "val_loss": curve.get("val_loss", []),
            "tokens": curve.get("tokens", []),
            **({"adamw_lr": self.base_lr(point, arm)} if arm in MATRIX_RATE_ARMS else {}),
            "wall_s": round(wall_s, 1),  # this invocation's: a resumed run's earlier part is not in it
            "from_step": curve.get("from_step", 0),  # where this invocation began
            "date": datetime.date.today().isoformat(),
        }
        if rc not in (0, None) and not row["val_loss"]:
            # a crash, not a divergence: keep it out of the ledger so that a rerun retries it
            self.failed.set()
            raise SystemExit(f"error: {name} seed {seed} at {point} failed (exit {rc}); see {run_dir / 'train.log'}")
        with self.lock:  # runs finish on several threads
            self.ledger.add(row)
            self.done_now += 1
            if self.bar is not None:
                self.bar.total = max(self.bar.total, self.bar.n + 1)
                self.bar.update(1)
            self.report()
        return row

    def sweep_finals(self, point: Point, arm: str) -> dict[float, float]:
        """Final validation loss by rate of the arm's sweep runs so far (the ledger's)."""
        return {
            lr: final_loss(row)
            for (p, a, lr, s), row in self.ledger.rows.items()
            if (p, a, s) == (str(point), arm, self.args.sweep_seed)
        }

    def drop_stale(self, point: Point, arms: list[str]) -> None:
        """Forget (in memory: the ledger file keeps them, a rerun's line comes later and wins) the
        runs of matrix-rate arms whose AdamW part ran at another rate than the one GPT has picked
        now (a tie decided after them), and their pick, so that they run again."""
        with self.lock:
            self._drop(point, arms)

    def _drop(self, point: Point, arms: list[str]) -> None:
        stale = {
            key
            for key, row in self.ledger.rows.items()
            if key[0] == str(point) and key[1] in arms and row.get("adamw_lr") != self.base_lr(point, key[1])
        }
        self.ledger.rows = {key: row for key, row in self.ledger.rows.items() if key not in stale}
        stale_arms = {key[:2] for key in stale}
        self.ledger.picks = {key: pick for key, pick in self.ledger.picks.items() if key not in stale_arms}

    def run_point(self, point: Point, arms: list[str]) -> None:
        """Stage 1 (sweeps, grown until bracketed) and stage 2 (seeds) for every arm at the
        point, ``--jobs`` runs at a time across the arms."""
        print(f"== {point}: {', '.join(arms)}", flush=True)
        seed0 = self.args.sweep_seed
        default = {
            arm: MATRIX_START_LR
            if arm in MATRIX_RATE_ARMS
            else self.args.gpt_lr
            if arm.startswith("gpt")
            else self.args.ngpt_lr
            for arm in arms
        }
        start = {**default, **getattr(self.args, "start_lr", {})}  # a study may centre each arm's grid
        grid = {arm: (self.args.grid if arm not in MATRIX_RATE_ARMS else None) or lr_grid(start[arm]) for arm in arms}
        going_ahead = getattr(self.args, "ahead", False) and self.args.jobs > 1
        with ThreadPoolExecutor(max_workers=self.args.jobs) as pool, ThreadPoolExecutor(len(arms)) as aheads:
            ahead_runs = []

            def run_all(jobs: list[tuple[str, float, int]]) -> None:
                list(pool.map(lambda job: self.run(point, *job), jobs))

            def sweep(group: list[str]) -> None:
                sweeping = threading.Event()
                sweeping.set()
                if going_ahead:
                    ahead_runs.extend(aheads.submit(go_ahead, self, point, arm, sweeping) for arm in group)
                try:
                    grown(group)
                finally:  # what goes ahead stops choosing; a run under way ends on its own
                    sweeping.clear()
                    with self.changed:
                        self.changed.notify_all()
                    self.places.wake()

            def grown(group: list[str]) -> None:
                run_all([(arm, lr, seed0) for arm in group for lr in grid[arm]])
                while True:
                    more = []
                    for arm in group:
                        finals = self.sweep_finals(point, arm)
                        extensions = sum(lr not in grid[arm] for lr in finals)
                        lr = next_lr(finals, extensions, self.args.max_extend)
                        if lr is not None:
                            more.append((arm, lr, seed0))
                    if not more:
                        break
                    if self.bar is not None:
                        self.bar.total += len(more)
                    run_all(more)

            def seeds(group: list[str]) -> None:
                """Stage 2 by the rate rule (``scaling_ledger.decide``): each arm's best rate, and a
                tied runner-up, on every seed; then the pick, recorded."""
                margin = self.tie_margin
                for arm in group:
                    finals = self.sweep_finals(point, arm)
                    cands = candidates(finals, margin)
                    tie = (
                        f"; tied with {cands[1]:g} within {margin:g} nats: both on every seed" if len(cands) > 1 else ""
                    )
                    tried = ", ".join(f"{x:g}" for x in sorted(finals))
                    print(
                        f"  {point} {arm}: lr {cands[0]:g} (tried {tried}){tie}"
                        if cands
                        else f"  {point} {arm}: no finite run"
                    )
                while True:  # a tie picked at the sweep's edge grows the sweep: the rule runs again
                    jobs = [
                        (arm, lr, s)
                        for arm in group
                        for lr, s in decide(self.ledger, str(point), arm, self.args.seeds, seed0, margin)[1]
                    ]
                    if not jobs:
                        break
                    if self.bar is not None:
                        self.bar.total = max(self.bar.total, self.bar.n + len(jobs))
                    run_all(jobs)
                for arm in group:
                    pick, _ = decide(self.ledger, str(point), arm, self.args.seeds, seed0, margin)
                    if pick is not None and pick is not self.ledger.picks.get((str(point), arm)):
                        with self.lock:
                            self.ledger.add_pick({**pick, "date": datetime.date.today().isoformat()})

            def side_by_side(group: list[str]) -> None:
                """Each arm's sweep, then its seeds, the arms at once: a run that ends frees its
                place for the next run of any arm, so no place waits for another arm's stage."""
                if group:
                    with ThreadPoolExecutor(max_workers=len(group)) as arms_at_once:
                        list(arms_at_once.map(lambda arm: (sweep([arm]), seeds([arm])), group))

            # a matrix-rate arm's AdamW part takes GPT's pick, so GPT's seeds (and a tie) come first
            side_by_side([arm for arm in arms if arm not in MATRIX_RATE_ARMS])
            self.drop_stale(point, [arm for arm in arms if arm in MATRIX_RATE_ARMS])
            side_by_side([arm for arm in arms if arm in MATRIX_RATE_ARMS])
            for run in ahead_runs:
                run.result()  # a run gone ahead that crashed stops the study here
        with self.lock:  # another arm's run_point may be writing the same tables
            write_results(self.args, self.ledger)

    def report(self) -> None:
        elapsed = time.monotonic() - self.started
        print(
            f"  [{len(self.ledger.rows)} runs in the ledger, {self.done_now} run by this command, {elapsed / 60:.1f} min]",
            flush=True,
        )
        write_results(self.args, self.ledger, plots=False)  # the plots: once a point is done


def study_paths(args: argparse.Namespace, name: str) -> None:
    """``args.data`` as a ``data.source``, its label, and the study's directories: scratch runs in
    ``--out`` (default ``/tmp/<name>[_quick]/<corpus>``) and results in ``--results`` (default
    ``benchmarks/results/<name>/<corpus>``; ``--quick``: under the scratch directory)."""
    args.data = convergence.data_source(args.data)
    args.corpus_label = convergence.corpus_label(args.data)
    slug = "default_corpus" if args.data == "stdlib" else args.corpus_label.split(" ")[0]
    slug = "".join(c if c.isalnum() or c in "-_" else "_" for c in slug.removesuffix(".txt"))
    args.out = (args.out or Path(f"/tmp/{name}_quick" if args.quick else f"/tmp/{name}") / slug).resolve()
    args.results = (
        args.results or (args.out / "results" if args.quick else ROOT / "benchmarks/results" / name / slug)
    ).resolve()
    args.results.mkdir(parents=True, exist_ok=True)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="smoke run: 2 points, 2 arms, 20 steps, 2 seeds")
    p.add_argument("--points", nargs="+", default=DEFAULT_POINTS, help="SIZE@CONTEXT, e.g. tiny@256")
    p.add_argument("--arms", nargs="+", default=OPTIMIZER_ARMS, choices=sorted({*OPTIMIZER_ARMS, *UPDATE_ARMS}))
    p.add_argument(
        "--update-point", default="tiny@256", help="where LERP, SLERP and Riemannian are compared ('' = none)"
    )
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--sweep-seed", type=int, default=0)
    p.add_argument("--gpt-lr", type=float, default=1e-2, help="the GPT arms' sweep centre")
    p.add_argument("--ngpt-lr", type=float, default=3e-2, help="the nGPT arms' sweep centre")
    p.add_argument("--grid", nargs="+", type=float, default=None, help="a fixed starting grid for every arm")
    p.add_argument("--max-extend", type=int, default=3, help="how often a sweep may grow past its edge")
    p.add_argument(
        "--tie-margin",
        type=float,
        default=TIE_MARGIN,
        help="nats: a runner-up rate this close to the best on the sweep seed runs on every seed too, the better mean wins",
    )
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--tokens-per-step", type=int, default=4096)
    p.add_argument("--eval-every", type=int, default=10)
    p.add_argument("--eval-batches", type=int, default=4)
    p.add_argument("--data", default=None, help="data.source (default: tinyshakespeare when present, else stdlib)")
    p.add_argument("--out", type=Path, default=None, help="scratch run directories (default /tmp/scaling[_quick])")
    p.add_argument("--results", type=Path, default=None, help="ledger, tables and plots")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--ahead", action="store_true", help=AHEAD_HELP)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--nice", type=int, default=10)
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar (none off a terminal)")
    compare.add_override_argument(p, "recipes.train overrides for every run, after the study's own")
    if compare.parse_args_with_overrides(p, argv).quick:
        p.set_defaults(
            points=["tiny@32", "tiny@128"],
            arms=["gpt", "ngpt"],
            update_point="",
            steps=20,
            tokens_per_step=1024,
            eval_every=5,
            eval_batches=2,
            seeds=[0, 1],
            max_extend=1,
        )
    args = compare.parse_args_with_overrides(p, argv)
    args.command = portable_command(shlex.join(["python", "benchmarks/scaling.py", *argv]))
    args.points = [Point.parse(t) for t in args.points]
    args.update_point = Point.parse(args.update_point) if args.update_point else None
    if BASELINE not in args.arms:
        raise SystemExit("error: the study needs the gpt baseline among --arms")
    if args.sweep_seed not in args.seeds:
        args.seeds = [args.sweep_seed, *args.seeds]
    if args.data is None:
        args.data = str(convergence.TINYSHAKESPEARE) if convergence.TINYSHAKESPEARE.is_file() else "stdlib"
    study_paths(args, "scaling")
    args.params = {
        str(pt): parameters(pt) for pt in {*args.points, *([args.update_point] if args.update_point else [])}
    }
    sizes = {}
    for pt in args.points:
        sizes.setdefault(pt.size, []).append(pt.context)
    args.context_size = max(sizes, key=lambda s: len(sizes[s]))  # the size with the most contexts
    contexts = {}
    for pt in args.points:
        contexts.setdefault(pt.context, []).append(pt.size)
    args.size_context = max(contexts, key=lambda c: len(contexts[c]))
    meta = args.results / "study.json"  # the first start's date stays, so the header does not churn
    args.date = json.loads(meta.read_text())["started"] if meta.is_file() else datetime.date.today().isoformat()
    meta.write_text(json.dumps({"started": args.date, "command": args.command}, indent=1) + "\n")
    # every run's overrides, checked as recipes.train will read them, before the first run
    study = Study(args)
    compare.check_overrides(
        DEFAULT_CONFIG,
        *(
            [
                *convergence.shared_overrides(study.point_args(pt)),
                *compare.variant_overrides(study.spec(pt, a, 1e-3, 1e-3 if a in MATRIX_RATE_ARMS else None), pt.size)[
                    1
                ],
            ]
            for pt in args.points
            for a in arms_at(args, pt)
        ),
    )
    print(f"data: {args.corpus_label}; results in {args.results}", flush=True)
    with subprocesses.stop_children_on_signals():
        for pt in args.points:
            study.run_point(pt, arms_at(args, pt))
    if study.bar is not None:
        study.bar.close()
    write_results(args, study.ledger)
    print(f"wrote {args.results / 'scaling.md'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
