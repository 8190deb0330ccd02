"""``relearn analyze nll`` and ``relearn analyze passk``: the paper's section 2 analyses.

Compatibility (nll): how likely a model finds each pool's own assistant tokens.
Complementarity (passk): which problems each pool solves, and how often.
Both take several pools by name (``--pool historical=a.jsonl --pool current=b.jsonl``) and
write a JSON, a Markdown table and a PNG into ``--out``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from records.pools import count_records, write_text_atomic
from relearn.analyze.pools import NamedPool, PoolSpecError, parse_pools
from relearn.cli.cluster import NodesColumn, RayArg, ray_backend, show_nodes
from relearn.cli.output import EXIT_OK, EXIT_PARTIAL, EXIT_USAGE, err, out, show_problems

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


class UsageError(Exception):
    """Nothing can be done as asked (exit 2)."""


def _pools(specs: list[str] | None) -> list[NamedPool]:
    try:
        return parse_pools(specs or [])
    except PoolSpecError as exc:
        err.print(f"[red]error:[/red] {exc}", highlight=False)
        raise typer.Exit(EXIT_USAGE) from None


def _progress(label: str, show: bool = True, nodes: NodesColumn | None = None) -> Progress:
    columns = [TextColumn(f"[bold]{label}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), *([nodes] if nodes else [])]
    return Progress(*columns, console=err, transient=True, disable=not show)


def _check_device(device: str) -> None:
    if device == "cpu":
        return
    if not device.startswith("cuda"):
        raise UsageError(f"--device must be cpu or cuda[:N], not {device!r}")
    import torch

    if not torch.cuda.is_available():
        raise UsageError(f"--device {device}: no CUDA device is available here")


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
    ] = None,
    defect_scope: Annotated[
        str,
        typer.Option(
            help="With --reviews: action (a defect in a tool call excludes the whole call, as `relearn masks` does by default) | minimal (only the quoted text)."
        ),
    ] = "action",
    model: Annotated[str | None, typer.Option(help="Model folder: any Hugging Face causal LM (the current policy, say).")] = None,
    tiny: Annotated[str | None, typer.Option(help="Tiny random model instead of --model: qwen3 | qwen3-moe | qwen3.5-moe (tests).")] = None,
    seed: Annotated[int, typer.Option(help="Seed of a --tiny model's init.")] = 0,
    tokenizer: Annotated[
        str | None,
        typer.Option(help="`qwen3.6` (built in, offline) or a tokenizer folder (default: the --model folder's; qwen3.6 with --tiny)."),
    ] = None,
    ctx: Annotated[int, typer.Option(min=2, help="Longest trajectory in tokens; longer ones are skipped and counted, never cut.")] = 65536,
    limit: LimitOption = None,
    positive_only: Annotated[
        bool, typer.Option("--positive-only", help="Score only verified-positive trajectories (what SFT would train on).")
    ] = False,
    device: Annotated[str, typer.Option(help="cpu | cuda | cuda:N.")] = "cpu",
    bf16: Annotated[bool, typer.Option("--bf16", help="Run the model in bf16 (the softmax stays fp32).")] = False,
    attn: Annotated[str, typer.Option(help="Attention implementation: sdpa | flash_attention_2 | eager.")] = "sdpa",
    chunk: Annotated[int, typer.Option(min=1, help="Eligible positions per LM-head chunk (memory ~ chunk x vocab x 4 bytes).")] = 1024,
    preserve_thinking: Annotated[
        bool, typer.Option(help="Keep reasoning on every turn (Qwen3.6's preserve_thinking), as `relearn masks` does.")
    ] = True,
    bootstrap: Annotated[int, typer.Option(min=100, help="Bootstrap resamples for the 95% intervals.")] = 10_000,
    progress: Annotated[bool, typer.Option(help="Show the progress bar.")] = True,
    workers: Annotated[
        int,
        typer.Option(
            min=1,
            help="Worker processes scoring on CPU at once (each loads the model once; batches of trajectories are their work units). 1: score here.",
        ),
    ] = 1,
    ray: RayArg = None,
    batch: Annotated[
        int,
        typer.Option(
            min=1,
            help="With --workers or --ray: trajectories per work unit (larger: less overhead per unit; smaller: spread over more workers).",
        ),
    ] = 8,
) -> None:
    """Compatibility: token-level NLL of each pool's eligible tokens under one model.

    Each trajectory is rendered over the chat template and scored on its eligible tokens A
    (generated assistant turns, as `relearn masks` finds them; defects are not removed),
    everything else staying as context. Per pool: NLL per token (token-weighted, 95%
    bootstrap CI), perplexity, the distribution of per-trajectory means (mean with CI,
    median, p10-p90) and the difference from the first pool. Lower means more compatible:
    historical rollouts of the same policy line, current-policy rollouts and an external
    teacher's can be compared side by side. Scores are cached in --out; a rerun is free.

    With --reviews, each trajectory's eligible tokens are also split by the ROSS mask its
    latest review gives: kept (A \\ E, what ROSS trains on) and excluded (E), with the NLL
    of each, of each defect category's excluded tokens and of the excluded - kept gap
    (95% bootstrap over trajectories). A trajectory the review rejects, or that the mask
    compiler refuses, is scored but not split, and counted by reason; one whose latest
    review line is unreadable is listed too (never split by an earlier review). A changed
    review is split again; everything else comes from the cache.

    With --workers N (CPU) or --ray ADDRESS, batches of trajectories are scored by worker
    processes or on a Ray cluster's nodes (--device cuda: each unit asks Ray for a GPU, and
    this machine needs none); each worker process loads the model once. Only this process
    writes the score cache and the results, which equal a run here.
    """
    from envs.executor import LocalBackend, Needs
    from relearn.analyze.nll import ModelLoadError, ModelSpec, Settings, folder_fingerprint, score_pools
    from relearn.analyze.nll_report import analyze, markdown
    from relearn.analyze.plots import nll_chart

    named = _pools(pools)
    review_problems: list[str] = []
    latest = None
    if reviews is not None:
        from relearn.masks.shards import load_reviews

        if not reviews.is_file():
            err.print(f"[red]error:[/red] --reviews {reviews}: no such file", highlight=False)
            raise typer.Exit(EXIT_USAGE)
        latest = load_reviews(reviews, review_problems)
    if (model is None) == (tiny is None):
        err.print("[red]error:[/red] give exactly one of --model FOLDER or --tiny NAME")
        raise typer.Exit(EXIT_USAGE)
    if model is not None and not Path(model).is_dir():
        err.print(f"[red]error:[/red] --model {model}: no such folder")
        raise typer.Exit(EXIT_USAGE)
    tokenizer_name = tokenizer or model or "qwen3.6"
    try:
        if workers > 1 and device != "cpu":
            raise UsageError("--workers runs CPU processes: score on GPUs with --ray")
        if ray is None or not device.startswith("cuda"):  # on a cluster, the nodes' GPUs count, not this machine's
            _check_device(device)
        if defect_scope not in ("action", "minimal"):
            raise UsageError(f"--defect-scope must be action or minimal, not {defect_scope!r}")
    except UsageError as exc:
        err.print(f"[red]error:[/red] {exc}", highlight=False)
        raise typer.Exit(EXIT_USAGE) from None
    settings = Settings(
        model=f"tiny:{tiny}:seed={seed}" if tiny else str(Path(str(model)).resolve()),
        tokenizer=tokenizer_name if tokenizer_name == "qwen3.6" else str(Path(tokenizer_name).resolve()),
        dtype="bfloat16" if bf16 else "float32",
        template_kwargs={"preserve_thinking": preserve_thinking},
        fingerprint=folder_fingerprint(*([model] if model else []), tokenizer_name),
        defect_scope=defect_scope,
    )
    # A Ray unit sees the GPU Ray gave it as cuda (cuda:0), whatever index was named here.
    load = ModelSpec(
        model, tiny, seed, tokenizer_name, attn, bf16, "cuda" if ray is not None and device.startswith("cuda") else device, chunk
    )
    total = sum(count_records(p.path, limit) for p in named)
    nodes = NodesColumn()
    bar_view = _progress("scoring NLL", progress, nodes)
    backend = ray_backend(ray, Needs(gpus=1) if device.startswith("cuda") else Needs(cpus=1), nodes)
    if backend is None and workers > 1:
        backend = LocalBackend(workers, processes=True, threads_per_process=max(1, (os.cpu_count() or 1) // workers))
    try:
        with bar_view:
            bar = bar_view.add_task("nll", total=total)
            results = score_pools(
                named, settings, load, out_dir, ctx=ctx, limit=limit, positive_only=positive_only, reviews=latest, on_record=lambda: bar_view.advance(bar), backend=backend, batch=batch
            )  # fmt: skip
    except ModelLoadError as exc:
        err.print(f"[red]error:[/red] {exc}", highlight=False)
        raise typer.Exit(EXIT_USAGE) from None
    except RuntimeError as exc:  # a batch a worker could not score
        err.print(f"[red]error:[/red] {exc}", highlight=False)
        raise typer.Exit(EXIT_PARTIAL) from None
    finally:
        if backend is not None:
            backend.close()
    show_nodes(nodes.per_node(), "NLL batches")
    rejected = [str(e) for r in results for e in r.rejected]
    show_problems("rejected", rejected)
    review_problems += [problem for r in results for problem in r.review_errors]
    show_problems("unreadable reviews", review_problems)
    if not any(r.scores for r in results):
        skipped = {reason: n for r in results for reason, n in r.skipped.items()}
        err.print(
            f"[red]error:[/red] no trajectory could be scored (skipped: {skipped or 'none'}, rejected: {len(rejected)})", highlight=False
        )
        raise typer.Exit(EXIT_USAGE)
    result = analyze(results, settings, ctx, samples=bootstrap)
    write_text_atomic(out_dir / "nll.json", json.dumps(result, indent=1))
    write_text_atomic(out_dir / "nll.md", markdown(result))
    nll_chart(result, out_dir / "nll.png")
    out.print(_nll_table(result))
    if latest is not None:
        out.print(_split_table(result))
    out.print(f"written: {out_dir / 'nll.md'}, {out_dir / 'nll.json'}, {out_dir / 'nll.png'}")
    raise typer.Exit(EXIT_PARTIAL if rejected or review_problems else EXIT_OK)


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
    ] = None,
    limit: LimitOption = None,
) -> None:
    """Complementarity: per-problem success rates, unbiased pass@k curves, problems solved by one pool only.

    Success is the verifier's (resolved, or a positive reward); trajectories without a
    verifier result or a task_id are rejected and listed, never counted as failures. Over
    the problems all pools attempted: problems solved only by each pool, and by any; for
    each pair of pools, problems solved by both, only one, or neither.
    """
    from relearn.analyze.passk import analyze, markdown, read_outcomes
    from relearn.analyze.plots import passk_chart

    named = _pools(pools)
    bar_view = _progress("reading pools")
    with bar_view:
        bar = bar_view.add_task("passk", total=sum(count_records(p.path, limit) for p in named))
        outcomes = [read_outcomes(p, limit, on_record=lambda: bar_view.advance(bar)) for p in named]
    rejected = [str(e) for o in outcomes for e in o.rejected]
    show_problems("rejected", rejected)
    if not any(o.table for o in outcomes):
        err.print(f"[red]error:[/red] no verified trajectory with a task_id in any pool (rejected: {len(rejected)})")
        raise typer.Exit(EXIT_USAGE)
    result = analyze(outcomes, max_k)
    for p in result["pools"]:
        fewer = [point for point in p["curve"] if point["problems"] < p["problems"]]
        if fewer:
            err.print(
                f"note: {p['name']}: from k={fewer[0]['k']} on, pass@k averages only the problems with at least k attempts "
                f"({fewer[-1]['problems']} of {p['problems']} at k={fewer[-1]['k']})",
                highlight=False,
            )
    write_text_atomic(out_dir / "passk.json", json.dumps(result, indent=1))
    write_text_atomic(out_dir / "passk.md", markdown(result))
    passk_chart(result, out_dir / "passk.png")
    for table in _passk_tables(result):
        out.print(table)
    out.print(f"written: {out_dir / 'passk.md'}, {out_dir / 'passk.json'}, {out_dir / 'passk.png'}")
    raise typer.Exit(EXIT_PARTIAL if rejected else EXIT_OK)


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
