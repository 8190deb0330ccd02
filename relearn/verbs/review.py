"""What `relearn review`, `review agree`, `review bench` and `review label` accept (the pipeline's
``[review]``); the work is ``relearn.ops.review`` and ``relearn.ops.review_bench``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from relearn.options import nested, option, same_as
from relearn.verbs.containers import ContainerOptions
from review.reading import DEFAULT_JUDGE_CONTEXT
from review.reasoning import Effort

JudgeBackend = Literal["anthropic", "chat", "responses"]
Reviewer = Literal["judges", "heuristic"]
PIPELINE_PATHS = "the pipeline names it: the work folder's verified pool and reviews.jsonl"


@dataclass
class JudgeOptions:
    """Who reviews and at what price (``relearn review`` and ``relearn review bench``)."""

    judge1: str | None = option(None, "Model of judge 1 (confirms errors).", metavar="MODEL")
    judge2: str | None = option(None, "Model of judge 2 (localizes them); defaults to judge 1's.", metavar="MODEL")
    reviewer: Reviewer = option(
        "judges", "judges: the two LLM judges named by --judge1 and --judge2, the paper's reviewer (one of them must be named) | "
        "heuristic: the offline heuristic reviewer, asked for by name: no model is called, and its own bench says it finds about "
        "half the errors and accepts reward hacks, so it is for demos and tests, not for a pool you train on.",
    )  # fmt: skip
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
    # How each judge reasons and samples (review.reasoning): judge 2 takes judge 1's unless given.
    reasoning_effort: Effort | None = option(
        None, "Judge 1's reasoning effort: responses sends reasoning.effort, chat reasoning_effort, anthropic output_config.effort "
        "(low to max). Which levels a model takes varies (default: the model's own).",
    )  # fmt: skip
    judge2_reasoning_effort: Effort | None = option(None, "Judge 2's reasoning effort, when it differs (default: judge 1's).")
    thinking_budget: int | None = option(
        None, "Judge 1's Anthropic extended thinking: thinking {type: enabled, budget_tokens: N}, N at least 1024; max_tokens becomes "
        "N + 4096. Takes no --temperature. 0: no thinking.", ge=0, metavar="TOKENS",
    )  # fmt: skip
    judge2_thinking_budget: int | None = option(
        None, "Judge 2's thinking budget, when it differs (default: judge 1's; 0: none).", ge=0, metavar="TOKENS"
    )
    temperature: float | None = option(None, "Judge 1's sampling temperature (default: the server's).", ge=0, le=2)
    judge2_temperature: float | None = option(None, "Judge 2's temperature, when it differs (default: judge 1's).", ge=0, le=2)
    # The pipeline writes it as a table ({ chat_template_kwargs = { enable_thinking = true } }) or as JSON text.
    extra_body: str | None = option(
        None, "A JSON object merged into each judge-1 request body (the SDKs' extra_body), e.g. "
        "'{\"chat_template_kwargs\": {\"enable_thinking\": true}}' for vLLM or SGLang serving an open model.",
        metavar="JSON", table_type=dict[str, Any] | str | None,
    )  # fmt: skip
    judge2_extra_body: str | None = option(
        None, "Judge 2's extra request fields, when they differ (default: judge 1's; '{}': none).", metavar="JSON",
        table_type=dict[str, Any] | str | None,
    )  # fmt: skip

    @property
    def heuristic(self) -> bool:
        return self.reviewer == "heuristic"


@dataclass
class ReviewOptions:
    """Review verified trajectories with two LLM judges (or, with --reviewer heuristic, the offline heuristic reviewer).

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
    """Cohen's kappa on decisions and categories, span F1 and the share of correct tokens wrongly excluded."""

    reference: Path = option(help="The reference reviews.", argument=True, metavar="REFERENCE", exists="file")
    other: Path = option(help="The reviews compared with them.", argument=True, metavar="OTHER", exists="file")
    pool: Path = option(help="The pool both reviews cover (for span agreement).", metavar="POOL", exists="file")


@dataclass
class BenchOptions:
    """Score a reviewer (two judges, or --reviewer heuristic) on a labelled review benchmark.

    Decision accuracy and Cohen's kappa, error detection per step and category, span F1 over excluded words, minimality, collateral damage, no_valid_target and grounding failures, cost, tokens and seconds per trajectory, into DIR/bench.json and DIR/bench.md (the case format is in docs/review.md). Rerunning into the same DIR resumes and pays for nothing twice; DIR is refused for another reviewer or case set.
    """

    # Named on purpose, never defaulted: a rerun into it resumes, and it is refused for another bench.
    output: Path = option(help="The results folder (bench.json, bench.md, the reviews).", flags=("-o", "--output"), metavar="DIR")
    bench: Path | None = option(
        None, "A labelled case set (default: the shipped one in review/bench/cases/).", argument=True, metavar="BENCH"
    )
    judges: JudgeOptions = nested(JudgeOptions)
    workers: int = same_as(ReviewOptions, "workers")  # 1 measures each trajectory's seconds and tokens exactly
    spend_cap: float | None = same_as(ReviewOptions, "spend_cap")
    include_suspicious: bool = same_as(ReviewOptions, "include_suspicious")


@dataclass
class LabelOptions:
    """Turn reviews written or corrected by hand into labelled cases for `relearn review bench`: each error takes the defects of its step and category as its gold spans."""

    pool: Path = option(help="The pool the reviews cover.", argument=True, metavar="POOL", exists="file")
    reviews: Path = option(
        help="Reviews that say what a perfect reviewer would (their gold labels).", argument=True, metavar="REVIEWS", exists="file"
    )
    output: Path = option(help="The cases file to write.", flags=("-o", "--output"), metavar="FILE")
