"""``relearn stats``' report (``compute``) as rich tables: one or more per section, in the order
they are shown; a figure that is missing reads "—"."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from rich.table import Table

LENGTH_GROUPS = ("all", "resolved", "unresolved")


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{value:.1%}"


def _num(value: Any) -> str:
    if value is None:
        return "—"
    return f"{value:,.2f}" if isinstance(value, float) else f"{value:,}"


def grid(title: str, columns: Sequence[str], rows: Iterable[Sequence[str]], *, summary: Sequence[str] = (), bold: bool = True) -> Table:
    """A table whose first column names its rows, the figures right-aligned; ``summary`` is an
    italic last row."""
    table = Table(title=title, title_justify="left")
    table.add_column(columns[0], style="bold" if bold else None)
    for name in columns[1:]:
        table.add_column(name, justify="right")
    for row in rows:
        table.add_row(*row)
    if summary:
        table.add_row(*summary, style="italic")
    return table


def kv_table(title: str, rows: Iterable[tuple[str, str | None]]) -> Table:
    """A table of named figures; a figure of None is left out."""
    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column(justify="right")
    for name, value in rows:
        if value is not None:
            table.add_row(name, value)
    return table


def outcomes_table(t: dict[str, Any], _shown: int) -> Table:
    outcomes = ["resolved", *(["suspicious"] if t["by_outcome"].get("suspicious") else []), "unresolved", "not verified"]
    rows = sorted(t["outcome_by_exit_status"].items(), key=lambda kv: -sum(kv[1].values()))
    return grid(
        f"trajectories: {t['total']:,} ({t['unreadable']} unreadable)", ["exit status", *outcomes, "total"],
        ([status, *(_num(counts.get(o, 0)) for o in outcomes), _num(sum(counts.values()))] for status, counts in rows),
        summary=["all", *(_num(t["by_outcome"].get(o, 0)) for o in outcomes), _num(t["total"])],
    )  # fmt: skip


def pass_at_k_table(p: dict[str, Any], shown: int) -> Table:
    at = [f"pass@{k}" for k in p["k"]]
    tasks = list(p["tasks"].items())
    rows = [[task, _num(row["attempts"]), _num(row["resolved"]), *(_pct(row.get(a)) for a in at)] for task, row in tasks[:shown]]
    rows += [[f"… {len(tasks) - shown:,} more tasks (--tasks, --json)", "", "", *("" for _ in at)]] if len(tasks) > shown else []
    mean = [f"{_pct(p['mean'].get(a))} ({p['tasks_counted'][a]})" for a in at]
    return grid(f"pass@k (unbiased) over {len(tasks):,} tasks", ["task", "attempts", "resolved", *at], rows, summary=["mean over tasks", "", "", *mean])  # fmt: skip


def reviews_table(r: dict[str, Any], _shown: int) -> Table:
    return kv_table(f"reviews: {r['file']}", [
        ("reviewed", _num(r["reviewed"])), ("not reviewed", _num(r["not_reviewed"])),
        *((f"decision: {k}", _num(v)) for k, v in r["decisions"].items()),
        ("accepted / verified positive", f"{r['accepted_of_positive']:,} / {r['positive']:,}"),
        *((f"rejected: {k}", _num(v)) for k, v in r["rejection_reasons"].items()),
        *((f"confirmed errors: {k}", _num(v)) for k, v in r["errors_by_category"].items()),
        ("unreadable reviews", _num(r["unreadable"]) if r["unreadable"] else None),
        ("reviews of trajectories not in the pools", _num(r["not_in_pools"]) if r["not_in_pools"] else None),
    ])  # fmt: skip


def dataset_table(d: dict[str, Any], _shown: int) -> Table:
    tokens = d["tokens"] or {}
    return kv_table(f"dataset: {d['path']}", [
        ("mode", str(d["mode"])), ("trajectories in / out", f"{_num(d['trajectories_in'])} / {_num(d['trajectories_out'])}"),
        ("samples", _num(d["samples"])), ("tokens", _num(tokens.get("total"))), ("eligible (A)", _num(tokens.get("eligible"))),
        ("excluded (A ∩ E)", _num(tokens.get("excluded"))), ("supervised (A \\ E)", _num(tokens.get("supervised"))),
        *((f"rejected: {k}", _num(v)) for k, v in sorted(d["rejected"].items())), ("image audit", _audit_cell(d.get("audit"))),
    ])  # fmt: skip


def ter_table(ter: dict[str, Any], _shown: int) -> Table:
    dist = ter["per_trajectory"]
    note = "" if ter["source"] == "tokens" else " (estimated in characters: give --dataset for tokens)"
    return kv_table(f"TER{note}", [
        (f"{ter['unit']}-weighted TER", _pct(ter["weighted"])), ("trajectories with a TER", _num(dist["n"])),
        *((f"per trajectory: {k}", _pct(dist[k])) for k in (("mean", "median", "p90", "max") if dist["n"] else ())),
        ("trajectories with nothing excluded", _pct(ter["zero_share"]) if dist["n"] else None),
        *((f"TER, {scope} scope{' (trained)' if scope == ter['trained_scope'] else ''}", _scope_cell(by_scope, ter["unit"]))
          for scope, by_scope in ter["by_scope"].items()),
    ])  # fmt: skip


# The groups table's columns: a figure of each group and how it is shown.
GROUP_COLUMNS = (("n", "trajectories", _num), ("resolved", "resolved_rate", _pct), ("accepted", "accepted", _num))
GROUP_COLUMNS += (("with TER", "with_ter", _num), ("TER weighted", "ter_token_weighted", _pct), ("TER mean", "ter_mean", _pct))


def groups_table(ter: dict[str, Any], _shown: int) -> Table:
    rows = ([g["group"], *(show(g[key]) for _name, key, show in GROUP_COLUMNS)] for g in ter["groups"])
    return grid(f"outcomes and TER ({ter['unit']}) by {ter['by']}", ["group", *(c[0] for c in GROUP_COLUMNS)], rows, bold=False)


def windows_table(ter: dict[str, Any], _shown: int) -> Table | None:
    windowed = [g for g in ter["groups"] if "primary_share" in g]
    names = sorted({k for g in windowed for k in g["primary_share"]})
    rows = (
        [g["group"], _num(sum(g["primary_category"].values())), *(_pct(g["primary_share"].get(n, 0.0)) if g["primary_share"] else "—" for n in names)]
        for g in windowed
    )  # fmt: skip
    title = "primary category per step window (one label per entering trajectory with defects)"
    return grid(title, ["window", "with defects", *names], rows) if windowed else None


def excluded_table(e: dict[str, Any], _shown: int) -> Table:
    tokens = ["tokens", "token share"] if "token_share" in e else []
    categories = sorted(set(e["primary_category"]) | set(e.get("token_share", {})) | set(e["char_share"]))
    rows = (
        [name, _num(e["primary_category"].get(name, 0)), *([_num(e["tokens"].get(name, 0)), _pct(e["token_share"].get(name))] if tokens else []),
         _pct(e["char_share"].get(name))]
        for name in categories
    )  # fmt: skip
    title = f"excluded content by category ({e['with_defects']:,} of {e['trajectories']:,} entering trajectories have defects)"
    return grid(title, ["category", "primary (trajs)", *tokens, "char share"], rows)


def lengths_table(lengths: dict[str, Any], _shown: int) -> Table:
    def cell(d: dict[str, Any] | None) -> str:
        return "—" if not d or not d["n"] else f"{d['mean']:,.1f} / {d['median']:,.0f} / {d['p90']:,.0f} / {d['max']:,}"

    rows = ([metric, *(cell(groups.get(name)) for name in LENGTH_GROUPS)] for metric, groups in lengths.items())
    return grid("lengths (mean / median / p90 / max)", ["per trajectory", *LENGTH_GROUPS], rows)


def context_table(c: dict[str, Any], _shown: int) -> Table:
    """`--context`: trajectories by the rule that decided their context, and the turns whose
    render differs from the prompt ids they recorded."""
    rows = [(f"rule {rule}", f"{_num(n)} trajectories, {_num(c['differs_by_rule'][rule])} differ") for rule, n in c["by_rule"].items()]
    rows += [("turns checked against prompt ids", _num(c["turns_checked"])), ("turns whose context differs", _num(c["turns_differ"]))]
    rows.append(("compiled per turn as sent by `relearn masks`", f"{_num(c['as_sent'])} trajectories"))
    rows.append(("trajectories the template cannot render", _num(c["render_errors"]) if c["render_errors"] else None))
    for x in (x for x in c["examples"][:1] if "position" in x):
        hint = f" ({x['hint']})" if "hint" in x else ""
        where = f"first difference ({x['trajectory']}, message {x['message']})"
        rows.append((where, f"token {x['position']}: recorded {x['recorded']!r}, rendered {x['rendered']!r}{hint}"))
    per_turn = ", per turn" if c["per_turn"] else ""
    return kv_table(f"context the model saw (preserve_thinking={c['template_kwargs']['preserve_thinking']}{per_turn})", rows)


# The report's sections in the order they are shown, each drawn from its part of the report.
SECTIONS = (
    ("trajectories", outcomes_table), ("pass_at_k", pass_at_k_table), ("reviews", reviews_table), ("dataset", dataset_table),
    ("ter", ter_table), ("ter", groups_table), ("ter", windows_table), ("excluded", excluded_table), ("lengths", lengths_table),
    ("context", context_table),
)  # fmt: skip


def report_tables(report: dict[str, Any], shown_tasks: int) -> list[Table]:
    """The tables of the report's sections, in order; ``shown_tasks`` rows of per-task pass@k."""
    drawn = [section(report[key], shown_tasks) for key, section in SECTIONS if key in report]
    return [table for table in drawn if table is not None]


def _scope_cell(by_scope: dict[str, Any] | None, unit: str) -> str:
    """A scope's weighted TER and mean per trajectory, or why there is none."""
    if by_scope is None:
        return "— (needs a dataset of `relearn masks`)" if unit == "characters" else "— (dataset compiled before both scopes were counted)"
    return f"{_pct(by_scope['weighted'])} weighted, {_pct(by_scope['mean'])} mean"


def _audit_cell(audit: dict[str, Any] | None) -> str:
    if not audit or not audit.get("applied"):
        return "none applied"
    kept = " (kept: --keep-flagged)" if audit.get("kept") else f", {_num(audit.get('trajectories_left_out'))} successes left out"
    return f"{_num(audit.get('tasks_flagged'))} of {_num(audit.get('tasks_audited'))} tasks flagged{kept}"
