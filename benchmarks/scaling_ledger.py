"""What the scaling study (``benchmarks/scaling.py``) records and reads back: its points
(``SIZE@CONTEXT``), the 1-3-10 ladder its rate sweeps climb, the ledger of finished runs
(``runs.jsonl``) and each arm's chosen rate. The budget study (``benchmarks/budget.py``) keeps
one such ledger per budget."""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass
from pathlib import Path

BASELINE = "gpt"
#: The residual updates compared at ``--update-point``.
UPDATE_ARMS = ["ngpt", "ngpt-slerp", "ngpt-riemannian"]


@dataclass(frozen=True)
class Point:
    size: str
    context: int

    @classmethod
    def parse(cls, text: str) -> Point:
        size, sep, context = text.partition("@")
        if not sep or not size or not context.isdigit() or int(context) < 2:
            raise SystemExit(f"error: point {text!r} must be SIZE@CONTEXT, e.g. tiny@256")
        return cls(size, int(context))

    def __str__(self) -> str:
        return f"{self.size}@{self.context}"


def parameters(point: Point) -> int:
    """The nGPT model's parameter count at this point (built on the meta device)."""
    import torch

    from spherenet.models import from_preset

    with torch.device("meta"):
        model = from_preset(f"ngpt-{point.size}", max_seq_len=point.context)
    return sum(p.numel() for p in model.parameters())


def ladder(lr: float, direction: int) -> float:
    """The next rate on the 1-3-10 ladder up (+1) or down (-1): 1e-2 -> 3e-2 -> 1e-1."""
    exponent = math.floor(math.log10(lr) + 1e-9)
    mantissa = round(lr / 10**exponent)
    steps = [(1, 0), (3, 0), (1, 1)] if mantissa == 1 else [(3, 0), (1, 1), (3, 1)]
    if direction < 0:
        steps = [(1, 0), (3, -1), (1, -1)] if mantissa == 1 else [(3, 0), (1, 0), (3, -1)]
    m, shift = steps[1]
    return float(f"{m}e{exponent + shift}")


def lr_grid(start: float) -> list[float]:
    return [ladder(start, -1), start, ladder(start, +1)]


def next_lr(finals: dict[float, float], extensions: int, max_extend: int) -> float | None:
    """The rate to try next so that the best one is bracketed, or None when it is (or when the
    grid may not grow any more). ``finals``: final validation loss by rate (inf: diverged)."""
    if extensions >= max_extend or len(finals) < 2:
        return None
    lrs = sorted(finals)
    best = min(lrs, key=lambda lr: (finals[lr], lr))
    if not math.isfinite(finals[best]) or best == lrs[0]:
        return ladder(lrs[0], -1)  # every rate diverged, or the smallest is best: go down
    if best == lrs[-1]:
        return ladder(lrs[-1], +1)
    return None


#: Two sweep rates whose seed-sweep final losses differ by less than this (nats) tie: the
#: smaller end of the seed spreads the tiny budget study saw (std over seeds of a rate's final
#: loss: 0.004-0.12, median about 0.03), so one seed cannot order them.
TIE_MARGIN = 0.02


class Ledger:
    """``runs.jsonl``: one line per finished run, the study's memory across restarts; beside it
    ``picks.jsonl``: one line per decided rate (:func:`decide`), so that a resumed study and the
    report read the same choice."""

    def __init__(self, path: Path):
        self.path = path
        self.picks_path = path.with_name("picks.jsonl")
        self.rows: dict[tuple[str, str, float, int], dict] = {}
        self.picks: dict[tuple[str, str], dict] = {}
        if path.is_file():
            for line in path.read_text().splitlines():
                if line.strip():
                    r = json.loads(line)
                    self.rows[(r["point"], r["arm"], float(r["lr"]), int(r["seed"]))] = r
        if self.picks_path.is_file():
            for line in self.picks_path.read_text().splitlines():
                if line.strip():
                    r = json.loads(line)
                    self.picks[(r["point"], r["arm"])] = r

    # Runs finish on several threads while others read the ledger: a new row or pick replaces
    # the dict (copy on write), so that a reader iterating the old one is never disturbed.

    def add_pick(self, pick: dict) -> None:
        self.picks = {**self.picks, (pick["point"], pick["arm"]): pick}
        with self.picks_path.open("a") as f:
            f.write(json.dumps(pick) + "\n")

    def get(self, point: Point, arm: str, lr: float, seed: int) -> dict | None:
        return self.rows.get((str(point), arm, float(lr), seed))

    def add(self, row: dict) -> None:
        self.rows = {**self.rows, (row["point"], row["arm"], float(row["lr"]), int(row["seed"])): row}
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")


def final_loss(row: dict) -> float:
    """The last validation loss of a run that finished (inf: diverged or stopped early)."""
    vals = row["val_loss"]
    if not row.get("finished", True):
        return math.inf
    return vals[-1] if vals and vals[-1] is not None and math.isfinite(vals[-1]) else math.inf


def sweep_finals(ledger: Ledger, point: str, arm: str, sweep_seed: int) -> dict[float, float]:
    return {lr: final_loss(r) for (p, a, lr, s), r in ledger.rows.items() if (p, a, s) == (point, arm, sweep_seed)}


def candidates(finals: dict[float, float], margin: float) -> list[float]:
    """The rates the pick is between: the sweep's best, and its runner-up when that one's final
    loss is less than ``margin`` nats above the best's (a tie one seed cannot break)."""
    ranked = sorted((lr for lr in finals if math.isfinite(finals[lr])), key=lambda lr: (finals[lr], lr))
    if len(ranked) >= 2 and finals[ranked[1]] - finals[ranked[0]] < margin:
        return ranked[:2]
    return ranked[:1]


def seed_mean(ledger: Ledger, point: str, arm: str, lr: float, seeds: list[int]) -> float:
    losses = [final_loss(ledger.rows[(point, arm, float(lr), s)]) for s in seeds]
    return sum(losses) / len(losses)


#: The most rates a sweep may hold once :func:`decide` grows it past a tie's pick (the grid of
#: three, ``--max-extend`` growths of the sweep stage, and a few more).
MAX_SWEEP_RATES = 9


def _at_edge(lr: float, rates) -> int:
    """-1 / +1 when ``lr`` is the smallest / largest of ``rates`` (nothing tried past it), else 0."""
    rates = sorted(rates)
    return -1 if lr == rates[0] else +1 if lr == rates[-1] else 0


def _stands(recorded: dict, finals: dict[float, float]) -> bool:
    """A recorded pick stands, unless it was written before ties were bracketed and a tie put it
    at an edge of the sweep (then :func:`decide` takes it up again)."""
    return "bracketed" in recorded or len(recorded["candidates"]) < 2 or not _at_edge(recorded["picked"], finals)


def decide(ledger: Ledger, point: str, arm: str, seeds: list[int], sweep_seed: int, margin: float = TIE_MARGIN):
    """The rate rule, after the sweep on ``sweep_seed``: the best rate runs on every seed; when
    the runner-up ties with it (:func:`candidates`), the runner-up runs on every seed too and the
    lower mean final loss over the seeds wins (equal means: the sweep's best). When the tie puts
    the pick at an edge of the sweep, the sweep grows one ladder step past it (a run on the sweep
    seed) and the rule runs again on the wider sweep, so that the pick ends bracketed (up to
    :data:`MAX_SWEEP_RATES` rates); in a tie every rate already run on all seeds competes by its
    mean. Returns (the decision to record in ``picks.jsonl``, or None
    while runs are missing; the runs (lr, seed) still missing). A decision already recorded
    stands (see :func:`_stands`); ``seeds`` beyond those it was decided on run at its pick only
    (more seeds sharpen the pick's mean, they do not reopen the choice)."""
    recorded = ledger.picks.get((point, arm))
    finals = sweep_finals(ledger, point, arm, sweep_seed)
    if recorded is not None and _stands(recorded, finals):
        picked = float(recorded["picked"])
        return recorded, [(picked, s) for s in seeds if (point, arm, picked, s) not in ledger.rows]
    cands = candidates(finals, margin)
    if not cands:
        return None, []
    missing = [(lr, s) for lr in cands for s in seeds if (point, arm, float(lr), s) not in ledger.rows]
    if missing:
        return None, missing
    # every rate run on all seeds competes by its mean (a candidate before the sweep grew stays one)
    full = [lr for lr in sorted(finals) if lr not in cands and all((point, arm, lr, s) in ledger.rows for s in seeds)]
    contenders = [*cands, *full] if len(cands) > 1 else cands
    means = {lr: seed_mean(ledger, point, arm, lr, seeds) for lr in contenders}
    picked = min(contenders, key=lambda lr: (means[lr], contenders.index(lr)))
    edge = _at_edge(picked, finals)
    if len(cands) > 1 and edge and len(finals) < MAX_SWEEP_RATES:
        return None, [(ladder(picked, edge), sweep_seed)]
    pick = {
        "point": point,
        "arm": arm,
        "picked": picked,
        "candidates": [{"lr": lr, "sweep_final": finals[lr], "mean": means[lr]} for lr in contenders],
        "tried": sorted(finals),
        "bracketed": not edge,
        "seeds": list(seeds),
        "sweep_seed": sweep_seed,
        "tie_margin": margin,
    }
    return pick, []


def chosen(
    ledger: Ledger, point: str, arm: str, sweep_seed: int, margin: float = TIE_MARGIN
) -> tuple[float | None, bool]:
    """The arm's rate at the point and whether the rates tried bracket it (a tried rate on
    either side): the pick recorded by :func:`decide`; before one is, the rule applied to the
    runs so far (the sweep's best until a tied runner-up has run on the best's seeds)."""
    finals = sweep_finals(ledger, point, arm, sweep_seed)
    if not finals or not any(math.isfinite(v) for v in finals.values()):
        return None, False
    recorded = ledger.picks.get((point, arm))
    if recorded is not None:
        best = float(recorded["picked"])
    else:
        cands = candidates(finals, margin)
        best = cands[0]
        seeds = sorted(s for (p, a, lr, s) in ledger.rows if (p, a, lr) == (point, arm, best))
        if len(cands) == 2 and len(seeds) > 1 and all((point, arm, cands[1], s) in ledger.rows for s in seeds):
            means = {lr: seed_mean(ledger, point, arm, lr, seeds) for lr in cands}
            best = min(cands, key=lambda lr: (means[lr], cands.index(lr)))
    return best, min(finals) < best < max(finals)


def arms_at(args: argparse.Namespace, point: Point) -> list[str]:
    arms = list(args.arms)
    if args.update_point is not None and point == args.update_point:
        arms += [a for a in UPDATE_ARMS if a not in arms]
    return arms
