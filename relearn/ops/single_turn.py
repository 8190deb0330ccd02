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
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, get_args

from harness.import_run import ImportSummary
from records.pools import JsonlWriter, RecordError, iter_lines, read_trajectories_lenient
from records.review import Review, latest_reviews
from records.trajectory import Trajectory
from relearn.ops.containers import docker_client, sweep_orphans
from relearn.ops.importing import import_reporting
from relearn.ops.outputs import POOL, REVIEWS, check_jsonl_output, prepare_parent
from relearn.ops.reporting import SILENT, OpError, Reporter, stage
from relearn.ops.review import make_judges
from relearn.verbs.single_turn import COLUMNS, SingleTurnFormat, SingleTurnImportOptions, SingleTurnReviewOptions, SingleTurnVerifyOptions

if TYPE_CHECKING:
    from review.judges import Ledger
    from review.run import ReviewSummary as PoolReview

FORMATS: tuple[str, ...] = get_args(SingleTurnFormat)


# ---- import -------------------------------------------------------------------------------


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
    if options.judges.judge1 is None and options.judges.judge2 is None:  # no heuristic stand-in reviews keep intervals
        raise OpError("the single-turn review needs a keep judge: name its model (--judge, or judge1 in [review])")
    pair, _table = make_judges(options.judges)
    assert pair is not None
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
