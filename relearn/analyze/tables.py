"""The tables ``relearn analyze`` prints: each pool's NLL (``nll``), its kept/excluded split
(``split``), and pass@k with the problems each pool solves (``passk``), from the results those
modules write to JSON."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from relearn.analyze.split import fmt_ci, not_split_text

NLL_COLUMNS = ("pool", "scored", "skipped", "rejected", "eligible tokens", "NLL/token [95% CI]", "traj. mean", "median", "p10-p90")
SPLIT_COLUMNS = ("pool", "split", "not split", "kept tokens", "kept NLL", "excluded tokens", "excluded NLL", "excluded - kept")
PASSK_COLUMNS = ("pool", "problems", "attempts (min-max)", "success rate", "pass@K (K)", "solved", "solved only here (common)")
PAIR_COLUMNS = ("A", "B", "problems", "both", "only A", "only B", "neither")
SHOWN_PER_PROBLEM = 40  # more problems than this: the per-problem table is left out


def table(title: str, columns: tuple[str, ...], left: tuple[str, ...] = ("pool",)) -> Table:
    """An empty table, its columns right-aligned save those in ``left``."""
    shown = Table(title=title)
    for column in columns:
        shown.add_column(column, justify="left" if column in left else "right")
    return shown


def nll_tables(result: dict[str, Any], split: bool) -> list[Table]:
    """The NLL of each pool and, with ``split`` (reviews given), its kept/excluded split."""
    return [nll_table(result), *([split_table(result)] if split else [])]


def nll_table(result: dict[str, Any]) -> Table:
    """One row per pool: its counts, NLL per eligible token and the difference from the first."""
    shown = table(
        f"relearn analyze nll ({result['settings']['model']}): NLL per eligible token, nats", (*NLL_COLUMNS, "Δ vs first [95% CI]")
    )
    for r in result["pools"]:
        counts = (r["name"], str(r["scored"]), str(sum(r["skipped"].values())), str(r["rejected"]))
        if not r["scored"]:
            shown.add_row(*counts, *["-"] * 6)
            continue
        (lo, hi), (dlo, dhi) = r["nll_per_token_ci95"], r.get("diff_vs_first_ci95", (0, 0))
        diff = f"{r['diff_vs_first']:+.3f} [{dlo:+.3f}, {dhi:+.3f}]" if "diff_vs_first" in r else "-"
        shown.add_row(
            *counts, f"{r['eligible_tokens']:,}", f"{r['nll_per_token']:.3f} [{lo:.3f}, {hi:.3f}]", f"{r['trajectory_mean']:.3f}",
            f"{r['median']:.3f}", f"{r['p10']:.3f}-{r['p90']:.3f}", diff,
        )  # fmt: skip
    return shown


def split_table(result: dict[str, Any]) -> Table:
    """One row per pool (kept, excluded and the gap), then a row per defect category."""
    shown = table("kept (A \\ E) vs excluded (E) eligible tokens: NLL per token, nats [95% CI]", SPLIT_COLUMNS, ("pool", "not split"))
    for r in result["pools"]:
        s = r["split"]
        if not s["trajectories"]:
            shown.add_row(r["name"], "0", not_split_text(s["not_split"]), *["-"] * 5)
            continue
        k, e, g = s["kept"], s["excluded"], s["gap"]
        shown.add_row(
            r["name"], str(s["trajectories"]), not_split_text(s["not_split"]), f"{k['tokens']:,}", fmt_ci(k["nll"], k["ci95"]),
            f"{e['tokens']:,}", fmt_ci(e["nll"], e["ci95"]), fmt_ci(g["nll"], g["ci95"], sign=True),
        )  # fmt: skip
        for category, c in s["categories"].items():
            shown.add_row(f"  {category}", "", "", "", "", f"{c['tokens']:,}", fmt_ci(c["nll"], c["ci95"]), "")
    return shown


def passk_tables(result: dict[str, Any]) -> list[Table]:
    """Each pool's pass@k and solved problems; each pair's overlap; per problem, when few."""
    pools = table(f"relearn analyze passk ({result['common_problems']} problems in all pools, {result['solved_by_any_common']} solved by any)", PASSK_COLUMNS)  # fmt: skip
    for p in result["pools"]:
        last = p["curve"][-1] if p["curve"] else {"k": 0, "pass": 0.0}
        pools.add_row(
            p["name"], str(p["problems"]), f"{p['attempts']} ({p['attempts_min']}-{p['attempts_max']})", f"{p['success_rate']:.1%}",
            f"{last['pass']:.1%} ({last['k']})", str(p["solved"]), str(p["solved_only_here"]),
        )  # fmt: skip
    shown = [pools]
    if result["pairs"]:
        pairs = table("solved by (problems both pools attempted)", PAIR_COLUMNS, ("A", "B"))
        for q in result["pairs"]:
            pairs.add_row(q["a"], q["b"], *(str(q[key]) for key in ("problems", "both", "only_a", "only_b", "neither")))
        shown.append(pairs)
    if len(result["problems"]) <= SHOWN_PER_PROBLEM:
        names = [p["name"] for p in result["pools"]]
        per = table("per problem: resolved / attempts", ("problem", *names), ("problem",))
        for task, row in result["problems"].items():
            per.add_row(task, *[f"{row[n]['resolved']}/{row[n]['attempts']}" if n in row else "-" for n in names])
        shown.append(per)
    return shown
