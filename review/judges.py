"""The two judges: judge 1 confirms errors, judge 2 localizes each to verbatim quotes, and
deterministic grounding turns quotes into defect spans.

Judges are called through the harness's policy clients (Anthropic Messages, OpenAI Chat
Completions or Responses, any OpenAI-compatible server), asking for JSON in the
provider's structured-output form. Prompts are the versioned files in
``review/prompts/``; their hash is recorded in every Review. Every paid call is cached
by its exact request, appended and flushed, so a crash loses nothing already paid for.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ValidationError

from harness.policies.base import PolicyError, PolicySpec, SdkPolicy
from harness.policies.make import make_policy
from records.pools import JsonlWriter, iter_lines
from records.review import CATEGORIES, Defect, Review, numbered_steps
from records.trajectory import Message, Trajectory, Usage
from review.grounding import ground
from review.prefilters import prefilter
from review.reading import DEFAULT_JUDGE_CONTEXT, TOO_LONG, TooLongForJudge, count_tokens, render_for_reading, render_step

PROMPTS = Path(__file__).parent / "prompts"
# A review that says the judges could not be used (unusable answers, a failing endpoint): the
# trajectory is rejected for now, and a rerun reviews it again.
JUDGE_ERROR = "judge_error"


def prompt(name: str) -> str:
    return (PROMPTS / f"{name}.md").read_text()


def prompts_hash() -> str:
    digest = hashlib.sha256()
    for name in ("judge1", "judge2"):
        digest.update(prompt(name).encode())
    return digest.hexdigest()[:16]


# ---- structured outputs ---------------------------------------------------------------


class ConfirmedError(BaseModel):
    step: int
    category: Literal[*CATEGORIES]  # type: ignore[valid-type]
    description: str
    evidence: str = ""


class Omission(BaseModel):
    description: str


class Judge1Output(BaseModel):
    decision: Literal["accept", "reject"]
    reason: str = ""
    errors: list[ConfirmedError] = []
    omissions: list[Omission] = []


class Span(BaseModel):
    error: int
    field: str
    quote: str
    context_before: str = ""
    context_after: str = ""


class Judge2Output(BaseModel):
    spans: list[Span] = []


def structured_output(kind: str, name: str, schema: dict[str, Any]) -> dict[str, Any]:
    """The sampling parameters that ask each provider for JSON matching ``schema``."""
    if kind == "anthropic":
        return {"output_config": {"format": {"type": "json_schema", "schema": schema}}}
    if kind == "responses":
        return {"text": {"format": {"type": "json_schema", "name": name, "schema": schema, "strict": False}}}
    return {"response_format": {"type": "json_schema", "json_schema": {"name": name, "schema": schema}}}


# ---- calls, cache, spend ----------------------------------------------------------------


class SpendCapReached(Exception):
    pass


@dataclass
class Ledger:
    """Spend across a review run, shared by its workers; enforces the hard cap.

    Tokens are counted as the vendors bill them: ``input_tokens`` is the whole prompt, of
    which ``cached_input_tokens`` were read from the provider's prompt cache (billed at the
    spec's cached price); ``batched`` counts the answers that came from a batch (billed at
    the batch discount)."""

    cap_usd: float | None = None
    spent_usd: float = 0.0
    calls: int = 0
    cached: int = 0
    batched: int = 0
    input_tokens: int = 0
    cached_input_tokens: int = 0
    output_tokens: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def before_call(self) -> None:
        with self.lock:
            if self.cap_usd is not None and self.spent_usd >= self.cap_usd:
                raise SpendCapReached(f"spend cap ${self.cap_usd:.2f} reached (${self.spent_usd:.4f} spent)")

    def charge(self, cost: float, usage: Usage | None = None, *, batched: bool = False) -> None:
        with self.lock:
            self.spent_usd += cost
            if batched:
                self.batched += 1
            else:
                self.calls += 1
            if usage is not None:
                self.input_tokens += usage.input_tokens or 0
                self.cached_input_tokens += usage.cached_input_tokens or 0
                self.output_tokens += usage.output_tokens or 0

    def counters(self) -> dict[str, float]:
        """What this ledger counted, for another ledger to ``add`` (a cluster node's unit
        reports its spend to the driver's one ledger this way)."""
        with self.lock:
            return {name: getattr(self, name) for name in LEDGER_COUNTERS}

    def add(self, counters: dict[str, float]) -> None:
        with self.lock:
            for name in LEDGER_COUNTERS:
                setattr(self, name, getattr(self, name) + counters.get(name, 0))


LEDGER_COUNTERS = ("spent_usd", "calls", "cached", "batched", "input_tokens", "cached_input_tokens", "output_tokens")


class CallCache:
    """Judge answers keyed by the exact request; appended and flushed per call."""

    def __init__(self, path: Path) -> None:
        self.entries: dict[str, dict[str, Any]] = {}
        if path.exists():
            for _number, text in iter_lines(path):
                try:
                    entry = json.loads(text)
                except json.JSONDecodeError:
                    continue
                self.entries[entry["key"]] = entry
        self._writer = JsonlWriter(path, fsync=True)
        self._lock = threading.Lock()
        # Answers a batch paid for in this run and no Review has read yet: the first read is
        # the batch's answer arriving (counted as batched), a later read a cache hit.
        self._unattributed: set[str] = set()

    def get(self, key: str) -> dict[str, Any] | None:
        return self.entries.get(key)

    def put(self, key: str, entry: dict[str, Any], *, unattributed: bool = False) -> None:
        with self._lock:
            self.entries[key] = {"key": key, **entry}
            self._writer.write(self.entries[key])
            if unattributed:
                self._unattributed.add(key)

    def attribute(self, key: str) -> bool:
        """True once for an answer a batch paid for in this run."""
        with self._lock:
            if key in self._unattributed:
                self._unattributed.discard(key)
                return True
            return False

    def close(self) -> None:
        self._writer.close()


# What Judge.ask answers for a request it was told to defer (see review_trajectory's defer).
DEFERRED = "deferred to a batch"
CACHE_CONTROL = {"type": "ephemeral"}


@dataclass(frozen=True)
class JudgeRequest:
    """One judge request, by its cache key: what is sent (system, user) and how.

    ``prefix_ends`` are offsets into ``user`` where a prefix shared with other requests
    ends (the trajectory's leading system and task messages): the layout marks them for
    the provider's prompt cache. They change how the request is laid out on the wire, not
    what the judge reads, and are not part of the key."""

    key: str
    role: str
    spec: PolicySpec  # with the structured-output sampling
    system: str
    user: str
    schema: type[BaseModel]
    prefix_ends: tuple[int, ...] = ()

    def messages(self) -> list[Message]:
        return [Message(role="system", content=self.system), Message(role="user", content=self.user)]

    def cache_group(self) -> str:
        """What requests sharing the longest cached prefix have in common: OpenAI's
        ``prompt_cache_key``, which routes them to the same cache."""
        shared = self.user[: self.prefix_ends[-1]] if self.prefix_ends else ""
        digest = hashlib.sha256(json.dumps([self.role, self.spec.model, self.system, shared]).encode()).hexdigest()
        return f"relearn-{self.role}-{digest[:24]}"

    def wire(self, policy: SdkPolicy | None = None) -> dict[str, Any]:
        """The keyword arguments of the SDK's create call, laid out for prompt caching.

        Anthropic: the instructions and each shared prefix end in a ``cache_control``
        breakpoint (at most 3 of the API's 4), the user text split into blocks there; the
        blocks joined are the user text. The unique rest gets no breakpoint: writing it to
        the cache costs 1.25x and nothing would read it. OpenAI caches identical prefixes
        itself; ``prompt_cache_key`` keeps the rollouts of one task on one cache.
        ``policy``: a client for this spec, to reuse (making one loads TLS certificates)."""
        policy = policy or make_policy(self.spec)
        request = policy._request(self.messages(), [])  # noqa: SLF001 - the policy's own wire format, then our layout
        if self.spec.kind == "anthropic":
            request["system"] = [{"type": "text", "text": self.system, "cache_control": CACHE_CONTROL}]
            cuts = [0, *(end for end in self.prefix_ends if 0 < end < len(self.user)), len(self.user)]
            blocks: list[dict[str, Any]] = []
            for start, stop in zip(cuts, cuts[1:], strict=False):
                block: dict[str, Any] = {"type": "text", "text": self.user[start:stop]}
                if stop < len(self.user):
                    block["cache_control"] = CACHE_CONTROL
                blocks.append(block)
            request["messages"] = [{"role": "user", "content": blocks}]
        else:
            request["prompt_cache_key"] = self.cache_group()
        return request


def request_key(role: str, spec: PolicySpec, system: str, user: str) -> str:
    """The call cache's key: the exact request as the judge reads it, and how it is sampled
    (the reasoning settings are in ``spec.sampling``: a judge without them has the keys it had
    before they existed). Unchanged by the prompt-cache layout, so answers cached before it
    are still honoured."""
    identity = json.dumps([role, spec.kind, spec.model, spec.base_url, spec.sampling, system, user], sort_keys=True, default=str)
    return hashlib.sha256(identity.encode()).hexdigest()


@dataclass
class Judge:
    spec: PolicySpec
    role: str  # "judge1" or "judge2"
    context: int = DEFAULT_JUDGE_CONTEXT  # tokens of prompt the judge reads at most (review.reading)
    # The client its requests go through, made on first use and shared by the workers:
    # making one per call loaded the TLS certificates every time (50 ms a call).
    _policy: Any = field(default=None, init=False, repr=False, compare=False)

    def policy(self, request: JudgeRequest) -> Any:
        """A client for ``request.spec`` (the judge's spec with its structured output)."""
        if self._policy is None or self._policy[0] != request.spec:
            self._policy = (request.spec, make_policy(request.spec))
        return self._policy[1]

    def request(self, system: str, user: str, schema: type[BaseModel], prefix_ends: tuple[int, ...] = ()) -> JudgeRequest:
        sampling = dict(self.spec.sampling)
        for key, value in structured_output(self.spec.kind, self.role, schema.model_json_schema()).items():
            # Anthropic's effort and answer format are both in output_config.
            sampling[key] = {**sampling[key], **value} if isinstance(sampling.get(key), dict) else value
        spec = replace(self.spec, sampling=sampling)
        return JudgeRequest(request_key(self.role, spec, system, user), self.role, spec, system, user, schema, prefix_ends)

    def ask(
        self,
        system: str,
        user: str,
        schema: type[BaseModel],
        cache: CallCache,
        ledger: Ledger,
        *,
        prefix_ends: tuple[int, ...] = (),
        defer: list[JudgeRequest] | None = None,
    ) -> tuple[BaseModel | None, str | None, float]:
        """The parsed answer, or None and why it is unusable; and what it cost.

        An answer that is not JSON of ``schema`` is asked again, as a 5xx would be (up to the
        spec's retries), and never cached: a rerun asks again too. Only usable answers are
        cached, so a rerun of a reviewed trajectory costs nothing. With ``defer``, a request
        the cache cannot answer is added to it instead of sent (None, DEFERRED, 0)."""
        request = self.request(system, user, schema, prefix_ends)
        entry = cache.get(request.key)
        if entry is not None:
            parsed, problem = self.parse(entry["text"], schema)
            if parsed is not None and defer is not None:
                return parsed, None, 0.0  # a review to be thrown away: it accounts for nothing
            if parsed is not None:
                # The Review costs what its answers cost, whenever they were paid (the ledger
                # says what this run paid): a review killed before it was written and made
                # again from the cache is the same line a lone run writes.
                if not cache.attribute(request.key):
                    ledger.cached += 1
                return parsed, None, float(entry.get("cost_usd") or 0.0)
        if defer is not None:
            defer.append(request)
            return None, DEFERRED, 0.0
        cost = 0.0
        problem = None
        for _attempt in range(1 + request.spec.max_retries):
            ledger.before_call()
            policy = self.policy(request)
            (message, _finish), _attempts = policy._send_with_retries(request.wire(policy))  # noqa: SLF001 - complete() without its own layout
            usage = message.usage
            if usage is not None:
                usage.cost_usd = request.spec.cost_usd(usage)
            spent = (usage.cost_usd or 0.0) if usage else 0.0
            ledger.charge(spent, usage)
            cost += spent
            parsed, problem = self.parse(message.content or "", schema)
            if parsed is not None:
                # What the answer cost, its unusable attempts included: what a Review using it costs.
                cache.put(request.key, {"text": message.content or "", "cost_usd": cost, "model": request.spec.model})
                return parsed, None, cost
        return None, problem, cost

    def parse(self, text: str, schema: type[BaseModel]) -> tuple[BaseModel | None, str | None]:
        try:
            return schema.model_validate_json(_strip_fences(text)), None
        except ValidationError as exc:
            kind = "not JSON" if any(e["type"] == "json_invalid" for e in exc.errors()) else "schema violation"
            return None, f"{self.role} answer is {kind}: {exc.errors()[0]['msg']}"


def judge_pair(
    judge1: str | None, judge2: str | None, spec: Callable[[str, str], PolicySpec], *, context: int = DEFAULT_JUDGE_CONTEXT
) -> tuple[Judge, Judge] | None:
    """The two judges from their model names (judge 2 defaults to judge 1's model), or None
    when neither is named: the offline heuristic reviewer. ``spec(model, role)`` says how
    each is reached; ``context`` is how many tokens of prompt each reads."""
    first = judge1 or judge2
    if first is None:
        return None
    return Judge(spec(first, "judge1"), "judge1", context), Judge(spec(judge2 or first, "judge2"), "judge2", context)


def _strip_fences(text: str) -> str:
    stripped = text.strip()
    if stripped.startswith("```"):
        stripped = stripped.split("\n", 1)[1] if "\n" in stripped else ""
        stripped = stripped.rsplit("```", 1)[0]
    return stripped.strip()


# ---- one trajectory ---------------------------------------------------------------------


@dataclass
class GroundingStats:
    grounded: int = 0
    rejected: int = 0
    methods: dict[str, int] = field(default_factory=dict)
    reasons: dict[str, int] = field(default_factory=dict)


def shared_prefix_ends(trajectory: Trajectory, text: str) -> tuple[int, ...]:
    """Where judge 1's text stops being the same for other trajectories: after the agent's
    system prompt (shared by a whole pool) and after the task statement (shared by a task's
    rollouts). Only the leading system/user messages count, and only while the rendered text
    starts with them (an elision notice comes first and shares nothing)."""
    system_end = task_end = 0
    prefix = ""
    for message in trajectory.messages:
        if message.role not in ("system", "developer", "user"):
            break
        prefix += f"### {message.role}\n{message.content or ''}\n\n"
        if not text.startswith(prefix):
            break
        if message.role == "user":
            task_end = len(prefix)
        elif not task_end:
            system_end = len(prefix)
    return tuple(end for end in (system_end, task_end) if end)


def review_trajectory(
    trajectory: Trajectory, judge1: Judge, judge2: Judge, cache: CallCache, ledger: Ledger, *, defer: list[JudgeRequest] | None = None
) -> Review:
    """Judge 1, then judge 2 per erroneous step, then grounding. Fails closed.

    With ``defer``, nothing is sent: requests the cache cannot answer are collected there
    (judge 1's, or every judge 2 request once judge 1's answer is cached) and the Review
    returned is to be thrown away; this is how a batch learns what the review will ask."""
    base: dict[str, Any] = {
        "trajectory_id": trajectory.id,
        "judges": {"judge1": judge1.spec.model, "judge2": judge2.spec.model},
        # How each judge reasoned and sampled: the fields its requests carried beyond the prompt
        # and the answer format (review.reasoning; empty: the server's defaults).
        "sampling": {"judge1": judge1.spec.sampling, "judge2": judge2.spec.sampling},
        "prompts_hash": prompts_hash(),
    }
    cost = 0.0
    hints = [
        f"step {step}: {signal.kind}: {signal.detail}"
        for signal in prefilter(trajectory)
        for step, index in numbered_steps(trajectory).items()
        if index == signal.message_index
    ]
    try:
        reading = render_for_reading(trajectory, hints, budget=judge1.context, system=prompt("judge1"))
    except TooLongForJudge as exc:
        return Review(**base, decision="reject", reason=str(exc), reading={"tokens": exc.tokens, "budget": exc.budget}, cost_usd=0.0)
    base["reading"] = {"tokens": reading.tokens, "budget": judge1.context, "elided": reading.elided}
    answer, problem, spent = judge1.ask(
        prompt("judge1"), reading.text, Judge1Output, cache, ledger, prefix_ends=shared_prefix_ends(trajectory, reading.text), defer=defer
    )
    cost += spent
    if answer is None:
        return Review(**base, decision="reject", reason=f"{JUDGE_ERROR}: {problem}", cost_usd=cost)
    assert isinstance(answer, Judge1Output)
    numbered = numbered_steps(trajectory)
    errors = [e for e in answer.errors if e.step in numbered]
    # A step that does not exist holds no text to exclude, and the error it names may sit
    # anywhere: it is an error that cannot be grounded, not one to forget.
    unlocated = sorted({e.step for e in answer.errors if e.step not in numbered})
    review_errors = [
        {
            "step": e.step,
            "message_index": numbered.get(e.step),
            "category": e.category,
            "description": e.description,
            "evidence": e.evidence,
        }
        for e in answer.errors
    ]
    omissions = [o.model_dump() for o in answer.omissions]
    if answer.decision == "reject":
        return Review(
            **base, decision="reject", reason=answer.reason or "judge 1 rejected", errors=review_errors, omissions=omissions, cost_usd=cost
        )
    stats = GroundingStats()
    if unlocated:
        stats.reasons["no such step"] = len(unlocated)
    defects: list[Defect] = []
    by_step: dict[int, list[ConfirmedError]] = {}
    for error in errors:
        by_step.setdefault(error.step, []).append(error)
    judge2_prompt = prompt("judge2")
    judge2_prompt_tokens = count_tokens(judge2_prompt)
    for step, step_errors in sorted(by_step.items()):
        index = numbered[step]
        step_text = render_step(trajectory.messages[index], [f"[{e.category}] {e.description}" for e in step_errors])
        if judge2_prompt_tokens + count_tokens(step_text) > judge2.context:
            unlocated.append(step)  # a step judge 2 cannot read whole cannot be localized
            stats.reasons[TOO_LONG] = stats.reasons.get(TOO_LONG, 0) + 1
            continue
        located, problem, spent = judge2.ask(judge2_prompt, step_text, Judge2Output, cache, ledger, defer=defer)
        cost += spent
        if located is None and problem == DEFERRED:
            continue  # collect the other steps' requests too
        if located is None:
            return Review(
                **base, decision="reject", reason=f"{JUDGE_ERROR}: {problem}", errors=review_errors, omissions=omissions, cost_usd=cost
            )
        assert isinstance(located, Judge2Output)
        # An error is excluded only when every quote judge 2 gave for it grounds: a quote that
        # fails would leave part of the error supervised.
        quoted: set[int] = set()
        failed: set[int] = set()
        for span in located.spans:
            if not 0 <= span.error < len(step_errors):
                stats.rejected += 1
                stats.reasons["no such error"] = stats.reasons.get("no such error", 0) + 1
                continue
            error = step_errors[span.error]
            quoted.add(span.error)
            result = ground(
                trajectory,
                index,
                span.field,
                span.quote,
                context_before=span.context_before,
                context_after=span.context_after,
                category=error.category,
                description=error.description,
            )
            stats.methods[result.method] = stats.methods.get(result.method, 0) + 1
            if result.defect is None:
                stats.rejected += 1
                reason = result.reason or "rejected"
                stats.reasons[reason] = stats.reasons.get(reason, 0) + 1
                failed.add(span.error)
                continue
            stats.grounded += 1
            defects.append(result.defect)
        unlocated += [step for i in range(len(step_errors)) if i not in quoted or i in failed]
    grounding = {
        "grounded": stats.grounded,
        "rejected": stats.rejected,
        "methods": stats.methods,
        "reasons": stats.reasons,
        "errors_outside_assistant_steps": len(answer.errors) - len(errors),
    }
    if unlocated:
        # A confirmed error that cannot be excluded would be imitated: drop the trajectory.
        return Review(
            **base,
            decision="reject",
            reason=f"no_valid_target: errors at steps {sorted(set(unlocated))} could not be grounded",
            errors=review_errors,
            omissions=omissions,
            grounding=grounding,
            cost_usd=cost,
        )
    return Review(
        **base,
        decision="accept",
        reason=answer.reason,
        errors=review_errors,
        omissions=omissions,
        defects=defects,
        grounding=grounding,
        cost_usd=cost,
    )


__all__ = [
    "DEFERRED",
    "CallCache",
    "Judge",
    "JudgeRequest",
    "Ledger",
    "PolicyError",
    "SpendCapReached",
    "prompts_hash",
    "review_trajectory",
]
