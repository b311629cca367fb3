"""The budget study's size axis (``size_axis.md``, ``size_axis.png``): the compute multiplier
against tokens per parameter at every size the studies' results directories hold, side by side,
and the update rules' final losses paired by seed with LERP's."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from budget_report import (
    budgets_of,
    cannot_show,
    fmt_multiplier,
    in_plan,
    multiplier_axes,
    summary,
    tokens_per_param,
)
from scaling_ledger import BASELINE
from scaling_report import fmt_values, mean_std

#: The update-rule arms, paired by seed with LERP (``ngpt``) in the size-axis table.
LERP = "ngpt"
RULE_ARMS = ("ngpt-slerp", "ngpt-riemannian", "ngpt-tangent")


def size_axis_rows(studies: list[argparse.Namespace]) -> list[dict]:
    """Every (point, budget, arm) the studies plan (:func:`budget_report.in_plan`), ordered by
    model size, context and budget: its :func:`summary` row with the paired differences to LERP
    (``vs_lerp``: per seed, the arm's final loss minus LERP's), or ``None`` ("not run")."""
    out = []
    for order, args in enumerate(studies):
        found = {(str(r["point"]), r["budget"], r["arm"]): r for r in summary(args)}
        for pt in args.points:
            for b in budgets_of(args, pt):
                for arm in (a for a in args.arms if in_plan(args, pt, b, a)):
                    r = found.get((str(pt), b, arm))
                    if r is not None and arm in RULE_ARMS and (str(pt), b, LERP) in found:
                        lerp = dict(zip(found[str(pt), b, LERP]["seeds"], found[str(pt), b, LERP]["finals"]))
                        r = {**r, "vs_lerp": [f - lerp[s] for s, f in zip(r["seeds"], r["finals"]) if s in lerp]}
                    out.append(
                        {"point": pt, "params": args.params[str(pt)], "budget": b, "arm": arm, "row": r,
                         "tokens_per_param": tokens_per_param(args, pt, b), "study": order}
                    )  # fmt: skip  # one row's fields
    out.sort(key=lambda e: (e["params"], e["point"].context, e["study"], e["budget"]))
    return out


def write_size_axis(studies: list[argparse.Namespace], out: Path) -> None:
    """``size_axis.md`` and ``size_axis.png`` in ``out``: the compute multiplier against tokens
    per parameter at every size the studies (results directories) hold, side by side."""
    entries = size_axis_rows(studies)
    lines = [
        "| point | params | budget (steps) | tokens / param | arm | lr | seeds | final val loss | gap to GPT | "
        "compute multiplier (per seed) | minus LERP (per seed) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for e in entries:
        r = e["row"]
        head = f"| {e['point']} | {e['params'] / 1e6:.2f}M | {e['budget']} | {e['tokens_per_param']:.1f} | {e['arm']} |"
        if r is None or not r["seeds"]:
            lines.append(head + " not run | 0 | - | - | - | - |")
            continue
        finite = [m for m, _ in r["multipliers"] if math.isfinite(m)]
        mark = "*" if any(x for _, x in r["multipliers"]) else ""
        per_seed = ", ".join(fmt_multiplier(m, x) for m, x in r["multipliers"])
        vs = r.get("vs_lerp")
        vs_text = f"{fmt_values(vs, 4)} ({', '.join(f'{v:+.4f}' for v in vs)})" if vs else "-"
        rate = f"{r['lr']:g}" + (" (pending)" if r.get("pending") else "")
        lines.append(
            head + f" {rate} | {len(r['seeds'])} | {fmt_values(r['finals'], 4)} | {fmt_values(r['gaps'], 4)} | "
            f"{(fmt_values(finite) + mark) if finite else '-'} ({per_seed}) | {vs_text} |"
        )
    sources = "; ".join(
        f"`{_shown(a.results)}` ("
        + ", ".join(f"{p} at {'/'.join(map(str, budgets_of(a, p)))} steps" for p in a.points)
        + ")"
        for a in studies
    )
    ran = [e for e in entries if e["row"] is not None and e["row"]["seeds"]]
    sizes = sorted({e["params"] for e in ran})
    out.mkdir(parents=True, exist_ok=True)
    (out / "size_axis.md").write_text(
        "# Budget study: the compute multiplier against tokens per parameter at "
        f"{_count(len(sizes), 'size')}\n\n"
        f"From the budget studies' ledgers: {sources}. Each point at its own budgets, the same tokens per step "
        f"({', '.join(sorted({str(a.tokens_per_step) for a in studies}))}), so that the sizes meet at equal "
        "tokens per parameter (the nGPT model's count). Compute multiplier, gap to GPT and the rate: as in each "
        "study's `budget.md` (the arm's picked rate; *: extrapolated beyond GPT's budgets at that point; pending: "
        "the rate rule still needs runs before this rate is its pick, so the row may change). Minus "
        "LERP: the update rule's final loss minus LERP's (`ngpt`) at the same point, budget and seed (< 0: the "
        "rule is ahead); mean ± std over the seeds both ran. Not run: planned by the study's command, not in its "
        "ledger yet.\n\n" + "\n".join(lines) + "\n\n" + cannot_show(ran) + "\n"
    )
    plot_size_axis(entries, out / "size_axis.png", [a.results.name for a in studies])


def _count(n: int, noun: str) -> str:
    words = {1: "one", 2: "two", 3: "three"}
    return f"{words.get(n, n)} {noun}{'' if n == 1 else 's'}"


def _shown(path: Path) -> str:
    root = Path(__file__).resolve().parents[1]
    return str(path.relative_to(root)) if path.is_relative_to(root) else str(path)


def size_axis_curves(entries: list[dict]) -> dict[tuple[int, str, str], list[tuple]]:
    """The plot's lines, (study, point, arm) -> [(tokens per parameter, mean multiplier, std,
    seeds with a finite multiplier, whether one is extrapolated past GPT's budgets, whether the
    rate rule still needs runs before the rate is its pick)]:
    where some context is planned at two sizes or more, only the arms planned at two sizes or
    more at such a context (the rest say nothing about size); else every arm."""
    sizes: dict[tuple[int, str], set[str]] = {}  # (context, arm) -> the sizes that plan it
    for e in entries:
        sizes.setdefault((e["point"].context, e["arm"]), set()).add(e["point"].size)
    compared = {key for key, held in sizes.items() if len(held) > 1}
    lines: dict[tuple[int, str, str], list] = {}  # (study, point, arm): a point two studies hold, twice
    for e in entries:
        r = e["row"]
        finite = [m for m, _ in r["multipliers"] if math.isfinite(m)] if r is not None else []
        if e["arm"] == BASELINE or not finite or (compared and (e["point"].context, e["arm"]) not in compared):
            continue
        extrapolated = any(x for _, x in r["multipliers"])
        point = (e["tokens_per_param"], *mean_std(finite), len(finite), extrapolated, bool(r.get("pending")))
        lines.setdefault((e["study"], str(e["point"]), e["arm"]), []).append(point)
    return lines


def plot_size_axis(entries: list[dict], path: Path, names: list[str]) -> None:
    """One line per study, point and arm (colour: arm; style: point) of :func:`size_axis_curves`;
    ``names``: the studies' labels."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    lines = size_axis_curves(entries)
    curves = [
        (study, point)
        for _, study, point in sorted({(e["params"], e["study"], str(e["point"])) for e in entries})
        if any(key[:2] == (study, point) for key in lines)
    ]
    shared = {p for _, p in curves if sum(q == p for _, q in curves) > 1}
    arms = sorted({a for *_, a in lines})
    most_seeds = max((p[3] for pts in lines.values() for p in pts), default=0)
    styles = ["-", "--", ":", "-."]
    fig, ax = plt.subplots(figsize=(6.8, 4.4))
    for (study, point, arm), pts in sorted(lines.items()):
        pts.sort()
        where = f"{point} ({names[study]})" if point in shared else point
        color = f"C{arms.index(arm) % 10}"
        ax.errorbar([p[0] for p in pts], [p[1] for p in pts], yerr=[p[2] for p in pts], marker="o", capsize=3,
                    color=color, ls=styles[curves.index((study, point)) % len(styles)],
                    label=f"{arm} @ {where}")  # fmt: skip  # one call, its style beside it
        for marked, size, face in (
            ([p for p in pts if p[3] < most_seeds or p[5]], 140, "none"),
            ([p for p in pts if p[4]], 36, "white"),
        ):
            # a ring: fewer seeds, or a pick pending; an open marker: read past GPT's budgets
            ax.scatter(
                [p[0] for p in marked], [p[1] for p in marked], s=size, facecolors=face, edgecolors=color, zorder=4
            )
    multiplier_axes(ax, [p[0] for pts in lines.values() for p in pts])
    ax.set_title(
        f"colour: arm; line style: point (size@context); mean ± std over {most_seeds} seeds\n"
        "ring: fewer seeds, or the pick pending; open marker: extrapolated beyond GPT's budgets",
        fontsize=9,
    )
    if lines:
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
