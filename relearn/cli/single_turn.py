"""``relearn single-turn import | verify | review``: the single-turn half of the protocol (Math,
Code and instruction-following RL rollouts) one stage at a time; ``relearn masks`` compiles
their reviews (``--mode ross`` = A ∩ K) and ``relearn stats --by-step-window`` reads them.
The work is ``relearn.ops.single_turn``, which also runs a ``[pool.single_turn]`` pipeline."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from relearn.cli.output import EXIT_OK, EXIT_PARTIAL, out, run_op, show_problems
from relearn.cli.review import ApiKeyEnv, BaseUrl, PriceCachedIn, PriceIn, PriceOut, Prices, SpendCap
from relearn.ops.review import JudgeOptions
from relearn.ops.single_turn import (
    SingleTurnImportOptions,
    SingleTurnReviewOptions,
    SingleTurnVerifyOptions,
    run_single_turn_import,
    run_single_turn_review,
    run_single_turn_verify,
)

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
    paths: Annotated[
        list[Path], typer.Argument(metavar="PATH", help="Rollout files (.jsonl, .json, .parquet), or folders walked recursively.")
    ],
    output: Annotated[Path, typer.Option("-o", "--output", help="Pool to append to (.jsonl or .jsonl.zst).")],
    preset: Annotated[
        str,
        typer.Option(
            help="Column layout: rows (prompt, response, reward, step, task_id, checkpoint), verl ({step}.jsonl dumps: input, output, score, step), openrlhf (prompt, output, reward, global_step), or chat (records of chat messages with one assistant turn; no column flags)."
        ),
    ] = SingleTurnImportOptions.format,
    prompt: Annotated[str | None, typer.Option(help="The prompt column (dotted paths reach nested or JSON-text columns).")] = None,
    response: Annotated[str | None, typer.Option(help="The response column (reasoning and final answer).")] = None,
    reward: Annotated[str | None, typer.Option(help="The column of the reward the RL run logged.")] = None,
    step: Annotated[str | None, typer.Option(help="The column of the RL step that sampled the response.")] = None,
    task_id: Annotated[str | None, typer.Option("--task-id", help="The column naming the task (default: a digest of the prompt).")] = None,
    id_column: Annotated[str | None, typer.Option("--id", help="The column of the rollout's own id (default: a content hash).")] = None,
    checkpoint: Annotated[str | None, typer.Option(help="The column naming the checkpoint that sampled the response.")] = None,
    token_ids: Annotated[str | None, typer.Option("--token-ids", help="The column of the response's sampled token ids.")] = None,
    logprobs: Annotated[str | None, typer.Option(help="The column of the sampled tokens' log-probabilities.")] = None,
    thinking: Annotated[
        bool,
        typer.Option(
            "--thinking/--no-thinking",
            help="Keep the response whole as visible text, for training in the template's no-thinking form (the default, as the paper's single-turn relearning: no-thinking responses, a 32,768-token limit in the pipeline), or --thinking: split a response's <think> block into reasoning (the template's thinking form, as sampled; then compile with `relearn masks` without --no-thinking).",
        ),
    ] = SingleTurnImportOptions.thinking,
) -> None:
    """Import single-turn rollouts into a pool: one user prompt and one generated response per row.

    A response's <think>...</think> block (or its text up to a lone </think>) becomes the reasoning and the rest the final answer. The logged reward is kept as the imported outcome until `relearn single-turn verify` grades the response. A damaged row is rejected with its file, line and field and the rows after it are read; a rerun adds nothing already in the pool.
    """
    given = {
        "prompt": prompt, "response": response, "reward": reward, "step": step, "task_id": task_id, "id": id_column,
        "checkpoint": checkpoint, "token_ids": token_ids, "logprobs": logprobs,
    }  # fmt: skip
    columns = {name: value for name, value in given.items() if value is not None}
    options = SingleTurnImportOptions(paths, output, preset, columns, thinking)  # type: ignore[arg-type]  # the operation checks it
    summary = run_op(run_single_turn_import, options)
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
    pool: Annotated[Path, typer.Argument(metavar="POOL", help="Pool of single-turn rollouts.")],
    output: Annotated[
        Path, typer.Option("-o", "--output", help="The pool with each response's verdict (written beside, then renamed into place).")
    ],
    tasks: Annotated[
        str, typer.Option(help="Tasks .jsonl (id, kind, prompt, answer | tests | constraints), or `mini` for the shipped suite.")
    ] = SingleTurnVerifyOptions.tasks,
) -> None:
    """Grade every response with its task's verifier: Math by math-verify against the reference answer, Code by the task's unit tests (visible and hidden) on the last ```python block, in a fresh container without network, IF by IFEval's checkers for the prompt's constraints.

    The verdict replaces the reward the RL run logged (kept as `verdict.logged_reward`). Graded rollouts are appended to OUTPUT.partial as they are graded, so a killed run resumes without grading them again; the file is renamed into place at the end. A rollout whose task is unknown is listed and left ungraded (exit 1). Code tasks need the Docker engine; the offline base image is built on first use.
    """
    summary = run_op(run_single_turn_verify, SingleTurnVerifyOptions(pool, output, tasks))
    show_problems("unreadable tasks", summary.task_problems)
    show_problems("ungradable", summary.ungradable)
    show_problems("unreadable records", summary.unreadable)
    rows: list[tuple[str, object]] = sorted(summary.graded.items())
    if summary.resumed:
        rows.append(("graded before (resumed)", summary.resumed))
    rows.append(("positive in the output", summary.positive))
    out.print(_table(f"relearn single-turn verify -> {output}", rows))
    raise typer.Exit(EXIT_PARTIAL if summary.partial else EXIT_OK)


@app.command("review")
def review_command(
    pool: Annotated[Path, typer.Argument(metavar="POOL", help="Verified pool of single-turn rollouts.")],
    output: Annotated[Path, typer.Option("-o", "--output", help="Reviews JSONL (appended; resumable by rollout id).")],
    judge: Annotated[str, typer.Option(help="Model of the keep judge, which selects the keep intervals.")],
    auditor: Annotated[
        str | None, typer.Option(help="Model of the auditor, which checks the kept text alone (default: the judge's model).")
    ] = JudgeOptions.judge2,
    backend: Annotated[str, typer.Option(help="anthropic | chat (OpenAI-compatible) | responses.")] = JudgeOptions.backend,
    base_url: BaseUrl = JudgeOptions.base_url,
    auditor_base_url: Annotated[str | None, typer.Option(help="The auditor's endpoint, when it differs.")] = JudgeOptions.judge2_base_url,
    api_key_env: ApiKeyEnv = JudgeOptions.api_key_env,
    workers: Annotated[int, typer.Option(min=1, help="Rollouts reviewed at once.")] = SingleTurnReviewOptions.workers,
    spend_cap: SpendCap = SingleTurnReviewOptions.spend_cap,
    price_in: PriceIn = JudgeOptions.price_in,
    price_out: PriceOut = JudgeOptions.price_out,
    price_cached_in: PriceCachedIn = JudgeOptions.price_cached_in,
    prices: Prices = JudgeOptions.prices,
) -> None:
    """Review verifier-positive single-turn rollouts: keep intervals for Math and Code, full supervision for instruction following.

    The keep judge quotes the correct, self-contained reasoning and the complete final answer (leaving out wrong steps, abandoned approaches and repeated answer emission) or drops the response when no clean solution can be assembled from its own text; every quote is grounded to exact offsets, and one that does not ground drops the response. The auditor then reads the kept text alone and must find it self-contained and correct. Instruction-following positives are accepted whole without a call. Answers are cached beside the output, so a rerun costs nothing for what was reviewed; `relearn masks --mode ross` compiles A ∩ K from the reviews.
    """
    judges = JudgeOptions(
        judge1=judge, judge2=auditor, backend=backend, base_url=base_url, judge2_base_url=auditor_base_url, api_key_env=api_key_env,
        price_in=price_in, price_out=price_out, price_cached_in=price_cached_in, prices=prices,
    )  # fmt: skip
    summary = run_op(run_single_turn_review, SingleTurnReviewOptions(pool, output, judges, workers, spend_cap))
    run, ledger = summary.run, summary.ledger
    show_problems("not reviewed", run.errors)
    show_problems("unreadable records", [str(e) for e in run.unreadable])
    rows: list[tuple[str, object]] = [("reviewed", run.reviewed), ("already reviewed (skipped)", run.skipped)]
    rows += sorted(run.decisions.items())
    rows += [("judge calls", ledger.calls), ("answered from the cache", ledger.cached), ("cost (USD)", f"{ledger.spent_usd:.4f}")]
    out.print(_table(f"relearn single-turn review -> {output}", rows))
    raise typer.Exit(EXIT_PARTIAL if summary.partial else EXIT_OK)


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="single-turn")
