"""Where a budget study stands, read from its files alone (nothing trains): the seed runs the
rate rule still needs (``budget.py --pending``) and the runs done and under way
(``budget.py --status``)."""

from __future__ import annotations

import argparse

import convergence
import scaling
from budget_report import budgets_of, ledgers, seeds_of

from recipes.run_directory import live_trainer
from spherenet.train.metrics import MetricsLog


def pending(args: argparse.Namespace) -> list[tuple[str, int, str, float, int]]:
    """The seed runs (point, budget, arm, lr, seed) the rate rule (``scaling_ledger.decide``)
    still needs wherever an arm's sweep has run: the best rate's seeds, and a tied runner-up's.
    Sweeps still to grow are not listed (they depend on the budget before's pick)."""
    out = []
    for b, book in ledgers(args).items():
        for pt in args.points:
            for arm in args.arms:
                if b not in budgets_of(args, pt):
                    continue
                _, missing = scaling.decide(
                    book, str(pt), arm, seeds_of(args, pt, b, arm), args.sweep_seed, args.tie_margin
                )
                out += [(str(pt), b, arm, lr, s) for lr, s in missing]
    return out


def status(args: argparse.Namespace) -> list[str]:
    """Where a study stands: per budget, the runs in its ledger and the seed runs the rate rule
    still needs (:func:`pending`), then every run in ``--out`` that is not in a ledger yet: its
    last logged step (a stop's checkpoint and a resume included), whether a trainer holds it now,
    and the time to its end at its last logged speed. Read from the files alone; nothing starts
    or stops."""
    todo = pending(args)
    lines = []
    for b, book in ledgers(args).items():
        waiting = sum(1 for t in todo if t[1] == b)
        lines.append(f"{b} steps: {len(book.rows)} run(s) in the ledger, {waiting} seed run(s) the rate rule needs")
        finished = {(p, f"{arm}_lr{convergence.lr_tag(lr)}", seed) for p, arm, lr, seed in book.rows}
        for run in sorted((args.out / f"steps{b}" / "runs").glob("*/*/seed*")):
            point, name, seed = run.parent.parent.name, run.parent.name, run.name.removeprefix("seed")
            if not seed.isdigit() or (point, name, int(seed)) in finished:
                continue
            logged = [r for r in MetricsLog.read_complete(run / "metrics.jsonl") if "step" in r]
            # events count for the step (a stop's checkpoint and a resume log theirs), not the speed
            step = max((r["step"] for r in logged), default=0)
            speed = next((r["tok_per_s"] for r in reversed(logged) if "event" not in r and r.get("tok_per_s")), None)
            holder = live_trainer(run)
            state = "running" if holder else ("finished, not yet in the ledger" if step >= b else "stopped")
            left = ""
            if speed and step < b:
                seconds = (b - step) * args.tokens_per_step / speed
                left = f", about {seconds / 60:.0f} min to go at {args.tokens_per_step / speed:.2f} s a step"
            lines.append(f"  {point} {name} seed {seed}: logged step {step} of {b} ({state}{left})")
    return lines
