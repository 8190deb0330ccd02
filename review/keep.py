"""Single-turn review (the paper's §E.2/§E.4): keep intervals K for Math and Code responses,
full supervision for instruction following.

Only verifier-positive responses are reviewed. An instruction-following positive keeps all
of its eligible tokens, with no judge call. For a Math or Code positive, the keep judge
quotes the intervals to learn from (the correct, self-contained reasoning and the complete
final answer, without wrong steps, abandoned approaches or repeated answer emission), or
drops the response when no clean solution can be assembled from its own text. Every quote is
grounded deterministically (``review.grounding``, as for agentic defects); an interval that
does not ground drops the response, since training on the wrong text would be worse than
not training on it. An independent auditor then reads the selected text alone (with
``[...]`` where text was left out) and must find it self-contained and correct, else the
response is dropped.

The Review keeps the grounded intervals under ``keep`` and, as ``defects``, their complement
inside the response's reasoning and final answer (whitespace-only gaps stay kept): what the
mask compiler excludes, so that ``relearn masks --mode ross`` compiles ``m = A ∩ K`` (the
template's own markup inside the turn, such as the end-of-turn token, stays supervised as
part of A). ``protocol`` says which rule gave the review (``keep_intervals`` or
``full_supervision``).
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

from envs.executor import LocalBackend, run_units
from harness.policies.base import PolicyError
from records.pools import JsonlWriter, read_trajectories_lenient
from records.review import CATEGORIES, Defect, Review, field_text
from records.trajectory import Trajectory, is_verified_positive
from review.grounding import ground
from review.in_order import InOrder
from review.judges import JUDGE_ERROR, CallCache, Judge, Ledger, SpendCapReached, prompt
from review.resume import reviewed_ids
from review.run import ReviewSummary

KEEP_FIELDS = ("reasoning_content", "content")
ELISION = "[...]"
# Repeated answer emission: the same final answer written again after it was given (the
# paper's 4B Math case). A boxed answer or a "final answer" line that comes back.
BOXED = re.compile(r"\\boxed\{((?:[^{}]|\{(?:[^{}]|\{[^{}]*\})*\})*)\}")
FINAL_LINE = re.compile(r"(?im)^\s*(?:\*\*)?final answer(?:\*\*)?\s*[:：]\s*(.+?)\s*$")
FENCE = re.compile(r"```(?:python|py|python3)?[ \t]*\n(.*?)```", re.S)


def keep_prompts_hash() -> str:
    digest = hashlib.sha256()
    for name in ("keep_judge", "keep_audit"):
        digest.update(prompt(name).encode())
    return digest.hexdigest()[:16]


class Interval(BaseModel):
    field: str
    quote: str
    context_before: str = ""
    context_after: str = ""


class Excluded(BaseModel):
    category: Literal[*CATEGORIES]  # type: ignore[valid-type]
    description: str = ""


class KeepOutput(BaseModel):
    decision: Literal["keep", "drop"]
    reason: str = ""
    intervals: list[Interval] = []
    excluded: list[Excluded] = []


class AuditOutput(BaseModel):
    verdict: Literal["pass", "fail"]
    self_contained: bool
    correct: bool
    reason: str = ""


# ---- the pre-filter signal ----------------------------------------------------------------


@dataclass(frozen=True)
class RepeatedAnswer:
    answer: str
    count: int


def repeated_answer_emission(text: str) -> RepeatedAnswer | None:
    """The final answer emitted more than once in ``text`` (boxed answers, "Final answer:"
    lines, or the same program block), or None."""
    for pattern in (BOXED, FINAL_LINE, FENCE):
        found = Counter(m.strip() for m in pattern.findall(text or "") if m.strip())
        if found:
            answer, count = found.most_common(1)[0]
            if count > 1:
                return RepeatedAnswer(answer, count)
    return None


# ---- one response ---------------------------------------------------------------------


def _response(trajectory: Trajectory) -> tuple[int, Any]:
    generated = [(i, m) for i, m in enumerate(trajectory.messages) if m.role == "assistant" and m.generated]
    if len(generated) != 1:
        raise ValueError(f"{len(generated)} generated assistant messages: not a single-turn rollout")
    return generated[0]


def task_kind(trajectory: Trajectory) -> str | None:
    verdict = trajectory.outcome.verdict if trajectory.outcome is not None else None
    return verdict.get("kind") if isinstance(verdict, dict) else None


def _task_text(trajectory: Trajectory, index: int) -> str:
    return "\n\n".join(m.content or "" for m in trajectory.messages[:index] if m.role in ("system", "developer", "user"))


def judge_reading(trajectory: Trajectory) -> str:
    """What the keep judge reads: the task, the verifier's finding, the pre-filter signals
    and the response's two fields."""
    index, message = _response(trajectory)
    verdict = trajectory.outcome.verdict if trajectory.outcome else {}
    shown = {
        k: v
        for k, v in (verdict or {}).items()
        if k in ("kind", "verifier", "extracted", "reference", "visible_passed", "visible", "hidden_passed", "hidden")
    }
    signals = []
    repeated = repeated_answer_emission(message.content or "")
    if repeated is not None:
        signals.append(f"repeated answer emission: {repeated.answer[:80]!r} appears {repeated.count} times in the final answer")
    parts = [
        f"## Task\n{_task_text(trajectory, index)}",
        f"## Verifier\n{shown}",
        "## Pre-filter signals\n" + ("\n".join(f"- {s}" for s in signals) if signals else "(none)"),
        f"## reasoning_content\n{message.reasoning_content or ''}",
        f"## content\n{message.content or ''}",
    ]
    return "\n\n".join(parts)


def audit_reading(trajectory: Trajectory, keep: list[Defect]) -> str:
    """What the auditor reads: the task and the kept text alone, ``[...]`` where text was left out."""
    index, message = _response(trajectory)
    pieces: list[str] = []
    for name in KEEP_FIELDS:
        text = field_text(message, name) or ""
        spans = sorted((d.start, d.end) for d in keep if d.field == name)
        at = 0
        out: list[str] = []
        for start, end in spans:
            if text[at:start].strip():
                out.append(ELISION)
            out.append(text[start:end])
            at = end
        if text[at:].strip():
            out.append(ELISION)
        if text.strip():
            pieces.append(f"## {'reasoning' if name == 'reasoning_content' else 'final answer'}\n" + "\n".join(out or [ELISION]))
    return f"## Task\n{_task_text(trajectory, index)}\n\n" + "\n\n".join(pieces)


def complement(message: Any, keep: list[Defect], category: str, description: str) -> list[Defect]:
    """The text of the response's fields outside the keep intervals, as defects (E); gaps of
    whitespace alone are left supervised."""
    defects = []
    for name in KEEP_FIELDS:
        text = field_text(message, name) or ""
        at = 0
        for start, end in sorted((d.start, d.end) for d in keep if d.field == name) + [(len(text), len(text))]:
            if start > at and text[at:start].strip():
                defects.append(
                    Defect(
                        message_index=0, field=name, start=at, end=start, quote=text[at:start], category=category, description=description
                    )
                )
            at = max(at, end)
    return defects


def _merged(spans: list[Defect]) -> list[Defect]:
    """Overlapping or touching intervals of one field as one."""
    out: list[Defect] = []
    for span in sorted(spans, key=lambda d: (d.field, d.start, d.end)):
        last = out[-1] if out else None
        if last is not None and last.field == span.field and span.start <= last.end:
            if span.end > last.end:
                out[-1] = last.model_copy(update={"end": span.end, "quote": last.quote + span.quote[last.end - span.start :]})
            continue
        out.append(span)
    return out


def review_single_turn(trajectory: Trajectory, judge: Judge, auditor: Judge, cache: CallCache, ledger: Ledger) -> Review:
    """The Review of one single-turn rollout. Fails closed: every way a clean target cannot be
    had (judge drops it, a quote does not ground, no final answer kept, the audit fails) rejects."""
    base: dict[str, Any] = {"trajectory_id": trajectory.id, "prompts_hash": keep_prompts_hash()}
    if not is_verified_positive(trajectory):
        return Review(**base, decision="reject", reason="not verified positive", cost_usd=0.0)
    kind = task_kind(trajectory)
    index, message = _response(trajectory)
    if kind == "if":
        return Review(
            **base, decision="accept", reason="instruction following: full supervision", protocol="full_supervision", cost_usd=0.0
        )
    base |= {
        "protocol": "keep_intervals",
        "judges": {"keep": judge.spec.model, "audit": auditor.spec.model},
        "sampling": {"keep": judge.spec.sampling, "audit": auditor.spec.sampling},  # each judge's reasoning settings (review.reasoning)
    }
    repeated = repeated_answer_emission(message.content or "")
    if repeated is not None:
        base["signals"] = [{"kind": "repeated_answer_emission", "answer": repeated.answer[:200], "count": repeated.count}]
    answer, problem, cost = judge.ask(prompt("keep_judge"), judge_reading(trajectory), KeepOutput, cache, ledger)
    if answer is None:
        return Review(**base, decision="reject", reason=f"{JUDGE_ERROR}: {problem}", cost_usd=cost)
    assert isinstance(answer, KeepOutput)
    errors = [{"step": 1, "message_index": index, "category": e.category, "description": e.description} for e in answer.excluded]
    base["errors"] = errors
    if answer.decision == "drop":
        return Review(**base, decision="reject", reason=f"no_clean_solution: {answer.reason}", cost_usd=cost)
    keep: list[Defect] = []
    failures: list[str] = []
    for interval in answer.intervals:
        if interval.field not in KEEP_FIELDS:
            failures.append(f"interval in {interval.field!r} (only reasoning_content and content hold the response)")
            continue
        result = ground(
            trajectory,
            index,
            interval.field,
            interval.quote,
            context_before=interval.context_before,
            context_after=interval.context_after,
            category="other",
        )
        if result.defect is None:
            failures.append(f"{interval.quote[:60]!r}: {result.reason}")
            continue
        keep.append(result.defect.model_copy(update={"category": "other", "description": f"keep ({result.method})"}))
    if failures:
        return Review(
            **base, decision="reject", reason=f"no_valid_target: keep intervals did not ground: {'; '.join(failures[:3])}", cost_usd=cost
        )
    keep = _merged(keep)
    if (message.content or "").strip() and not any(k.field == "content" for k in keep):
        return Review(**base, decision="reject", reason="no_valid_target: no keep interval holds the final answer", cost_usd=cost)
    audit, problem, spent = auditor.ask(prompt("keep_audit"), audit_reading(trajectory, keep), AuditOutput, cache, ledger)
    cost += spent
    if audit is None:
        return Review(**base, decision="reject", reason=f"{JUDGE_ERROR}: {problem}", cost_usd=cost)
    assert isinstance(audit, AuditOutput)
    base["audit"] = audit.model_dump()
    keep_json = [
        k.model_dump(mode="json", include={"message_index", "field", "start", "end", "quote"}) | {"message_index": index} for k in keep
    ]
    if audit.verdict != "pass" or not (audit.self_contained and audit.correct):
        return Review(**base, decision="reject", reason=f"audit_failed: {audit.reason}", keep=keep_json, cost_usd=cost)
    primary = Counter(e.category for e in answer.excluded).most_common(1)
    category = primary[0][0] if primary else "other"
    description = "; ".join(e.description for e in answer.excluded) or "outside the keep intervals"
    defects = [d.model_copy(update={"message_index": index}) for d in complement(message, keep, category, description)]
    return Review(**base, decision="accept", reason=answer.reason, keep=keep_json, defects=defects, cost_usd=cost)


# ---- a pool ----------------------------------------------------------------------------


def review_single_turn_pool(
    pool: Path,
    output: Path,
    judge: Judge,
    auditor: Judge,
    *,
    workers: int = 4,
    spend_cap_usd: float | None = None,
    on_done: Callable[[Review | None], None] | None = None,
) -> tuple[ReviewSummary, Ledger]:
    """Review every single-turn rollout of ``pool`` not yet in ``output`` (resumable by id; a
    ``judge_error`` review is retried; answers are cached by request beside ``output``)."""
    summary = ReviewSummary()
    ledger = Ledger(cap_usd=spend_cap_usd)
    done = reviewed_ids(output)
    todo = []
    for trajectory in read_trajectories_lenient(pool, summary.unreadable):
        if trajectory.id in done:
            summary.skipped += 1
        else:
            todo.append(trajectory)
    cache = CallCache(output.with_name(output.name + ".calls.jsonl"))

    def one(trajectory: Trajectory) -> Review | str:
        try:
            return review_single_turn(trajectory, judge, auditor, cache, ledger)
        except SpendCapReached as exc:
            return f"{trajectory.id}: {exc}"
        except PolicyError as exc:  # the judge endpoint failed after retries: retried on a rerun
            return Review(trajectory_id=trajectory.id, decision="reject", reason=f"{JUDGE_ERROR}: judge call failed: {exc}", cost_usd=0.0)
        except ValueError as exc:  # not a single-turn rollout
            return Review(trajectory_id=trajectory.id, decision="reject", reason=f"not_single_turn: {exc}", cost_usd=0.0)

    def write(result: Review | str) -> None:
        if isinstance(result, str):
            summary.not_reviewed += 1
            summary.errors.append(result)
            if on_done:
                on_done(None)
            return
        writer.write(result.model_dump(mode="json"))
        summary.count(result)
        if on_done:
            on_done(result)

    # Written in the pool's order whatever order the workers finish in (review.in_order).
    order: InOrder[Trajectory] = InOrder()

    def finished(trajectory: Trajectory, result: Review | str) -> None:
        order.done(trajectory, lambda: write(result))

    def failed(_trajectory: Trajectory, exc: BaseException, _tries: int) -> bool:
        raise exc  # ``one`` turns every failure it expects into a record

    runner = LocalBackend(workers)
    try:
        with JsonlWriter(output, fsync=True) as writer:
            run_units(runner, order.numbered(todo), one, on_result=finished, on_error=failed, hold=lambda: order.full(workers))
    finally:
        runner.close()
        cache.close()
    return summary, ledger
