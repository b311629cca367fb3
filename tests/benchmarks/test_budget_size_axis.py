"""benchmarks/budget.py across sizes: ``--scale-budgets`` (each point its own budgets at equal
tokens per parameter), ``--size-axis`` (the multiplier of several studies' results directories
against tokens per parameter, in one table and plot), and ``--pending`` (the seed runs the rate
rule still needs), all on small synthetic ledgers: nothing trains."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


def params(budget, point: str) -> int:
    return budget.scaling.parameters(budget.scaling.Point.parse(point))


def write_study(
    results: Path, command: str, finals: dict[tuple[str, int, str, float, int], float], wall_s: float = 1.0
) -> None:
    """A results directory as the study leaves it: its first command and one ledger per budget
    ((point, budget, arm, lr, seed) -> final validation loss; each run ``wall_s`` seconds)."""
    results.mkdir(parents=True)
    (results / "study.json").write_text(json.dumps({"started": "2026-01-01", "command": command}))
    for (point, b, arm, lr, seed), final in finals.items():
        ledger = results / f"steps{b:04d}" / "runs.jsonl"
        ledger.parent.mkdir(exist_ok=True)
        row = {"point": point, "arm": arm, "lr": lr, "seed": seed, "finished": True, "exit": 0, "steps": [b],
               "val_loss": [final], "tokens": [b * 256], "wall_s": wall_s, "date": "2026-01-01"}  # fmt: skip  # one ledger line
        with ledger.open("a") as f:
            f.write(json.dumps(row) + "\n")


def test_scale_budgets_gives_each_point_the_first_points_tokens_per_parameter(budget, tmp_path):
    args = budget.parse(["--points", "tiny@32", "tiny@64", "cpu@32", "--budgets", "40", "160", "--scale-budgets",
                         "--results", str(tmp_path), "--out", str(tmp_path / "out")])  # fmt: skip  # a command line
    ratio = params(budget, "cpu@32") / params(budget, "tiny@32")
    cpu = [round(40 * ratio), round(160 * ratio)]
    assert args.point_budgets == {"tiny@32": [40, 160], "tiny@64": [40, 160], "cpu@32": cpu}
    assert args.budgets == sorted({40, 160, *cpu})  # every ledger the study keeps
    # without the flag every point trains every budget, as before
    args = budget.parse(["--points", "tiny@32", "cpu@32", "--budgets", "40", "160", "--results", str(tmp_path),
                         "--out", str(tmp_path / "out")])  # fmt: skip  # a command line
    assert not hasattr(args, "point_budgets") and budget.budgets_of(args, args.points[1]) == [40, 160]


def test_size_axis_reads_several_studies_and_marks_what_has_not_run(budget, tmp_path):
    seeds = (0, 1)
    # the small size: GPT's final loss 3.0 at 40 steps, 2.5 at 160 (both seeds); LERP at 40 steps reaches
    # GPT's loss at 80 steps (2.75): multiplier 2; SLERP 0.05 below LERP with seed 0, 0.05 above with seed 1
    tiny = {("tiny@32", b, "gpt", 0.01, s): v for b, v in ((40, 3.0), (160, 2.5)) for s in seeds}
    tiny |= {("tiny@32", 40, "ngpt", 0.03, s): 2.75 for s in seeds} | {
        ("tiny@32", 160, "ngpt", 0.03, s): 2.5 for s in seeds
    }
    tiny |= {("tiny@32", 40, "ngpt-slerp", 0.03, 0): 2.70, ("tiny@32", 40, "ngpt-slerp", 0.03, 1): 2.80}
    tiny |= {("tiny@32", 160, "ngpt-slerp", 0.03, s): 2.5 for s in seeds}
    arms = "--arms gpt ngpt ngpt-slerp --seeds 0 1 --tokens-per-step 256 --evals 4"
    write_study(tmp_path / "tiny", f"python benchmarks/budget.py --points tiny@32 --budgets 40 160 {arms}", tiny)
    # the larger size: its own budgets; only the first has run, and SLERP not at all
    ratio = params(budget, "cpu@32") / params(budget, "tiny@32")
    b1, b2 = round(40 * ratio), round(160 * ratio)
    cpu = {("cpu@32", b1, "gpt", 0.01, s): 2.9 for s in seeds} | {("cpu@32", b1, "ngpt", 0.03, s): 2.8 for s in seeds}
    write_study(tmp_path / "cpu", f"python benchmarks/budget.py --points cpu@32 --budgets {b1} {b2} {arms} "
                "--results /elsewhere", cpu)  # fmt: skip  # one call
    # a later start of the study added a third budget for GPT and LERP: read from its ledger
    b3 = round(640 * ratio)
    write_study(tmp_path / "later", "", {("cpu@32", b3, arm, 0.01, 0): 2.0 for arm in ("gpt", "ngpt")})
    (tmp_path / "later" / f"steps{b3:04d}").rename(tmp_path / "cpu" / f"steps{b3:04d}")
    out = tmp_path / "axis"
    assert budget.main(["--size-axis", str(tmp_path / "tiny"), str(tmp_path / "cpu"), "--results", str(out)]) == 0

    table = (out / "size_axis.md").read_text().splitlines()
    rows = {tuple(c.strip() for c in line.split("|")[1:6:2]): line for line in table if line.startswith("| ")}
    lerp = rows["tiny@32", "40", "ngpt"]
    assert f"| {40 * 256 / params(budget, 'tiny@32'):.1f} |" in lerp
    assert "| 2.00 ± 0.00 (2.00, 2.00) |" in lerp and "| -0.2500 ± 0.0000 |" in lerp and "| 0.03 | 2 |" in lerp
    slerp = rows["tiny@32", "40", "ngpt-slerp"]
    assert slerp.endswith("| 0.0000 ± 0.0707 (-0.0500, +0.0500) |")  # paired by seed with LERP
    assert rows["tiny@32", "40", "gpt"].endswith("| - |")  # GPT has no LERP difference
    # the larger size at its own budgets, after the small one; what has not run says so
    order = [key for key in rows if key[0] != "point"]
    assert order.index(("cpu@32", str(b1), "gpt")) > order.index(("tiny@32", "160", "ngpt-slerp"))
    assert f"| {b1 * 256 / params(budget, 'cpu@32'):.1f} |" in rows["cpu@32", str(b1), "ngpt"]
    assert "| 2.9000 ± 0.0000 |" in rows["cpu@32", str(b1), "gpt"]
    for key in [
        ("cpu@32", str(b1), "ngpt-slerp"),
        *(("cpu@32", str(b2), arm) for arm in ("gpt", "ngpt", "ngpt-slerp")),
    ]:
        assert "| not run |" in rows[key]
    assert "| 2.0000 |" in rows["cpu@32", str(b3), "ngpt"]
    assert ("cpu@32", str(b3), "ngpt-slerp") not in rows  # no start planned it: not "not run"
    assert (out / "size_axis.png").stat().st_size > 0
    # the table ends with what its rows cannot show, from what they span
    widest = b3 * 256 / params(budget, "cpu@32")
    sizes = f"{params(budget, 'tiny@32') / 1e6:.2f}M and {params(budget, 'cpu@32') / 1e6:.2f}M"
    assert table[-1].startswith(f"What these results cannot show: a trend in size (two sizes, {sizes} parameters")
    assert f"budgets past {widest:.1f} tokens per parameter" in table[-1]
    assert table[0].endswith("at two sizes")
    # the directories' common parent by default
    assert budget.main(["--size-axis", str(tmp_path / "tiny"), str(tmp_path / "cpu")]) == 0
    assert (tmp_path / "size_axis.md").read_text() != ""

    with pytest.raises(SystemExit, match="study.json not found"):
        budget.main(["--size-axis", str(tmp_path / "axis")])


def test_pending_lists_the_seed_runs_the_rate_rule_still_needs(budget, tmp_path, capsys):
    # gpt: 0.01 and 0.003 within 0.02 nats on seed 0, only 0.01 has run on seed 1
    finals = {("tiny@32", 40, "gpt", 0.01, 0): 3.00, ("tiny@32", 40, "gpt", 0.003, 0): 3.01,
              ("tiny@32", 40, "gpt", 0.03, 0): 3.5, ("tiny@32", 40, "gpt", 0.01, 1): 3.1}  # fmt: skip  # one ledger
    write_study(tmp_path / "r", "python benchmarks/budget.py", finals)
    argv = ["--points", "tiny@32", "--arms", "gpt", "--budgets", "40", "160", "--seeds", "0", "1",
            "--results", str(tmp_path / "r"), "--out", str(tmp_path / "out")]  # fmt: skip  # a command line
    assert budget.main([*argv, "--pending"]) == 0
    text = capsys.readouterr().out
    assert "  tiny@32 40 steps gpt lr 0.003 seed 1\n1 run(s) pending" in text
    assert budget.main([*argv, "--pending", "--tie-margin", "0.005"]) == 0
    assert "0 run(s) pending" in capsys.readouterr().out
    # a start of the study with other budgets lists them too: the ledgers', not the command's alone
    other = [*argv[:4], "--budgets", "160", "640", *argv[7:]]
    assert budget.main([*other, "--pending"]) == 0
    assert "  tiny@32 40 steps gpt lr 0.003 seed 1\n1 run(s) pending" in capsys.readouterr().out
    # until then the report shows the sweep's best, and says the rule still needs a run
    assert budget.main([*argv, "--report-only"]) == 0
    table = (tmp_path / "r" / "budget.md").read_text()
    row = next(line for line in table.splitlines() if line.startswith("| tiny@32 | 40 |"))
    assert "| **0.01** (0.003, 0.01, 0.03; pending: 0.003 on seed 1) |" in row
    assert "Pending: the runs the rate rule still needs" in table

    # once the runner-up has run on seed 1 the study decides; the report shows the tie and how it went
    ledger = budget.scaling.Ledger(tmp_path / "r" / "steps0040" / "runs.jsonl")
    ledger.add({**ledger.rows[("tiny@32", "gpt", 0.003, 0)], "seed": 1, "val_loss": [3.0]})
    # 0.003 wins (mean 3.005 against 3.05) at the sweep's lower edge: one run past it first
    assert budget.scaling.decide(ledger, "tiny@32", "gpt", [0, 1], 0) == (None, [(0.001, 0)])
    ledger.add({**ledger.rows[("tiny@32", "gpt", 0.003, 0)], "lr": 0.001, "val_loss": [3.4]})
    pick, missing = budget.scaling.decide(ledger, "tiny@32", "gpt", [0, 1], 0)
    assert missing == [] and pick["picked"] == 0.003 and pick["bracketed"]
    ledger.add_pick(pick)
    assert budget.main([*argv, "--report-only"]) == 0
    table = (tmp_path / "r" / "budget.md").read_text()
    row = next(line for line in table.splitlines() if line.startswith("| tiny@32 | 40 |"))
    assert "| **0.003** (0.001, 0.003, 0.01, 0.03; tie: mean 0.01 3.0500, 0.003 3.0050 over 2 seeds) |" in row
    assert "within 0.02 nats of the best's" in table and "pending" not in table


def test_the_size_axis_plot_keeps_the_arms_two_sizes_share_at_a_context(budget):
    """Where a context is planned at two sizes, the plot shows only the arms both plan there
    (a point at another context, or an arm at one size only, says nothing about size)."""
    from budget_size_axis import size_axis_curves

    Point = budget.scaling.Point

    def entry(point, arm, tokens, multipliers, study, extrapolated=False):
        row = {"multipliers": [(m, extrapolated and i == 0) for i, m in enumerate(multipliers)]}
        return {"point": Point.parse(point), "arm": arm, "tokens_per_param": tokens, "row": row, "study": study}

    entries = [
        entry("tiny@256", "gpt", 2.5, [1.0, 1.0], 0),
        entry("tiny@256", "ngpt", 2.5, [2.0, 1.8], 0),
        entry("tiny@256", "gpt-muon", 2.5, [3.0, 3.0], 0),  # at one size only
        entry("tiny@1024", "ngpt", 2.5, [2.4, 2.4], 0),  # another context
        entry("cpu@256", "gpt", 2.5, [1.0, 1.0], 1),
        entry("cpu@256", "ngpt", 2.5, [1.5, 1.7], 1),
        entry("cpu@256", "ngpt", 10.0, [1.4, 1.2], 1, extrapolated=True),  # one seed read past GPT's budgets
        entry("cpu@1024", "gpt-muon", 10.0, [float("inf")], 1),  # at one size only, nothing finite
        {**entry("cpu@256", "ngpt", 40.0, [], 1), "row": None},  # not run
    ]
    curves = size_axis_curves(entries)
    assert set(curves) == {(0, "tiny@256", "ngpt"), (1, "cpu@256", "ngpt")}
    assert curves[1, "cpu@256", "ngpt"] == [
        (2.5, pytest.approx(1.6), pytest.approx(2**0.5 * 0.1), 2, False, False),
        (10.0, pytest.approx(1.3), pytest.approx(2**0.5 * 0.1), 2, True, False),  # marked as extrapolated
    ]
    # a rate the rule has not yet picked (a tie's runner-up still to run) is marked
    pending = {**entries[5], "row": {**entries[5]["row"], "pending": "; pending: 0.01 on seed 1"}}
    assert size_axis_curves([*entries[:5], pending])[1, "cpu@256", "ngpt"][0][5] is True
    # one size only: every arm but GPT
    assert set(size_axis_curves(entries[:4])) == {(0, "tiny@256", "ngpt"), (0, "tiny@256", "gpt-muon"),
                                                   (0, "tiny@1024", "ngpt")}  # fmt: skip  # one set


def test_the_cost_paragraph_gives_the_measured_time_per_step_and_what_is_left(budget, tmp_path):
    from budget_report import EVAL_BATCH_COST, RUNS_PER_SWEEP, estimate_text, spent_core_hours

    # gpt: three sweep runs and one seed run at 40 steps (1 s each: 0.025 s a step); nothing at 160
    finals = {("tiny@32", 40, "gpt", lr, 0): 3.0 for lr in (0.003, 0.01, 0.03)} | {("tiny@32", 40, "gpt", 0.01, 1): 3.1}
    results = tmp_path / "r"
    write_study(results, "python benchmarks/budget.py", finals)
    estimate = {"timings": {"tiny@32|gpt": {"s_per_step": 0.5, "startup_s": 2.0},
                            "tiny@32|ngpt": {"s_per_step": 0.4, "startup_s": 0.0}},
                "date": "2026-01-01", "command": "python benchmarks/budget.py --estimate-only"}  # fmt: skip  # one file
    (results / "estimate.json").write_text(json.dumps(estimate))
    args = budget.parse(["--points", "tiny@32", "--arms", "gpt", "ngpt", "--budgets", "40", "160", "--seeds", "0", "1",
                         "--evals", "2", "--results", str(results), "--out", str(tmp_path / "out")])  # fmt: skip  # a command line
    text = estimate_text(args)
    assert "| tiny@32 | gpt | 0.500 | 2.0 | 0.025 (4) |" in text
    # a run continued from step 20 took its wall time for its last 20 steps only
    ledger = budget.scaling.Ledger(results / "steps0040" / "runs.jsonl")
    spent_before, _ = spent_core_hours(args)
    ledger.add({**ledger.rows[("tiny@32", "gpt", 0.01, 1)], "seed": 2, "wall_s": 1.0, "from_step": 20})
    assert "| tiny@32 | gpt | 0.500 | 2.0 | 0.028 (5) |" in estimate_text(args)  # 5 s over 4 x 40 + 20 steps
    # and is spent as all its 40 steps at that invocation's time per step: 2 s
    spent_after, runs = spent_core_hours(args)
    assert runs == 5 and spent_after - spent_before == pytest.approx(2.0 * args.threads / 3600)
    ledger.path.write_text("".join(line + "\n" for line in ledger.path.read_text().splitlines()[:-1]))
    assert "| tiny@32 | ngpt | 0.400 | 0.0 | - |" in text
    assert "Spent so far: 0.0 core-hours in 4 runs (a resumed run" in text
    # left: gpt 2 runs at 40 steps (its three rates tie: 0.003 on seed 1, and the sweep's one growth)
    # and 5 at 160 at 0.025 s a step; ngpt 5 + 5 runs at the estimate
    planned = RUNS_PER_SWEEP + 1
    evals = 2 * args.eval_batches * EVAL_BATCH_COST
    left = 2 * 40 * 0.025 + planned * 160 * 0.025 + planned * sum((b + evals) * 0.4 for b in (40, 160))
    assert f"{left * args.threads / 3600:.1f} core-hours, {left / args.jobs / 3600:.1f} h wall" in text


def test_the_runs_left_follow_the_rate_rule(budget, tmp_path):
    from budget_report import RUNS_PER_SWEEP, runs_to_go

    # seed 0's sweep: 0.003 and 0.01 tie (0.005 nats apart), 0.03 well behind
    finals = {("tiny@32", 40, "gpt", 0.003, 0): 3.0, ("tiny@32", 40, "gpt", 0.01, 0): 3.005,
              ("tiny@32", 40, "gpt", 0.03, 0): 3.5}  # fmt: skip  # one ledger
    write_study(tmp_path / "r", "python benchmarks/budget.py", finals)
    args = budget.parse(["--points", "tiny@32", "--arms", "gpt", "ngpt", "--budgets", "40", "160", "--seeds", "0", "1",
                         "2", "--results", str(tmp_path / "r"), "--out", str(tmp_path / "out")])  # fmt: skip  # a command line
    ledger = budget.scaling.Ledger(tmp_path / "r" / "steps0040" / "runs.jsonl")
    planned = RUNS_PER_SWEEP + 2
    assert runs_to_go(args, None, "tiny@32", "gpt", 0, planned) == planned  # a budget not started
    assert runs_to_go(args, ledger, "tiny@32", "ngpt", 0, planned) == planned  # an arm not started
    # the tie runs both rates on seeds 1 and 2 (4 runs), and the sweep grows once: 5, not 6 - 3
    assert runs_to_go(args, ledger, "tiny@32", "gpt", 3, planned) == 5

    def run(arm, lr, seed, final):
        ledger.add(
            {**ledger.rows[("tiny@32", "gpt", 0.003, 0)], "arm": arm, "lr": lr, "seed": seed, "val_loss": [final]}
        )

    for seed in (1, 2):
        run("gpt", 0.003, seed, 3.0)
        run("gpt", 0.01, seed, 3.1)
    # 0.003 wins on the mean at the sweep's lower edge: one run past it, on the sweep seed
    assert runs_to_go(args, ledger, "tiny@32", "gpt", 7, planned) == 1
    run("gpt", 0.001, 0, 3.3)
    assert runs_to_go(args, ledger, "tiny@32", "gpt", 8, planned) == 0  # picked and bracketed

    # no tie: a bracketed pick on every seed after a sweep of three leaves none, one below the plan
    for lr, seeds, final in ((0.003, [0], 3.3), (0.01, [0, 1, 2], 3.0), (0.03, [0], 3.4)):
        for seed in seeds:
            run("ngpt", lr, seed, final)
    assert runs_to_go(args, ledger, "tiny@32", "ngpt", 5, planned) == 0
    # a pick recorded by an older study (no "tried" or "bracketed") stands the same way
    older = {"point": "tiny@32", "arm": "ngpt", "picked": 0.01, "candidates": [{"lr": 0.01, "sweep_final": 3.0,
             "mean": 3.0}], "seeds": [0, 1, 2], "sweep_seed": 0, "tie_margin": 0.02}  # fmt: skip  # one picks.jsonl line
    ledger.add_pick(older)
    assert runs_to_go(args, ledger, "tiny@32", "ngpt", 5, planned) == 0
    # while the sweep is one rate, unbracketed, the plan's count stands
    (tmp_path / "r" / "steps0160").mkdir()
    other = budget.scaling.Ledger(tmp_path / "r" / "steps0160" / "runs.jsonl")
    other.add({**ledger.rows[("tiny@32", "ngpt", 0.01, 0)]})
    assert runs_to_go(args, other, "tiny@32", "ngpt", 1, planned) == planned - 1


def test_status_shows_the_runs_under_way_and_their_time_to_go(budget, tmp_path, capsys):
    import fcntl

    finals = {("tiny@32", 40, "gpt", 0.01, 0): 3.00, ("tiny@32", 40, "gpt", 0.003, 0): 3.01,
              ("tiny@32", 40, "gpt", 0.03, 0): 3.5, ("tiny@32", 40, "gpt", 0.01, 1): 3.1}  # fmt: skip  # one ledger
    write_study(tmp_path / "r", "python benchmarks/budget.py", finals)
    out = tmp_path / "out"
    argv = ["--points", "tiny@32", "--arms", "gpt", "--budgets", "40", "160", "--seeds", "0", "1",
            "--tokens-per-step", "256", "--results", str(tmp_path / "r"), "--out", str(out)]  # fmt: skip  # a command line

    def run_dir(budget_steps: int, name: str, seed: int, logged: list[dict]) -> Path:
        d = out / f"steps{budget_steps}" / "runs" / "tiny@32" / name / f"seed{seed}"
        d.mkdir(parents=True)
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in logged) + '{"step": 1')  # cut off
        return d

    run_dir(40, "gpt_lr1e-2", 0, [{"step": 40, "tok_per_s": 512.0}])  # in the ledger: not listed
    live = run_dir(160, "gpt_lr1e-2", 0, [{"step": 40, "tok_per_s": 100.0}, {"step": 100, "tok_per_s": 512.0}])
    run_dir(160, "gpt_lr3e-3", 0, [{"step": 20, "tok_per_s": 256.0}])
    # stopped at step 30 (its checkpoint), resumed there, stopped again before its next log line
    resumed = [{"step": 10, "tok_per_s": 512.0}, {"event": "halted", "step": 30}, {"event": "start", "step": 30}]
    run_dir(160, "gpt_lr1e-3", 0, resumed)
    run_dir(160, "gpt_lr3e-2", 0, [{"step": 160, "tok_per_s": 256.0}, {"event": "done", "step": 160}])
    with (live / "train.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        lock.write("pid 1 on a host")
        lock.flush()
        assert budget.main([*argv, "--status"]) == 0
    text = capsys.readouterr().out
    assert "40 steps: 4 run(s) in the ledger, 1 seed run(s) the rate rule needs" in text
    assert "160 steps: 0 run(s) in the ledger, 0 seed run(s) the rate rule needs" in text
    # 60 steps of 256 tokens at 512 tokens/s: 30 s
    assert "tiny@32 gpt_lr1e-2 seed 0: logged step 100 of 160 (running, about 0 min to go at 0.50 s a step)" in text
    assert "tiny@32 gpt_lr3e-3 seed 0: logged step 20 of 160 (stopped, about 2 min to go at 1.00 s a step)" in text
    assert "tiny@32 gpt_lr3e-2 seed 0: logged step 160 of 160 (finished, not yet in the ledger)" in text
    assert "tiny@32 gpt_lr1e-3 seed 0: logged step 30 of 160 (stopped, about 1 min to go at 0.50 s a step)" in text
    assert "40 steps gpt" not in text and text.count("gpt_lr") == 4


def test_every_start_of_a_study_writes_the_same_tables_and_plans_its_runs(budget, tmp_path, capsys):
    """A study started again with other --arms or --budgets (GPT and LERP at a longer budget,
    one arm alone) keeps every arm the ledgers hold in budget.md, records a start that plans
    more in study.json, and costs and marks "not run" only what some start planned."""
    results, seeds = tmp_path / "r", (0, 1)
    finals = {("tiny@32", b, arm, lr, s): v - 0.1 * s for b, v in ((40, 3.0), (160, 2.5))
              for arm, lr in (("gpt", 0.01), ("ngpt", 0.03), ("ngpt-slerp", 0.03)) for s in seeds}  # fmt: skip  # one ledger per budget
    common = ["--points", "tiny@32", "--seeds", "0", "1", "--tokens-per-step", "256", "--evals", "4", "--jobs", "1"]
    first = ["--budgets", "40", "160", "--arms", "gpt", "ngpt", "ngpt-slerp", *common]
    write_study(results, "python benchmarks/budget.py " + " ".join(first), finals, wall_s=3600.0)
    est = {f"tiny@32|{arm}": {"s_per_step": 1.0, "startup_s": 0.0} for arm in ("gpt", "ngpt", "ngpt-slerp")}
    (results / "estimate.json").write_text(json.dumps({"timings": est, "date": "2026-01-01", "command": "x"}))
    at = ["--results", str(results), "--out", str(tmp_path / "out")]
    longer = ["--budgets", "40", "160", "640", "--arms", "gpt", "ngpt", *common, *at]

    def tables(argv):
        assert budget.main([*argv, "--report-only"]) == 0
        return (results / "budget.md").read_text()

    before = tables([*first, *at])
    # starts that only look, or plan nothing new, leave the record as it is
    budget.remember_start(budget.parse(longer), trains=False)
    budget.remember_start(budget.parse(["--budgets", "40", "160", "--arms", "gpt", *common, *at]), trains=True)
    assert "later" not in json.loads((results / "study.json").read_text())
    # a start that trains more is recorded once, and from then on the first command's tables cost its runs
    for _ in range(2):
        budget.remember_start(budget.parse(longer), trains=True)
    record = json.loads((results / "study.json").read_text())
    assert record["later"] == ["python benchmarks/budget.py " + " ".join(longer[: -len(at)] + at[:2])]
    assert record["command"] == "python benchmarks/budget.py " + " ".join(first)
    after = tables([*first, *at])
    assert after != before and "Budgets: 40, 160, 640 steps" in after
    later = f"Later start: `{record['later'][0]}`"  # each table names every start, not the first alone
    assert later not in before and later in after and later in (results / "steps0160" / "scaling.md").read_text()
    left = [float(t.split("none once a rate is picked: ")[1].split(" ")[0]) for t in (before, after)]
    # GPT's and LERP's 640-step runs (5 each: the sweep and one more seed) at the measured time per step
    per_step = 4 * 3600.0 / (40 * 2 + 160 * 2)  # each arm's four runs, an hour each
    assert left[1] - left[0] == pytest.approx(5 * 640 * 2 * per_step / 3600, abs=0.11)
    # whichever start writes them, the tables are the same: every arm the ledgers hold stays, and
    # the runs at a time are the recorded commands' (the study's --jobs 1; the estimate's default 2)
    assert "torch CPU, 1 runs at a time" in after and "h wall at 2 runs at a time, assuming" in after
    for argv in (longer, ["--budgets", "40", "160", "--arms", "gpt", *common, *at], [*first, *at, "--jobs", "2"]):
        assert tables(argv) == after
    assert "torch CPU, 1 runs at a time" in (results / "steps0160" / "scaling.md").read_text()
    row = next(line for line in after.splitlines() if line.startswith("| tiny@32 | 160 |") and "| ngpt-slerp |" in line)
    assert "| 2 |" in row
    # --status tells where the whole study stands, whichever start asks
    assert budget.main(["--budgets", "40", "160", "--arms", "gpt", *common, *at, "--status"]) == 0
    assert "640 steps: 0 run(s) in the ledger" in capsys.readouterr().out
    # so does each budget's own table, which --report-only rewrites too
    assert "| tiny@32 | 0.17M | ngpt-slerp | **0.03** (0.03) |" in (results / "steps0160" / "scaling.md").read_text()
    shown = budget.reported(budget.parse(["--budgets", "40", "160", "--arms", "gpt", *common, *at]))
    assert ("tiny@32", 640, "ngpt") in shown.plan and ("tiny@32", 640, "ngpt-slerp") not in shown.plan
    # the size axis: what a start planned and has not run says so; what none planned is left out
    assert budget.main(["--size-axis", str(results), "--results", str(tmp_path / "axis")]) == 0
    axis = (tmp_path / "axis" / "size_axis.md").read_text()
    assert "| tiny@32 | 0.17M | 640 |" in axis and "| ngpt | not run |" in axis
    assert "| 640 | 9.9 | ngpt-slerp |" not in axis and not any(
        line.startswith("| tiny@32 |") and "| 640 |" in line and "ngpt-slerp" in line for line in axis.splitlines()
    )


def test_what_a_table_cannot_show_follows_its_sizes_budgets_and_corpus(budget):
    from budget_report import cannot_show

    def entry(n_params: int, tokens_per_param: float, extrapolated: bool = False) -> dict:
        return {"params": n_params, "tokens_per_param": tokens_per_param,
                "row": {"seeds": [0], "multipliers": [(1.5, extrapolated)]}}  # fmt: skip  # one row

    one = cannot_show([entry(170_000, 2.5), entry(170_000, 39.6)])
    assert one == ("What these results cannot show: any change with size (one size, 0.17M parameters); "
                   "budgets past 39.6 tokens per parameter.")  # fmt: skip  # one sentence
    three = cannot_show([entry(170_000, 2.5), entry(1_120_000, 9.9), entry(5_000_000, 2.5, extrapolated=True)])
    assert "sizes outside the 3 measured (0.17M to 5.00M parameters); budgets past 9.9 tokens" in three
    assert three.endswith("continued past its longest run (linear in log tokens), not on a GPT run that reached it.")
    assert "marked *" not in one
    assert cannot_show([]) == "Nothing has run yet."
    # a study's own budget.md names its corpus
    assert "39.6 tokens per parameter; another corpus. Every row ran on one: input.txt." in cannot_show(
        [entry(170_000, 39.6)], corpus="input.txt"
    )


def test_a_later_start_with_more_seeds_runs_them_at_the_picks_it_plans_only(budget, tmp_path, capsys):
    # seeds 0-2 decided at both budgets for gpt and ngpt; a later start asks for seeds 0-4
    finals = {("tiny@32", b, arm, lr, s): 3.0 + 10 * lr for b in (40, 160) for arm in ("gpt", "ngpt")
              for lr in (0.003, 0.01, 0.03) for s in ((0,) if lr != 0.003 else (0, 1, 2))}  # fmt: skip  # one ledger
    results = tmp_path / "r"
    write_study(results, "python benchmarks/budget.py --points tiny@32 --arms gpt ngpt --budgets 40 160", finals)
    for b in (40, 160):
        ledger = budget.scaling.Ledger(results / f"steps{b:04d}" / "runs.jsonl")
        for arm in ("gpt", "ngpt"):
            ledger.add_pick(budget.scaling.decide(ledger, "tiny@32", arm, [0, 1, 2], 0)[0])
    more = ["--points", "tiny@32", "--arms", "gpt", "ngpt", "--budgets", "40", "160", "--seeds", *"01234",
            "--results", str(results), "--out", str(tmp_path / "out")]  # fmt: skip  # a command line
    assert budget.main(["--points", "tiny@32", "--arms", "gpt", "ngpt", "--budgets", "40", "160", "--results",
                        str(results), "--out", str(tmp_path / "out"), "--pending"]) == 0  # fmt: skip  # a command line
    assert "0 run(s) pending" in capsys.readouterr().out
    assert budget.main([*more, "--pending"]) == 0
    lines = [line.strip() for line in capsys.readouterr().out.splitlines() if line.startswith("  ")]
    assert lines == [f"tiny@32 {b} steps {arm} lr 0.003 seed {s}" for b in (40, 160) for arm in ("gpt", "ngpt")
                     for s in (3, 4)]  # fmt: skip  # one list
    # the start that trains them is recorded; the report reads the seeds that ran, of those it asks
    budget.remember_start(budget.parse(more), trains=True)
    assert "--seeds" in json.loads((results / "study.json").read_text())["later"][0]
    ledger = budget.scaling.Ledger(results / "steps0040" / "runs.jsonl")
    for s in (3, 4):
        ledger.add({**ledger.rows[("tiny@32", "ngpt", 0.003, 0)], "seed": s})
    assert budget.main(["--results", str(results), "--out", str(tmp_path / "out"), "--report-only"]) == 0
    table = (results / "budget.md").read_text()
    assert "Seeds 0, 1, 2; seeds 0-4 at tiny@32 (40, 160 steps): gpt, ngpt." in table
    main_table = table.split("\n## ")[0]  # the sections after it list rows of their own
    rows = {line.split(" | ")[1:4:2][0] + line.split(" | ")[3]: line for line in main_table.splitlines()
            if line.startswith("| tiny@32 |")}  # fmt: skip  # budget + arm -> row
    assert "| 5 |" in rows["40ngpt"] and "| 3 |" in rows["40gpt"] and "| 3 |" in rows["160ngpt"]


def test_more_seeds_at_a_second_point_are_recorded_though_another_start_named_the_same_seeds(budget, tmp_path):
    # the first start planned seeds 0-2 at two points; a later one seeds 0-4 at the first point
    results = tmp_path / "r"
    first = "python benchmarks/budget.py --points tiny@32 tiny@64 --arms gpt ngpt --budgets 40 160 --seeds 0 1 2"
    write_study(results, first, {("tiny@32", 40, "gpt", 0.01, 0): 3.0})
    common = ["--arms", "gpt", "ngpt", "--budgets", "40", "160", "--seeds", *"01234", "--results", str(results),
              "--out", str(tmp_path / "out")]  # fmt: skip  # a command line
    budget.remember_start(budget.parse(["--points", "tiny@64", *common]), trains=True)
    # the same seeds at the other point are other runs: recorded too, once
    for _ in range(2):
        budget.remember_start(budget.parse(["--points", "tiny@32", *common]), trains=True)
    later = json.loads((results / "study.json").read_text())["later"]
    assert len(later) == 2 and "--points tiny@64" in later[0] and "--points tiny@32" in later[1]
    # so a report of the whole study reads seeds 0-4 at both points
    shown = budget.reported(budget.parse(["--results", str(results), "--out", str(tmp_path / "out")]))
    assert shown.plan_seeds[("tiny@32", 40, "gpt")] == shown.plan_seeds[("tiny@64", 40, "ngpt")] == [0, 1, 2, 3, 4]
