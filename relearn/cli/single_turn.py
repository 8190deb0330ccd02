"""``relearn single-turn import | verify | review``: the single-turn half of the protocol (Math,
Code and instruction-following RL rollouts) one stage at a time; ``relearn masks`` compiles
their reviews (``--mode ross`` = A ∩ K) and ``relearn stats --by-step-window`` reads them."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from relearn.cli.output import EXIT_OK, EXIT_PARTIAL, EXIT_USAGE, err, out, show_problems

app = typer.Typer(
    help="Single-turn RL rollouts (Math, Code, instruction following): import the row dumps, grade each response with its task's verifier, review with keep intervals.",
    no_args_is_help=True,
)


def _table(title: str, rows: list[tuple[str, object]]) -> Table:
    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column(justify="right")
    for name, value in rows:
        table.add_row(name, str(value))
    return table


@app.command("import")
def import_command(
    paths: Annotated[list[Path], typer.Argument(help="Rollout files (.jsonl, .json, .parquet), or folders walked recursively.")],
    output: Annotated[Path, typer.Option("-o", "--output", help="Pool to append to (.jsonl or .jsonl.zst).")],
    preset: Annotated[
        str,
        typer.Option(
            help="Column layout: rows (prompt, response, reward, step, task_id, checkpoint), verl ({step}.jsonl dumps: input, output, score, step) or openrlhf (prompt, output, reward, global_step)."
        ),
    ] = "rows",
    prompt: Annotated[str | None, typer.Option(help="The prompt column (dotted paths reach nested or JSON-text columns).")] = None,
    response: Annotated[str | None, typer.Option(help="The response column (reasoning and final answer).")] = None,
    reward: Annotated[str | None, typer.Option(help="The column of the reward the RL run logged.")] = None,
    step: Annotated[str | None, typer.Option(help="The column of the RL step that sampled the response.")] = None,
    task_id: Annotated[str | None, typer.Option("--task-id", help="The column naming the task (default: a digest of the prompt).")] = None,
    id_column: Annotated[str | None, typer.Option("--id", help="The column of the rollout's own id (default: a content hash).")] = None,
    no_thinking: Annotated[
        bool,
        typer.Option(
            "--no-thinking",
            help="Keep the response whole as visible text (for training in the template's no-thinking form) instead of splitting its <think> block into reasoning.",
        ),
    ] = False,
) -> None:
    """Import single-turn rollouts into a pool: one user prompt and one generated response per row.

    A response's <think>...</think> block (or its text up to a lone </think>) becomes the
    reasoning and the rest the final answer. The logged reward is kept as the imported outcome
    until `relearn single-turn verify` grades the response. A damaged row is rejected with its
    file, line and field and the rows after it are read; a rerun adds nothing already in the pool.
    """
    from harness.import_run import import_files
    from harness.importers.single_turn import PRESETS, SingleTurnImporter, options_for

    if preset not in PRESETS:
        err.print(f"[red]error:[/red] --preset must be one of {', '.join(PRESETS)}")
        raise typer.Exit(EXIT_USAGE)
    missing = [str(p) for p in paths if not p.exists()]
    if missing:
        err.print(f"[red]error:[/red] no such file or directory: {', '.join(missing)}")
        raise typer.Exit(EXIT_USAGE)
    importer = SingleTurnImporter(
        options_for(
            preset,
            prompt=prompt,
            response=response,
            reward=reward,
            step=step,
            task_id=task_id,
            id=id_column,
            split_thinking=not no_thinking,
        )
    )
    files = [f for p in paths for f in (importer.discover(p) if p.is_dir() else [p])]
    with err.status(f"importing {len(files)} file(s)"):
        summary = import_files("single-turn", files, output, importer=importer)
    show_problems("rejected", [str(e) for e in summary.rejected])
    out.print(
        _table(
            f"relearn single-turn import -> {output}",
            [
                ("files read", summary.files),
                ("rollouts imported", summary.imported),
                ("already in the pool (skipped)", summary.skipped_existing),
                ("rows rejected", len(summary.rejected)),
            ],
        )
    )
    raise typer.Exit(EXIT_PARTIAL if summary.rejected else EXIT_OK)


@app.command("verify")
def verify_command(
    pool: Annotated[Path, typer.Argument(help="Pool of single-turn rollouts.")],
    output: Annotated[
        Path, typer.Option("-o", "--output", help="The pool with each response's verdict (written beside, then renamed into place).")
    ],
    tasks: Annotated[
        str, typer.Option(help="Tasks .jsonl (id, kind, prompt, answer | tests | constraints), or `mini` for the shipped suite.")
    ] = "mini",
) -> None:
    """Grade every response with its task's verifier: Math by math-verify against the reference answer, Code by the task's unit tests (visible and hidden) on the last ```python block, in a fresh container without network, IF by IFEval's checkers for the prompt's constraints.

    The verdict replaces the reward the RL run logged (kept as `verdict.logged_reward`).
    Graded rollouts are appended to OUTPUT.partial as they are graded, so a killed run
    resumes without grading them again; the file is renamed into place at the end.
    A rollout whose task is unknown is listed and left ungraded (exit 1). Code tasks need the
    Docker engine; the offline base image is built on first use.
    """
    from envs.single_turn.tasks import MINI_TASKS, load_tasks
    from envs.single_turn.verify import GradeSummary, grade_all
    from records.pools import JsonlWriter, RecordError, read_trajectories_lenient

    task_file = MINI_TASKS if tasks == "mini" else Path(tasks)
    if not pool.is_file() or not task_file.is_file():
        err.print(f"[red]error:[/red] no such file: {pool if not pool.is_file() else task_file}")
        raise typer.Exit(EXIT_USAGE)
    known, task_errors = load_tasks(task_file)
    show_problems("unreadable tasks", [str(e) for e in task_errors])
    errors: list[RecordError] = []
    summary = GradeSummary()
    engine: list[tuple[object, str]] = []

    def client_image() -> tuple[object, str]:
        from envs.docker_backend import client_from_env
        from envs.images import build_base

        client = client_from_env()
        engine.append((client, build_base(client, log=lambda m: err.print(f"[dim]{m}[/dim]"))))
        return engine[0]

    # Graded rollouts are appended to a partial file first: a killed run resumes where it stopped.
    partial = output.with_name(output.name + ".partial")
    done = {t.id for t in read_trajectories_lenient(partial, [])} if partial.exists() else set()
    todo = (t for t in read_trajectories_lenient(pool, errors) if t.id not in done)
    with JsonlWriter(partial, fsync=True) as writer, err.status("grading responses"):
        for trajectory in grade_all(todo, known, summary, client_image=client_image):
            writer.write(trajectory)
    partial.replace(output)
    if done:
        summary.counts["graded before (resumed)"] += len(done)
    show_problems("ungradable", summary.ungradable)
    show_problems("unreadable records", [str(e) for e in errors])
    out.print(_table(f"relearn single-turn verify -> {output}", sorted(summary.counts.items())))
    raise typer.Exit(EXIT_PARTIAL if summary.ungradable or errors or task_errors else EXIT_OK)


@app.command("review")
def review_command(
    pool: Annotated[Path, typer.Argument(help="Verified pool of single-turn rollouts.")],
    output: Annotated[Path, typer.Option("-o", "--output", help="Reviews JSONL (appended; resumable by rollout id).")],
    judge: Annotated[str, typer.Option(help="Model of the keep judge, which selects the keep intervals.")],
    auditor: Annotated[
        str | None, typer.Option(help="Model of the auditor, which checks the kept text alone (default: the judge's model).")
    ] = None,
    backend: Annotated[str, typer.Option(help="anthropic | chat (OpenAI-compatible) | responses.")] = "anthropic",
    base_url: Annotated[str | None, typer.Option(help="The judges' endpoint (default: the provider's).")] = None,
    api_key_env: Annotated[str | None, typer.Option(help="Environment variable holding the API key.")] = None,
    workers: Annotated[int, typer.Option(min=1, help="Rollouts reviewed at once.")] = 4,
    spend_cap: Annotated[float | None, typer.Option("--spend-cap", help="Stop asking the judges once this many USD are spent.")] = None,
) -> None:
    """Review verifier-positive single-turn rollouts: keep intervals for Math and Code, full supervision for instruction following.

    The keep judge quotes the correct, self-contained reasoning and the complete final answer
    (leaving out wrong steps, abandoned approaches and repeated answer emission) or drops the
    response when no clean solution can be assembled from its own text; every quote is grounded
    to exact offsets, and one that does not ground drops the response. The auditor then reads the
    kept text alone and must find it self-contained and correct. Instruction-following positives
    are accepted whole without a call. Answers are cached beside the output, so a rerun costs
    nothing for what was reviewed; `relearn masks --mode ross` compiles A ∩ K from the reviews.
    """
    from review.estimate import judge_specs, load_prices
    from review.judges import Judge
    from review.keep import review_single_turn_pool

    if backend not in ("anthropic", "chat", "responses"):
        err.print("[red]error:[/red] --backend must be anthropic, chat or responses")
        raise typer.Exit(EXIT_USAGE)
    if not pool.is_file():
        err.print(f"[red]error:[/red] no such file: {pool}")
        raise typer.Exit(EXIT_USAGE)

    spec = judge_specs(load_prices(), backend=backend, base_url=base_url, api_key_env=api_key_env)
    with err.status("reviewing"):
        summary, ledger = review_single_turn_pool(
            pool,
            output,
            Judge(spec(judge, "judge1"), "keep"),
            Judge(spec(auditor or judge, "judge2"), "audit"),
            workers=workers,
            spend_cap_usd=spend_cap,
        )
    show_problems("not reviewed", summary.errors)
    rows: list[tuple[str, object]] = [("reviewed", len(summary.reviewed)), ("already reviewed (skipped)", summary.skipped)]
    rows += sorted(summary.decisions().items())
    rows += [("judge calls", ledger.calls), ("answered from the cache", ledger.cached), ("cost (USD)", f"{ledger.spent_usd:.4f}")]
    out.print(_table(f"relearn single-turn review -> {output}", rows))
    raise typer.Exit(EXIT_PARTIAL if summary.errors or summary.unreadable else EXIT_OK)


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="single-turn")
