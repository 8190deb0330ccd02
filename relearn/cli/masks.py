"""``relearn masks``: compile a pool into token masks A \\ E and Parquet shards."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from envs.executor import LocalBackend, Needs
from records.pools import is_zstd
from relearn.cli.cluster import NodesColumn, RayArg, ray_backend, show_nodes
from relearn.cli.output import EXIT_OK, EXIT_PARTIAL, EXIT_USAGE, err, out, show_problems
from relearn.masks.compile import DEFECT_SCOPES, MODES, MaskOptions
from relearn.masks.shards import build_dataset, load_reviews
from relearn.masks.template import PREFIX_CHECKS


def masks_command(
    pool: Annotated[Path, typer.Argument(metavar="POOL", exists=True, dir_okay=False, help="Pool of trajectories (.jsonl or .jsonl.zst).")],
    output: Annotated[Path, typer.Option("-o", "--output", help="Dataset folder: shard-*.parquet and stats.json.")],
    reviews: Annotated[
        Path | None, typer.Option("--reviews", "-r", exists=True, dir_okay=False, help="Review JSONL (needed for ross and ross-nomask).")
    ] = None,
    tokenizer: Annotated[str, typer.Option(help="`qwen3.6` (built in, offline) or a Hugging Face tokenizer folder.")] = "qwen3.6",
    mode: Annotated[
        str, typer.Option(help="ross (A \\ E, accepted) | positive (A, all verified-positive) | ross-nomask (A, accepted).")
    ] = "ross",
    ctx: Annotated[int, typer.Option(help="Longest sample in tokens; longer trajectories are dropped and counted, never cut.")] = 65536,
    prefix_check: Annotated[
        str, typer.Option(help="header (each turn opens with the generation prompt) | every (re-render each prefix) | off.")
    ] = "header",
    per_turn: Annotated[bool, typer.Option(help="One sample per generated turn, for templates that rewrite earlier turns.")] = False,
    preserve_thinking: Annotated[bool, typer.Option(help="Keep reasoning on every turn (Qwen3.6's preserve_thinking).")] = True,
    no_thinking: Annotated[
        bool,
        typer.Option(
            "--no-thinking",
            help="Render in the template's no-thinking form (enable_thinking=False: its empty think block is part of the generation prompt), for single-turn rollouts imported with `relearn single-turn import --no-thinking`.",
        ),
    ] = False,
    shard_size: Annotated[int, typer.Option(help="Trajectories of the pool per shard.")] = 256,
    include_suspicious: Annotated[
        bool,
        typer.Option(
            help="Also take successes the verifier found suspicious (edited tests or pytest config, code reaching into pytest); by default they are rejected and counted."
        ),
    ] = False,
    workers: Annotated[
        int,
        typer.Option(
            help="Worker processes compiling shards at once (each shard is one work unit; the files are written by this process, in the same bytes). 1: compile here, one shard after another, in the least memory."
        ),
    ] = 1,
    ray: RayArg = None,
    defect_scope: Annotated[
        str,
        typer.Option(
            help="action: a defect in a tool call excludes the whole call as the template renders it (tags, function name, every argument, and the end of turn after a turn's last call), since the error is the decision to call | minimal: only the quoted characters (the ablation)."
        ),
    ] = "action",
) -> None:
    """Compile token masks A \\ E over the real chat template, VALIDATE them, write Parquet shards.

    Each trajectory is rendered once; each rejected trajectory is counted with its reason.
    Resumable (finished shards with the same options are kept) and deterministic.

    ross and ross-nomask validate the same defects and so hold the same trajectories: the masking contrast is the same subset with and without the mask.
    """
    if mode not in MODES:
        err.print(f"[red]error:[/red] --mode must be one of {', '.join(MODES)}")
        raise typer.Exit(EXIT_USAGE)
    if defect_scope not in DEFECT_SCOPES:
        err.print(f"[red]error:[/red] --defect-scope must be one of {', '.join(DEFECT_SCOPES)}")
        raise typer.Exit(EXIT_USAGE)
    if prefix_check not in PREFIX_CHECKS:
        err.print(f"[red]error:[/red] --prefix-check must be one of {', '.join(PREFIX_CHECKS)}")
        raise typer.Exit(EXIT_USAGE)
    if mode != "positive" and reviews is None:
        err.print(f"[red]error:[/red] --mode {mode} needs --reviews")
        raise typer.Exit(EXIT_USAGE)
    from relearn.masks.tokenizers import load_tokenizer  # transformers is slow to import; only here

    try:
        tok = load_tokenizer(tokenizer)
    except ValueError as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(EXIT_USAGE) from None
    review_errors: list[str] = []
    review_map = load_reviews(reviews, review_errors)
    show_problems("unreadable reviews", review_errors)
    template_kwargs: dict[str, bool] = {"preserve_thinking": preserve_thinking}
    if no_thinking:
        template_kwargs["enable_thinking"] = False
    options = MaskOptions(
        mode=mode,
        ctx=ctx,
        template_kwargs=template_kwargs,
        prefix_check=prefix_check,
        per_turn=per_turn,
        include_suspicious=include_suspicious,
        defect_scope=defect_scope,
    )
    # The bar counts the pool's bytes (a compressed pool's are only known as they are read) and
    # shows the tokens compiled so far.
    total = None if is_zstd(pool) else pool.stat().st_size
    nodes = NodesColumn()
    progress = Progress(
        TextColumn("[bold]compiling masks"),
        BarColumn(),
        DownloadColumn(),
        TextColumn("{task.fields[tokens]:,} tokens"),
        TimeElapsedColumn(),
        nodes,
        console=err,
        transient=True,
    )
    with progress:
        bar = progress.add_task("masks", total=total, tokens=0)
        compiled = 0

        def advance(size: int, tokens: int) -> None:
            nonlocal compiled
            compiled += tokens
            progress.update(bar, advance=size, tokens=compiled)

        backend = ray_backend(ray, Needs(cpus=1), nodes) or (LocalBackend(workers, processes=True) if workers > 1 else None)
        try:
            stats, reused = build_dataset(
                pool, review_map, tok, tokenizer, options, output, shard_size=shard_size, on_record=advance, backend=backend
            )
        except RuntimeError as exc:  # a shard a worker could not compile
            err.print(f"[red]error:[/red] {exc}")
            raise typer.Exit(EXIT_PARTIAL) from None
        finally:
            if backend is not None:
                backend.close()
    show_nodes(nodes.per_node(), "shards")
    show_problems("rejected", [f"{r['trajectory_id']}: {r['reason']}: {r['detail']}" for r in stats["rejections"]])
    table = Table(title=f"relearn masks --mode {mode} -> {output}", show_header=False)
    tokens = stats["tokens"]
    for name, value in (
        ("trajectories in", stats["trajectories_in"]),
        ("trajectories out", stats["trajectories_out"]),
        ("samples", stats["samples"]),
        ("shards (reused)", f"{stats['shards']} ({reused})"),
        ("tokens", tokens["total"]),
        ("eligible (A)", tokens["eligible"]),
        ("excluded (A ∩ E)", tokens["excluded"]),
        ("supervised (A \\ E)", tokens["supervised"]),
        ("TER token-weighted", f"{stats['ter_token_weighted']:.4f}"),
        ("TER mean per sample", f"{stats['ter_mean']:.4f}"),
    ):
        table.add_row(name, str(value))
    for reason, count in stats["rejected"].items():
        table.add_row(f"rejected: {reason}", str(count))
    for category, count in stats["excluded_by_category"].items():
        table.add_row(f"excluded tokens: {category}", str(count))
    out.print(table)
    out.print(f"statistics: {output / 'stats.json'}")
    invalid = {k: v for k, v in stats["rejected"].items() if k not in ("not verified positive", "review rejected", "no review")}
    raise typer.Exit(EXIT_PARTIAL if invalid or review_errors else EXIT_OK)


def register(app: typer.Typer) -> None:
    app.command("masks")(masks_command)
