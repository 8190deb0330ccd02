"""``relearn review POOL`` and the pipeline's review stage: two LLM judges (or the offline
heuristic reviewer) over a verified pool, into an appended, resumable reviews.jsonl.

The operation owns what every caller must do: the pricing table and the judges' specs, the
cost estimate before anything is paid, the call cache and ledger (inside ``review.run``),
batch mode, and the Ray backend's lifetime."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, get_args

from envs.executor import Needs
from records.pools import iter_lines
from records.review import Review, latest_reviews
from relearn.ops.containers import open_backend
from relearn.ops.outputs import POOL, REVIEWS, check_jsonl_input, check_jsonl_output, empty_pool, output_lock, prepare_parent
from relearn.ops.reporting import SILENT, OpError, Reporter, stage
from relearn.verbs.review import AgreeOptions, JudgeBackend, JudgeOptions, ReviewOptions

if TYPE_CHECKING:
    from review.estimate import JudgeEstimate, PriceTable
    from review.judges import Judge, Ledger
    from review.run import ReviewSummary as PoolReview


@dataclass
class Estimate:
    """What the review would send and cost (``--estimate``, and before every paid review)."""

    estimates: list[JudgeEstimate]
    trajectories: int
    table: PriceTable

    def render(self) -> Any:
        from review.estimate import render

        return render(self.estimates, self.trajectories, self.table)


@dataclass
class ReviewCounts:
    """The output file in one pass, latest line of each trajectory: what later stages read."""

    reviewed: int = 0
    decisions: Counter[str] = field(default_factory=Counter)
    defects: int = 0
    unreadable: int = 0


@dataclass
class ReviewRunSummary:
    reviewer: str  # "judges" or "heuristic"
    estimate: Estimate | None = None  # with judges, when the prices are known
    run: PoolReview | None = None  # None with ``estimate``: nothing was reviewed
    ledger: Ledger | None = None
    pool: Path = Path()
    records: int = 0  # lines of the pool, readable or not

    @property
    def warnings(self) -> list[str]:
        """A review that had nothing to review: the front-ends warn and the verb exits 1."""
        return [empty_pool(self.pool)] if self.run is not None and not self.records else []

    @property
    def partial(self) -> bool:
        return self.run is not None and bool(self.run.errors or self.run.unreadable)


def count_reviews(path: Path) -> ReviewCounts:
    """Decisions and defects of the latest review of each trajectory, streamed: memory holds
    one small entry per trajectory, never the reviews."""
    latest, unreadable = latest_reviews(path, lambda review: (review.decision, len(review.defects)))
    counts = ReviewCounts(unreadable=unreadable)
    counts.reviewed = len(latest)
    counts.decisions = Counter(decision for decision, _ in latest.values())
    counts.defects = sum(n for _, n in latest.values())
    return counts


def make_judges(options: JudgeOptions) -> tuple[tuple[Judge, Judge] | None, PriceTable]:
    """The two judges (None: the heuristic reviewer) and the pricing table they are paid by."""
    from review.estimate import PricesError, judge_specs, load_prices
    from review.judges import judge_pair

    check_reviewer(options)
    if options.backend not in get_args(JudgeBackend):
        raise OpError(f"--backend must be anthropic, chat or responses, not {options.backend!r}")
    try:
        table = load_prices(options.prices)
    except PricesError as exc:
        raise OpError(str(exc)) from None
    spec = judge_specs(
        table, backend=options.backend, base_url=options.base_url, judge2_base_url=options.judge2_base_url,
        api_key_env=options.api_key_env, price_in=options.price_in, price_out=options.price_out,
        price_cached_in=options.price_cached_in, sampling=judge_sampling(options),
    )  # fmt: skip
    return judge_pair(options.judge1, options.judge2, spec, context=options.context), table


def check_reviewer(options: JudgeOptions) -> None:
    """Judges named, or the heuristic reviewer asked for by name: never the stand-in by default."""
    named = options.judge1 is not None or options.judge2 is not None
    if options.reviewer == "heuristic" and named:
        raise OpError("--reviewer heuristic calls no judge: drop --judge1/--judge2, or leave --reviewer at judges")
    if options.reviewer == "judges" and not named:
        raise OpError(
            "no reviewer: name the judges (--judge1 MODEL, and --judge2 MODEL when it differs), or ask for the offline heuristic "
            "reviewer by name (--reviewer heuristic; it is for demos and tests)"
        )


def judge_sampling(options: JudgeOptions) -> dict[str, dict[str, Any]]:
    """Each judge's reasoning and sampling fields on the wire (``review.reasoning``), judge 2's
    settings defaulting one by one to judge 1's; ``OpError`` names what the backend would refuse."""
    from review.reasoning import JudgeSettings, SettingsError, parse_extra_body, sampling

    def given(value: Any, fallback: Any) -> Any:
        return fallback if value is None else value

    try:
        extra1 = parse_extra_body(options.extra_body, "--extra-body")
        extra2 = parse_extra_body(options.judge2_extra_body, "--judge2-extra-body") if options.judge2_extra_body is not None else extra1
        first = JudgeSettings(options.reasoning_effort, options.thinking_budget, options.temperature, extra1)
        second = JudgeSettings(
            given(options.judge2_reasoning_effort, first.reasoning_effort), given(options.judge2_thinking_budget, first.thinking_budget),
            given(options.judge2_temperature, first.temperature), extra2, flag="--judge2-",
        )  # fmt: skip
        return {"judge1": sampling(options.backend, first), "judge2": sampling(options.backend, second)}
    except SettingsError as exc:
        raise OpError(str(exc)) from None


def check_options(options: ReviewOptions) -> None:
    if not options.pool.is_file():
        raise OpError(f"{options.pool}: no such pool")
    check_jsonl_input(options.pool, POOL, flag="POOL")
    check_jsonl_output(options.output, REVIEWS)
    if options.ray is not None and options.batch:
        raise OpError("--batch and --ray do not go together: the batches are one account, submit them from one machine")
    if options.judges.heuristic:
        if options.estimate:
            raise OpError("--estimate prices the judges: name --judge1 (the heuristic reviewer costs nothing)")
        if options.batch:
            raise OpError("--batch sends the judges' requests: name --judge1")


def estimate_review(options: ReviewOptions, judges: tuple[Judge, Judge], table: PriceTable) -> Estimate:
    """What reviewing ``options.pool`` into ``options.output`` would still send; ``OpError``
    (from ``UnknownModel``) when a judge's model has no price."""
    from review.estimate import UnknownModel, estimate_pool

    try:
        estimates, count = estimate_pool(options.pool, options.output, judges, table, include_suspicious=options.include_suspicious)
    except UnknownModel as exc:
        raise OpError(str(exc)) from None
    return Estimate(estimates, count, table)


def run_review(
    options: ReviewOptions, reporter: Reporter = SILENT, *, on_estimate: Callable[[Estimate], None] | None = None
) -> ReviewRunSummary:
    """Review every trajectory of ``options.pool`` not yet in ``options.output``. With judges
    and ``on_estimate``, the estimate is made first and handed to it before anything is paid
    (``reporter.note`` says when it cannot be made); with ``options.estimate`` only the
    estimate is made. Raises ``OpError`` for unusable options."""
    from review.batch import BatchOptions
    from review.run import review_pool

    check_options(options)
    judges, table = make_judges(options.judges)
    summary = ReviewRunSummary("judges" if judges else "heuristic", pool=options.pool)
    if judges is not None and (options.estimate or on_estimate is not None):
        try:
            summary.estimate = estimate_review(options, judges, table)
        except OpError as exc:
            if options.estimate:
                raise
            reporter.note(f"no cost estimate: {exc}")
        if summary.estimate is not None and on_estimate is not None:
            on_estimate(summary.estimate)
    if options.estimate:
        return summary
    total = summary.records = sum(1 for _ in iter_lines(options.pool))
    prepare_parent(options.output, reporter)
    batching = BatchOptions(poll_s=options.poll_interval, on_event=reporter.note) if options.batch else None
    with output_lock(options.output), open_backend(options.ray, Needs(cpus=0.5)) as backend, stage(reporter, "reviewing", total):

        def done(_review: Review | None, ledger: Ledger) -> None:
            reporter.advance(1, spent=f"${ledger.spent_usd:.4f}")

        summary.run, summary.ledger = review_pool(
            options.pool, options.output, judges=judges, workers=options.workers, spend_cap_usd=options.spend_cap, on_done=done,
            include_suspicious=options.include_suspicious, batch=batching, backend=backend,
        )  # fmt: skip
    return summary


@dataclass
class AgreeSummary:
    result: dict[str, Any]  # kappa on decisions and categories, span F1, correct tokens wrongly excluded
    unreadable: int  # pool records that could not be read


def run_agree(options: AgreeOptions, reporter: Reporter = SILENT) -> AgreeSummary:
    from records.pools import RecordError, read_trajectories_lenient
    from review.agreement import agreement

    errors: list[RecordError] = []
    trajectories = {t.id: t for t in read_trajectories_lenient(options.pool, errors)}
    reference, other = (latest_reviews(path, lambda review: review)[0] for path in (options.reference, options.other))
    return AgreeSummary(agreement(reference, other, trajectories), len(errors))
