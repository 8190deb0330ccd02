"""``relearn stats``: pool, review and dataset statistics as tables, JSON and PNG plots."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from records.pool_index import PoolIndex, ReviewIndex
from records.pools import write_text_atomic
from relearn.cli.output import EXIT_OK, EXIT_PARTIAL, EXIT_USAGE, err, out, print_error, show_problems, show_warnings
from relearn.ops.masks import MasksOptions
from relearn.ops.outputs import check_json_output, dataset_of_another_pool, empty_pool, reviews_of_another_pool
from relearn.ops.reporting import OpError, check_writable
from relearn.view.catalog import DatasetInfo, UsageError


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{value:.1%}"


def _num(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:,.2f}"
    return f"{value:,}"


def _kv_table(title: str, rows: list[tuple[str, str]]) -> Table:
    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column(justify="right")
    for name, value in rows:
        table.add_row(name, value)
    return table


def tables(report: dict[str, Any], shown_tasks: int) -> list[Table]:
    out_tables: list[Table] = []
    t = report["trajectories"]
    outcomes = ["resolved", *(["suspicious"] if t["by_outcome"].get("suspicious") else []), "unresolved", "not verified"]
    table = Table(title=f"trajectories: {t['total']:,} ({t['unreadable']} unreadable)", title_justify="left")
    table.add_column("exit status", style="bold")
    for name in outcomes:
        table.add_column(name, justify="right")
    table.add_column("total", justify="right")
    for status, counts in sorted(t["outcome_by_exit_status"].items(), key=lambda kv: -sum(kv[1].values())):
        table.add_row(status, *(_num(counts.get(o, 0)) for o in outcomes), _num(sum(counts.values())))
    table.add_row("all", *(_num(t["by_outcome"].get(o, 0)) for o in outcomes), _num(t["total"]), style="italic")
    out_tables.append(table)

    p = report["pass_at_k"]
    table = Table(title=f"pass@k (unbiased) over {len(p['tasks']):,} tasks", title_justify="left")
    table.add_column("task", style="bold")
    table.add_column("attempts", justify="right")
    table.add_column("resolved", justify="right")
    for k in p["k"]:
        table.add_column(f"pass@{k}", justify="right")
    for task, row in list(p["tasks"].items())[:shown_tasks]:
        table.add_row(task, _num(row["attempts"]), _num(row["resolved"]), *(_pct(row.get(f"pass@{k}")) for k in p["k"]))
    if len(p["tasks"]) > shown_tasks:
        table.add_row(f"… {len(p['tasks']) - shown_tasks:,} more tasks (--tasks, --json)", "", "", *("" for _ in p["k"]))
    counted = p["tasks_counted"]
    table.add_row(
        "mean over tasks", "", "", *(f"{_pct(p['mean'].get(f'pass@{k}'))} ({counted[f'pass@{k}']})" for k in p["k"]), style="italic"
    )
    out_tables.append(table)

    if "reviews" in report:
        r = report["reviews"]
        rows = [("reviewed", _num(r["reviewed"])), ("not reviewed", _num(r["not_reviewed"]))]
        rows += [(f"decision: {k}", _num(v)) for k, v in r["decisions"].items()]
        rows += [("accepted / verified positive", f"{r['accepted_of_positive']:,} / {r['positive']:,}")]
        rows += [(f"rejected: {k}", _num(v)) for k, v in r["rejection_reasons"].items()]
        rows += [(f"confirmed errors: {k}", _num(v)) for k, v in r["errors_by_category"].items()]
        if r["unreadable"]:
            rows.append(("unreadable reviews", _num(r["unreadable"])))
        if r["not_in_pools"]:
            rows.append(("reviews of trajectories not in the pools", _num(r["not_in_pools"])))
        out_tables.append(_kv_table(f"reviews: {r['file']}", rows))

    if "dataset" in report:
        d = report["dataset"]
        tokens = d["tokens"] or {}
        rows = [
            ("mode", str(d["mode"])),
            ("trajectories in / out", f"{_num(d['trajectories_in'])} / {_num(d['trajectories_out'])}"),
            ("samples", _num(d["samples"])),
            ("tokens", _num(tokens.get("total"))),
            ("eligible (A)", _num(tokens.get("eligible"))),
            ("excluded (A ∩ E)", _num(tokens.get("excluded"))),
            ("supervised (A \\ E)", _num(tokens.get("supervised"))),
        ]
        rows += [(f"rejected: {k}", _num(v)) for k, v in sorted(d["rejected"].items())]
        rows.append(("image audit", _audit_cell(d.get("audit"))))
        out_tables.append(_kv_table(f"dataset: {d['path']}", rows))

    ter = report["ter"]
    dist = ter["per_trajectory"]
    rows = [
        (f"{ter['unit']}-weighted TER", _pct(ter["weighted"])),
        ("trajectories with a TER", _num(dist["n"])),
    ]
    if dist["n"]:
        rows += [(f"per trajectory: {k}", _pct(dist[k])) for k in ("mean", "median", "p90", "max")]
        rows.append(("trajectories with nothing excluded", _pct(ter["zero_share"])))
    for scope, by_scope in ter["by_scope"].items():
        trained = " (trained)" if scope == ter["trained_scope"] else ""
        rows.append((f"TER, {scope} scope{trained}", _scope_cell(by_scope, ter["unit"])))
    note = "" if ter["source"] == "tokens" else " (estimated in characters: give --dataset for tokens)"
    out_tables.append(_kv_table(f"TER{note}", rows))

    table = Table(title=f"outcomes and TER ({ter['unit']}) by {ter['by']}", title_justify="left")
    for name, justify in (
        ("group", "left"),
        ("n", "right"),
        ("resolved", "right"),
        ("accepted", "right"),
        ("with TER", "right"),
        ("TER weighted", "right"),
        ("TER mean", "right"),
    ):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for g in ter["groups"]:
        table.add_row(
            g["group"],
            _num(g["trajectories"]),
            _pct(g["resolved_rate"]),
            _num(g["accepted"]),
            _num(g["with_ter"]),
            _pct(g["ter_token_weighted"]),
            _pct(g["ter_mean"]),
        )
    out_tables.append(table)
    windowed = [g for g in ter["groups"] if "primary_share" in g]
    if windowed:
        names = sorted({k for g in windowed for k in g["primary_share"]})
        table = Table(title="primary category per step window (one label per entering trajectory with defects)", title_justify="left")
        table.add_column("window", style="bold")
        table.add_column("with defects", justify="right")
        for name in names:
            table.add_column(name, justify="right")
        for g in windowed:
            table.add_row(
                g["group"],
                _num(sum(g["primary_category"].values())),
                *(_pct(g["primary_share"].get(n, 0.0)) if g["primary_share"] else "—" for n in names),
            )
        out_tables.append(table)

    e = report["excluded"]
    categories = sorted(set(e["primary_category"]) | set(e.get("token_share", {})) | set(e["char_share"]))
    table = Table(
        title=f"excluded content by category ({e['with_defects']:,} of {e['trajectories']:,} entering trajectories have defects)",
        title_justify="left",
    )
    table.add_column("category", style="bold")
    table.add_column("primary (trajs)", justify="right")
    if "token_share" in e:
        table.add_column("tokens", justify="right")
        table.add_column("token share", justify="right")
    table.add_column("char share", justify="right")
    for name in categories:
        cells = [_num(e["primary_category"].get(name, 0))]
        if "token_share" in e:
            cells += [_num(e["tokens"].get(name, 0)), _pct(e["token_share"].get(name))]
        cells.append(_pct(e["char_share"].get(name)))
        table.add_row(name, *cells)
    out_tables.append(table)

    table = Table(title="lengths (mean / median / p90 / max)", title_justify="left")
    table.add_column("per trajectory", style="bold")
    for name in ("all", "resolved", "unresolved"):
        table.add_column(name, justify="right")
    for metric, groups in report["lengths"].items():
        cells = []
        for name in ("all", "resolved", "unresolved"):
            d = groups.get(name)
            cells.append("—" if not d or not d["n"] else f"{d['mean']:,.1f} / {d['median']:,.0f} / {d['p90']:,.0f} / {d['max']:,}")
        table.add_row(metric, *cells)
    out_tables.append(table)
    if "context" in report:
        out_tables.append(_context_table(report["context"]))
    return out_tables


def _context_table(context: dict[str, Any]) -> Table:
    """`--context`: trajectories by the rule that decided their context, and the turns whose
    render differs from the prompt ids they recorded."""
    rows = [
        (f"rule {rule}", f"{_num(n)} trajectories, {_num(context['differs_by_rule'][rule])} differ")
        for rule, n in context["by_rule"].items()
    ]
    rows.append(("turns checked against prompt ids", _num(context["turns_checked"])))
    rows.append(("turns whose context differs", _num(context["turns_differ"])))
    rows.append(("compiled per turn as sent by `relearn masks`", f"{_num(context['as_sent'])} trajectories"))
    if context["render_errors"]:
        rows.append(("trajectories the template cannot render", _num(context["render_errors"])))
    for example in context["examples"][:1]:
        if "position" in example:
            rows.append(
                (
                    f"first difference ({example['trajectory']}, message {example['message']})",
                    f"token {example['position']}: recorded {example['recorded']!r}, rendered {example['rendered']!r}"
                    + (f" ({example['hint']})" if "hint" in example else ""),
                )
            )
    per_turn = ", per turn" if context["per_turn"] else ""
    return _kv_table(f"context the model saw (preserve_thinking={context['template_kwargs']['preserve_thinking']}{per_turn})", rows)


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


def stats_command(
    pools: Annotated[list[Path], typer.Argument(metavar="POOL", help="Pools of trajectories (.jsonl or .jsonl.zst).")],
    reviews: Annotated[Path | None, typer.Option("--reviews", "-r", help="Reviews JSONL: decisions, reasons, defect categories.")] = None,
    dataset: Annotated[
        Path | None, typer.Option("--dataset", "-d", help="Dataset folder written by `relearn masks` (TER in tokens).")
    ] = None,
    k: Annotated[str, typer.Option("--k", help="pass@k for these k (comma list); a task counts for k when it has k attempts.")] = "1,5,10",
    by: Annotated[
        str, typer.Option(help="Group TER and outcomes by step (training-step windows), checkpoint, policy, task, exit or none.")
    ] = "step",
    windows: Annotated[
        int, typer.Option(min=1, help="With --by step: this many equal windows over the steps seen (2 = early vs late).")
    ] = 2,
    window_size: Annotated[int | None, typer.Option(min=1, help="With --by step: fixed windows of this many steps instead.")] = None,
    by_step_window: Annotated[
        str | None,
        typer.Option(
            "--by-step-window",
            help="Group by these step windows (FIRST-LAST, comma-separated, e.g. 1-20,81-100: the paper's early vs late), pooled and token-weighted, with each window's primary-category shares; implies --by step.",
        ),
    ] = None,
    json_out: Annotated[
        str | None, typer.Option("--json", help="Write every statistic as JSON to this file (`-`: stdout, no tables).")
    ] = None,
    plots: Annotated[
        Path | None,
        typer.Option(
            help="Write ter_over_steps.png and category_shares.png (and, with --by-step-window, primary_by_window.png) into this folder."
        ),
    ] = None,
    tasks: Annotated[int, typer.Option(min=0, help="Per-task pass@k rows shown in the table (all are in --json).")] = 20,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Do not read or write the saved indexes (.FILE.view-index.jsonl).")] = False,
    context: Annotated[
        bool,
        typer.Option(
            "--context",
            help="Check the context each turn is trained under against what the model saw: where a call recorded its prompt ids, the template's render of the history is tokenised and compared with them (turns that differ, and where); elsewhere the trajectory's protocol decides and the rule is counted. Reads every record once more.",
        ),
    ] = False,
    tokenizer: Annotated[
        str,
        typer.Option(
            help="With --context: the tokenizer and chat template of the masks (built-in qwen3.6, qwen3 for pools sampled from Qwen3, or a Hugging Face folder)."
        ),
    ] = MasksOptions.tokenizer,
    preserve_thinking: Annotated[
        bool, typer.Option(help="With --context: render as `relearn masks` does with this preserve_thinking.")
    ] = MasksOptions.preserve_thinking,
    per_turn: Annotated[
        bool, typer.Option("--per-turn", help="With --context: render one sample per turn, as `relearn masks --per-turn` does.")
    ] = MasksOptions.per_turn,
) -> None:
    """Statistics of pools, reviews and datasets: outcomes and exit statuses, per-task pass@k, acceptance and rejection reasons, TER per trajectory and weighted by group, excluded content by category, lengths.

    Tables in the terminal; --json for every figure; --plots for PNGs (TER over training steps,
    category shares). TER is in tokens with --dataset (from `relearn masks`' stats.json), else
    estimated in characters and labelled so. Records are indexed once and the index is saved
    beside each file, so a rerun over a 100k pool reads no record. --context checks the context
    each turn is trained under against the prompt ids its call recorded, or names the protocol
    rule that decides it. Exit 1 when some records are unreadable (listed with file, line and
    field).
    """
    from relearn.stats.compute import GROUP_KEYS, compute, parse_step_windows
    from relearn.stats.plots import write_plots

    try:
        ks = tuple(sorted({int(x) for x in k.split(",") if x.strip()}))
        if not ks or min(ks) < 1:
            raise ValueError
    except ValueError:
        print_error(f"--k takes positive integers separated by commas, not {k!r}")
        raise typer.Exit(EXIT_USAGE) from None
    explicit = None
    if by_step_window is not None:
        try:
            explicit = parse_step_windows(by_step_window)
        except ValueError as exc:
            print_error(f"--by-step-window: {exc}")
            raise typer.Exit(EXIT_USAGE) from None
        by = "step"
    if by not in GROUP_KEYS:
        print_error(f"--by must be one of {', '.join(GROUP_KEYS)}")
        raise typer.Exit(EXIT_USAGE)
    missing = [str(p) for p in [*pools, *([reviews] if reviews else [])] if not p.is_file()]
    if missing:
        print_error(f"no such file: {', '.join(missing)}")
        raise typer.Exit(EXIT_USAGE)
    try:
        info = DatasetInfo.load(dataset) if dataset is not None else None
        if json_out and json_out != "-":
            check_json_output(Path(json_out), STATS_KEYS, "a statistics file of `relearn stats`", flag="--json")
            check_writable(Path(json_out), "--json")
        if plots is not None:
            check_writable(plots, "--plots")
        if plots is not None and plots.exists() and not plots.is_dir():
            raise OpError(f"--plots {plots}: is a file, not a folder; give a new or existing folder")
    except (UsageError, OpError) as exc:
        print_error(str(exc))
        raise typer.Exit(EXIT_USAGE) from None

    indexes = [PoolIndex(p, cache=not no_cache) for p in pools]
    review_index = ReviewIndex(reviews, cache=not no_cache) if reviews is not None else None
    progress = Progress(
        SpinnerColumn(),
        TextColumn("[bold]indexing {task.description}"),
        TextColumn("{task.completed:,} records"),
        TimeElapsedColumn(),
        console=err,
        transient=True,
        disable=not err.is_terminal,  # (rich would leave an empty line on a pipe)
    )
    with progress:
        for index in [*indexes, *([review_index] if review_index is not None else [])]:
            bar = progress.add_task(index.path.name, total=None)
            index.start()
            while not index.ready.wait(0.1):
                progress.update(bar, completed=len(index))
            index.join()
    report = compute(indexes, review_index, info, ks=ks, by=by, windows=windows, window_size=window_size, step_windows_given=explicit)
    if context:
        from relearn.masks.tokenizers import load_tokenizer  # transformers is slow to import; only here
        from relearn.stats.compute import context_section

        try:
            loaded = load_tokenizer(tokenizer)
        except (ValueError, OSError) as exc:
            print_error(f"--tokenizer {tokenizer}: {exc}")
            raise typer.Exit(EXIT_USAGE) from None
        report["context"] = context_section(pools, loaded, {"preserve_thinking": preserve_thinking}, per_turn)
    problems = [str(e) for i in indexes for e in i.errors] + ([str(e) for e in review_index.errors] if review_index is not None else [])
    show_problems("unreadable records", problems)
    warnings = nothing_matched(report, pools, indexes, info)
    if json_out == "-":
        sys.stdout.write(json.dumps(report, indent=1) + "\n")
    else:
        for table in tables(report, tasks):
            out.print(table)
        if json_out:
            write_text_atomic(Path(json_out), json.dumps(report, indent=1))
            out.print(f"statistics: {json_out}", highlight=False)
    if plots is not None:
        written = write_plots(report, plots)
        (err if json_out == "-" else out).print(
            "plots: " + (", ".join(str(p) for p in written) if written else "none (no TER with a training step, nothing excluded)"),
            highlight=False,
        )
    warned = show_warnings(warnings)
    raise typer.Exit(EXIT_PARTIAL if problems or warned else EXIT_OK)


# The keys of the report `--json` writes: an existing file without them is not replaced.
STATS_KEYS = frozenset({"pools", "trajectories", "pass_at_k"})


def nothing_matched(report: dict[str, Any], pools: list[Path], indexes: list[PoolIndex], dataset: DatasetInfo | None) -> list[str]:
    """The statistics of nothing: an empty pool, reviews or a dataset of another pool."""
    warnings = [empty_pool(path) for path, index in zip(pools, indexes, strict=True) if not len(index) and not index.errors]
    if not report["trajectories"]["total"]:
        return warnings
    named = pools[0] if len(pools) == 1 else "the pools"
    reviews = report.get("reviews")
    if reviews and not reviews["reviewed"] and reviews["not_in_pools"]:
        warnings.append(reviews_of_another_pool(Path(reviews["file"]), named, reviews["not_in_pools"]))
    data = report.get("dataset")
    if data and dataset is not None and dataset.by_trajectory and data["not_in_pools"] == len(dataset.by_trajectory):
        warnings.append(dataset_of_another_pool(Path(data["path"]), named, len(dataset.by_trajectory)))
    return warnings


def register(app: typer.Typer) -> None:
    app.command("stats")(stats_command)
