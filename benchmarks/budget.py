"""Budget study: when does nGPT pay off across training length? The compute multiplier against
tokens per parameter.

    nice python benchmarks/budget.py                  # the study on the default corpus (hours: see its estimate)
    python benchmarks/budget.py --estimate-only       # time every arm, write the estimate, train nothing
    python benchmarks/budget.py --report-only         # rewrite the tables and plots from the ledgers
    python benchmarks/budget.py --gpu-plan            # the GPU version's command and its cost (6 N D), no training
    python benchmarks/budget.py --pending             # the seed runs the rate rule still needs (every start's), no training
    python benchmarks/budget.py --status --out DIR    # runs done, runs under way in DIR and their time to go
    python benchmarks/budget.py --quick               # a smoke run of the pipeline (minutes)
    python benchmarks/budget.py --points cpu@256 --budgets 677 2707 --results benchmarks/results/budget/default_corpus_cpu
    python benchmarks/budget.py --size-axis benchmarks/results/budget/default_corpus benchmarks/results/budget/default_corpus_cpu

At each point ``SIZE@CONTEXT`` (default ``tiny@256`` and ``tiny@1024``) every arm trains at each
budget (default 100, 400 and 1600 steps of ``--tokens-per-step`` tokens). Every budget is its
own cosine run (GPT arms: warmup 5% of the budget) at its own learning rate, chosen as
``benchmarks/scaling.py`` chooses it: a grid of three rates a factor 3 apart, grown until the best
is bracketed, then the best rate for every seed, and a runner-up within ``--tie-margin`` nats of
it on the sweep seed too, the lower mean over the seeds picked and bracketed in turn (recorded
in each ledger's ``picks.jsonl``). A budget's grid is centred on the arm's rate
chosen at the budget before it, since the best rate moves with the budget. Validation runs
``--evals`` times per run, the last at its final step.

The compute multiplier of an arm at budget B: the budget GPT needs to reach the arm's final
validation loss at B, divided by B. GPT's budget is read off GPT's final-loss-against-budget
curve, linear in log tokens between the two budgets that bracket the loss; beyond the budgets
measured it lies on the line through the two nearest and is marked as an extrapolation. Per
seed, against GPT's curve of the same seed; mean ± std over the seeds. Beside it: the final-loss
gap to GPT at equal tokens.

Sizes: a point's tokens per parameter is its budget x ``--tokens-per-step`` / its nGPT parameter
count. ``--scale-budgets`` takes ``--budgets`` as the first point's and gives every other point
the budgets of equal tokens per parameter (``round(budget x its params / the first point's)``:
``tiny@256 cpu@256 --budgets 100 400 1600`` gives cpu 677, 2707 and 10828 steps); a size may as
well run as its own study in its own results directory with its budgets named. ``--size-axis
DIR...`` reads several studies' results directories (each with the command in its
``study.json``) and writes ``size_axis.md`` and ``size_axis.png`` (into ``--results``, default
their common parent): the multiplier against tokens per parameter, one line per point and arm,
and the update rules' final losses paired by seed with LERP's; what a study plans and has not run
is marked "not run".

No warmup-stable-decay shortcut is taken: every budget is a separate cosine run, so there is no
decay branch to check against one.

Resumable: each budget keeps its own ledger ``RESULTS/stepsNNNN/runs.jsonl`` (with that budget's
``scaling.md``, the steps-to-target table of ``benchmarks/scaling.py``); a run found there is not
trained again. ``RESULTS/budget.md`` is rewritten after every run, ``multiplier.png`` and
``loss_budget.png`` after every budget. ``RESULTS/estimate.json`` holds the time per step measured before the first
run, from which ``budget.md`` states the study's cost. ``RESULTS`` defaults to
``benchmarks/results/budget/<corpus>/``; run directories are scratch in ``--out``, where a
restart continues a half-done run from its checkpoints (runs of 1000 steps or more checkpoint
every 5% of their steps).

Places: ``--jobs`` runs train at once, the waiting run of the shortest budget first. A sweep
waits for its runs before it grows, so with fewer runs to go than places a place can sit idle
for a whole run; ``--ahead`` lets such a place train the seed runs of the sweep's best rate so
far (``benchmarks/study_places.py``), at most ``--jobs`` - 1 at once. The rule may pick another
rate, and then the run was spent for nothing (it stays in the ledger, counted in the cost).
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import os
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
import scaling  # noqa: E402
from _machine import portable_command  # noqa: E402
from budget_gpu_plan import gpu_plan  # noqa: E402
from budget_report import (  # noqa: E402
    BASELINE,
    RUNS_PER_SWEEP,
    budget_dir,
    budgets_of,
    ledgers,
    scaled_budgets,
    write_results,
)
from budget_size_axis import write_size_axis  # noqa: E402
from budget_status import pending, status  # noqa: E402

from recipes import compare, subprocesses  # noqa: E402
from recipes.config_files import DEFAULT_CONFIG  # noqa: E402

ARMS = ["gpt", "ngpt", "gpt-muon", "gpt-adamh", "gpt-muonh", "ngpt-slerp", "ngpt-riemannian", "ngpt-tangent"]
POINTS = ["tiny@256", "tiny@1024"]
BUDGETS = [100, 400, 1600]


# ---------------------------------------------------------------- the study


def budget_args(args: argparse.Namespace, budget: int, start_lr: dict[str, float]) -> argparse.Namespace:
    """The namespace ``scaling.Study`` reads, for one budget."""
    b = copy.copy(args)
    b.steps = budget
    b.eval_every = max(1, budget // args.evals)
    b.out = args.out / f"steps{budget}"
    b.results = budget_dir(args.results, budget)
    b.start_lr = dict(start_lr)
    b.update_point = None
    b.grid = None
    return b


class BudgetStudy(scaling.Study):
    """One budget's sweeps and seeds; after every run the whole study's tables are rewritten."""

    def __init__(self, args: argparse.Namespace, study_args: argparse.Namespace, bar, places=None):
        super().__init__(args, bar, places)
        self.study_args = study_args

    def report(self) -> None:
        super().report()
        write_results(reported(self.study_args), plots=False)  # the plots: once a budget is done


def run_arms_through_budgets(args: argparse.Namespace, point: scaling.Point, bar) -> None:
    """Every arm through the point's budgets, shortest first, the arms side by side: an arm moves
    on to its next budget (its grid centred on the rate it got at this one) as soon as its own
    rate is picked, so a place that one arm frees goes to another arm's next run: the waiting run
    of the shortest budget first (:class:`scaling.Places`). ``--jobs`` places in all. A
    matrix-rate arm waits, at each budget, for the pick of the arm whose rate its AdamW part
    takes."""
    places = scaling.Places(args.jobs)
    budgets = budgets_of(args, point)
    studies: dict[int, BudgetStudy] = {}  # one ledger per budget, shared by the arms
    opening = threading.Lock()
    done = {(arm, b): threading.Event() for arm in args.arms for b in budgets}
    stopped: set[str] = set()  # arms that ended on an error
    errors: list[BaseException] = []

    def study_at(budget: int) -> BudgetStudy:
        with opening:
            if budget not in studies:
                bargs = budget_args(args, budget, {})
                bargs.results.mkdir(parents=True, exist_ok=True)
                studies[budget] = BudgetStudy(bargs, args, bar, places)
            return studies[budget]

    def through_budgets(arm: str) -> None:
        start = None
        for budget in budgets:
            base = scaling.MATRIX_RATE_ARMS.get(arm)
            if base in done_arms:
                done[base, budget].wait()
                if base in stopped:
                    return  # nothing to take the AdamW part's rate from
            study = study_at(budget)
            if start is not None:
                study.args.start_lr[arm] = start
            study.run_point(point, [arm])
            start, _ = scaling.chosen(study.ledger, str(point), arm, args.sweep_seed, args.tie_margin)
            done[arm, budget].set()
            with places.lock:
                write_results(reported(args))

    def guarded(arm: str) -> None:
        try:
            through_budgets(arm)
        except BaseException as exc:  # noqa: BLE001 - raised again below, once every arm has ended
            places.failed.set()
            stopped.add(arm)
            errors.append(exc)
            for b in budgets:  # an arm waiting on this one stops waiting
                done[arm, b].set()

    done_arms = set(args.arms)
    with ThreadPoolExecutor(max_workers=len(args.arms)) as arms_at_once:
        list(arms_at_once.map(guarded, args.arms))
    if errors:
        raise errors[0]


# ---------------------------------------------------------------- the estimate


def measure(args: argparse.Namespace, steps: int = 40) -> None:
    """Time ``steps`` steps of every arm at every point, ``--jobs`` at a time as the study runs
    them, and write ``estimate.json``: seconds per step (the trainer's tokens/s at its last log)
    and start-up seconds (the rest of the run's wall time)."""
    path = args.results / "estimate.json"
    est = json.loads(path.read_text()) if path.is_file() else {"timings": {}}
    todo = [(pt, arm) for pt in args.points for arm in args.arms if f"{pt}|{arm}" not in est["timings"]]
    if not todo:
        return
    timing_args = budget_args(args, steps, {})
    timing_args.eval_every = steps // 2
    timing_args.eval_batches = 1
    timing_args.out = timing_args.results = args.out / "estimate"
    study = scaling.Study(timing_args, bar=None)

    def one(job: tuple[scaling.Point, str]) -> tuple[str, dict]:
        pt, arm = job
        pargs = study.point_args(pt)
        lr = args.gpt_lr if arm.startswith("gpt") else args.ngpt_lr
        began = time.monotonic()
        base = lr if arm in scaling.MATRIX_RATE_ARMS else None  # a timing: any AdamW rate will do
        name, _, rc = convergence.train_one(pargs, study.spec(pt, arm, lr, base), 0, lambda line: None)
        wall = time.monotonic() - began
        run_dir = pargs.runs / name / "seed0"
        if rc != 0:
            raise SystemExit(f"error: timing run {arm} at {pt} failed (exit {rc}); see {run_dir / 'train.log'}")
        logged = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        rate = [r["tok_per_s"] for r in logged if r.get("tok_per_s")][-1]
        s_per_step = pargs.batch * pargs.block / rate
        return f"{pt}|{arm}", {"s_per_step": s_per_step, "startup_s": max(0.0, wall - steps * s_per_step)}

    print(f"timing {len(todo)} arm(s), {steps} steps each", flush=True)
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        for key, timing in pool.map(one, todo):
            est["timings"][key] = timing
    est.update(date=datetime.date.today().isoformat(), command=args.command)
    path.write_text(json.dumps(est, indent=1) + "\n")


# ---------------------------------------------------------------- main


def parse(argv: list[str]) -> argparse.Namespace:
    """The study's settings from its command line: points, budgets (per point with
    ``--scale-budgets``), parameter counts and directories; nothing written but the results
    directory."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="smoke run: 1 point, 2 arms, budgets 10 and 40, 2 seeds")
    p.add_argument("--estimate-only", action="store_true", help="time the arms, write the estimate, train nothing")
    p.add_argument(
        "--report-only", action="store_true", help="rewrite the tables and plots from the ledgers, train nothing"
    )
    p.add_argument(
        "--pending",
        action="store_true",
        help="list the seed runs the rate rule still needs (every start's arms and budgets), train nothing",
    )
    p.add_argument(
        "--status",
        action="store_true",
        help="where the study stands: runs per ledger, the runs in --out under way and their time to go; train nothing",
    )
    p.add_argument(
        "--size-axis",
        nargs="+",
        type=Path,
        metavar="RESULTS",
        help="write size_axis.md/.png from these studies' results directories (into --results, default their "
        "parent), train nothing",
    )
    p.add_argument("--gpu-plan", action="store_true", help="print the GPU version's command and cost, train nothing")
    p.add_argument("--points", nargs="+", default=POINTS, help="SIZE@CONTEXT, e.g. tiny@256")
    p.add_argument("--arms", nargs="+", default=ARMS, choices=sorted(compare.BUILTIN))
    p.add_argument("--budgets", nargs="+", type=int, default=BUDGETS, help="training steps per run")
    p.add_argument(
        "--scale-budgets",
        action="store_true",
        help="--budgets are the first point's; every other point's budget keeps its tokens per parameter: "
        "round(budget x its params / the first point's)",
    )
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--sweep-seed", type=int, default=0)
    p.add_argument("--gpt-lr", type=float, default=1e-2, help="the GPT arms' first sweep centre")
    p.add_argument("--ngpt-lr", type=float, default=3e-2, help="the nGPT arms' first sweep centre")
    p.add_argument("--max-extend", type=int, default=3, help="how often a sweep may grow past its edge")
    p.add_argument(
        "--tie-margin",
        type=float,
        default=scaling.TIE_MARGIN,
        help="nats: a runner-up rate this close to the best on the sweep seed runs on every seed too, the better mean wins",
    )
    p.add_argument("--tokens-per-step", type=int, default=4096)
    p.add_argument("--evals", type=int, default=10, help="validations per run (every budget / evals steps)")
    p.add_argument("--eval-batches", type=int, default=4)
    p.add_argument("--data", default="stdlib", help="data.source (default: the trainer's default corpus)")
    p.add_argument("--out", type=Path, default=None, help="scratch run directories (default /tmp/budget[_quick])")
    p.add_argument("--results", type=Path, default=None, help="ledgers, tables and plots")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--ahead", action="store_true", help=scaling.AHEAD_HELP)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--nice", type=int, default=10)
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar (none off a terminal)")
    compare.add_override_argument(p, "recipes.train overrides for every run, after the study's own")
    if compare.parse_args_with_overrides(p, argv).quick:
        p.set_defaults(points=["tiny@32"], arms=["gpt", "ngpt"], budgets=[10, 40], tokens_per_step=256,
                       evals=5, eval_batches=1, seeds=[0, 1], max_extend=1)  # fmt: skip  # the smoke settings
    args = compare.parse_args_with_overrides(p, argv)
    if args.gpu_plan or args.size_axis:
        return args
    args.command = portable_command(shlex.join(["python", "benchmarks/budget.py", *argv]))
    args.seeds_given = "--seeds" in argv  # a report asked for these seeds alone (budget.reported)
    args.points = [scaling.Point.parse(t) for t in args.points]
    args.budgets = sorted(set(args.budgets))
    if BASELINE not in args.arms:
        raise SystemExit("error: the study needs the gpt baseline among --arms")
    if len(args.budgets) < 2 or min(args.budgets) < args.evals:
        raise SystemExit(f"error: --budgets needs two or more budgets of at least --evals ({args.evals}) steps")
    if args.sweep_seed not in args.seeds:
        args.seeds = [args.sweep_seed, *args.seeds]
    scaling.study_paths(args, "budget")
    args.params = {str(pt): scaling.parameters(pt) for pt in args.points}
    if args.scale_budgets:
        ref = args.params[str(args.points[0])]
        args.point_budgets = {str(pt): scaled_budgets(args.budgets, args.params[str(pt)], ref) for pt in args.points}
        args.budgets = sorted({b for budgets in args.point_budgets.values() for b in budgets})
    args.context_size = args.points[0].size  # what scaling's per-budget plots read
    args.size_context = args.points[0].context
    return args


def planned(args: argparse.Namespace) -> set[tuple[str, int, str]]:
    """The (point, budget, arm) runs a command plans."""
    return {key for pt in args.points for key in planned_at(args, pt)}


def planned_at(args: argparse.Namespace, pt: scaling.Point) -> set[tuple[str, int, str]]:
    return {(str(pt), b, arm) for b in budgets_of(args, pt) for arm in args.arms}


def planned_runs(args: argparse.Namespace) -> set[tuple[str, int, str, int]]:
    """The (point, budget, arm, seed) runs a command plans."""
    return {(*key, seed) for key in planned(args) for seed in args.seeds}


def recorded_starts(results: Path) -> list[argparse.Namespace]:
    """The study's starts recorded in ``results/study.json``, parsed: the first, then each later
    one that planned more (none when the study has no record yet)."""
    meta = results / "study.json"
    if not meta.is_file():
        return []
    record = json.loads(meta.read_text())
    return [parsed(c, results) for c in [record["command"], *record.get("later", [])]]


def parsed(command: str, results: Path) -> argparse.Namespace:
    """A recorded ``python benchmarks/budget.py ...`` command, parsed as it ran at ``results``."""
    return parse([*shlex.split(command)[2:], "--results", str(results)])  # past "python budget.py"


def remember_start(args: argparse.Namespace, trains: bool) -> None:
    """``args.date``, ``args.command`` and ``args.study_jobs``: the study's first start, from
    ``study.json`` (written on the first start), so that the reports' header does not churn;
    ``args.estimate_jobs``: the runs at a time ``estimate.json`` was timed with. A later start that trains
    runs the record does not plan is added to its ``later`` list, so that the reports know the
    whole plan whichever command wrote them last."""
    meta, estimate = args.results / "study.json", args.results / "estimate.json"
    # runs at a time, of the first start (the header) and of the estimate's timing (its wall time)
    args.study_jobs = args.estimate_jobs = args.jobs
    if estimate.is_file():
        args.estimate_jobs = parsed(json.loads(estimate.read_text())["command"], args.results).jobs
    if not meta.is_file():
        args.date = datetime.date.today().isoformat()
        meta.write_text(json.dumps({"started": args.date, "command": args.command}, indent=1) + "\n")
        return
    record = json.loads(meta.read_text())
    starts = recorded_starts(args.results)
    # per run, not per seed list: seeds 0-7 at one point are new runs even where another start
    # already named seeds 0-7 at another point
    more_runs = not planned_runs(args) <= set().union(*map(planned_runs, starts))
    if trains and more_runs:
        record["later"] = [*record.get("later", []), args.command]
        meta.write_text(json.dumps(record, indent=1) + "\n")
    args.date, args.command = record["started"], portable_command(record["command"])
    args.later_commands = [portable_command(c) for c in record.get("later", [])]
    args.study_jobs = parsed(record["command"], args.results).jobs


def reported(args: argparse.Namespace) -> argparse.Namespace:
    """``args`` as the reports read it: the points, budgets and arms of every recorded start and
    of the ledgers besides this command's, and ``plan``, the (point, budget, arm) runs one of the
    starts planned or a ledger holds. A start with fewer arms or budgets thus rewrites the same
    tables, and a run nobody planned is neither costed nor marked "not run"."""
    shown = copy.copy(args)
    shown.arms, shown.points, shown.params = list(args.arms), list(args.points), dict(args.params)
    shown.point_budgets, shown.plan = {}, set()
    starts = [args, *recorded_starts(args.results)]
    shown.plan_seeds = {}  # (point, budget, arm) -> the seeds of every start that planned it
    for start in starts:
        for pt in start.points:
            join(shown, pt, budgets_of(start, pt), start.arms)
            for key in planned_at(start, pt):
                shown.plan_seeds[key] = sorted({*shown.plan_seeds.get(key, ()), *start.seeds})
    if args.seeds_given:  # the seeds this command names, where it plans: a report of those seeds alone
        shown.plan_seeds.update({key: sorted(args.seeds) for pt in args.points for key in planned_at(args, pt)})
    for path in sorted(args.results.glob("steps*/runs.jsonl")):
        budget = int(path.parent.name.removeprefix("steps"))
        for point, arm, _, _ in scaling.Ledger(path).rows:
            join(shown, scaling.Point.parse(point), [budget], [arm])
    shown.budgets = sorted({b for budgets in shown.point_budgets.values() for b in budgets})
    return shown


def join(shown: argparse.Namespace, point: scaling.Point, budgets: list[int], arms: list[str]) -> None:
    """Adds ``arms`` at ``point`` and ``budgets`` to the reported study ``shown`` and its plan."""
    if str(point) not in shown.params:
        shown.points.append(point)
        shown.params[str(point)] = scaling.parameters(point)
    shown.point_budgets[str(point)] = sorted({*shown.point_budgets.get(str(point), ()), *budgets})
    shown.arms += [a for a in arms if a not in shown.arms]
    shown.plan |= {(str(point), b, a) for b in budgets for a in arms}


def size_axis(dirs: list[Path], out: Path | None) -> Path:
    """The size-axis report of the studies in ``dirs``, each read as its first recorded start
    (``study.json``) and all it plans or holds, written into ``out`` (default: the directories'
    common parent)."""
    studies = []
    for d in dirs:
        starts = recorded_starts(d.resolve())
        if not starts:
            raise SystemExit(
                f"error: {d / 'study.json'} not found: --size-axis takes budget studies' results directories"
            )
        studies.append(reported(starts[0]))
    out = (out or Path(os.path.commonpath([d.resolve() for d in dirs]))).resolve()
    write_size_axis(studies, out)
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse(argv)
    if args.gpu_plan:
        print(gpu_plan(ARMS), end="")
        return 0
    if args.size_axis:
        out = size_axis(args.size_axis, args.results)
        print(f"wrote {out / 'size_axis.md'}, {out / 'size_axis.png'}", flush=True)
        return 0
    remember_start(args, trains=not (args.pending or args.status or args.report_only or args.estimate_only))
    probe = scaling.Study(budget_args(args, args.budgets[0], {}), bar=None)
    compare.check_overrides(
        DEFAULT_CONFIG,
        *(
            [*convergence.shared_overrides(probe.point_args(pt)), *compare.variant_overrides(probe.spec(pt, a, 1e-3, 1e-3 if a in scaling.MATRIX_RATE_ARMS else None), pt.size)[1]]
            for pt in args.points
            for a in args.arms
        ),
    )  # fmt: skip  # one comprehension per line
    print(f"data: {args.corpus_label}; results in {args.results}", flush=True)
    if args.pending:
        todo = pending(reported(args))  # the whole study's, as --status, whichever start asks
        for point, b, arm, lr, seed in todo:
            print(f"  {point} {b} steps {arm} lr {lr:g} seed {seed}")
        print(f"{len(todo)} run(s) pending", flush=True)
        return 0
    if args.status:
        print("\n".join(status(reported(args))), flush=True)  # the whole study, whichever start asks
        return 0
    if args.report_only:
        shown = reported(args)
        for b in shown.budgets:  # each budget's own table and plots, as its last run left them
            ledger = budget_dir(args.results, b) / "runs.jsonl"
            if ledger.is_file():
                scaling.write_results(budget_args(shown, b, {}), scaling.Ledger(ledger))
        write_results(shown)
        print(f"wrote {args.results / 'budget.md'}", flush=True)
        return 0
    with subprocesses.stop_children_on_signals():
        measure(args)
        write_results(reported(args))
        if args.estimate_only:
            print(f"wrote {args.results / 'budget.md'} (estimate only)", flush=True)
            return 0
        per_budget = (RUNS_PER_SWEEP - 1 + len(args.seeds)) * len(args.arms)
        runs_planned = per_budget * sum(len(budgets_of(args, pt)) for pt in args.points)
        done = sum(len(book.rows) for book in ledgers(args).values())
        bar = compare.progress_bar(max(runs_planned, done), "budget study", enabled=args.progress, initial=done)
        for pt in args.points:
            run_arms_through_budgets(args, pt, bar)
        if bar is not None:
            bar.close()
    write_results(reported(args))
    print(f"wrote {args.results / 'budget.md'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
