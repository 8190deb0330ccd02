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

from harness.policies.base import PolicyError, PolicySpec
from harness.policies.make import make_policy
from records.pools import JsonlWriter, iter_lines
from records.review import CATEGORIES, Defect, Review, numbered_steps
from records.trajectory import Message, Trajectory
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
    """Spend across a review run, shared by its workers; enforces the hard cap."""

    cap_usd: float | None = None
    spent_usd: float = 0.0
    calls: int = 0
    cached: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def before_call(self) -> None:
        with self.lock:
            if self.cap_usd is not None and self.spent_usd >= self.cap_usd:
                raise SpendCapReached(f"spend cap ${self.cap_usd:.2f} reached (${self.spent_usd:.4f} spent)")

    def charge(self, cost: float) -> None:
        with self.lock:
            self.spent_usd += cost
            self.calls += 1


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

    def get(self, key: str) -> dict[str, Any] | None:
        return self.entries.get(key)

    def put(self, key: str, entry: dict[str, Any]) -> None:
        with self._lock:
            self.entries[key] = {"key": key, **entry}
            self._writer.write(self.entries[key])

    def close(self) -> None:
        self._writer.close()


@dataclass
class Judge:
    spec: PolicySpec
    role: str  # "judge1" or "judge2"
    context: int = DEFAULT_JUDGE_CONTEXT  # tokens of prompt the judge reads at most (review.reading)

    def ask(self, system: str, user: str, schema: type[BaseModel], cache: CallCache, ledger: Ledger) -> tuple[BaseModel | None, str | None, float]:
        """The parsed answer, or None and why it is unusable; and what it cost.

        An answer that is not JSON of ``schema`` is asked again, as a 5xx would be (up to the
        spec's retries), and never cached: a rerun asks again too. Only usable answers are
        cached, so a rerun of a reviewed trajectory costs nothing."""
        spec = replace(self.spec, sampling={**self.spec.sampling, **structured_output(self.spec.kind, self.role, schema.model_json_schema())})
        identity = json.dumps([self.role, spec.kind, spec.model, spec.base_url, spec.sampling, system, user], sort_keys=True, default=str)
        key = hashlib.sha256(identity.encode()).hexdigest()
        entry = cache.get(key)
        if entry is not None:
            parsed, problem = self._parse(entry["text"], schema)
            if parsed is not None:
                ledger.cached += 1
                return parsed, None, 0.0
        cost = 0.0
        problem = None
        for _attempt in range(1 + spec.max_retries):
            ledger.before_call()
            turn = make_policy(spec).complete([Message(role="system", content=system), Message(role="user", content=user)], [])
            spent = (turn.message.usage.cost_usd or 0.0) if turn.message.usage else 0.0
            ledger.charge(spent)
            cost += spent
            parsed, problem = self._parse(turn.message.content or "", schema)
            if parsed is not None:
                cache.put(key, {"text": turn.message.content or "", "cost_usd": spent, "model": spec.model})
                return parsed, None, cost
        return None, problem, cost

    def _parse(self, text: str, schema: type[BaseModel]) -> tuple[BaseModel | None, str | None]:
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


def review_trajectory(trajectory: Trajectory, judge1: Judge, judge2: Judge, cache: CallCache, ledger: Ledger) -> Review:
    """Judge 1, then judge 2 per erroneous step, then grounding. Fails closed."""
    base: dict[str, Any] = {
        "trajectory_id": trajectory.id,
        "judges": {"judge1": judge1.spec.model, "judge2": judge2.spec.model},
        "prompts_hash": prompts_hash(),
    }
    cost = 0.0
    hints = [f"step {step}: {signal.kind}: {signal.detail}" for signal in prefilter(trajectory) for step, index in numbered_steps(trajectory).items() if index == signal.message_index]
    try:
        reading = render_for_reading(trajectory, hints, budget=judge1.context, system=prompt("judge1"))
    except TooLongForJudge as exc:
        return Review(**base, decision="reject", reason=str(exc), reading={"tokens": exc.tokens, "budget": exc.budget}, cost_usd=0.0)
    base["reading"] = {"tokens": reading.tokens, "budget": judge1.context, "elided": reading.elided}
    answer, problem, spent = judge1.ask(prompt("judge1"), reading.text, Judge1Output, cache, ledger)
    cost += spent
    if answer is None:
        return Review(**base, decision="reject", reason=f"{JUDGE_ERROR}: {problem}", cost_usd=cost)
    assert isinstance(answer, Judge1Output)
    numbered = numbered_steps(trajectory)
    errors = [e for e in answer.errors if e.step in numbered]
    # A step that does not exist holds no text to exclude, and the error it names may sit
    # anywhere: it is an error that cannot be grounded, not one to forget.
    unlocated = sorted({e.step for e in answer.errors if e.step not in numbered})
    review_errors = [{"step": e.step, "message_index": numbered.get(e.step), "category": e.category, "description": e.description, "evidence": e.evidence} for e in answer.errors]
    omissions = [o.model_dump() for o in answer.omissions]
    if answer.decision == "reject":
        return Review(**base, decision="reject", reason=answer.reason or "judge 1 rejected", errors=review_errors, omissions=omissions, cost_usd=cost)
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
        located, problem, spent = judge2.ask(judge2_prompt, step_text, Judge2Output, cache, ledger)
        cost += spent
        if located is None:
            return Review(**base, decision="reject", reason=f"{JUDGE_ERROR}: {problem}", errors=review_errors, omissions=omissions, cost_usd=cost)
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
            result = ground(trajectory, index, span.field, span.quote, context_before=span.context_before, context_after=span.context_after, category=error.category, description=error.description)
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
    grounding = {"grounded": stats.grounded, "rejected": stats.rejected, "methods": stats.methods, "reasons": stats.reasons, "errors_outside_assistant_steps": len(answer.errors) - len(errors)}
    if unlocated:
        # A confirmed error that cannot be excluded would be imitated: drop the trajectory.
        return Review(**base, decision="reject", reason=f"no_valid_target: errors at steps {sorted(set(unlocated))} could not be grounded", errors=review_errors, omissions=omissions, grounding=grounding, cost_usd=cost)
    return Review(**base, decision="accept", reason=answer.reason, errors=review_errors, omissions=omissions, defects=defects, grounding=grounding, cost_usd=cost)


__all__ = ["CallCache", "Judge", "Ledger", "PolicyError", "SpendCapReached", "prompts_hash", "review_trajectory"]
