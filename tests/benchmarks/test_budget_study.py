"""benchmarks/budget.py: the compute multiplier read off GPT's final-loss-against-budget curve
(interpolated in log tokens, extrapolations marked), each budget's own bracketed sweep centred
on the last budget's rate, the ledgers that make the study resumable, and its tables. The
trainings are replaced by a function that writes a run's ``metrics.jsonl`` with a known final
loss, so the study's logic runs in seconds; the real trainings are ``convergence.train_one``'s."""

from __future__ import annotations

import json
import math
import sys

import pytest


@pytest.fixture(scope="module")
def report(budget):
    return sys.modules["budget_report"]  # imported by budget.py


# GPT's final loss falls by 0.5 per factor 4 of budget: 3.0 at 100 steps, 2.5 at 400, 2.0 at 1600.
CURVE = [(100, 3.0), (400, 2.5), (1600, 2.0)]


def test_interpolates_in_log_budget(report):
    assert report.budget_for_loss(2.5, CURVE) == (pytest.approx(400), False)
    # halfway between 3.0 and 2.5 in loss is halfway between 100 and 400 in log: 200
    needed, extrapolated = report.budget_for_loss(2.75, CURVE)
    assert needed == pytest.approx(200) and not extrapolated
    # a loss on GPT's curve at 200 steps, reached by an arm in 100 steps: multiplier 2
    assert report.multiplier(2.75, 100, CURVE) == (pytest.approx(2.0), False)
    # an arm worse than GPT at equal tokens has a multiplier below 1
    m, extrapolated = report.multiplier(2.75, 400, CURVE)
    assert m == pytest.approx(0.5) and not extrapolated


def test_order_of_the_curve_does_not_matter(report):
    assert report.budget_for_loss(2.25, list(reversed(CURVE)))[0] == pytest.approx(800)


def test_beyond_the_curve_is_extrapolated_and_marked(report):
    # below GPT's loss at its largest budget: the line through 400 and 1600 continued to 1.5 at 6400
    needed, extrapolated = report.budget_for_loss(1.5, CURVE)
    assert needed == pytest.approx(6400) and extrapolated
    assert report.multiplier(1.5, 1600, CURVE) == (pytest.approx(4.0), True)
    # above GPT's loss at its smallest budget: the line through 100 and 400 continued down
    needed, extrapolated = report.budget_for_loss(3.5, CURVE)
    assert needed == pytest.approx(25) and extrapolated
    assert report.fmt_multiplier(4.0, True) == "4.00*" and report.fmt_multiplier(2.0, False) == "2.00"


def test_a_curve_that_stops_falling_gives_no_finite_extrapolation(report):
    flat_end = [(100, 3.0), (400, 2.5), (1600, 2.6)]  # GPT got worse at its longest budget
    needed, extrapolated = report.budget_for_loss(2.0, flat_end)
    assert math.isinf(needed) and extrapolated
    assert report.fmt_multiplier(math.inf, True) == "∞*"
    # inside the curve the first bracketing segment counts
    assert report.budget_for_loss(2.55, flat_end)[0] == pytest.approx(100 * 4 ** (0.45 / 0.5))
    # too few finite points: nothing to read
    assert math.isnan(report.budget_for_loss(2.5, [(100, 3.0), (400, math.inf)])[0])
    assert report.fmt_multiplier(math.nan, False) == "-"


# A fake study: every arm's final loss is a parabola in log10 lr around its best rate, which
# falls with the budget; nGPT's loss at budget B is GPT's at 2B.
BEST = {"gpt": {40: 1e-2, 160: 3e-3}, "ngpt": {40: 1e-1, 160: 3e-2}}


def gpt_loss(steps: float) -> float:
    return 4.0 - 0.5 * math.log(steps / 40, 4)


def fake_final(arm: str, steps: int, lr: float, seed: int) -> float:
    best = gpt_loss(steps if arm == "gpt" else 2 * steps)
    return best + (math.log10(lr) - math.log10(BEST[arm][steps])) ** 2 + 0.001 * seed


def fake_train_one(calls):
    def train_one(pargs, spec, seed, say):
        name, _, items = spec.partition(":")
        arm = name.split("_lr")[0]
        lr = float(next(kv.split("=")[1] for kv in items.split(",") if kv.startswith("optim.lr=")))
        run_dir = pargs.runs / name / f"seed{seed}"
        run_dir.mkdir(parents=True, exist_ok=True)
        loss = fake_final(arm, pargs.steps, lr, seed) if pargs.steps in BEST[arm] else 3.0
        tokens = pargs.block * pargs.batch
        lines = [
            {"step": s, "loss": loss, "tok_per_s": 1000.0, "val_loss": loss, "tokens": s * tokens}
            for s in range(pargs.eval_every, pargs.steps + 1, pargs.eval_every)
        ]
        lines.append({"event": "done", "step": pargs.steps, "val_loss": loss})
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
        calls.append((pargs.steps, arm, lr, seed))
        say(f"  {name} seed {seed}: ok")
        return name, seed, 0

    return train_one


@pytest.mark.slow
def test_study_sweeps_each_budget_from_the_last_rate_reports_the_multiplier_and_resumes(budget, tmp_path, monkeypatch):
    calls: list = []
    monkeypatch.setattr(budget.convergence, "train_one", fake_train_one(calls))
    results = tmp_path / "results"
    argv = ["--points", "tiny@32", "--arms", "gpt", "ngpt", "--budgets", "40", "160", "--seeds", "0", "1",
            "--tokens-per-step", "256", "--evals", "4", "--data", "stdlib", "--out", str(tmp_path / "out"),
            "--results", str(results), "--no-progress"]  # fmt: skip  # a command line
    assert budget.main(argv) == 0

    estimate = json.loads((results / "estimate.json").read_text())
    assert set(estimate["timings"]) == {"tiny@32|gpt", "tiny@32|ngpt"}
    assert estimate["timings"]["tiny@32|gpt"]["s_per_step"] == pytest.approx(256 / 1000.0)

    ledgers = {
        b: [json.loads(line) for line in (results / f"steps{b:04d}" / "runs.jsonl").read_text().splitlines()]
        for b in (40, 160)
    }
    sweep = {
        (b, arm): sorted(r["lr"] for r in rows if r["arm"] == arm and r["seed"] == 0)
        for b, rows in ledgers.items()
        for arm in BEST
    }
    assert sweep[40, "gpt"] == [3e-3, 1e-2, 3e-2]
    assert sweep[40, "ngpt"] == [1e-2, 3e-2, 1e-1, 3e-1]  # grown once past the top of 1e-2 3e-2 1e-1
    # the 160-step grids start at the 40-step choices and grow down to the new best
    assert sweep[160, "gpt"] == [1e-3, 3e-3, 1e-2, 3e-2]
    assert sweep[160, "ngpt"] == [1e-2, 3e-2, 1e-1, 3e-1]
    assert {(b, r["arm"]): r["lr"] for b, rows in ledgers.items() for r in rows if r["seed"] == 1} == {
        (b, arm): BEST[arm][b] for b in (40, 160) for arm in BEST
    }
    assert all(r["wall_s"] >= 0 for rows in ledgers.values() for r in rows)

    table = (results / "budget.md").read_text()
    row40 = next(line for line in table.splitlines() if line.startswith("| tiny@32 | 40 |") and "| ngpt |" in line)
    row160 = next(line for line in table.splitlines() if line.startswith("| tiny@32 | 160 |") and "| ngpt |" in line)
    # nGPT at 40 steps reaches GPT's loss at 80: multiplier 2, read inside GPT's curve
    assert "2.00 ± 0.00 (2.00, 2.00)" in row40
    # at 160 steps nGPT is below GPT's loss at 160: beyond the curve, marked
    assert "2.00 ± 0.00* (2.00*, 2.00*)" in row160
    assert "-0.2500 ± 0.0000" in row40  # GPT's loss at 80 steps is 0.25 below its loss at 40
    assert "Estimated before the first run" in table
    # the table ends with what one size and two budgets cannot show, from the rows that ran
    n_params = budget.scaling.parameters(budget.scaling.Point.parse("tiny@32"))
    last = table.splitlines()[-1]
    assert last.startswith(f"What these results cannot show: any change with size (one size, {n_params / 1e6:.2f}M")
    assert (
        f"budgets past {160 * 256 / n_params:.1f} tokens per parameter; another corpus. Every row ran on one: " in last
    )
    assert "marked * rests on GPT's final loss continued past its longest run" in last  # row160 is read past it
    for name in ("multiplier.png", "loss_budget.png", "steps0040/scaling.md"):
        assert (results / name).stat().st_size > 0

    # resumed: everything is in the ledgers and the estimate, nothing trains again
    calls.clear()
    assert budget.main(argv) == 0
    assert calls == []

    # the report alone, with another command line: nothing trains, the first command stays
    (results / "budget.md").unlink()
    assert budget.main([*argv, "--report-only", "--jobs", "1"]) == 0
    assert calls == []
    table = (results / "budget.md").read_text()
    assert "2.00 ± 0.00 (2.00, 2.00)" in table and "--report-only" not in table
    # one seed: its values alone, without a "± 0" spread that one seed cannot have
    i = argv.index("--seeds")
    assert budget.main([*argv[: i + 2], *argv[i + 3 :], "--report-only"]) == 0
    row40 = next(
        line
        for line in (results / "budget.md").read_text().splitlines()
        if line.startswith("| tiny@32 | 40 |") and "| ngpt |" in line
    )
    assert "| 1 |" in row40 and "| 2.00 (2.00) |" in row40 and "-0.2500 |" in row40 and "±" not in row40
    # the recorded command is what reproduces the results: the scratch directory left out
    i = argv.index("--out")
    assert json.loads((results / "study.json").read_text())["command"] == "python benchmarks/budget.py " + " ".join(
        argv[:i] + argv[i + 2 :]
    )


def test_a_recorded_command_leaves_out_scratch_and_names_checkout_paths_from_its_root(budget):
    root = budget.ROOT
    command = (
        f"python benchmarks/budget.py --points cpu@256 --out /scratch/runs --results {root}/benchmarks/results/x "
        f"--out=/elsewhere --data ../shared/data/input.txt --data-label 'two words' --results={root}/r/y"
    )
    assert budget.portable_command(command) == (
        "python benchmarks/budget.py --points cpu@256 --results benchmarks/results/x "
        "--data ../shared/data/input.txt --data-label 'two words' --results=r/y"
    )
    # a path outside the checkout stays as it was: it is where the data are
    assert budget.portable_command("python x.py --data /data/corpus.txt") == "python x.py --data /data/corpus.txt"


def test_an_arm_moves_on_to_its_next_budget_while_another_still_sweeps(budget, tmp_path, monkeypatch):
    """GPT's 40-step sweep is bracketed at once, nGPT's grows past its top: with two places,
    GPT's 160-step runs start beside nGPT's growth instead of after the whole 40-step budget."""
    import threading

    gpt_at_160 = threading.Event()
    overlapped = []
    calls: list = []
    fake = fake_train_one(calls)

    def train_one(pargs, spec, seed, say):
        name = spec.partition(":")[0]
        if pargs.steps == 160 and name.startswith("gpt_"):
            gpt_at_160.set()
        elif pargs.steps == 40 and name == "ngpt_lr3e-1":  # nGPT's growth past its first grid
            overlapped.append(gpt_at_160.wait(timeout=10))
        return fake(pargs, spec, seed, say)

    monkeypatch.setattr(budget.convergence, "train_one", train_one)
    results = tmp_path / "results"
    argv = ["--points", "tiny@32", "--arms", "gpt", "ngpt", "--budgets", "40", "160", "--seeds", "0", "1",
            "--tokens-per-step", "256", "--evals", "4", "--data", "stdlib", "--out", str(tmp_path / "out"),
            "--results", str(results), "--no-progress", "--jobs", "2"]  # fmt: skip  # a command line
    assert budget.main(argv) == 0
    assert overlapped == [True]
    # the rule decided as one budget after the other would: each arm's best rate on seed 1
    seed1 = {(steps, arm): lr for steps, arm, lr, seed in calls if seed == 1}
    assert seed1 == {(b, arm): BEST[arm][b] for b in (40, 160) for arm in BEST}


def test_a_matrix_rate_arm_takes_gpts_pick_at_each_budget(budget, tmp_path, monkeypatch):
    """gpt-adamh's AdamW part trains at GPT's rate of the same budget: it waits for GPT's pick
    there, while the arms otherwise run side by side."""
    adamh: list = []
    fake = fake_train_one([])

    def train_one(pargs, spec, seed, say):
        name, _, items = spec.partition(":")
        if not name.startswith("gpt-adamh"):
            return fake(pargs, spec, seed, say)
        values = dict(kv.split("=", 1) for kv in items.split(",") if kv.startswith("optim."))
        adamh.append((pargs.steps, float(values["optim.lr"])))
        loss = 3.0 + (math.log10(float(values["optim.matrix_lr"])) + 1) ** 2  # best matrix rate 0.1
        run_dir = pargs.runs / name / f"seed{seed}"
        run_dir.mkdir(parents=True, exist_ok=True)
        lines = [
            {"step": s, "val_loss": loss, "tokens": s * 256, "tok_per_s": 1000.0}
            for s in range(10, pargs.steps + 1, 10)
        ]
        lines.append({"event": "done", "step": pargs.steps, "val_loss": loss})
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
        return name, seed, 0

    monkeypatch.setattr(budget.convergence, "train_one", train_one)
    argv = ["--points", "tiny@32", "--arms", "gpt", "gpt-adamh", "--budgets", "40", "160", "--seeds", "0", "1",
            "--tokens-per-step", "256", "--evals", "4", "--data", "stdlib", "--out", str(tmp_path / "out"),
            "--results", str(tmp_path / "results"), "--no-progress", "--jobs", "2"]  # fmt: skip  # a command line
    assert budget.main(argv) == 0
    measured = {steps for steps, _ in adamh if steps in (40, 160)}
    assert measured == {40, 160}
    assert {(steps, lr) for steps, lr in adamh if steps in (40, 160)} == {
        (40, BEST["gpt"][40]),
        (160, BEST["gpt"][160]),
    }


def test_a_single_budget_is_refused(budget, tmp_path):
    with pytest.raises(SystemExit, match="two or more budgets"):
        budget.main(["--budgets", "100", "--out", str(tmp_path), "--results", str(tmp_path)])


def test_gpu_plan_costs_each_run_by_6_n_d(budget, capsys):
    assert budget.main(["--gpu-plan"]) == 0
    text = capsys.readouterr().out
    assert (
        "--points base@1024 base@4096 0.5b@1024 --budgets 750 3000 12000 --scale-budgets --tokens-per-step 524288"
        in text
    )
    n = budget.scaling.parameters(budget.scaling.Point.parse("base@1024"))
    tokens = 12000 * 524288
    row = next(line for line in text.splitlines() if line.startswith("| base@1024 | ") and "| 12000 |" in line)
    assert f"| {6 * n * tokens:.2e} |" in row and f"| {tokens / n:.1f} |" in row
    attention = 6 * 12 * 1024 * 768 * tokens
    runs = (budget.RUNS_PER_SWEEP + 2) * len(budget.ARMS)  # each arm's sweep and two more seeds
    assert f"| {runs} |" in row
    hours = runs * (6 * n * tokens + attention) / (989e12 * 0.4) / 3600
    assert row.endswith(f"| {hours:.0f} |")
    # the size axis: 0.5b at base's tokens per parameter, budget by budget
    big = budget.scaling.parameters(budget.scaling.Point.parse("0.5b@1024"))
    for b in (750, 3000, 12000):
        steps = round(b * big / n)
        row = next(line for line in text.splitlines() if line.startswith("| 0.5b@1024 | ") and f"| {steps} |" in line)
        assert f"| {steps * 524288 / big:.1f} |" in row and f"| {b * 524288 / n:.1f} |" in row
