"""The studies' rate rule (``benchmarks/scaling_ledger.py``): the sweep's best rate runs on every
seed, and a runner-up within ``--tie-margin`` nats of it on the sweep seed runs on every seed too,
the better mean over the seeds picked and recorded in ``picks.jsonl``, so that a resumed study and
the report agree. The trainings are replaced by a function that writes a known final loss."""

from __future__ import annotations

import json
import math

import pytest


def row(point: str, arm: str, lr: float, seed: int, final: float) -> dict:
    return {"point": point, "arm": arm, "lr": lr, "seed": seed, "finished": True, "exit": 0, "steps": [10],
            "val_loss": [final], "tokens": [100], "wall_s": 1.0, "date": "2026-01-01"}  # fmt: skip  # one ledger line


def test_a_runner_up_within_the_margin_ties(scaling):
    finals = {1e-2: 2.004, 3e-2: 2.000, 1e-1: 2.3}
    assert scaling.candidates(finals, 0.02) == [3e-2, 1e-2]
    assert scaling.candidates(finals, 0.004) == [3e-2]  # 0.004 apart: not below a margin of 0.004
    assert scaling.candidates({1e-2: math.inf, 3e-2: 2.0}, 0.02) == [3e-2]  # a diverged rate ties with nothing
    assert scaling.candidates({1e-2: math.inf}, 0.02) == []


def test_a_tie_runs_both_rates_on_every_seed_and_the_better_mean_is_picked_and_kept(scaling, tmp_path):
    ledger = scaling.Ledger(tmp_path / "runs.jsonl")
    for lr, final in [(1e-2, 2.004), (3e-2, 2.000), (1e-1, 2.3)]:
        ledger.add(row("tiny@32", "ngpt", lr, 0, final))
    # before the seeds: the sweep's best, and the runs the rule needs (both tied rates, seeds 1 and 2)
    assert scaling.chosen(ledger, "tiny@32", "ngpt", 0) == (3e-2, True)
    pick, missing = scaling.decide(ledger, "tiny@32", "ngpt", [0, 1, 2], 0)
    assert pick is None and missing == [(3e-2, 1), (3e-2, 2), (1e-2, 1), (1e-2, 2)]
    # with a margin below the gap only the best runs on
    assert scaling.decide(ledger, "tiny@32", "ngpt", [0, 1, 2], 0, margin=0.001)[1] == [(3e-2, 1), (3e-2, 2)]
    for seed, (best, runner_up) in {1: (2.10, 2.02), 2: (2.08, 2.04)}.items():
        ledger.add(row("tiny@32", "ngpt", 3e-2, seed, best))
        ledger.add(row("tiny@32", "ngpt", 1e-2, seed, runner_up))
    # the runner-up's mean over the seeds is lower: it wins, and as the lowest rate tried it is not
    # bracketed, so the sweep grows past it on the sweep seed first
    assert scaling.chosen(ledger, "tiny@32", "ngpt", 0) == (1e-2, False)
    assert scaling.decide(ledger, "tiny@32", "ngpt", [0, 1, 2], 0) == (None, [(3e-3, 0)])
    ledger.add(row("tiny@32", "ngpt", 3e-3, 0, 2.2))  # no tie with the best: 1e-2 stands, bracketed
    pick, missing = scaling.decide(ledger, "tiny@32", "ngpt", [0, 1, 2], 0)
    assert missing == [] and pick["picked"] == 1e-2 and pick["bracketed"]
    assert pick["tried"] == [3e-3, 1e-2, 3e-2, 1e-1]
    assert [c["lr"] for c in pick["candidates"]] == [3e-2, 1e-2]
    assert pick["candidates"][1]["mean"] == pytest.approx((2.004 + 2.02 + 2.04) / 3)
    ledger.add_pick(pick)
    # read back: the recorded pick stands, whatever margin a later reader passes
    again = scaling.Ledger(tmp_path / "runs.jsonl")
    assert again.picks[("tiny@32", "ngpt")]["picked"] == 1e-2
    assert scaling.chosen(again, "tiny@32", "ngpt", 0, margin=0.0) == (1e-2, True)
    assert scaling.decide(again, "tiny@32", "ngpt", [0, 1, 2], 0, margin=0.0) == (again.picks[("tiny@32", "ngpt")], [])
    assert len(again.rows) == 8  # picks.jsonl is beside the runs, not among them
    # more seeds later: they run at the recorded pick only (the tied runner-up does not), and
    # the pick stands whatever they give
    pick = again.picks[("tiny@32", "ngpt")]
    assert scaling.decide(again, "tiny@32", "ngpt", [0, 1, 2, 3, 4], 0) == (pick, [(1e-2, 3), (1e-2, 4)])
    again.add(row("tiny@32", "ngpt", 1e-2, 3, 9.0))
    assert scaling.decide(again, "tiny@32", "ngpt", [0, 1, 2, 3, 4], 0) == (pick, [(1e-2, 4)])
    assert scaling.chosen(again, "tiny@32", "ngpt", 0) == (1e-2, True)


def test_a_tie_won_at_the_edge_grows_the_sweep_until_the_pick_is_bracketed(scaling, tmp_path):
    """The grown rate ties with the best on the sweep seed: it runs on every seed, wins by its
    mean, and the sweep grows past it again; a rate already run on all seeds keeps competing."""
    ledger = scaling.Ledger(tmp_path / "runs.jsonl")
    finals = {3e-2: [2.000, 2.10, 2.08], 1e-2: [2.004, 2.02, 2.04], 1e-1: [2.3], 3e-3: [1.990, 2.00, 2.01], 1e-3: [2.5]}

    def run(missing):
        for lr, seed in missing:
            ledger.add(row("tiny@32", "ngpt", lr, seed, finals[lr][seed]))

    run([(3e-2, 0), (1e-2, 0), (1e-1, 0)])
    steps = []
    while True:
        pick, missing = scaling.decide(ledger, "tiny@32", "ngpt", [0, 1, 2], 0)
        if not missing:
            break
        steps.append(missing)
        run(missing)
    assert steps == [
        [(3e-2, 1), (3e-2, 2), (1e-2, 1), (1e-2, 2)],  # the tie
        [(3e-3, 0)],  # 1e-2 won at the lower edge: one step past it on the sweep seed
        [(3e-3, 1), (3e-3, 2)],  # 3e-3 is the sweep seed's best now, tied with 3e-2
        [(1e-3, 0)],  # 3e-3 won at the edge: past it again
    ]
    assert pick["picked"] == 3e-3 and pick["bracketed"] and pick["tried"] == [1e-3, 3e-3, 1e-2, 3e-2, 1e-1]
    assert [c["lr"] for c in pick["candidates"]] == [3e-3, 3e-2, 1e-2]  # 1e-2 ran on every seed: it competes


def test_a_pick_recorded_before_ties_were_bracketed_is_taken_up_again(scaling, tmp_path):
    ledger = scaling.Ledger(tmp_path / "runs.jsonl")
    for lr, finals in {3e-2: [2.000, 2.10, 2.08], 1e-2: [2.004, 2.02, 2.04], 1e-1: [2.3]}.items():
        for seed, final in enumerate(finals):
            ledger.add(row("tiny@32", "ngpt", lr, seed, final))
    old = {"point": "tiny@32", "arm": "ngpt", "picked": 1e-2, "seeds": [0, 1, 2], "sweep_seed": 0,
           "candidates": [{"lr": 3e-2, "sweep_final": 2.0, "mean": 2.06}, {"lr": 1e-2, "sweep_final": 2.004,
                                                                          "mean": 2.0213}]}  # fmt: skip  # a ledger line
    ledger.add_pick(old)
    assert scaling.decide(ledger, "tiny@32", "ngpt", [0, 1, 2], 0) == (None, [(3e-3, 0)])
    # a recorded pick that is bracketed, or was decided by the sweep seed alone, stands
    ledger.add_pick({**old, "picked": 3e-2, "candidates": old["candidates"][:1]})
    assert scaling.decide(ledger, "tiny@32", "ngpt", [0, 1, 2], 0)[1] == []


# gpt's final loss: 1e-2 best on seed 0, 3e-3 0.01 behind it there but better on seeds 1 and 2
FINALS = {
    ("gpt", 3e-3): [2.51, 2.50, 2.50],
    ("gpt", 1e-2): [2.50, 2.60, 2.60],
    ("gpt", 3e-2): [2.90, 2.90, 2.90],
    ("gpt", 1e-3): [3.20, 3.20, 3.20],
}


def fake_train_one(calls):
    def train_one(pargs, spec, seed, say):
        name, _, items = spec.partition(":")
        arm = name.split("_lr")[0]
        lr = float(next(kv.split("=")[1] for kv in items.split(",") if kv.startswith("optim.lr=")))
        final = FINALS[arm, lr][seed]
        run_dir = pargs.runs / name / f"seed{seed}"
        run_dir.mkdir(parents=True, exist_ok=True)
        lines = [{"step": s, "val_loss": final + (100 - s) / 100, "tokens": s * 64} for s in range(10, 101, 10)]
        lines.append({"event": "done", "step": 100, "val_loss": final})
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
        calls.append((arm, lr, seed))
        return name, seed, 0

    return train_one


def test_the_study_runs_a_tied_runner_up_on_every_seed_records_the_pick_and_resumes(scaling, tmp_path, monkeypatch):
    calls: list = []
    monkeypatch.setattr(scaling.convergence, "train_one", fake_train_one(calls))
    results = tmp_path / "results"
    argv = ["--points", "tiny@32", "--arms", "gpt", "--update-point", "", "--seeds", "0", "1", "2", "--data",
            "stdlib", "--out", str(tmp_path / "out"), "--results", str(results), "--no-progress", "--jobs", "1"]  # fmt: skip  # a command line
    # an earlier study's ledger: the sweep and the best rate's seeds, decided by seed 0 alone
    results.mkdir(parents=True)
    ledger = scaling.Ledger(results / "runs.jsonl")
    for (arm, lr), finals in FINALS.items():
        if lr != 1e-3:
            ledger.add(row("tiny@32", arm, lr, 0, finals[0]))
    for seed in (1, 2):
        ledger.add(row("tiny@32", "gpt", 1e-2, seed, FINALS["gpt", 1e-2][seed]))
    assert scaling.chosen(ledger, "tiny@32", "gpt", 0)[0] == 1e-2

    assert scaling.main(argv) == 0
    # the tied runner-up's seeds; it wins at the sweep's lower edge, so one run past it (seed 0)
    assert calls == [("gpt", 3e-3, 1), ("gpt", 3e-3, 2), ("gpt", 1e-3, 0)]
    (pick,) = [json.loads(line) for line in (results / "picks.jsonl").read_text().splitlines()]
    assert pick["picked"] == 3e-3 and pick["tie_margin"] == scaling.TIE_MARGIN
    row_md = next(line for line in (results / "scaling.md").read_text().splitlines() if "| gpt |" in line)
    assert "**0.003**" in row_md

    # resumed, even with a margin that would not call it a tie: the recorded pick stands, nothing trains
    calls.clear()
    assert scaling.main([*argv, "--tie-margin", "0.001"]) == 0
    assert calls == []
    assert len((results / "picks.jsonl").read_text().splitlines()) == 1


def test_a_hyperball_arm_reruns_when_a_tie_moves_gpts_rate_under_its_adamw_part(scaling, tmp_path, monkeypatch):
    calls: list = []
    train = fake_train_one(calls)

    def train_one(pargs, spec, seed, say):  # gpt-adamh: its matrix rate decides, 0.1 best on every seed
        if spec.startswith("gpt-adamh"):
            spec = spec.replace("optim.lr=", "optim.adamw_lr=").replace("optim.matrix_lr=", "optim.lr=")
        return train(pargs, spec, seed, say)

    monkeypatch.setattr(scaling.convergence, "train_one", train_one)
    monkeypatch.setitem(FINALS, ("gpt-adamh", 0.03), [2.9] * 3)
    monkeypatch.setitem(FINALS, ("gpt-adamh", 0.1), [2.7] * 3)
    monkeypatch.setitem(FINALS, ("gpt-adamh", 0.3), [2.95] * 3)
    results = tmp_path / "results"
    results.mkdir(parents=True)
    ledger = scaling.Ledger(results / "runs.jsonl")
    for (arm, lr), finals in FINALS.items():
        if arm == "gpt" and lr != 1e-3:
            ledger.add(row("tiny@32", arm, lr, 0, finals[0]))
    for seed in (1, 2):
        ledger.add(row("tiny@32", "gpt", 1e-2, seed, FINALS["gpt", 1e-2][seed]))
    # the Hyperball arm's runs, done with GPT's seed-0 rate 0.01 for its AdamW part
    for lr, seeds in ((0.03, [0]), (0.1, [0, 1, 2]), (0.3, [0])):
        for seed in seeds:
            ledger.add({**row("tiny@32", "gpt-adamh", lr, seed, 2.0), "adamw_lr": 1e-2})
    argv = ["--points", "tiny@32", "--arms", "gpt", "gpt-adamh", "--update-point", "", "--seeds", "0", "1", "2",
            "--data", "stdlib", "--out", str(tmp_path / "out"), "--results", str(results), "--no-progress",
            "--jobs", "1"]  # fmt: skip  # a command line
    assert scaling.main(argv) == 0
    # GPT's tie is decided first (0.003, bracketed by a run past it), then every Hyperball run again with it
    assert calls[:3] == [("gpt", 3e-3, 1), ("gpt", 3e-3, 2), ("gpt", 1e-3, 0)]
    assert sorted(calls[3:]) == [("gpt-adamh", lr, s) for lr, s in [(0.03, 0), (0.1, 0), (0.1, 1), (0.1, 2), (0.3, 0)]]
    again = scaling.Ledger(results / "runs.jsonl")
    adamh = [r for key, r in again.rows.items() if key[1] == "gpt-adamh"]
    assert len(adamh) == 5 and all(r["adamw_lr"] == 3e-3 and r["val_loss"][-1] > 2.5 for r in adamh)
    assert again.picks[("tiny@32", "gpt-adamh")]["picked"] == 0.1
