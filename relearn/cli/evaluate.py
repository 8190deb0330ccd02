"""``relearn eval run|report|compare``: SWE-bench-style evaluation under a fixed budget."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from relearn.cli.cluster import RayArg, RegistryArg, show_nodes
from relearn.cli.harness import AgentArg, ApplyPatchArg, ReasoningEffortArg, TokenIdsArg
from relearn.cli.image_options import CpusArg, ImageMapArg, ImageTemplateArg, MemoryArg, PullArg
from relearn.cli.output import EXIT_OK, EXIT_PARTIAL, EXIT_USAGE, out, print_error, run_op, show_problems
from relearn.ops.collect import AgentOptions
from relearn.ops.containers import ContainerOptions
from relearn.ops.evaluate import EvalOptions, run_evaluation

eval_app = typer.Typer(
    help="Evaluate a policy on SWE-bench Verified (or the mini suite) under a fixed budget; report and compare runs.", no_args_is_help=True
)


@eval_app.command("run")
def run_command(
    out_dir: Annotated[Path, typer.Option("--out", help="Run folder (created, or resumed when it holds the same run).")],
    model: Annotated[str, typer.Option(help="Model name the endpoint serves.")],
    dataset: Annotated[
        str,
        typer.Option(
            help="`mini`, a local .parquet/.jsonl/.json (e.g. ../shared/samples/swebench_verified.parquet), or a Hugging Face dataset name."
        ),
    ] = EvalOptions.dataset,
    agent: AgentArg = AgentOptions.agent,
    apply_patch: ApplyPatchArg = AgentOptions.apply_patch,
    policy: Annotated[str | None, typer.Option(help="chat (the builtin default) | responses (codex-cli's only one) | anthropic.")] = None,
    reasoning_effort: ReasoningEffortArg = AgentOptions.reasoning_effort,
    token_ids: TokenIdsArg = AgentOptions.token_ids,
    base_url: Annotated[str | None, typer.Option(help="Endpoint URL.")] = None,
    api_key_env: Annotated[str | None, typer.Option(help="Environment variable holding the API key.")] = None,
    checkpoint: Annotated[str | None, typer.Option(help="Checkpoint served (recorded in the manifest).")] = None,
    ids: Annotated[list[str] | None, typer.Option("--id", help="Only these instances (repeatable).")] = None,
    repos: Annotated[list[str] | None, typer.Option("--repo", help="Only these repositories (repeatable).")] = None,
    difficulties: Annotated[list[str] | None, typer.Option("--difficulty", help="Only these difficulty labels (repeatable).")] = None,
    slice_: Annotated[str | None, typer.Option("--slice", help="start:stop over the selected instances.")] = None,
    temperature: Annotated[float | None, typer.Option(help="Sampling temperature.")] = None,
    max_output_tokens: Annotated[int | None, typer.Option(help="Per-call output token limit.")] = None,
    seed: Annotated[int | None, typer.Option(help="Sampling seed, sent to the endpoint and recorded.")] = None,
    workers: Annotated[int, typer.Option(min=1, help="Instances at once.")] = EvalOptions.workers,
    max_turns: Annotated[int | None, typer.Option(help="Budget: model calls per instance.")] = EvalOptions.max_turns,
    max_tokens: Annotated[int | None, typer.Option(help="Budget: tokens per instance.")] = None,
    max_seconds: Annotated[float | None, typer.Option(help="Budget: seconds per instance.")] = None,
    max_cost: Annotated[float | None, typer.Option(help="Budget: USD per instance.")] = None,
    spend_cap: Annotated[float | None, typer.Option(help="Stop starting instances once the run has spent this many USD.")] = None,
    price_in: Annotated[float, typer.Option(help="USD per million input tokens.")] = EvalOptions.price_in,
    price_out: Annotated[float, typer.Option(help="USD per million output tokens.")] = EvalOptions.price_out,
    image_map: ImageMapArg = None,
    image_template: ImageTemplateArg = None,
    pull: PullArg = ContainerOptions.pull,
    cpus: CpusArg = ContainerOptions.cpus,
    memory: MemoryArg = ContainerOptions.memory,
    ray: RayArg = None,
    registry: RegistryArg = None,
) -> None:
    """Run one policy on the selected instances under a fixed budget; grade each in a fresh container.

    Writes manifest.json, trajectories, predictions.jsonl (SWE-bench format), per-instance
    reports and report.md/json. Resumable: rerun the same command to finish a killed run.
    """
    options = EvalOptions(
        out=out_dir, model=model, dataset=dataset, agent=AgentOptions(agent, policy, apply_patch, reasoning_effort, token_ids), base_url=base_url,
        api_key_env=api_key_env, checkpoint=checkpoint, ids=ids, repos=repos, difficulties=difficulties, slice=slice_,
        temperature=temperature, max_output_tokens=max_output_tokens, seed=seed, workers=workers, max_turns=max_turns,
        max_tokens=max_tokens, max_seconds=max_seconds, max_cost=max_cost, spend_cap=spend_cap, price_in=price_in, price_out=price_out,
        containers=ContainerOptions(image_map, image_template, pull, cpus, memory, ray, registry),
    )  # fmt: skip
    summary = run_op(run_evaluation, options)
    show_nodes(summary.collect.per_node, "instances")
    show_problems("infrastructure failures (kept apart from model failures)", summary.collect.errors)
    report = summary.report
    low, high = report["resolved_rate_ci95"]
    out.print(
        f"{summary.selected} instances: {summary.collect.skipped} already done, {len(summary.collect.finished)} run now, {summary.collect.capped} not started (spend cap), "
        f"{len(report['infra_errors'])} infrastructure failures"
    )
    out.print(
        f"resolved {report['resolved']}/{report['graded']} = {report['resolved_rate']:.1%} (95% CI {low:.1%}–{high:.1%}); report: {out_dir / 'report.md'}"
    )
    raise typer.Exit(EXIT_PARTIAL if summary.partial else EXIT_OK)


@eval_app.command("report")
def report_command(run_dir: Annotated[Path, typer.Argument(metavar="RUN", help="A run folder.")]) -> None:
    """Write report.json and report.md for a run and print the summary."""
    from eval.report import write_report

    try:
        report = write_report(run_dir)
    except FileNotFoundError as exc:
        print_error(str(exc))
        raise typer.Exit(EXIT_USAGE) from None
    out.print((run_dir / "report.md").read_text(), markup=False, highlight=False)
    raise typer.Exit(EXIT_PARTIAL if report["unreadable_records"] else EXIT_OK)


@eval_app.command("compare")
def compare_command(
    runs: Annotated[list[Path], typer.Argument(metavar="RUN", help="Run folders; the first is the baseline.")],
    output: Annotated[Path, typer.Option("-o", "--output", help="Folder for compare.md, compare.json and compare.png.")] = Path("compare"),
    names: Annotated[
        list[str] | None, typer.Option("--name", help="Display names, one per run (e.g. Upstream, Positive SFT, ROSS).")
    ] = None,
) -> None:
    """Put runs side by side with paired statistics; refuses runs whose scaffold, budget or instances differ."""
    from eval.report import NotComparable, compare, compare_chart, compare_markdown

    labels = names or [path.name for path in runs]
    if len(labels) != len(runs):
        print_error("give one --name per run")
        raise typer.Exit(EXIT_USAGE)
    try:
        result = compare(list(zip(labels, runs, strict=True)))
    except (NotComparable, FileNotFoundError) as exc:
        print_error(str(exc))
        raise typer.Exit(EXIT_USAGE) from None
    output.mkdir(parents=True, exist_ok=True)
    (output / "compare.json").write_text(json.dumps(result, indent=1))
    (output / "compare.md").write_text(compare_markdown(result))
    compare_chart(result, output / "compare.png")
    out.print(compare_markdown(result), markup=False, highlight=False)
    out.print(f"written: {output / 'compare.md'}, {output / 'compare.json'}, {output / 'compare.png'}")


def register(app: typer.Typer) -> None:
    app.add_typer(eval_app, name="eval")
