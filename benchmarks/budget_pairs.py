"""The update rules against LERP at equal tokens, paired by seed: per point, budget and rule the
differences ``rule - LERP`` of the final validation loss on each seed both ran, their mean, its
standard error and a 95% interval (Student's t with n - 1 degrees of freedom), and whether the
interval excludes 0. And every arm whose gap to GPT, paired by seed the same way, lies within two
standard deviations of 0: the multipliers that rest on such a gap. Sections of a budget study's
``budget.md`` (:mod:`budget_report`)."""

from __future__ import annotations

import math
import statistics

LERP = "ngpt"  # the paper's update, the reference every other rule is paired with
GPT = "gpt"  # the baseline every multiplier is read against
RULES = ("ngpt-slerp", "ngpt-riemannian", "ngpt-tangent")

# Student's t at 0.975 for 1-30 degrees of freedom (two-sided 95%); past 30 the normal's 1.96
# is within 4% of it.
T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
         2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)  # fmt: skip  # a table


def t_975(dof: int) -> float:
    return T_975[dof - 1] if dof <= len(T_975) else 1.96


def interval(diffs: list[float]) -> dict:
    """Mean, standard error and 95% interval of paired differences (nan below two)."""
    n = len(diffs)
    mean = statistics.fmean(diffs) if diffs else math.nan
    if n < 2:
        return {"n": n, "mean": mean, "se": math.nan, "low": math.nan, "high": math.nan}
    se = statistics.stdev(diffs) / math.sqrt(n)
    half = t_975(n - 1) * se
    return {"n": n, "mean": mean, "se": se, "low": mean - half, "high": mean + half}


def paired(rows: list[dict]) -> list[dict]:
    """One entry per (point, budget, rule) where both the rule and LERP have a chosen rate:
    the per-seed differences (seeds both ran, in seed order) and :func:`interval` of them.
    ``rows``: :func:`budget_report.summary`'s."""
    by_key = {(str(r["point"]), r["budget"], r["arm"]): r for r in rows}
    out = []
    for (point, budget, arm), row in by_key.items():
        lerp = by_key.get((point, budget, LERP))
        if arm not in RULES or lerp is None:
            continue
        lerp_final = dict(zip(lerp["seeds"], lerp["finals"]))
        seeds = [s for s in row["seeds"] if s in lerp_final]
        diffs = [f - lerp_final[s] for s, f in zip(row["seeds"], row["finals"]) if s in lerp_final]
        out.append({"point": point, "budget": budget, "rule": arm, "seeds": seeds, "diffs": diffs, **interval(diffs)})
    return out


def paired_section(rows: list[dict], corpus: str, tokens_per_param) -> str:
    """The section of ``budget.md``: a table and what it is read as. ``tokens_per_param(point,
    budget)`` gives the budget's tokens per parameter."""
    pairs = paired(rows)
    if not pairs:
        return ""
    lines = [
        "\n## Update rules against LERP, paired by seed\n",
        f"Final validation loss of each rule minus LERP's (the `ngpt` arm) on the same seed, each at its own "
        f"chosen rate; {corpus} only. Mean, standard error (SE) and 95% interval (t, n - 1 degrees of "
        "freedom) of the paired differences; > 0: the rule is behind LERP. Excludes 0: the interval lies on "
        "one side of 0; otherwise these seeds cannot tell the two apart.\n",
        "| point | budget (steps) | tokens / param | rule | seeds | rule - LERP per seed | mean | SE | 95% interval | excludes 0 |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p in pairs:
        per_seed = ", ".join(f"{d:+.3f}" for d in p["diffs"])
        if p["n"] < 2:
            se = ci = verdict = "-"
        else:
            se, ci = f"{p['se']:.3f}", f"[{p['low']:+.3f}, {p['high']:+.3f}]"
            verdict = "yes: behind" if p["low"] > 0 else "yes: ahead" if p["high"] < 0 else "no"
        lines.append(
            f"| {p['point']} | {p['budget']} | {tokens_per_param(p['point'], p['budget']):.1f} | {p['rule']} | "
            f"{p['n']} | {per_seed} | {p['mean']:+.3f} | {se} | {ci} | {verdict} |"
        )
    return "\n".join(lines) + "\n"


def close_gaps(rows: list[dict]) -> list[dict]:
    """The (point, budget, arm) rows, GPT's own left out, whose mean gap to GPT (``row["gaps"]``:
    the arm's final loss minus GPT's on the same seed) is within two standard deviations of the
    per-seed gaps from 0: with ``n`` seeds, a sign the seeds may not hold. Two seeds or more."""
    out = []
    for row in rows:
        gaps = [g for g in row.get("gaps", []) if math.isfinite(g)]
        if row["arm"] == GPT or len(gaps) < 2:
            continue
        mean, std = statistics.fmean(gaps), statistics.stdev(gaps)
        if abs(mean) <= 2 * std:
            out.append(
                {
                    "point": str(row["point"]),
                    "budget": row["budget"],
                    "arm": row["arm"],
                    "gaps": gaps,
                    "mean": mean,
                    "std": std,
                }
            )
    return out


def close_gaps_section(rows: list[dict], corpus: str, tokens_per_param) -> str:
    """The section of ``budget.md`` listing :func:`close_gaps`: the multipliers a few more seeds
    could move. Empty when there are none."""
    close = close_gaps(rows)
    if not close:
        return ""
    lines = [
        "\n## Gaps to GPT within two standard deviations\n",
        f"The arms whose final loss minus GPT's, paired by seed, has a mean within two standard deviations "
        f"(std of the per-seed gaps) of 0; {corpus} only. A multiplier read at these points rests on a gap "
        "the seeds run so far may not hold: these are the points that need more seeds first.\n",
        "| point | budget (steps) | tokens / param | arm | seeds | gap to GPT per seed | mean ± std |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in close:
        per_seed = ", ".join(f"{g:+.3f}" for g in c["gaps"])
        lines.append(
            f"| {c['point']} | {c['budget']} | {tokens_per_param(c['point'], c['budget']):.1f} | {c['arm']} | "
            f"{len(c['gaps'])} | {per_seed} | {c['mean']:+.3f} ± {c['std']:.3f} |"
        )
    return "\n".join(lines) + "\n"
