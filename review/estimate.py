"""What reviewing a pool will cost, before anything is sent.

The judge-1 requests are built exactly as a review builds them (review_trajectory with
``defer``, against the call cache, so what the cache already answers costs nothing) and
counted with tiktoken over the Qwen3.6 ranks: the vendors' own tokenizers count somewhat
differently (Claude's usually more). Judge-2 requests depend on judge 1's answers: those
whose judge-1 answer is cached are counted exactly, the others from the pricing table's
``[assumptions]`` (requests per judged trajectory, each the judge-2 prompt and an average
step of that trajectory). Output lengths are assumed too.

Prompt caching is priced best case: each request reads the longest prefix an earlier one
wrote (the judge instructions, the agent's system prompt, the task statement shared by a
task's rollouts) and writes the rest of its own shared prefixes; prefixes shorter than the
model's minimum are not cached. The unique rest of each request is never cached.
"""

from __future__ import annotations

import hashlib
import tomllib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from harness.policies.base import PolicySpec
from records.review import numbered_steps
from records.trajectory import Trajectory
from review.judges import CallCache, Judge, JudgeRequest, Ledger, prompt, review_trajectory
from review.reading import count_tokens, render_step
from review.reasoning import assumed_reasoning
from review.resume import reviewed_ids

PRICES = Path(__file__).parent / "prices.toml"


class ModelPrice(BaseModel):
    model_config = ConfigDict(extra="forbid")
    provider: Literal["anthropic", "openai"]
    input: float = Field(ge=0)
    output: float = Field(ge=0)
    cache_read: float = Field(ge=0)
    cache_write: float = Field(ge=0)
    min_cache_tokens: int = Field(1024, ge=0)
    batch_discount: float = Field(0.5, gt=0, le=1)
    cache_in_batch: bool = True


# Reasoning tokens a request is assumed to spend at each effort level (billed as output).
EFFORT_TOKENS = {"none": 0, "minimal": 250, "low": 1_000, "medium": 3_000, "high": 8_000, "xhigh": 16_000, "max": 24_000}


class Assumptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    judge1_output_tokens: int = Field(800, ge=0)
    judge2_output_tokens: int = Field(300, ge=0)
    judge2_requests_per_judged: float = Field(1.0, ge=0)
    # Reasoning: a judge with an Anthropic thinking budget is assumed to think this share of
    # it a request; one with a reasoning effort, the level's tokens.
    thinking_budget_share: float = Field(0.5, ge=0, le=1)
    effort_reasoning_tokens: dict[str, int] = Field(default_factory=lambda: dict(EFFORT_TOKENS))

    def reasoning(self, spec: PolicySpec) -> tuple[int, str]:
        """The reasoning tokens a request of ``spec`` is assumed to spend, and why."""
        return assumed_reasoning(spec.sampling, {**EFFORT_TOKENS, **self.effort_reasoning_tokens}, self.thinking_budget_share)


class UnknownModel(LookupError):
    """No entry in the pricing table for a judge's model."""


class PriceTable(BaseModel):
    model_config = ConfigDict(extra="forbid")
    as_of: str = ""
    source: str = ""
    models: dict[str, ModelPrice] = {}
    assumptions: Assumptions = Assumptions()

    def price(self, model: str) -> ModelPrice:
        """The entry for ``model``, or for the longest name it starts with (a dated
        snapshot such as ``claude-sonnet-4-5-20250929`` is priced as its model)."""
        if model in self.models:
            return self.models[model]
        matches = [name for name in self.models if model.startswith(name)]
        if not matches:
            raise UnknownModel(
                f'no price for model {model!r} (known: {", ".join(sorted(self.models))}); add [models."{model}"] to a --prices file'
            )
        return self.models[max(matches, key=len)]


class PricesError(ValueError):
    pass


def judge_specs(
    table: PriceTable,
    *,
    backend: str,
    base_url: str | None,
    judge2_base_url: str | None = None,
    api_key_env: str | None = None,
    price_in: float | None = None,
    price_out: float | None = None,
    price_cached_in: float | None = None,
    sampling: dict[str, dict[str, Any]] | None = None,
) -> Callable[[str, str], PolicySpec]:
    """How each judge (model, role) is called and priced: the table's prices for a model it
    knows, unless given (an unknown model costs 0 unless given); ``sampling`` by role, its
    reasoning and sampling fields (``review.reasoning``). What ``relearn review``, its bench
    and the pipeline's review stage all build their judges from."""

    def spec(model: str, role: str) -> PolicySpec:
        url = (judge2_base_url or base_url) if role == "judge2" else base_url
        try:
            listed = table.price(model)
            known: tuple[float, float, float | None] = (listed.input, listed.output, listed.cache_read)
        except UnknownModel:
            known = (0.0, 0.0, None)
        cached_in = price_cached_in if price_cached_in is not None else (known[2] if price_in is None else None)
        # A judge needs no token ids, and api.openai.com refuses vLLM's request for them.
        return PolicySpec(
            kind=backend, model=model, base_url=url, api_key_env=api_key_env, request_token_ids=False,  # type: ignore[arg-type]
            price_in_per_mtok=known[0] if price_in is None else price_in,
            price_out_per_mtok=known[1] if price_out is None else price_out,
            price_cached_in_per_mtok=cached_in, sampling=dict((sampling or {}).get(role) or {}),
        )  # fmt: skip

    return spec


def load_prices(override: Path | None = None) -> PriceTable:
    """The shipped table, with ``override``'s models and assumptions laid over it."""
    data = _read_toml(PRICES)
    if override is not None:
        extra = _read_toml(override)
        unknown = sorted(set(extra) - {"as_of", "source", "models", "assumptions"})
        if unknown:
            raise PricesError(f"{override}: unknown keys {unknown}; expected as_of, source, [models.NAME], [assumptions]")
        data = {**data, **{k: v for k, v in extra.items() if k in ("as_of", "source")}}
        data["models"] = {**data.get("models", {}), **extra.get("models", {})}
        data["assumptions"] = {**data.get("assumptions", {}), **extra.get("assumptions", {})}
    try:
        return PriceTable.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise PricesError(f"{override or PRICES}: {where}: {first['msg']}") from exc


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text())
    except FileNotFoundError as exc:
        raise PricesError(f"{path}: no such prices file") from exc
    except tomllib.TOMLDecodeError as exc:
        raise PricesError(f"{path}: not TOML: {exc}") from exc


# ---- counting ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Shape:
    """One request as the bill sees it: its input tokens, the shared prefixes it ends in a
    cache breakpoint (an id and the tokens up to it, shortest first), its output tokens (of
    which ``reasoning_tokens`` are assumed reasoning)."""

    tokens: int
    prefixes: tuple[tuple[str, int], ...]
    output_tokens: int
    reasoning_tokens: int = 0


@dataclass
class Totals:
    requests: float = 0
    input_tokens: float = 0
    output_tokens: float = 0  # reasoning tokens included
    reasoning_tokens: float = 0  # assumed from the judge's settings
    cache_read_tokens: float = 0  # best case, see the module docstring
    cache_write_tokens: float = 0
    exact: bool = True  # False where judge-2 counts are assumed

    def add(self, shapes: Iterable[Shape], price: ModelPrice, scale: float = 1.0) -> None:
        """Count ``shapes`` (``scale`` times each: an assumed number of requests)."""
        written: set[str] = set()
        for shape in shapes:
            self.requests += scale
            self.input_tokens += shape.tokens * scale
            self.output_tokens += shape.output_tokens * scale
            self.reasoning_tokens += shape.reasoning_tokens * scale
            cacheable = [(key, tokens) for key, tokens in shape.prefixes if tokens >= price.min_cache_tokens]
            read = max((tokens for key, tokens in cacheable if key in written), default=0)
            longest = max((tokens for _key, tokens in cacheable), default=0)
            self.cache_read_tokens += read * scale
            self.cache_write_tokens += max(longest - read, 0) * scale
            written.update(key for key, _tokens in cacheable)

    def dollars(self, price: ModelPrice, *, batch: bool, cached: bool) -> float:
        read = write = 0.0
        if cached and (price.cache_in_batch or not batch):
            read, write = self.cache_read_tokens, self.cache_write_tokens
        plain = self.input_tokens - read - write
        total = plain * price.input + read * price.cache_read + write * price.cache_write + self.output_tokens * price.output
        return total / 1_000_000 * (price.batch_discount if batch else 1.0)


@dataclass
class JudgeEstimate:
    role: str
    model: str
    price: ModelPrice
    totals: Totals = field(default_factory=Totals)
    reasoning: str = ""  # how its reasoning tokens were assumed ("" for none)

    def row(self) -> dict[str, Any]:
        t, p = self.totals, self.price
        return {
            "judge": self.role,
            "model": self.model,
            "requests": round(t.requests),
            "input_tokens": round(t.input_tokens),
            "cache_read_tokens": round(t.cache_read_tokens),
            "cache_write_tokens": round(t.cache_write_tokens),
            "output_tokens": round(t.output_tokens),
            "reasoning_tokens": round(t.reasoning_tokens),
            "reasoning_assumed": self.reasoning,
            "exact": t.exact,
            "usd": round(t.dollars(p, batch=False, cached=False), 2),
            "usd_cached": round(t.dollars(p, batch=False, cached=True), 2),
            "usd_batch": round(t.dollars(p, batch=True, cached=False), 2),
            "usd_batch_cached": round(t.dollars(p, batch=True, cached=True), 2),
        }


def shape_of(request: JudgeRequest, output_tokens: int, reasoning_tokens: int = 0) -> Shape:
    """``output_tokens`` of answer and ``reasoning_tokens`` of reasoning, both billed as output."""
    system = count_tokens(request.system)
    prefixes = [(_digest(request.role, request.spec.model, request.system), system)]
    for end in request.prefix_ends:
        shared = request.user[:end]
        prefixes.append((_digest(request.role, request.spec.model, request.system, shared), system + count_tokens(shared)))
    return Shape(system + count_tokens(request.user), tuple(prefixes), output_tokens + reasoning_tokens, reasoning_tokens)


def _digest(*parts: str) -> str:
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()


def estimate(trajectories: Iterable[Trajectory], judges: tuple[Judge, Judge], cache: CallCache, table: PriceTable) -> list[JudgeEstimate]:
    """The two judges' estimates for reviewing ``trajectories`` (already filtered to the
    verified ones a review sends to the judges)."""
    a = table.assumptions
    first = JudgeEstimate("judge1", judges[0].spec.model, table.price(judges[0].spec.model))
    second = JudgeEstimate("judge2", judges[1].spec.model, table.price(judges[1].spec.model))
    thinks1, first.reasoning = a.reasoning(judges[0].spec)
    thinks2, second.reasoning = a.reasoning(judges[1].spec)
    judge1_shapes: list[Shape] = []
    judge2_shapes: list[Shape] = []
    assumed: list[Shape] = []
    judge2_prompt = prompt("judge2")
    judge2_system = count_tokens(judge2_prompt)
    judge2_prefix = ((_digest("judge2", second.model, judge2_prompt), judge2_system),)
    ledger = Ledger()
    for trajectory in trajectories:
        deferred: list[JudgeRequest] = []
        review_trajectory(trajectory, judges[0], judges[1], cache, ledger, defer=deferred)
        for request in deferred:
            if request.role == "judge1":
                judge1_shapes.append(shape_of(request, a.judge1_output_tokens, thinks1))
            else:
                judge2_shapes.append(shape_of(request, a.judge2_output_tokens, thinks2))
        if any(r.role == "judge1" for r in deferred):
            # Judge 2 will read one step of this trajectory per confirmed error: priced as
            # its average step, with one error listed.
            steps = [
                render_step(trajectory.messages[i], ["[category] a one-line description of the error"])
                for i in numbered_steps(trajectory).values()
            ]
            if steps:
                mean = sum(count_tokens(s) for s in steps) / len(steps)
                assumed.append(Shape(round(judge2_system + mean), judge2_prefix, a.judge2_output_tokens + thinks2, thinks2))
    first.totals.add(judge1_shapes, first.price)
    second.totals.add(judge2_shapes, second.price)
    if assumed:
        second.totals.add(assumed, second.price, scale=a.judge2_requests_per_judged)
        second.totals.exact = False
    return [first, second]


def synthetic(
    tasks: int,
    rollouts: int,
    tokens: int,
    *,
    shared_pool: int,
    shared_task: int,
    judge2_tokens: int,
    models: tuple[str, str],
    table: PriceTable,
) -> list[JudgeEstimate]:
    """The estimate for a pool described by its sizes alone: ``tasks`` × ``rollouts``
    trajectories of ``tokens`` judge-1 tokens each, whose first ``shared_pool`` tokens
    (instructions and agent system prompt) are the same for all and first ``shared_task``
    for a task's rollouts; judge 2 reads ``judge2_tokens`` a request. (The figures in docs/review.md.)"""
    a = table.assumptions
    first = JudgeEstimate("judge1", models[0], table.price(models[0]))
    second = JudgeEstimate("judge2", models[1], table.price(models[1]))
    first.totals.add(
        (
            Shape(tokens, (("pool", shared_pool), (f"task{task}", shared_task)), a.judge1_output_tokens)
            for task in range(tasks)
            for _rollout in range(rollouts)
        ),
        first.price,
    )
    instructions = (("judge2", count_tokens(prompt("judge2"))),)
    second.totals.add(
        (Shape(judge2_tokens, instructions, a.judge2_output_tokens) for _ in range(tasks * rollouts)),
        second.price,
        scale=a.judge2_requests_per_judged,
    )
    second.totals.exact = False
    return [first, second]


def estimate_pool(
    pool: Path, output: Path, judges: tuple[Judge, Judge], table: PriceTable, *, include_suspicious: bool = False
) -> tuple[list[JudgeEstimate], int]:
    """The estimate for what ``relearn review POOL -o OUTPUT`` would still send (reviewed
    trajectories and cached answers cost nothing), and how many trajectories it covers."""
    import tempfile

    from records.pools import read_trajectories_lenient
    from records.trajectory import is_verified_positive

    done = reviewed_ids(output)
    todo = [
        t for t in read_trajectories_lenient(pool, []) if t.id not in done and is_verified_positive(t, allow_suspicious=include_suspicious)
    ]
    calls = output.with_name(output.name + ".calls.jsonl")
    with tempfile.TemporaryDirectory() as scratch:
        # Only read: without a calls file, an empty cache that writes nowhere that matters.
        cache = CallCache(calls if calls.exists() else Path(scratch) / "calls.jsonl")
        try:
            return estimate(todo, judges, cache, table), len(todo)
        finally:
            cache.close()


def render(estimates: list[JudgeEstimate], trajectories: int, table: PriceTable) -> Any:
    """A rich Table of the estimate, one row per judge and a total."""
    from rich.table import Table

    out = Table(title=f"estimate for {trajectories:,} trajectories (prices as of {table.as_of or '?'}: check them)")
    for column in ("judge", "model", "requests", "input tok", "cache read", "output tok", "$", "$ cached", "$ batch", "$ batch+cached"):
        out.add_column(column, justify="left" if column in ("judge", "model") else "right")
    rows = [e.row() for e in estimates]
    for row in rows:
        approx = "" if row["exact"] else "~"
        out.add_row(
            row["judge"], row["model"], f"{approx}{row['requests']:,}", f"{approx}{row['input_tokens']:,}", f"{approx}{row['cache_read_tokens']:,}", f"{approx}{row['output_tokens']:,}",
            *(f"{row[k]:,.2f}" for k in ("usd", "usd_cached", "usd_batch", "usd_batch_cached")),
        )  # fmt: skip
    out.add_row(
        "total", "", "", "", "", "", *(f"{sum(r[k] for r in rows):,.2f}" for k in ("usd", "usd_cached", "usd_batch", "usd_batch_cached"))
    )
    out.caption = "~: assumed (judge-2 requests and all output lengths depend on answers not yet given); tokens counted with tiktoken over the Qwen3.6 ranks"
    thinking = [
        f"{e.role} {round(e.totals.reasoning_tokens / e.totals.requests):,} a request ({e.reasoning})"
        for e in estimates
        if e.reasoning and e.totals.requests
    ]
    if thinking:
        out.caption += "\noutput tok include reasoning tokens, assumed from the judges' settings and [assumptions]: " + "; ".join(thinking)
    return out
