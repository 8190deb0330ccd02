"""`relearn single-turn import | verify | review` and the stages of a ``[pool.single_turn]``
pipeline: single-turn RL rollouts (Math, Code, instruction following) imported from row dumps,
each response graded by its task's verifier, the positives reviewed with keep intervals.

The operations own what every caller must do: the importer and its columns, the tasks file,
the Docker engine (orphans swept) and the offline base image the first Code task needs, the
resumable partial file of the grading, the judges and their prices, and the call cache and
ledger (inside ``review.keep``). Every count comes from the pass that writes the file or from
one streaming pass over it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, get_args

from harness.import_run import ImportSummary
from records.pools import JsonlWriter, RecordError, iter_lines, read_trajectories_lenient
from records.review import Review, latest_reviews
from records.trajectory import Trajectory
from relearn.ops.containers import docker_client, sweep_orphans
from relearn.ops.importing import import_reporting
from relearn.ops.outputs import POOL, REVIEWS, check_jsonl_output, prepare_parent
from relearn.ops.reporting import SILENT, OpError, Reporter, stage
from relearn.ops.review import JudgeOptions, ReviewOptions, make_judges
from relearn.options import nested, option, same_as

if TYPE_CHECKING:
    from review.judges import Ledger
    from review.run import ReviewSummary as PoolReview

# The row presets of harness.importers.single_turn, and chat records with one assistant turn.
SingleTurnFormat = Literal["rows", "verl", "openrlhf", "chat"]
FORMATS: tuple[str, ...] = get_args(SingleTurnFormat)
# The token limit of the paper's single-turn relearning (its C.3), the single-turn pipeline's
# default [masks] and [train] ctx (the agentic default is relearn.masks.compile.CONTEXT_TOKENS).
SINGLE_TURN_CONTEXT = 32_768


# ---- import -------------------------------------------------------------------------------


PIPELINE_NAMES = "the pipeline names it: the work folder's pool, verified pool and reviews"
FORMAT_HELP = (
    "Column layout: rows (prompt, response, reward, step, task_id, checkpoint), verl ({step}.jsonl dumps: input, output, score, "
    "step), openrlhf (prompt, output, reward, global_step), or chat (records of chat messages with one assistant turn; no column "
    "flags)."
)
THINKING_HELP = (
    "Keep the response whole as visible text, for training in the template's no-thinking form (the default, as the paper's "
    "single-turn relearning: no-thinking responses, a 32,768-token limit in the pipeline), or --thinking: split a response's "
    "<think> block into reasoning (the template's thinking form, as sampled; then compile with `relearn masks` without "
    "--no-thinking)."
)


def _column(help: str) -> Any:
    return option(None, help, metavar="COLUMN", front="cli", why="the pipeline file names it in [pool.single_turn] columns")


@dataclass
class SingleTurnColumns:
    """The command line's column flags; the pipeline file writes the same as its ``columns`` table."""

    prompt: str | None = _column("The prompt column (dotted paths reach nested or JSON-text columns).")
    response: str | None = _column("The response column (reasoning and final answer).")
    reward: str | None = _column("The column of the reward the RL run logged.")
    step: str | None = _column("The column of the RL step that sampled the response.")
    task_id: str | None = _column("The column naming the task (default: a digest of the prompt).")
    id: str | None = _column("The column of the rollout's own id (default: a content hash).")
    checkpoint: str | None = _column("The column naming the checkpoint that sampled the response.")
    token_ids: str | None = _column("The column of the response's sampled token ids.")
    logprobs: str | None = _column("The column of the sampled tokens' log-probabilities.")


# The columns a row preset's layout can be overridden for (harness.importers.single_turn.SingleTurnOptions).
COLUMNS = tuple(f.name for f in fields(SingleTurnColumns))


@dataclass
class SingleTurnImportOptions:
    """Import single-turn rollouts into a pool: one user prompt and one generated response per row.

    A response's <think>...</think> block (or its text up to a lone </think>) becomes the reasoning and the rest the final answer. The logged reward is kept as the imported outcome until `relearn single-turn verify` grades the response. A damaged row is rejected with its file, line and field and the rows after it are read; a rerun adds nothing already in the pool.
    """

    paths: list[Path] = option(
        help="Rollout files (.jsonl, .json, .parquet), or folders walked recursively; in a pipeline file, relative to it (default there with tasks = \"mini\": the suite's rollouts).",
        argument=True, metavar="PATH", table_type=list[str] | None,  # kept as written: the stage resolves them
    )  # fmt: skip
    output: Path = option(
        help="Pool to append to (.jsonl or .jsonl.zst).", flags=("-o", "--output"), metavar="FILE", front="cli", why=PIPELINE_NAMES
    )
    format: SingleTurnFormat = option("rows", FORMAT_HELP, flags=("--preset",))
    columns: dict[str, str] = option(
        factory=dict, help="Columns over the row preset's, by name: " + ", ".join(COLUMNS) + ".", front="pipeline",
        why="the command line names each column by its own flag (SingleTurnColumns)",
    )  # fmt: skip
    thinking: bool = option(False, THINKING_HELP)  # False: the paper's single-turn relearning (its C.2)


def _importer(options: SingleTurnImportOptions) -> Any:
    from harness.importers import chat
    from harness.importers.single_turn import SingleTurnImporter, options_for

    if options.format not in FORMATS:
        raise OpError(f"unknown single-turn format {options.format!r}; known: {', '.join(FORMATS)}")
    unknown = sorted(set(options.columns) - set(COLUMNS))
    if unknown:
        raise OpError(f"unknown column option(s) {', '.join(unknown)}; known: {', '.join(COLUMNS)}")
    if options.format == "chat":
        if options.columns:
            raise OpError("column options apply to the row formats (rows, verl, openrlhf), not chat")
        return chat.ChatImporter(chat.options_for())
    return SingleTurnImporter(options_for(options.format, split_thinking=options.thinking, **options.columns))


def run_single_turn_import(options: SingleTurnImportOptions, reporter: Reporter = SILENT) -> ImportSummary:
    """Import ``options.paths`` into ``options.output``; a damaged row is rejected (file, line,
    field), counted in the summary, and the rows after it are read."""
    importer = _importer(options)
    missing = [str(p) for p in options.paths if not p.exists()]
    if missing:
        raise OpError(f"no such file or directory: {', '.join(missing)}")
    files = [f for p in options.paths for f in (importer.discover(p) if p.is_dir() else [p])]
    if not files:
        raise OpError(f"no rollout files (.jsonl, .json, .parquet) under {', '.join(map(str, options.paths))}")
    check_jsonl_output(options.output, POOL)
    prepare_parent(options.output, reporter)
    return import_reporting(f"importing {len(files)} file(s)", "single-turn", files, options.output, reporter, importer=importer)


# ---- verify -------------------------------------------------------------------------------


@dataclass
class SingleTurnVerifyOptions:
    """Grade every response with its task's verifier: Math by math-verify against the reference answer, Code by the task's unit tests (visible and hidden) on the last ```python block, in a fresh container without network, IF by IFEval's checkers for the prompt's constraints.

    The verdict replaces the reward the RL run logged (kept as `verdict.logged_reward`). Graded rollouts are appended to OUTPUT.partial as they are graded, so a killed run resumes without grading them again; the file is renamed into place at the end. A rollout whose task is unknown is listed and left ungraded (exit 1). Code tasks need the Docker engine; the offline base image is built on first use.
    """

    pool: Path = option(help="Pool of single-turn rollouts.", argument=True, metavar="POOL", front="cli", why=PIPELINE_NAMES)
    output: Path = option(
        help="The pool with each response's verdict (written beside, then renamed into place).", flags=("-o", "--output"),
        metavar="FILE", front="cli", why=PIPELINE_NAMES,
    )  # fmt: skip
    tasks: str = option("mini", "Tasks .jsonl (id, kind, prompt, answer | tests | constraints), or `mini` for the shipped suite.")


@dataclass
class SingleTurnVerifySummary:
    graded: Counter[str] = field(default_factory=Counter)  # this run: "math passed", "code failed", "ungradable", ...
    resumed: int = 0  # graded by an earlier, interrupted run (read back from the partial file)
    positive: int = 0  # resolved responses in the output, this run's and the resumed ones
    by_kind: Counter[str] = field(default_factory=Counter)  # graded responses in the output by task kind
    ungradable: list[str] = field(default_factory=list)  # "ID: why" (unknown task, not single-turn): left without our verdict
    unreadable: list[str] = field(default_factory=list)  # pool lines that could not be read
    task_problems: list[str] = field(default_factory=list)  # task records that could not be read
    orphans: list[str] = field(default_factory=list)  # containers of a killed run, removed before the first Code task

    @property
    def partial(self) -> bool:
        return bool(self.ungradable or self.unreadable or self.task_problems)

    def tally(self, trajectory: Trajectory) -> None:
        """Count one trajectory of the output."""
        outcome = trajectory.outcome
        self.positive += bool(outcome and outcome.resolved)
        if outcome is not None and outcome.verdict and "kind" in outcome.verdict:
            self.by_kind[str(outcome.verdict["kind"])] += 1


def tasks_path(tasks: str) -> Path:
    from envs.single_turn.tasks import MINI_TASKS

    return MINI_TASKS if tasks == "mini" else Path(tasks)


def run_single_turn_verify(options: SingleTurnVerifyOptions, reporter: Reporter = SILENT) -> SingleTurnVerifySummary:
    """Grade every response of ``options.pool`` by its task's kind: Math by math-verify, Code by
    unit tests in a fresh container without network, IF by IFEval's checkers. Graded rollouts
    are appended to OUTPUT.partial as they are graded (a killed run resumes by id), which is
    renamed to OUTPUT at the end. The pool is streamed."""
    from envs.single_turn.tasks import load_tasks
    from envs.single_turn.verify import GradeSummary, grade_all

    task_file = tasks_path(options.tasks)
    if not options.pool.is_file():
        raise OpError(f"{options.pool}: no such pool")
    if not task_file.is_file():
        raise OpError(f"{task_file}: no such tasks file")
    tasks, task_errors = load_tasks(task_file)
    if not tasks:
        first = f" (first problem: {task_errors[0]})" if task_errors else ""
        raise OpError(f"{task_file}: no task could be read{first}")
    check_jsonl_output(options.output, POOL)  # replaced at the end by the pool with verdicts
    summary = SingleTurnVerifySummary(task_problems=[str(e) for e in task_errors])
    partial = options.output.with_name(options.output.name + ".partial")
    done: set[str] = set()
    if partial.exists():
        for trajectory in read_trajectories_lenient(partial, []):
            done.add(trajectory.id)
            summary.tally(trajectory)
    summary.resumed = len(done)
    engine: list[tuple[Any, str]] = []

    def client_image() -> tuple[Any, str]:
        """The engine and the offline base image, on the first Code task only."""
        from envs.images import build_base

        client = docker_client()
        summary.orphans = sweep_orphans(client, reporter)
        try:
            engine.append((client, build_base(client, log=reporter.note)))
        except RuntimeError as exc:
            raise OpError(f"the base image for Code tasks: {exc}") from None
        return engine[0]

    errors: list[RecordError] = []
    grades = GradeSummary(counts=summary.graded, ungradable=summary.ungradable)
    todo = (t for t in read_trajectories_lenient(options.pool, errors) if t.id not in done)
    total = max(0, sum(1 for _ in iter_lines(options.pool)) - len(done))
    with JsonlWriter(partial, fsync=True) as writer, stage(reporter, "grading responses", total):
        for trajectory in grade_all(todo, tasks, grades, client_image=client_image):
            writer.write(trajectory)
            summary.tally(trajectory)
            reporter.advance(1, positive=summary.positive)
    partial.replace(options.output)
    summary.unreadable = [str(e) for e in errors]
    return summary


# ---- review -------------------------------------------------------------------------------


KEEP_ROLES = "[review] names them: judge1 the keep judge, judge2 the auditor, judge2_base_url the auditor's endpoint"


@dataclass
class KeepJudges:
    """The command line's names for the judges' roles in the keep-interval review (``JudgeOptions``'
    judge1, judge2 and judge2_base_url)."""

    judge: str = option(help="Model of the keep judge, which selects the keep intervals.", metavar="MODEL", front="cli", why=KEEP_ROLES)
    auditor: str | None = option(
        None, "Model of the auditor, which checks the kept text alone (default: the judge's model).", metavar="MODEL", front="cli",
        why=KEEP_ROLES,
    )  # fmt: skip
    auditor_base_url: str | None = option(None, "The auditor's endpoint, when it differs.", metavar="URL", front="cli", why=KEEP_ROLES)

    def judge_options(self, judges: JudgeOptions) -> JudgeOptions:
        return replace(judges, judge1=self.judge, judge2=self.auditor, judge2_base_url=self.auditor_base_url)


@dataclass
class SingleTurnReviewOptions:
    """The pipeline's single-turn review reads [review], as the agentic review does."""

    pool: Path = option(help="Verified pool of single-turn rollouts.", argument=True, metavar="POOL", front="cli", why=PIPELINE_NAMES)
    output: Path = option(
        help="Reviews JSONL (appended; resumable by rollout id).", flags=("-o", "--output"), metavar="FILE", front="cli",
        why=PIPELINE_NAMES,
    )  # fmt: skip
    # judge1: the keep judge, which selects the keep intervals (required); judge2: the
    # auditor, which reads the kept text alone (default: the keep judge's model). Its
    # ``context`` is not used: a single-turn judge reads the whole response.
    judges: JudgeOptions = nested(JudgeOptions)
    workers: int = same_as(ReviewOptions, "workers")
    spend_cap: float | None = same_as(ReviewOptions, "spend_cap")


@dataclass
class KeepCounts:
    """The reviews file in one pass, latest review of each rollout."""

    reviewed: int = 0
    decisions: Counter[str] = field(default_factory=Counter)  # accept, or "reject: REASON" (the reason's first word)
    protocols: Counter[str] = field(default_factory=Counter)  # keep_intervals | full_supervision | none
    keep_intervals: int = 0
    unreadable: int = 0


@dataclass
class SingleTurnReviewSummary:
    run: PoolReview  # this run: reviewed, skipped, errors (not reviewed), unreadable pool lines
    ledger: Ledger  # judge calls, cached answers, spend
    counts: KeepCounts  # the whole output file

    @property
    def partial(self) -> bool:
        return bool(self.run.errors or self.run.unreadable)


def decision_label(review: Review) -> str:
    return review.decision if review.decision == "accept" else f"reject: {(review.reason or '').split(':')[0]}"


def count_keep_reviews(path: Path) -> KeepCounts:
    """Decisions, protocols and keep intervals of the latest review of each rollout, streamed:
    memory holds one small entry per rollout, never the reviews."""

    def summary(review: Review) -> tuple[str, str, int]:
        extra = review.model_extra or {}
        return decision_label(review), str(extra.get("protocol", "none")), len(extra.get("keep") or [])

    latest, unreadable = latest_reviews(path, summary) if path.exists() else ({}, 0)
    counts = KeepCounts(unreadable=unreadable)
    counts.reviewed = len(latest)
    for decision, protocol, keep in latest.values():
        counts.decisions[decision] += 1
        counts.protocols[protocol] += 1
        counts.keep_intervals += keep
    return counts


def run_single_turn_review(options: SingleTurnReviewOptions, reporter: Reporter = SILENT) -> SingleTurnReviewSummary:
    """Review every rollout of ``options.pool`` not yet in ``options.output``: keep intervals
    for Math and Code positives (keep judge, then auditor), full supervision for instruction
    following; answers cached beside the output, so a rerun pays nothing for what was reviewed."""
    from review.judges import JUDGE_ERROR
    from review.keep import review_single_turn_pool

    if not options.pool.is_file():
        raise OpError(f"{options.pool}: no such pool")
    check_jsonl_output(options.output, REVIEWS)
    pair, _table = make_judges(options.judges)
    if pair is None:
        raise OpError("the single-turn review needs a keep judge: name its model (--judge, or judge1 in [review])")
    keep_judge, auditor = pair
    # The roles are part of the cached requests' keys: the same as every earlier keep review.
    keep_judge.role, auditor.role = "keep", "audit"
    before = count_keep_reviews(options.output)
    standing = before.reviewed - before.decisions[f"reject: {JUDGE_ERROR}"]  # a judge_error review is retried
    total = max(0, sum(1 for _ in iter_lines(options.pool)) - standing)
    with stage(reporter, "reviewing", total):
        run, ledger = review_single_turn_pool(
            options.pool, options.output, keep_judge, auditor, workers=options.workers, spend_cap_usd=options.spend_cap,
            on_done=lambda _review: reporter.advance(1),
        )  # fmt: skip
    return SingleTurnReviewSummary(run, ledger, count_keep_reviews(options.output))
