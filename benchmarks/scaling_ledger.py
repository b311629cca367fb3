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


class Ledger:
    """``runs.jsonl``: one line per finished run, the study's memory across restarts."""

    def __init__(self, path: Path):
        self.path = path
        self.rows: dict[tuple[str, str, float, int], dict] = {}
        if path.is_file():
            for line in path.read_text().splitlines():
                if line.strip():
                    r = json.loads(line)
                    self.rows[(r["point"], r["arm"], float(r["lr"]), int(r["seed"]))] = r

    def get(self, point: Point, arm: str, lr: float, seed: int) -> dict | None:
        return self.rows.get((str(point), arm, float(lr), seed))

    def add(self, row: dict) -> None:
        self.rows[(row["point"], row["arm"], float(row["lr"]), int(row["seed"]))] = row
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")


def final_loss(row: dict) -> float:
    """The last validation loss of a run that finished (inf: diverged or stopped early)."""
    vals = row["val_loss"]
    if not row.get("finished", True):
        return math.inf
    return vals[-1] if vals and vals[-1] is not None and math.isfinite(vals[-1]) else math.inf


def chosen(ledger: Ledger, point: str, arm: str, sweep_seed: int) -> tuple[float | None, bool]:
    """The arm's best rate at the point (lowest final loss over the sweep) and whether the
    rates tried bracket it (a tried rate on either side)."""
    finals = {lr: final_loss(r) for (p, a, lr, s), r in ledger.rows.items() if (p, a, s) == (point, arm, sweep_seed)}
    if not finals or not any(math.isfinite(v) for v in finals.values()):
        return None, False
    best = min(finals, key=lambda lr: (finals[lr], lr))
    return best, min(finals) < best < max(finals)


def arms_at(args: argparse.Namespace, point: Point) -> list[str]:
    arms = list(args.arms)
    if args.update_point is not None and point == args.update_point:
        arms += [a for a in UPDATE_ARMS if a not in arms]
    return arms
