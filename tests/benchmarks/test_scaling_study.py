"""benchmarks/scaling.py: the learning-rate ladder, sweeps grown until the best rate is
bracketed, the ledger that makes the study resumable, and the speedup it reports. The trainings
are replaced by a function that writes a run's ``metrics.jsonl`` with a known curve, so the
study's logic runs in a second; the real trainings are ``convergence.train_one``'s, tested in
test_study_tools.py."""

from __future__ import annotations

import io
import json
import math
import sys
import threading
import time

import pytest


@pytest.fixture(scope="module")
def scaling_ledger(scaling):
    return sys.modules["scaling_ledger"]  # imported by scaling.py


@pytest.fixture(scope="module")
def scaling_report(scaling):
    return sys.modules["scaling_report"]


def test_ladder_steps_through_1_3_10(scaling, scaling_ledger):
    assert scaling.lr_grid(1e-2) == [3e-3, 1e-2, 3e-2]
    assert scaling.lr_grid(3e-2) == [1e-2, 3e-2, 1e-1]
    assert scaling_ledger.ladder(1e-1, +1) == 3e-1 and scaling_ledger.ladder(3e-1, +1) == 1.0
    assert scaling_ledger.ladder(1e-3, -1) == 3e-4 and scaling_ledger.ladder(3e-4, -1) == 1e-4


def test_a_spread_is_shown_only_where_there_are_two_values(scaling_report):
    assert scaling_report.fmt_values([1.5, 2.5]) == "2.00 ± 0.71"
    assert scaling_report.fmt_values([1.5, math.nan], 4) == "1.5000"  # one finite value: no "± 0"
    assert scaling_report.fmt_values([math.nan]) == "-"


def test_next_lr_grows_the_grid_past_the_best_edge(scaling):
    assert scaling.next_lr({1e-3: 2.0, 3e-3: 1.5, 1e-2: 1.2}, 0, 3) == 3e-2  # best at the top
    assert scaling.next_lr({1e-3: 1.0, 3e-3: 1.5, 1e-2: 1.7}, 0, 3) == 3e-4  # best at the bottom
    assert scaling.next_lr({1e-3: 2.0, 3e-3: 1.0, 1e-2: 1.7}, 0, 3) is None  # bracketed
    assert scaling.next_lr({1e-3: 2.0, 3e-3: 1.5, 1e-2: 1.2}, 3, 3) is None  # no more growth allowed
    # a diverged top rate brackets from above; everything diverged: go down
    assert scaling.next_lr({1e-3: 2.0, 3e-3: 1.5, 1e-2: math.inf}, 0, 3) is None
    assert scaling.next_lr({1e-3: math.inf, 3e-3: math.inf}, 0, 3) == 3e-4


# Each arm's final loss is smallest at its ``BEST`` rate (a parabola in log10 lr); nGPT's best
# lies two ladder steps above its starting grid, so its sweep has to grow twice.
BEST = {"gpt": 1e-2, "ngpt": 3e-1}
STEPS = list(range(10, 101, 10))


def fake_curve(arm: str, lr: float, seed: int) -> list[float]:
    final = 2.0 + (math.log10(lr) - math.log10(BEST[arm])) ** 2 + 0.01 * seed
    # GPT comes down linearly to its final loss at step 100; nGPT twice as fast, then flat
    rate = 1.0 if arm == "gpt" else 2.0
    return [max(final, 4.0 - rate * (4.0 - final) * s / 100) for s in STEPS]


def fake_train_one(calls):
    def train_one(pargs, spec, seed, say):
        name, _, items = spec.partition(":")
        arm = name.split("_lr")[0]
        lr = float(next(kv.split("=")[1] for kv in items.split(",") if kv.startswith("optim.lr=")))
        run_dir = pargs.runs / name / f"seed{seed}"
        run_dir.mkdir(parents=True, exist_ok=True)
        lines = [
            {"step": s, "val_loss": v, "tokens": s * pargs.block * pargs.batch}
            for s, v in zip(STEPS, fake_curve(arm, lr, seed))
        ]
        lines.append({"event": "done", "step": STEPS[-1], "val_loss": lines[-1]["val_loss"]})
        # a seed-1 run was stopped at step 50 and resumed: its log has a second start there
        starts = [{"event": "start", "step": 0}] + ([{"event": "start", "step": 50}] if seed == 1 else [])
        lines = starts[:1] + lines[:5] + starts[1:] + lines[5:]
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
        calls.append((str(pargs.block), arm, lr, seed))
        say(f"  {name} seed {seed}: ok")
        return name, seed, 0

    return train_one


def test_study_brackets_every_arm_reports_the_speedup_and_resumes(scaling, tmp_path, monkeypatch):
    calls: list = []
    monkeypatch.setattr(scaling.convergence, "train_one", fake_train_one(calls))
    argv = ["--points", "tiny@32", "--arms", "gpt", "ngpt", "--update-point", "", "--seeds", "0", "1",
            "--data", "stdlib", "--out", str(tmp_path / "out"), "--results", str(tmp_path / "results"), "--no-progress"]  # fmt: skip # a command line
    assert scaling.main(argv) == 0

    ledger = [json.loads(line) for line in (tmp_path / "results" / "runs.jsonl").read_text().splitlines()]
    sweep = {arm: sorted(r["lr"] for r in ledger if r["arm"] == arm and r["seed"] == 0) for arm in BEST}
    assert sweep["gpt"] == [3e-3, 1e-2, 3e-2]  # bracketed by the first grid
    assert sweep["ngpt"] == [1e-2, 3e-2, 1e-1, 3e-1, 1.0]  # grown twice past its top edge
    seed1 = {r["arm"]: r["lr"] for r in ledger if r["seed"] == 1}
    assert seed1 == BEST  # the second seed at each arm's best rate
    # each row records where its run's last invocation began (a resumed run's time covers only that)
    assert {(r["seed"], r["from_step"]) for r in ledger} == {(0, 0), (1, 50)}

    table = (tmp_path / "results" / "scaling.md").read_text()
    row = next(line for line in table.splitlines() if line.startswith("| tiny@32 |") and "| ngpt |" in line)
    # nGPT reaches GPT's final loss in half the steps, with either seed
    assert "2.00 ± 0.00 (2.00, 2.00)" in row and "| yes |" in row
    assert (tmp_path / "results" / "speedup_context.png").stat().st_size > 0

    # resumed: everything is in the ledger, nothing trains again
    calls.clear()
    assert scaling.main(argv) == 0
    assert calls == []


def test_arms_run_side_by_side_so_no_place_waits_for_another_arms_stage(scaling, tmp_path, monkeypatch):
    """nGPT's sweep grows twice past its grid while GPT's is bracketed at once: with two places,
    GPT's second seed runs beside nGPT's growth instead of after it."""
    import threading

    gpt_seed_started = threading.Event()
    overlapped = []
    calls: list = []
    fake = fake_train_one(calls)

    def train_one(pargs, spec, seed, say):
        name = spec.partition(":")[0]
        if name.startswith("gpt_") and seed == 1:
            gpt_seed_started.set()
        elif name in ("ngpt_lr3e-1", "ngpt_lr1e0") and seed == 0:  # the growth runs
            overlapped.append(gpt_seed_started.wait(timeout=10))
        return fake(pargs, spec, seed, say)

    monkeypatch.setattr(scaling.convergence, "train_one", train_one)
    argv = ["--points", "tiny@32", "--arms", "gpt", "ngpt", "--update-point", "", "--seeds", "0", "1", "--jobs", "2",
            "--data", "stdlib", "--out", str(tmp_path / "out"), "--results", str(tmp_path / "results"), "--no-progress"]  # fmt: skip # a command line
    assert scaling.main(argv) == 0
    assert overlapped and all(overlapped), overlapped
    # the same runs as one at a time: the rule decides the same
    seed1 = {arm: lr for (_, arm, lr, seed) in calls if seed == 1}
    assert seed1 == BEST and len(calls) == 3 + 5 + 2


def _until(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_a_free_place_goes_to_the_waiting_run_of_fewest_steps(scaling):
    """The one place is taken; a 10828-step run asks for it, then a 2707-step one, then another
    10828-step one: the shorter run gets it first, the equal ones in the order they asked."""
    places = scaling.Places(1)
    order: list[str] = []

    def run(steps: int, name: str) -> None:
        with places.place(steps):
            order.append(name)

    threads = []
    with places.place(677):
        for steps, name in ((10828, "long, first"), (2707, "short"), (10828, "long, second")):
            threads.append(threading.Thread(target=run, args=(steps, name)))
            threads[-1].start()
            _until(lambda: len(places._waiting) == len(threads))  # it waits before the next asks
        assert order == []
    for thread in threads:
        thread.join(timeout=10)
    assert order == ["short", "long, first", "long, second"]


def test_as_many_runs_hold_places_at_once_as_there_are_places(scaling):
    places = scaling.Places(2)
    inside, both_in = threading.Barrier(2, timeout=10), []

    def run() -> None:
        with places.place(100):
            inside.wait()  # breaks (and so fails) unless both hold a place at the same time
            both_in.append(True)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    assert both_in == [True, True] and places.free == 2


def test_a_crashed_run_stays_out_of_the_ledger(scaling, tmp_path, monkeypatch):
    monkeypatch.setattr(scaling.convergence, "train_one", lambda pargs, spec, seed, say: (spec.split(":")[0], seed, 1))
    argv = ["--points", "tiny@32", "--arms", "gpt", "--update-point", "", "--seeds", "0", "--data", "stdlib",
            "--out", str(tmp_path / "out"), "--results", str(tmp_path / "results"), "--jobs", "1"]  # fmt: skip # a command line
    with pytest.raises(SystemExit, match="failed \\(exit 1\\)"):
        scaling.main(argv)
    assert not (tmp_path / "results" / "runs.jsonl").exists()


def test_after_a_crash_no_other_run_starts(scaling, tmp_path, monkeypatch):
    import time

    started = []

    def train_one(pargs, spec, seed, say):
        name = spec.partition(":")[0]
        started.append(name)
        if name.startswith("gpt_"):
            return name, seed, 1  # a crash: no metrics
        time.sleep(0.2)
        return fake_train_one([])(pargs, spec, seed, say)

    monkeypatch.setattr(scaling.convergence, "train_one", train_one)
    argv = ["--points", "tiny@32", "--arms", "gpt", "ngpt", "--update-point", "", "--seeds", "0", "--jobs", "2",
            "--data", "stdlib", "--out", str(tmp_path / "out"), "--results", str(tmp_path / "results")]  # fmt: skip # a command line
    with pytest.raises(SystemExit, match="failed \\(exit 1\\)"):
        scaling.main(argv)
    # the runs under way when the first crash came may end; none of the six queued after it starts
    assert len(started) <= 3, started


def test_bad_point_is_refused(scaling, tmp_path):
    with pytest.raises(SystemExit, match="SIZE@CONTEXT"):
        scaling.main(["--points", "tiny256", "--out", str(tmp_path), "--results", str(tmp_path)])


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("flag", [[], ["--no-progress"]])
def test_progress_bar_on_a_terminal_unless_no_progress(scaling, tmp_path, monkeypatch, flag):
    monkeypatch.setattr(scaling.convergence, "train_one", fake_train_one([]))
    monkeypatch.setattr(sys, "stderr", FakeTerminal())
    argv = ["--points", "tiny@32", "--arms", "gpt", "--update-point", "", "--seeds", "0", "--data", "stdlib",
            "--out", str(tmp_path / "out"), "--results", str(tmp_path / "results"), *flag]  # fmt: skip # a command line
    assert scaling.main(argv) == 0
    shown = sys.stderr.getvalue()
    if flag:
        assert "scaling study" not in shown
    else:
        assert "scaling study" in shown and "3/3" in shown  # the sweep's three runs, all planned


@pytest.mark.slow
def test_one_real_training_through_the_study(scaling, tmp_path):
    """The study drives convergence.train_one, a real recipes.train process, as it is today:
    one GPT run of a few steps lands in the ledger with its validation curve."""
    text = tmp_path / "corpus.txt"
    text.write_text("\n\n".join(f"line {i}: the quick brown fox jumps over the lazy dog" for i in range(300)))
    argv = ["--points", "tiny@16", "--arms", "gpt", "--update-point", "", "--seeds", "0", "--grid", "0.01",
            "--steps", "4", "--tokens-per-step", "64", "--eval-every", "2", "--eval-batches", "1", "--jobs", "1",
            "--data", str(text), "--out", str(tmp_path / "out"), "--results", str(tmp_path / "results"),
            "--no-progress"]  # fmt: skip  # options beside their values
    assert scaling.main(argv) == 0
    (row,) = [json.loads(line) for line in (tmp_path / "results" / "runs.jsonl").read_text().splitlines()]
    assert row["finished"] and row["exit"] == 0 and row["steps"] == [2, 4] and len(row["val_loss"]) == 2


def test_a_ratio_reached_at_the_first_evaluation_is_reported_as_a_lower_bound(scaling, scaling_report, tmp_path):
    """With validation every 10 of 100 steps no ratio above 10x can be measured: an arm already
    at GPT's best loss by its first evaluation is marked, in the table, as a lower bound."""
    import argparse

    def run(arm, lr, seed, val_loss):
        return {"point": "tiny@32", "arm": arm, "lr": lr, "seed": seed, "finished": True,
                "steps": [10, 20, 30], "val_loss": val_loss}  # fmt: skip  # one ledger row per line

    ledger = scaling.Ledger(tmp_path / "runs.jsonl")
    for row in [
        run("gpt", 1e-2, 0, [3.0, 2.5, 2.0]),
        run("gpt", 3e-3, 0, [3.0, 2.6, 2.2]),
        run("gpt", 3e-2, 0, [3.0, 2.6, 2.3]),
        run("gpt", 1e-2, 1, [3.0, 2.5, 2.0]),
        run("ngpt", 3e-2, 0, [1.9, 1.8, 1.7]),  # at GPT's best (2.0) by step 10: 3x or more
        run("ngpt", 1e-2, 0, [2.5, 2.2, 2.1]),
        run("ngpt", 1e-1, 0, [2.5, 2.2, 2.1]),
        run("ngpt", 3e-2, 1, [2.5, 1.9, 1.8]),  # at 2.0 by step 20: exactly 1.5x
    ]:
        ledger.add(row)
    paired = scaling_report.paired(ledger, "tiny@32", "ngpt", 3e-2, 1e-2, [0, 1])
    assert paired["ratios"] == [3.0, 1.5] and paired["censored"] == [True, False]
    assert scaling_report.paired(ledger, "tiny@32", "gpt", 1e-2, 1e-2, [0, 1])["censored"] == [False, False]

    point = scaling.Point.parse("tiny@32")
    args = argparse.Namespace(
        points=[point], arms=["gpt", "ngpt"], update_point=None, sweep_seed=0, seeds=[0, 1],
        params={"tiny@32": 170_000}, results=tmp_path, command="python benchmarks/scaling.py", jobs=1, threads=1,
        date="2026-01-01", corpus_label="a corpus", tokens_per_step=1024, steps=30, eval_every=10,
        eval_batches=1, overrides=[],
    )  # fmt: skip  # the study's arguments, grouped by kind
    args.context_size, args.size_context = "tiny", 32
    scaling.write_results(args, ledger)
    assert (tmp_path / "speedup_context.png").stat().st_size > 0  # drawn with the lower-bound marker
    table = (tmp_path / "scaling.md").read_text()
    row = next(line for line in table.splitlines() if "| ngpt |" in line)
    assert "| ≥ 2.25 ± 1.06 (≥3.00, 1.50) |" in row and "| yes |" in row
    gpt_row = next(line for line in table.splitlines() if "| gpt |" in line)
    assert "≥" not in gpt_row
    assert "3x is the most this budget can measure" in table
    # a start with fewer --arms rewrites the same table: the arms the ledger holds stay in it
    args.arms = ["gpt"]
    scaling.write_results(args, ledger, plots=False)
    assert (tmp_path / "scaling.md").read_text() == table


def test_a_hyperball_arm_sweeps_its_matrix_rate_after_gpt_with_gpts_rate_for_its_adamw_part(
    scaling, tmp_path, monkeypatch
):
    """The runs are faked (their curves a function of the rates); what is real is the order, the
    overrides each run gets and what the ledger records."""
    specs = []

    def fake_train_one(pargs, spec, seed, say):
        name, extra = scaling.compare.variant_overrides(spec, pargs.size)
        specs.append((name, dict(item.split("=", 1) for item in extra), seed))
        run_dir = pargs.runs / name / f"seed{seed}"
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "metrics.jsonl").write_text("")
        return name, seed, 0

    def fake_curve(run_dir):
        _, extra, _ = next(s for s in specs if s[0] == run_dir.parent.name)
        rate = float(extra.get("optim.matrix_lr", extra["optim.lr"]))
        best = 0.1 if "optim.matrix_lr" in extra else 0.01
        return {"steps": [2, 4], "val_loss": [3.0, 2.0 + abs(math.log(rate / best))], "tokens": [128, 256]}

    monkeypatch.setattr(scaling.convergence, "train_one", fake_train_one)
    monkeypatch.setattr(scaling.compare, "read_curve", fake_curve)
    monkeypatch.setattr(scaling.compare, "finished", lambda run_dir: True)
    argv = ["--points", "tiny@16", "--arms", "gpt-adamh", "gpt", "--update-point", "", "--seeds", "0", "1",
            "--steps", "4", "--tokens-per-step", "64", "--eval-every", "2", "--eval-batches", "1", "--jobs", "2",
            "--data", "stdlib", "--out", str(tmp_path / "out"), "--results", str(tmp_path / "results"),
            "--no-progress"]  # fmt: skip  # options beside their values
    assert scaling.main(argv) == 0
    first_adamh = next(i for i, (name, _, _) in enumerate(specs) if name.startswith("gpt-adamh"))
    gpt_sweep = [i for i, (name, _, seed) in enumerate(specs) if name.startswith("gpt_") and seed == 0]
    assert max(gpt_sweep) < first_adamh  # GPT's whole sweep first
    adamh = [extra for name, extra, _ in specs if name.startswith("gpt-adamh")]
    assert {extra["optim.lr"] for extra in adamh} == {"0.01"}  # GPT's best rate for the AdamW part
    assert {float(extra["optim.matrix_lr"]) for extra in adamh} >= {0.03, 0.1, 0.3}  # the grid around 0.1
    rows = [json.loads(line) for line in (tmp_path / "results" / "runs.jsonl").read_text().splitlines()]
    assert all(r["adamw_lr"] == 0.01 for r in rows if r["arm"] == "gpt-adamh")
    assert scaling.chosen(scaling.Ledger(tmp_path / "results" / "runs.jsonl"), "tiny@16", "gpt-adamh", 0) == (
        0.1,
        True,
    )
    assert "`optim.matrix_lr`" in (tmp_path / "results" / "scaling.md").read_text()
