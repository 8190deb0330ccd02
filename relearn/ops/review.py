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
from typing import TYPE_CHECKING, Any, Literal, get_args

from envs.executor import Needs
from records.pools import iter_lines
from records.review import Review, latest_reviews
from relearn.ops.containers import ContainerOptions, open_backend
from relearn.ops.outputs import REVIEWS, check_jsonl_output, empty_pool, prepare_parent
from relearn.ops.reporting import SILENT, OpError, Reporter, stage
from relearn.options import nested, option, same_as
from review.reading import DEFAULT_JUDGE_CONTEXT

if TYPE_CHECKING:
    from review.estimate import JudgeEstimate, PriceTable
    from review.judges import Judge, Ledger
    from review.run import ReviewSummary as PoolReview

JudgeBackend = Literal["anthropic", "chat", "responses"]
PIPELINE_PATHS = "the pipeline names it: the work folder's verified pool and reviews.jsonl"


@dataclass
class JudgeOptions:
    """Who reviews and at what price (``relearn review`` and ``relearn review bench``)."""

    judge1: str | None = option(
        None, "Model of judge 1 (confirms errors). Omit both judges for the offline heuristic reviewer.", metavar="MODEL"
    )
    judge2: str | None = option(None, "Model of judge 2 (localizes them); defaults to judge 1's.", metavar="MODEL")
    backend: JudgeBackend = option("anthropic", "anthropic | chat (any OpenAI-compatible server) | responses.")
    base_url: str | None = option(None, "Judge endpoint (default: the provider's).", metavar="URL")
    judge2_base_url: str | None = option(None, "Judge 2 endpoint, when it differs.", metavar="URL")
    api_key_env: str | None = option(None, "Environment variable holding the API key.", metavar="NAME")
    price_in: float | None = option(
        None, "USD per million input tokens (default: the pricing table's price for the judge's model, else 0).", ge=0, metavar="USD"
    )
    price_out: float | None = option(None, "USD per million output tokens (default: from the pricing table, else 0).", ge=0, metavar="USD")
    price_cached_in: float | None = option(
        None, "USD per million prompt tokens read from the provider's prompt cache (default: from the pricing table, else --price-in).",
        ge=0, metavar="USD",
    )  # fmt: skip
    # The pipeline resolves it against its file's folder.
    prices: Path | None = option(
        None, "A TOML pricing table laid over the shipped one (review/prices.toml: [models.NAME] input, output, cache_read, "
        "cache_write, min_cache_tokens, batch_discount, cache_in_batch; [assumptions]).", metavar="FILE",
    )  # fmt: skip
    context: int = option(
        DEFAULT_JUDGE_CONTEXT, "Tokens of prompt a judge reads at most (counted with tiktoken over the Qwen3.6 ranks). Judge 1 reads "
        "the whole trajectory; past this, only the middles of the longest tool outputs are elided, and the prompt says so. A "
        "trajectory whose task and agent text alone exceed it is rejected as too_long_for_judge and counted.",
        flags=("--judge-context",), table_name="judge_context", ge=1000, metavar="TOKENS",
    )  # fmt: skip

    @property
    def heuristic(self) -> bool:
        return self.judge1 is None and self.judge2 is None


@dataclass
class ReviewOptions:
    """Review verified trajectories with two LLM judges (or, without --judge1, the offline heuristic reviewer).

    `relearn review POOL -o reviews.jsonl --judge1 M --judge2 M` prints accepted, rejected by reason, errors by category, grounded/rejected spans and cost; a rerun costs nothing. Judge 1 reads the task statement, every step and the verifier's evidence whole (see --judge-context). Judge 2 quotes each confirmed error; every quote of an error must ground in the step's text, or the trajectory is rejected as no_valid_target.

    `relearn review POOL --judge1 M --estimate` prints what the review would cost before anything is paid: requests and tokens per judge, and dollars with and without batch mode and prompt caching, from the shipped pricing table (check its prices; override with --prices).

    `--batch` sends every judge-1 request as one batch (several past the vendors' size limits), waits, then does the same for judge 2; the answers fill the same call cache, so a later run without --batch costs nothing. Requests are laid out for prompt caching either way: the judge instructions and the trajectory's shared start (agent system prompt, task) come first.
    """

    pool: Path = option(
        help="The verified pool to review (.jsonl or .jsonl.zst).", argument=True, metavar="POOL", front="cli", why=PIPELINE_PATHS
    )
    output: Path = option(
        Path("reviews.jsonl"), "Reviews JSONL (appended; reviewed trajectories are skipped).", flags=("-o", "--output"),
        metavar="FILE", front="cli", why=PIPELINE_PATHS,
    )  # fmt: skip
    judges: JudgeOptions = nested(JudgeOptions)
    workers: int = option(4, "Trajectories reviewed at once.", ge=1)
    spend_cap: float | None = option(
        None, "Hard cap in USD: no judge call starts once it is spent.", ge=0, metavar="USD", table_name="spend_cap_usd"
    )
    estimate: bool = option(
        False, "Send nothing: count what the review would send (requests, input and output tokens per judge, with tiktoken) and "
        "print its cost from the pricing table, plain, with prompt caching, in batch mode, and both.", flag_only=True,
    )  # fmt: skip
    batch: bool = option(
        False, "Send the judges' requests as Anthropic Message Batches or OpenAI Batches (half price, answers within 24 h): judge 1 "
        "for the whole pool, then judge 2 for what it accepted. Batch ids are kept in OUTPUT.batches.json, so a run killed while "
        "waiting polls them again instead of paying twice; requests a batch could not answer are sent one by one.", flag_only=True,
    )  # fmt: skip
    poll_interval: float = option(60.0, "With --batch: seconds between polls of a batch's status.", gt=0, metavar="SECONDS")
    include_suspicious: bool = option(
        False, "Also review successes the verifier found suspicious (by default they are rejected unreviewed, at no cost)."
    )
    ray: str | None = same_as(ContainerOptions, "ray")


@dataclass
class AgreeOptions:
    """``relearn review agree``: two reviews of one pool compared."""

    reference: Path = option(help="The reference reviews.", argument=True, metavar="REFERENCE", exists="file")
    other: Path = option(help="The reviews compared with them.", argument=True, metavar="OTHER", exists="file")
    pool: Path = option(help="The pool both reviews cover (for span agreement).", metavar="POOL", exists="file")


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

    if options.backend not in get_args(JudgeBackend):
        raise OpError(f"--backend must be anthropic, chat or responses, not {options.backend!r}")
    try:
        table = load_prices(options.prices)
    except PricesError as exc:
        raise OpError(str(exc)) from None
    spec = judge_specs(
        table, backend=options.backend, base_url=options.base_url, judge2_base_url=options.judge2_base_url,
        api_key_env=options.api_key_env, price_in=options.price_in, price_out=options.price_out,
        price_cached_in=options.price_cached_in,
    )  # fmt: skip
    return judge_pair(options.judge1, options.judge2, spec, context=options.context), table


def check_options(options: ReviewOptions) -> None:
    if not options.pool.is_file():
        raise OpError(f"{options.pool}: no such pool")
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
    with open_backend(options.ray, Needs(cpus=0.5)) as backend, stage(reporter, "reviewing", total):

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
