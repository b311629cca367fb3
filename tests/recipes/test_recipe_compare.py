"""recipes.compare, end to end on tiny runs and on runs stood in for."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
import tool_runs
from tool_runs import FAST

from recipes import compare, compare_variants
from spherenet.train.config import load_config

# the tools' corpus: a text file and its data cache
corpus = tool_runs.corpus


@pytest.mark.slow  # six training processes, ~80 s on 2 shared cores
def test_a_30_step_compare_draws_curves_and_flags_a_run_of_too_few_points(corpus, capsys):
    """train.eval_every left out: every run validates at least 10 times (every 3 steps of 30);
    a variant that sets it to 15 keeps its 2 points and is flagged in the table and on stdout."""
    out = corpus / "cmp"
    fast = [o for o in FAST if not o.startswith("train.eval_every=")]
    rc = compare.main(["--variants", "gpt", "ngpt", "sparse:model.preset=ngpt-tiny,train.eval_every=15",
                       "--seeds", "0", "1", "--size", "tiny", "--out", str(out), *fast, "train.steps=30",
                       f"data.source={corpus / 'c.txt'}", f"data.cache_dir={corpus / 'cache'}"])  # fmt: skip  # options beside their values
    assert rc == 0
    stdout = capsys.readouterr().out
    result = json.loads((out / "compare.json").read_text())
    assert [r["variant"] for r in result["rows"]] == ["gpt", "ngpt", "sparse"]
    assert all(r["seeds"] == 2 for r in result["rows"])
    curves = result["curves"]
    for name in ("gpt", "ngpt"):
        for seed in ("0", "1"):
            assert curves[name][seed]["steps"] == list(range(3, 31, 3))
            assert len(curves[name][seed]["val_loss"]) == 10
    assert curves["sparse"]["0"]["steps"] == [15, 30]
    # seeds differ, variants differ
    assert curves["ngpt"]["0"]["val_loss"] != curves["ngpt"]["1"]["val_loss"]
    assert curves["ngpt"]["0"]["val_loss"] != curves["gpt"]["0"]["val_loss"]
    # the target is the baseline's best validation loss, averaged over seeds
    assert result["target"] == pytest.approx(statistics.mean(min(c["val_loss"]) for c in curves["gpt"].values()))
    gpt_row = result["rows"][0]
    assert gpt_row["reached"] == "2/2" and gpt_row["speedup_vs_baseline"] == 1.0  # paired by seed
    table = (out / "compare.md").read_text()
    assert "| gpt | 2 | 10 |" in table and "| ngpt | 2 | 10 |" in table
    assert "| sparse | 2 | 2 (too few: see below) |" in table
    advice = (
        "2 validation points in 30 steps: too few to draw a curve or to read a speedup from; pass train.eval_every=3"
    )
    assert f"- sparse seed 0: {advice}" in table and f"- sparse seed 1: {advice}" in table
    assert result["few_points"] == [
        f"sparse seed 0: {advice} (or leave it out) for 10",
        f"sparse seed 1: {advice} (or leave it out) for 10",
    ]
    assert f"warning: sparse seed 0: {advice}" in stdout  # after the table
    assert f"sparse: warning: {advice}" in stdout  # and before the first run
    assert "gpt, ngpt: validation every 3 steps and at step 30: 10 points a run" in stdout
    png = (out / "compare.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"


def test_compare_variant_syntax():
    assert compare.variant_overrides("ngpt-slerp", "tiny") == (
        "ngpt-slerp",
        ["model.preset=ngpt-tiny", "model.update=slerp", "optim.method=riemannian_adam"],
    )
    assert compare.variant_overrides("mine:optim.lr=1e-3,model.n_layers=3", "tiny") == (
        "mine",
        ["optim.lr=1e-3", "model.n_layers=3"],
    )
    with pytest.raises(SystemExit, match="unknown variant"):
        compare.variant_overrides("ngpt-cubic", "tiny")
    with pytest.raises(SystemExit, match="name:section.key=value"):
        compare.variant_overrides("mine:oops", "tiny")


def test_summarize_pairs_seeds():
    def curve(vals):
        return {"steps": [10, 20, 30, 40], "val_loss": vals}

    results = {
        "gpt": {0: curve([3.0, 2.5, 2.2, 2.0]), 1: curve([3.0, 2.4, 2.3, 2.3])},
        "fast": {0: curve([2.6, 2.0, 1.9, 1.8]), 1: curve([2.3, 2.2, 2.2, 2.2])},
        "slow": {0: curve([3.5, 3.0, 2.9, 2.8]), 1: curve([3.0, 2.9, 2.3, 2.3])},
    }
    rows, target = compare.summarize(results, "gpt")
    by = {r["variant"]: r for r in rows}
    assert target == pytest.approx((2.0 + 2.3) / 2)
    assert by["fast"]["steps_to_target"] == [20, 10] and by["fast"]["reached"] == "2/2"
    assert by["fast"]["speedup_vs_baseline"] == pytest.approx((40 / 20 + 30 / 10) / 2)
    assert by["slow"]["steps_to_target"] == [float("inf"), 30] and by["slow"]["reached"] == "1/2"
    assert by["slow"]["speedup_vs_baseline"] == pytest.approx(1.0)


def test_steps_to_reach():
    curve = {"steps": [10, 20, 30], "val_loss": [3.0, 2.5, 2.0]}
    assert compare.steps_to_reach(curve, 2.5) == 20
    assert compare.steps_to_reach(curve, 1.0) == float("inf")


# --- a fair compare by default ------------------------------------------------------------


def test_each_builtin_variant_gets_its_studied_rate_and_gpt_a_scaled_warmup():
    specs = ["gpt", "ngpt", "ngpt-slerp", "gpt-muon", "ngpt-row", "mine:model.preset=ngpt-tiny"]
    variants = [compare.variant_overrides(v, "tiny") for v in specs]
    fair, notes = compare_variants.fair_defaults(variants, specs, "tiny", [], 400)
    extra = dict(fair)
    assert "optim.lr=0.003" in extra["gpt"] and "optim.warmup_steps=20" in extra["gpt"]  # 5% of 400
    assert "optim.lr=0.03" in extra["ngpt"] and not any("warmup" in o for o in extra["ngpt"])
    assert "optim.lr=0.03" in extra["ngpt-slerp"] and "ngpt's" in notes[2]  # the same optimizer's rate
    assert "optim.lr=0.03" in extra["gpt-muon"] and "optim.warmup_steps=20" in extra["gpt-muon"]
    assert not any(o.startswith("optim.lr") for o in extra["ngpt-row"]) and "no studied rate" in notes[4]
    assert extra["mine"] == ["model.preset=ngpt-tiny"]  # a custom variant is the user's
    assert (
        notes[0]
        == "gpt: lr 0.003 (best bracketed rate of the studies at tiny, 400 steps of 4,096 tokens at context 256); "
        "warmup 20 steps (5% of 400, at most 2000)"
    )


def test_the_nearest_measured_budget_gives_the_rate_and_the_command_line_wins():
    studied_rate = compare_variants.studied_rate
    assert studied_rate("gpt", "tiny", 150) == (
        1e-2,
        "best bracketed rate of the studies at tiny, 100 steps of 4,096 tokens at context 256",
    )
    assert studied_rate("gpt", "tiny", 300)[0] == 3e-3  # nearer 400 than 100 in log steps
    assert studied_rate("gpt", "cpu", 5000)[0] == 3e-3  # cpu: 100 and 677 steps measured
    assert studied_rate("gpt", "0.5b", 100) is None
    variants = [compare.variant_overrides(v, "tiny") for v in ("gpt", "ngpt")]
    fair, notes = compare_variants.fair_defaults(
        variants, ["gpt", "ngpt"], "tiny", ["optim.lr=0.001", "optim.warmup_steps=3"], 100
    )
    assert fair == variants and notes == ["gpt: lr from the command line", "ngpt: lr from the command line"]
    _, long = compare_variants.fair_defaults(variants[:1], ["gpt"], "tiny", [], 100_000)
    assert "warmup 2000 steps" in long[0]


def test_the_studied_rates_are_the_budget_studys_picks():
    """The table follows the committed ledgers: every pick of the budget study at context 256, at
    a size and budget the table lists, is the table's rate for that arm (a variant that takes
    ngpt's rate was picked at ngpt's where the study ran it)."""
    results = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "budget"
    checked = 0
    for picks in sorted([*results.glob("default_corpus/steps*/picks.jsonl"), *results.glob("default_corpus_cpu/steps*/picks.jsonl")]):  # fmt: skip  # two studies
        budget = int(picks.parent.name.removeprefix("steps"))
        decided = {}
        for line in picks.read_text().splitlines():
            row = json.loads(line)
            decided[row["point"], row["arm"]] = row["picked"]  # a later line stands
        for (point, arm), picked in decided.items():
            size, context = point.split("@")
            if context != "256":
                continue
            rate = compare_variants.studied_rate(arm, size, budget)
            if rate is None or not rate[1].endswith(f" {budget} steps of 4,096 tokens at context 256"):
                continue  # a budget the table does not list yet (a study still running adds picks)
            assert rate[0] == picked, (point, budget, arm, rate[0], picked)
            checked += 1
    assert checked >= 26  # tiny: 8 arms at 3 budgets; cpu: 2 arms at 677 steps


def test_a_warmup_as_long_as_the_run_is_refused_before_the_first_run(capsys, monkeypatch):
    monkeypatch.setattr(compare, "run_variants", lambda *a: pytest.fail("no run may start"))
    rc = compare.main(["--variants", "gpt", "ngpt", "--size", "tiny", "train.steps=50", "optim.warmup_steps=50"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and err.startswith("error: ")
    assert "variant gpt: optim.warmup_steps=50 must be < train.steps=50; pass optim.warmup_steps=N" in err


def _readme_compare_command() -> list[str]:
    import shlex

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    block = readme.split("python -m recipes.compare", 1)[1].split("```", 1)[0]
    return shlex.split(block.replace("\\\n", " "))


def test_the_readme_compare_command_runs_as_written(monkeypatch, tmp_path, capsys):
    """The README's command line, parsed and checked as written; the trainings are replaced by
    fake curves (the real ones: test_the_readme_compare_command_trains_in_a_fresh_clone)."""
    argv = _readme_compare_command()
    assert not any(a.startswith("data.source=") for a in argv)  # the embedded corpus: nothing to fetch
    monkeypatch.chdir(tmp_path)
    seen = {}
    _fake_runs(monkeypatch, seen=seen)
    assert compare.main(argv) == 0
    assert set(seen) == {"gpt", "ngpt", "ngpt-slerp", "ngpt-riemannian", "ngpt-adam_normalize"}
    assert all(any(o.startswith("optim.lr=") for o in extra) for extra in seen.values())
    assert "Learning rates: gpt: lr" in (tmp_path / "runs" / "compare" / "compare.md").read_text()


@pytest.mark.slow  # fifteen training processes, ~2 minutes on 2 shared cores
def test_the_readme_compare_command_trains_in_a_fresh_clone(monkeypatch, tmp_path, capsys):
    """The README's command, run from a directory holding nothing else, with short runs."""
    monkeypatch.chdir(tmp_path)
    short = ["train.steps=4", "model.max_seq_len=32", "train.batch_size=2", "train.eval_batches=1",
             f"data.cache_dir={tmp_path / 'cache'}", "--no-progress"]  # fmt: skip  # options beside their values
    assert compare.main([*_readme_compare_command(), *short]) == 0
    out = capsys.readouterr().out
    report = json.loads((tmp_path / "runs" / "compare" / "compare.json").read_text())
    assert [r["variant"] for r in report["rows"]] == [
        "gpt",
        "ngpt",
        "ngpt-slerp",
        "ngpt-riemannian",
        "ngpt-adam_normalize",
    ]
    assert all(r["seeds"] == 3 and r["val_points"] == [4, 4, 4] for r in report["rows"])
    assert report["few_points"] == [] and "warning" not in out
    assert "train 64 tokens a step at context 32 (2 sequences): the best rate may differ" in out


def test_a_hyperball_variant_gets_gpts_rate_for_adamw_and_its_own_matrix_rate():
    variants = [compare.variant_overrides(v, "tiny") for v in ("gpt", "gpt-adamh")]
    fair, notes = compare_variants.fair_defaults(variants, ["gpt", "gpt-adamh"], "tiny", [], 1600)
    assert "optim.lr=0.01" in fair[1][1] and "optim.matrix_lr=0.03" in fair[1][1]
    assert "AdamW lr 0.01 (gpt's best bracketed rate" in notes[1] and "matrix_lr 0.03 (best bracketed rate" in notes[1]
    fair, notes = compare_variants.fair_defaults(variants, ["gpt", "gpt-adamh"], "tiny", ["optim.matrix_lr=0.2"], 1600)
    assert (
        not any(o.startswith("optim.matrix_lr") for o in fair[1][1]) and "matrix_lr from the command line" in notes[1]
    )


# --- a report that never misleads ----------------------------------------------------------


def _fake_runs(monkeypatch, steps_of=None, seen=None):
    """Replace the trainings by falling curves, one validation at each step of ``steps_of(name)``
    (default: every train.eval_every steps, as compare asks for); ``seen`` collects the overrides."""

    def fake(args, variants, out):
        results = {}
        for i, (name, extra) in enumerate(variants):
            if seen is not None:
                seen[name] = extra
            train = load_config(args.config, [*args.overrides, *extra]).train
            steps = steps_of(name) if steps_of else list(range(train.eval_every, train.steps + 1, train.eval_every))
            results[name] = {
                seed: {
                    "steps": steps,
                    "val_loss": [3.0 - 0.1 * k * (i + 1) - 0.01 * seed for k in range(len(steps))],
                    "tokens": [s * 2048 for s in steps],
                    "train": [],
                    "sphere_norm_error": None,
                }
                for seed in args.seeds
            }
        return results

    monkeypatch.setattr(compare, "run_variants", fake)


def test_compare_validates_at_least_10_times_unless_told(monkeypatch, tmp_path, capsys):
    seen = {}
    _fake_runs(monkeypatch, seen=seen)
    argv = ["--variants", "gpt", "ngpt", "mine:model.preset=ngpt-tiny,train.eval_every=5", "--size", "tiny"]
    assert compare.main([*argv, "--out", str(tmp_path), "train.steps=30"]) == 0
    assert seen["gpt"][-1] == "train.eval_every=3" and seen["ngpt"][-1] == "train.eval_every=3"
    assert "train.eval_every=3" not in seen["mine"]  # the variant's own is kept
    out = capsys.readouterr().out
    assert "gpt, ngpt: validation every 3 steps and at step 30: 10 points a run (train.eval_every= to choose)" in out
    assert (
        "mine: validation every 5 steps and at step 30: 6 points a run (train.eval_every from the command line)" in out
    )

    # 555 steps: every 55 steps and at step 555, 11 points; 3000: the config's 100 are often enough
    assert compare.main([*argv[:3], "--size", "tiny", "--out", str(tmp_path), "train.steps=555"]) == 0
    assert seen["gpt"][-1] == "train.eval_every=55"
    assert "validation every 55 steps and at step 555: 11 points a run" in capsys.readouterr().out
    assert compare.validation_defaults(compare.DEFAULT_CONFIG, [("a", [])], ["train.steps=3000"]) == (
        [("a", [])],
        ["a: validation every 100 steps and at step 3000: 30 points a run (train.eval_every= to choose)"],
    )

    # a shared train.eval_every is the user's; a config that validates often enough is kept
    seen.clear()
    assert (
        compare.main([*argv[:3], "--size", "tiny", "--out", str(tmp_path), "train.steps=30", "train.eval_every=3"]) == 0
    )
    assert not any("train.eval_every" in o for o in seen["gpt"])


def test_a_run_of_3_points_or_fewer_is_flagged_in_the_table_and_on_stdout(monkeypatch, tmp_path, capsys):
    _fake_runs(monkeypatch, steps_of=lambda name: [10, 20, 30] if name == "ngpt" else [3, 6, 9, 12])
    rc = compare.main(["--variants", "gpt", "ngpt", "--seeds", "0", "1", "--size", "tiny", "--out", str(tmp_path),
                       "train.steps=30"])  # fmt: skip  # options beside their values
    assert rc == 0
    out = capsys.readouterr().out
    advice = (
        "3 validation points in 30 steps: too few to draw a curve or to read a speedup from; "
        "pass train.eval_every=3 (or leave it out) for 10"
    )
    table = (tmp_path / "compare.md").read_text()
    assert "| ngpt | 2 | 3 (too few: see below) |" in table and "| gpt | 2 | 4 |" in table
    assert f"- ngpt seed 0: {advice}\n- ngpt seed 1: {advice}\n" in table
    assert f"warning: ngpt seed 0: {advice}\nwarning: ngpt seed 1: {advice}\n" in out
    assert "warning: gpt" not in out
    assert json.loads((tmp_path / "compare.json").read_text())["few_points"] == [
        f"ngpt seed 0: {advice}",
        f"ngpt seed 1: {advice}",
    ]


def test_a_run_too_short_for_4_points_is_told_to_train_longer(capsys):
    variants, lines = compare.validation_defaults(compare.DEFAULT_CONFIG, [("a", [])], ["train.steps=3"])
    assert variants == [("a", ["train.eval_every=1"])]
    assert lines == [
        "a: warning: 3 validation points in 3 steps: too few to draw a curve or to read a speedup from; "
        "train more than 3 steps (train.steps=)"
    ]


def test_one_seed_shows_no_spread_and_two_seeds_do(tmp_path):
    def curve(vals):
        return {"steps": [10, 20, 30, 40], "val_loss": vals}

    one = {"gpt": {0: curve([3.0, 2.5, 2.2, 2.0])}, "ngpt": {0: curve([2.6, 2.0, 1.9, 1.8])}}
    rows, target = compare.summarize(one, "gpt")
    assert rows[0]["best_val_std"] is None and rows[1]["speedup_std"] is None
    table = compare.write_table(rows, target, "gpt", tmp_path / "one.md")
    assert "±" not in table
    assert "| ngpt | 1 | 4 | 1.8000 | 1.8000 | 20 | 1/1 | 2.00 |" in table

    two = {name: {**by_seed, 1: curve([v + 0.1 for v in by_seed[0]["val_loss"]])} for name, by_seed in one.items()}
    rows, target = compare.summarize(two, "gpt")
    table = compare.write_table(rows, target, "gpt", tmp_path / "two.md")
    assert "| ngpt | 2 | 4 | 1.8500 ± 0.0707 | 1.8500 ± 0.0707 | 20, 20 | 2/2 | 2.00 ± 0.00 |" in table


def test_the_plot_marks_every_validation_point():
    curve = {"steps": [10], "val_loss": [2.0], "tokens": [40960]}
    fig = compare.figure({"gpt": {0: curve, 1: curve}, "ngpt": {0: curve}}, "title")
    lines = [line for ax in fig.axes for line in ax.get_lines()]
    assert len(lines) == 6 and all(line.get_marker() == "o" for line in lines)


def test_help_lists_every_builtin_variant_in_one_line(capsys):
    with pytest.raises(SystemExit) as exc:
        compare.main(["--help"])
    assert exc.value.code == 0
    lines = capsys.readouterr().out.splitlines()
    assert set(compare_variants.DESCRIPTIONS) == set(compare_variants.BUILTIN)
    for name, description in compare_variants.DESCRIPTIONS.items():
        assert sum(line.split() == [name, *description.split()] for line in lines) == 1, name


def test_the_studied_rates_say_where_they_were_found_and_compare_says_when_the_run_differs(
    monkeypatch, tmp_path, capsys
):
    _fake_runs(monkeypatch)
    argv = ["--variants", "gpt", "ngpt", "ngpt-row", "--size", "tiny", "--out", str(tmp_path), "train.steps=30"]
    assert compare.main(argv) == 0  # the default config: 16 sequences of 128
    out = capsys.readouterr().out
    note = (
        "note: the studied rates were found at 4,096 tokens a step at context 256 (16 sequences); gpt, ngpt train "
        "2,048 tokens a step at context 128 (16 sequences): the best rate may differ"
    )
    assert note in out and "ngpt-row train" not in out  # ngpt-row has no studied rate
    assert "gpt: lr 0.01 (best bracketed rate of the studies at tiny, 100 steps of 4,096 tokens at context 256)" in out
    assert note in (tmp_path / "compare.md").read_text()

    assert compare.main([*argv, "model.max_seq_len=256"]) == 0  # as the studies trained
    assert "note:" not in capsys.readouterr().out
    assert compare.main([*argv, "model.max_seq_len=256", "train.batch_size=4"]) == 0
    assert "gpt, ngpt train 1,024 tokens a step at context 256 (4 sequences)" in capsys.readouterr().out
    assert compare.main([*argv, "optim.lr=0.01"]) == 0  # no studied rate taken: nothing to say
    assert "note:" not in capsys.readouterr().out


@pytest.mark.parametrize(
    "override, message",
    [
        ("data.source=missing.txt", "error: data.source=missing.txt: source file not found: "),
        (
            "data.tokenizer=bpe:missing/tokenizer.json",
            "error: data.tokenizer=bpe:missing/tokenizer.json: no tokenizer file",
        ),
        ("data.tokenizer=hf:./nowhere", "error: data.tokenizer=hf:./nowhere: no tokenizer file nowhere"),
        ("train.init_from=./no/such/run", "error: train.init_from=./no/such/run: no run directory, checkpoint"),
        ("train.init_from=no/such/run", "error: train.init_from=no/such/run: no run directory, checkpoint"),
    ],
)
def test_every_data_path_is_checked_before_the_first_run(monkeypatch, tmp_path, capsys, override, message):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(compare, "run_variants", lambda *a: pytest.fail("no run may start"))
    assert compare.main(["--variants", "gpt", "ngpt", "--size", "tiny", override]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith(message) and captured.err.count("\n") == 1, captured.err
    assert captured.out == "" and not (tmp_path / "runs").exists()  # nothing trained, nothing written


def test_a_variants_own_data_path_is_checked_and_named(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(compare, "run_variants", lambda *a: pytest.fail("no run may start"))
    (tmp_path / "here.txt").write_text("some text\n\nmore text\n")
    spec = f"mine:model.preset=ngpt-tiny,data.source={tmp_path / 'gone.txt'}"
    rc = compare.main(
        ["--variants", "gpt", spec, "--out", str(tmp_path / "out"), f"data.source={tmp_path / 'here.txt'}"]
    )
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith(
        f"error: variant mine: data.source={tmp_path / 'gone.txt'}: source file not found"
    )
    assert not (tmp_path / "out").exists()
    _fake_runs(monkeypatch)  # a hub id and the embedded corpus pass without a download
    assert compare.main(["--variants", "gpt", "--out", str(tmp_path / "ok"), "train.steps=30"]) == 0
    assert compare.check_data_paths(compare.DEFAULT_CONFIG, [], ["data.source=hf:owner/name"]) is None
    # a file without an extension: checked with the format each variant names
    (tmp_path / "plain").write_text("some text\n\nmore text\n")
    source = f"data.source={tmp_path / 'plain'}"
    assert compare.check_data_paths(compare.DEFAULT_CONFIG, [("gpt", [])], [source, "data.format=text"]) is None
    with pytest.raises(SystemExit, match=r"^error: variant auto: data.source=.*plain: .*data.format=text"):
        compare.check_data_paths(compare.DEFAULT_CONFIG, [("auto", ["data.format=auto"])], [source, "data.format=text"])
