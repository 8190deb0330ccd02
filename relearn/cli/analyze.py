"""``relearn analyze nll`` and ``relearn analyze passk``: the paper's section 2 analyses.

Compatibility (nll): how likely a model finds each pool's own assistant tokens.
Complementarity (passk): which problems each pool solves, and how often.
Both take several pools by name (``--pool historical=a.jsonl --pool current=b.jsonl``) and
write a JSON, a Markdown table and a PNG into ``--out``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from relearn.analyze.pools import NamedPool, PoolSpecError, parse_pools
from relearn.cli.cluster import RayArg, show_nodes
from relearn.cli.output import EXIT_OK, EXIT_PARTIAL, EXIT_USAGE, err, out, print_error, run_op, show_problems
from relearn.ops.analyze import NllOptions, PasskOptions, run_nll, run_passk
from relearn.ops.reporting import SILENT, OpError, RichReporter

analyze_app = typer.Typer(
    name="analyze",
    help="Compare pools of trajectories: compatibility with a model (nll) and complementarity of what they solve (passk).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

POOL_HELP = "A pool as NAME=PATH (.jsonl or .jsonl.zst); repeat for several, e.g. --pool historical=a.jsonl --pool current=b.jsonl. The first is the baseline."
PoolsOption = Annotated[list[str] | None, typer.Option("--pool", "-p", metavar="NAME=PATH", help=POOL_HELP)]
LimitOption = Annotated[int | None, typer.Option(min=1, help="Read at most the first N records of each pool.")]


def _pools(specs: list[str] | None) -> list[NamedPool]:
    try:
        return parse_pools(specs or [])
    except PoolSpecError as exc:
        print_error(str(exc))
        raise typer.Exit(EXIT_USAGE) from None


@analyze_app.command("nll")
def nll_command(
    out_dir: Annotated[
        Path, typer.Option("--out", "-o", help="Folder for nll.json, nll.md, nll.png and the score cache nll-scores.jsonl.")
    ],
    pools: PoolsOption = None,
    reviews: Annotated[
        Path | None,
        typer.Option(
            "--reviews",
            "-r",
            help="reviews.jsonl (relearn review): also split each pool's eligible tokens into kept (A \\ E) and excluded (E, by category) as `relearn masks --mode ross` does; the latest review line of a trajectory is used.",
        ),
    ] = NllOptions.reviews,
    defect_scope: Annotated[
        str,
        typer.Option(
            help="With --reviews: action (a defect in a tool call excludes the whole call, as `relearn masks` does by default) | minimal (only the quoted text)."
        ),
    ] = NllOptions.defect_scope,
    context: Annotated[
        str,
        typer.Option(
            help="as-sent: a trajectory whose render departs from what the model saw (its recorded prompt ids disagree, or the harness never sent reasoning back) is scored one turn at a time under the context it was sent, as `relearn masks` compiles it | render: every turn under the template's render of the history."
        ),
    ] = NllOptions.context,
    model: Annotated[
        str | None, typer.Option(help="Model folder: any Hugging Face causal LM (the current policy, say).")
    ] = NllOptions.model,
    tiny: Annotated[
        str | None, typer.Option(help="Tiny random model instead of --model: qwen3 | qwen3-moe | qwen3.5-moe (tests).")
    ] = NllOptions.tiny,
    seed: Annotated[int, typer.Option(help="Seed of a --tiny model's init.")] = NllOptions.seed,
    tokenizer: Annotated[
        str | None,
        typer.Option(help="`qwen3.6` (built in, offline) or a tokenizer folder (default: the --model folder's; qwen3.6 with --tiny)."),
    ] = NllOptions.tokenizer,
    ctx: Annotated[
        int, typer.Option(min=2, help="Longest trajectory in tokens; longer ones are skipped and counted, never cut.")
    ] = NllOptions.ctx,
    limit: LimitOption = NllOptions.limit,
    positive_only: Annotated[
        bool, typer.Option("--positive-only", help="Score only verified-positive trajectories (what SFT would train on).")
    ] = NllOptions.positive_only,
    device: Annotated[str, typer.Option(help="cpu | cuda | cuda:N.")] = NllOptions.device,
    bf16: Annotated[bool, typer.Option("--bf16", help="Run the model in bf16 (the softmax stays fp32).")] = NllOptions.bf16,
    attn: Annotated[str, typer.Option(help="Attention implementation: sdpa | flash_attention_2 | eager.")] = NllOptions.attn,
    chunk: Annotated[
        int, typer.Option(min=1, help="Eligible positions per LM-head chunk (memory ~ chunk x vocab x 4 bytes).")
    ] = NllOptions.chunk,
    preserve_thinking: Annotated[
        bool, typer.Option(help="Keep reasoning on every turn (Qwen3.6's preserve_thinking), as `relearn masks` does.")
    ] = NllOptions.preserve_thinking,
    bootstrap: Annotated[int, typer.Option(min=100, help="Bootstrap resamples for the 95% intervals.")] = NllOptions.bootstrap,
    progress: Annotated[bool, typer.Option(help="Show the progress bar.")] = True,
    workers: Annotated[
        int,
        typer.Option(
            min=1,
            help="Worker processes scoring on CPU at once (each loads the model once; batches of trajectories are their work units). 1: score here.",
        ),
    ] = NllOptions.workers,
    ray: RayArg = NllOptions.ray,
    batch: Annotated[
        int,
        typer.Option(
            min=1,
            help="With --workers or --ray: trajectories per work unit (larger: less overhead per unit; smaller: spread over more workers).",
        ),
    ] = NllOptions.batch,
) -> None:
    """Compatibility: token-level NLL of each pool's eligible tokens under one model.

    Each trajectory is rendered over the chat template and scored on its eligible tokens A (generated assistant turns, as `relearn masks` finds them; defects are not removed), everything else staying as context. Per pool: NLL per token (token-weighted, 95% bootstrap CI), perplexity, the distribution of per-trajectory means (mean with CI, median, p10-p90) and the difference from the first pool. Lower means more compatible: historical rollouts of the same policy line, current-policy rollouts and an external teacher's can be compared side by side. Scores are cached in --out; a rerun is free.

    With --reviews, each trajectory's eligible tokens are also split by the ROSS mask its latest review gives: kept (A \\ E, what ROSS trains on) and excluded (E), with the NLL of each, of each defect category's excluded tokens and of the excluded - kept gap (95% bootstrap over trajectories). A trajectory the review rejects, or that the mask compiler refuses, is scored but not split, and counted by reason; one whose latest review line is unreadable is listed too (never split by an earlier review). A changed review is split again; everything else comes from the cache.

    With --workers N (CPU) or --ray ADDRESS, batches of trajectories are scored by worker processes or on a Ray cluster's nodes (--device cuda: each unit asks Ray for a GPU, and this machine needs none); each worker process loads the model once. Only this process writes the score cache and the results, which equal a run here.
    """
    options = NllOptions(
        pools=_pools(pools), out=out_dir, model=model, tiny=tiny, seed=seed, tokenizer=tokenizer, reviews=reviews, defect_scope=defect_scope, context=context,
        ctx=ctx, limit=limit, positive_only=positive_only, device=device, bf16=bf16, attn=attn, chunk=chunk,
        preserve_thinking=preserve_thinking, bootstrap=bootstrap, workers=workers, ray=ray, batch=batch,
    )  # fmt: skip
    try:
        summary = run_nll(options, RichReporter(err) if progress else SILENT)
    except OpError as exc:
        print_error(str(exc))
        raise typer.Exit(EXIT_USAGE) from None
    except RuntimeError as exc:  # a batch a worker could not score
        print_error(str(exc))
        raise typer.Exit(EXIT_PARTIAL) from None
    show_nodes(summary.per_node, "NLL batches")
    show_problems("rejected", summary.rejected)
    show_problems("unreadable reviews", summary.review_problems)
    out.print(_nll_table(summary.result))
    if reviews is not None:
        out.print(_split_table(summary.result))
    out.print(f"written: {out_dir / 'nll.md'}, {out_dir / 'nll.json'}, {out_dir / 'nll.png'}")
    raise typer.Exit(EXIT_PARTIAL if summary.partial else EXIT_OK)


def _nll_table(result: dict[str, Any]) -> Table:
    table = Table(title=f"relearn analyze nll ({result['settings']['model']}): NLL per eligible token, nats")
    for column in (
        "pool",
        "scored",
        "skipped",
        "rejected",
        "eligible tokens",
        "NLL/token [95% CI]",
        "traj. mean",
        "median",
        "p10-p90",
        "Δ vs first [95% CI]",
    ):
        table.add_column(column, justify="left" if column == "pool" else "right")
    for r in result["pools"]:
        skipped = str(sum(r["skipped"].values()))
        if not r["scored"]:
            table.add_row(r["name"], "0", skipped, str(r["rejected"]), *["-"] * 6)
            continue
        lo, hi = r["nll_per_token_ci95"]
        diff = "-"
        if "diff_vs_first" in r:
            dlo, dhi = r["diff_vs_first_ci95"]
            diff = f"{r['diff_vs_first']:+.3f} [{dlo:+.3f}, {dhi:+.3f}]"
        table.add_row(
            r["name"], str(r["scored"]), skipped, str(r["rejected"]), f"{r['eligible_tokens']:,}", f"{r['nll_per_token']:.3f} [{lo:.3f}, {hi:.3f}]",
            f"{r['trajectory_mean']:.3f}", f"{r['median']:.3f}", f"{r['p10']:.3f}-{r['p90']:.3f}", diff,
        )  # fmt: skip
    return table


def _split_table(result: dict[str, Any]) -> Table:
    from relearn.analyze.split import fmt_ci, not_split_text

    table = Table(title="kept (A \\ E) vs excluded (E) eligible tokens: NLL per token, nats [95% CI]")
    for column in ("pool", "split", "not split", "kept tokens", "kept NLL", "excluded tokens", "excluded NLL", "excluded - kept"):
        table.add_column(column, justify="left" if column in ("pool", "not split") else "right")
    for r in result["pools"]:
        s = r["split"]
        if not s["trajectories"]:
            table.add_row(r["name"], "0", not_split_text(s["not_split"]), *["-"] * 5)
            continue
        k, e, g = s["kept"], s["excluded"], s["gap"]
        table.add_row(
            r["name"], str(s["trajectories"]), not_split_text(s["not_split"]), f"{k['tokens']:,}", fmt_ci(k["nll"], k["ci95"]),
            f"{e['tokens']:,}", fmt_ci(e["nll"], e["ci95"]), fmt_ci(g["nll"], g["ci95"], sign=True),
        )  # fmt: skip
        for category, c in s["categories"].items():
            table.add_row(f"  {category}", "", "", "", "", f"{c['tokens']:,}", fmt_ci(c["nll"], c["ci95"]), "")
    return table


@analyze_app.command("passk")
def passk_command(
    out_dir: Annotated[Path, typer.Option("--out", "-o", help="Folder for passk.json, passk.md and passk.png.")],
    pools: PoolsOption = None,
    max_k: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Largest k of the curves (default: the fewest attempts any problem of the pool has, so every point averages the same problems).",
        ),
    ] = PasskOptions.max_k,
    limit: LimitOption = PasskOptions.limit,
) -> None:
    """Complementarity: per-problem success rates, unbiased pass@k curves, problems solved by one pool only.

    Success is the verifier's (resolved, or a positive reward); trajectories without a verifier result or a task_id are rejected and listed, never counted as failures. Over the problems all pools attempted: problems solved only by each pool, and by any; for each pair of pools, problems solved by both, only one, or neither.
    """
    summary = run_op(run_passk, PasskOptions(_pools(pools), out_dir, max_k=max_k, limit=limit))
    show_problems("rejected", summary.rejected)
    for table in _passk_tables(summary.result):
        out.print(table)
    out.print(f"written: {out_dir / 'passk.md'}, {out_dir / 'passk.json'}, {out_dir / 'passk.png'}")
    raise typer.Exit(EXIT_PARTIAL if summary.partial else EXIT_OK)


SHOWN_PER_PROBLEM = 40


def _passk_tables(result: dict[str, Any]) -> list[Table]:
    summary = Table(
        title=f"relearn analyze passk ({result['common_problems']} problems in all pools, {result['solved_by_any_common']} solved by any)"
    )
    for column in ("pool", "problems", "attempts (min-max)", "success rate", "pass@K (K)", "solved", "solved only here (common)"):
        summary.add_column(column, justify="left" if column == "pool" else "right")
    for p in result["pools"]:
        last = p["curve"][-1] if p["curve"] else {"k": 0, "pass": 0.0}
        summary.add_row(
            p["name"], str(p["problems"]), f"{p['attempts']} ({p['attempts_min']}-{p['attempts_max']})", f"{p['success_rate']:.1%}",
            f"{last['pass']:.1%} ({last['k']})", str(p["solved"]), str(p["solved_only_here"]),
        )  # fmt: skip
    tables = [summary]
    if result["pairs"]:
        pairs = Table(title="solved by (problems both pools attempted)")
        for column in ("A", "B", "problems", "both", "only A", "only B", "neither"):
            pairs.add_column(column, justify="left" if column in ("A", "B") else "right")
        for q in result["pairs"]:
            pairs.add_row(q["a"], q["b"], str(q["problems"]), str(q["both"]), str(q["only_a"]), str(q["only_b"]), str(q["neither"]))
        tables.append(pairs)
    problems = result["problems"]
    if len(problems) <= SHOWN_PER_PROBLEM:
        names = [p["name"] for p in result["pools"]]
        per = Table(title="per problem: resolved / attempts")
        per.add_column("problem")
        for name in names:
            per.add_column(name, justify="right")
        for task, row in problems.items():
            per.add_row(task, *[f"{row[n]['resolved']}/{row[n]['attempts']}" if n in row else "-" for n in names])
        tables.append(per)
    return tables


def register(app: typer.Typer) -> None:
    app.add_typer(analyze_app, name="analyze")
