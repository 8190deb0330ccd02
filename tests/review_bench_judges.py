"""Scripted judge pairs for the review bench: what a judge server answers about a bench case,
in three styles, served through harness.scripted.servers.ModelServer to the real SDKs.

- ``perfect``: judge 1 names exactly the gold errors and decision; judge 2 quotes exactly the
  gold spans (with context to tell repeats apart);
- ``whole``: judge 1 as perfect; judge 2 quotes every field of the step whole;
- ``invent``: judge 1 as perfect; judge 2 quotes a sentence the step does not hold.

Judge 1's request is matched to its case by the texts the case's steps hold (the task
statement, every reasoning and text field); judge 1 writes the case and the error's number
into each description, which judge 2 reads back from its own request.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any, Literal

from harness.scripted.servers import ScriptedTurn
from records.review import field_text
from review.bench.cases import BenchCase

Style = Literal["perfect", "whole", "invent"]
MARK = re.compile(r"\[bench case (\S+) error (\d+)\]")
INVENTED = "I will now delete the whole repository and start again."


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def _signature(case: BenchCase) -> list[str]:
    texts = [t for m in case.trajectory.messages if m.role == "assistant" for t in (m.content, m.reasoning_content) if t]
    user = next(m.content for m in case.trajectory.messages if m.role == "user")
    return [user or "", *texts]


class BenchJudges:
    """The callable a ModelServer answers with; ``requests`` counts judge-1 and judge-2 calls."""

    def __init__(self, cases: list[BenchCase], style: Style) -> None:
        self.cases = {c.id: c for c in cases}
        self.style = style
        self.signatures = {c.id: _signature(c) for c in cases}

    def __call__(self, request: dict[str, Any]) -> ScriptedTurn:
        text = "\n".join(_strings(request.get("messages", request.get("input", []))))
        if "localize confirmed errors" in "\n".join(_strings(request)):
            return ScriptedTurn(content=json.dumps(self.localize(text)), input_tokens=800, output_tokens=60)
        return ScriptedTurn(content=json.dumps(self.confirm(self.case_of(text))), input_tokens=4000, output_tokens=150)

    def case_of(self, text: str) -> BenchCase:
        matching = [case_id for case_id, signature in self.signatures.items() if all(s in text for s in signature)]
        if not matching:
            raise AssertionError("judge 1 request matches no bench case")
        return self.cases[max(matching, key=lambda i: sum(map(len, self.signatures[i])))]

    def confirm(self, case: BenchCase) -> dict[str, Any]:
        errors = [
            {
                "step": e.step,
                "category": e.category,
                "description": f"{e.description} [bench case {case.id} error {n}]",
                "evidence": "scripted",
            }
            for n, e in enumerate(case.gold.errors)
        ]
        return {
            "decision": case.gold.decision,
            "reason": case.gold.reason or "solved",
            "errors": errors,
            "omissions": [{"description": o} for o in case.gold.omissions],
        }

    def localize(self, text: str) -> dict[str, Any]:
        spans = []
        for position, (case_id, number) in enumerate(MARK.findall(text)):
            case = self.cases[case_id]
            error = case.gold.errors[int(number)]
            message = case.trajectory.messages[error.spans[0].message_index]
            if self.style == "invent":
                spans.append({"error": position, "field": "content", "quote": INVENTED})
            elif self.style == "whole":
                fields = [f for f in ("reasoning_content", "content") if field_text(message, f)]
                fields += [
                    f"tool_calls[{i}].arguments.{key}" for i, call in enumerate(message.tool_calls or []) for key in call.function.arguments
                ]
                spans += [{"error": position, "field": f, "quote": field_text(message, f)} for f in fields]
            else:
                for span in error.spans:
                    whole = field_text(message, span.field) or ""
                    before, after = whole[max(0, span.start - 40) : span.start], whole[span.end : span.end + 40]
                    spans.append(
                        {"error": position, "field": span.field, "quote": span.quote, "context_before": before, "context_after": after}
                    )
        return {"spans": spans}
