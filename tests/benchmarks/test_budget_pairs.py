"""The update rules against LERP, paired by seed (``benchmarks/budget_pairs.py``): the paired
differences, their standard error and 95% interval, and the verdict the report writes."""

from __future__ import annotations

import math
import statistics

import pytest


def row(arm: str, seeds: list[int], finals: list[float], budget: int = 400) -> dict:
    return {"point": "tiny@1024", "budget": budget, "arm": arm, "seeds": seeds, "finals": finals}


def test_the_interval_is_students_t_on_the_paired_differences(budget_pairs):
    diffs = [0.10, 0.02, 0.08, 0.09, 0.01]
    got = budget_pairs.interval(diffs)
    se = statistics.stdev(diffs) / math.sqrt(5)
    assert got["mean"] == pytest.approx(0.06) and got["se"] == pytest.approx(se)
    assert (got["low"], got["high"]) == pytest.approx((0.06 - 2.776 * se, 0.06 + 2.776 * se))  # t(4) = 2.776
    one = budget_pairs.interval([0.3])
    assert one["n"] == 1 and one["mean"] == 0.3 and math.isnan(one["se"]) and math.isnan(one["low"])
    assert budget_pairs.t_975(1) == 12.706 and budget_pairs.t_975(7) == 2.365 and budget_pairs.t_975(100) == 1.96


def test_rules_pair_with_lerp_on_the_seeds_both_ran(budget_pairs):
    rows = [
        row("gpt", [0, 1, 2], [3.0, 3.0, 3.0]),
        row("ngpt", [0, 1, 2, 3], [2.0, 2.1, 2.2, 2.3]),
        row("ngpt-slerp", [0, 1, 3], [2.5, 2.4, 2.8]),  # seed 2 not run: seeds 0, 1, 3 pair
        row("ngpt-riemannian", [0, 1, 2], [1.9, 2.2, 2.2], budget=1600),  # no LERP at 1600: no pair
    ]
    pairs = budget_pairs.paired(rows)
    assert [(p["rule"], p["seeds"]) for p in pairs] == [("ngpt-slerp", [0, 1, 3])]
    assert pairs[0]["diffs"] == pytest.approx([0.5, 0.3, 0.5])


def test_the_section_says_where_the_interval_excludes_0(budget_pairs):
    rows = [
        row("ngpt", [0, 1, 2, 3], [2.0, 2.0, 2.0, 2.0]),
        row("ngpt-slerp", [0, 1, 2, 3], [2.10, 2.12, 2.09, 2.11]),  # behind on every seed
        row("ngpt-riemannian", [0, 1, 2, 3], [1.95, 2.06, 1.97, 2.04]),  # both ways
        row("ngpt-tangent", [0, 1, 2, 3], [1.90, 1.91, 1.89, 1.92]),  # ahead on every seed
    ]
    text = budget_pairs.paired_section(rows, "a corpus", lambda point, budget: 9.9)
    lines = {line.split(" | ")[3]: line for line in text.splitlines() if line.startswith("| tiny@1024")}
    assert lines["ngpt-slerp"].endswith("| yes: behind |") and "+0.100, +0.120, +0.090, +0.110" in lines["ngpt-slerp"]
    assert lines["ngpt-riemannian"].endswith("| no |")
    assert lines["ngpt-tangent"].endswith("| yes: ahead |")
    assert "a corpus only" in text
    assert budget_pairs.paired_section([row("ngpt", [0], [2.0])], "a corpus", lambda p, b: 1.0) == ""


def test_gaps_to_gpt_within_two_standard_deviations_are_listed(budget_pairs):
    def gapped(arm: str, gaps: list[float]) -> dict:
        return {**row(arm, list(range(len(gaps))), [1.0] * len(gaps)), "gaps": gaps}

    rows = [
        gapped("gpt", [0.0, 0.0, 0.0]),  # the baseline itself: never listed
        gapped("ngpt", [-0.010, -0.060, -0.040]),  # mean -0.037, std 0.025: within 2 std
        gapped("gpt-muon", [-0.30, -0.32, -0.28]),  # far outside
        gapped("ngpt-slerp", [-0.05]),  # one seed: no std
        gapped("ngpt-riemannian", [0.02, float("nan"), 0.02]),  # zero spread, the nan left out: outside
    ]
    close = budget_pairs.close_gaps(rows)
    assert [c["arm"] for c in close] == ["ngpt"]
    assert close[0]["mean"] == pytest.approx(-0.11 / 3) and close[0]["std"] == pytest.approx(
        statistics.stdev([-0.01, -0.06, -0.04])
    )
    text = budget_pairs.close_gaps_section(rows, "a corpus", lambda point, budget: 39.6)
    (line,) = [ln for ln in text.splitlines() if ln.startswith("| tiny@1024")]
    assert line == "| tiny@1024 | 400 | 39.6 | ngpt | 3 | -0.010, -0.060, -0.040 | -0.037 ± 0.025 |"
    assert "a corpus only" in text
    assert budget_pairs.close_gaps_section(rows[2:], "a corpus", lambda p, b: 1.0) == ""
