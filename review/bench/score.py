"""Scoring a reviewer's Reviews against the labelled cases.

Words. Every span (a gold one or a Review's defect) is first moved to its message's
*canonical* field: ``content``, ``reasoning_content``, or ``tool_calls[i].arguments`` (the text
``json.dumps(arguments, ensure_ascii=False)``); a span in ``tool_calls[i].arguments.KEY`` is
mapped to the characters that render that value inside the arguments' JSON text, so a judge
that quotes ``ls -R`` inside ``["bash", "-lc", "ls -R"]`` and one that quotes the whole argv
list are compared on the same text. A word is a maximal run of non-whitespace characters
(the regular expression ``\\S+``) of a canonical field of a generated assistant message, and
a span *touches* a word when they share a character. A word is *excluded* by a review when
one of its defects touches it, and *gold* when a gold span touches it.

Figures (micro-averaged over cases unless said otherwise):

- decision accuracy and Cohen's kappa of the review's decision against ``gold.decision``;
- error detection per step (a step the review names in ``errors`` against the steps of the
  gold errors) and per category (a (step, category) pair against the gold pairs), with
  precision and recall;
- span precision, recall and F1 over excluded words against gold words, on the cases whose
  gold decision is ``accept`` (a rejected trajectory is never trained on, so where its
  defects lie does not matter; a review that rejects an accepted case is scored on whatever
  defects it kept, usually none);
- minimality: for each detected error (a (message, category) group of the review's defects at
  a step that holds a gold error), the share of its excluded words that are gold words,
  averaged over those errors (1.0: nothing outside the gold spans), and the mean number of its
  excluded words outside every gold span;
- collateral damage: excluded words that are not gold, over the words the gold keeps (and
  their number per trajectory); minimality and collateral damage are scored on the same
  cases as the spans;
- the share of cases rejected as ``no_valid_target``, the share with a quote that did not
  ground, and grounding failures over all quotes;
- cost (the Review's ``cost_usd``), the judge-1 prompt's tokens as the Review's ``reading``
  records it, and what the run measured per trajectory (``measured``: seconds, and the judges'
  billed input, cached input and output tokens, which ``relearn review bench`` takes from the
  review ledger between two finished reviews when one worker runs).
"""

from __future__ import annotations

import json
import re
import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from records.review import FIELD, Review, field_text
from records.trajectory import Message, Trajectory
from review.agreement import cohen_kappa
from review.bench.cases import BenchCase

WORD = re.compile(r"\S+")
Word = tuple[int, str, int]  # (message index, canonical field, word number)
# What a run measures per trajectory, beside the reviews (``score``'s ``measured``).
MEASURED = ("latency_s", "input_tokens", "cached_input_tokens", "output_tokens")


def canonical(message: Message, field_name: str, start: int, end: int) -> tuple[str, int, int] | None:
    """(canonical field, start, end) of a span, or None when the field is not in the message."""
    match = FIELD.match(field_name)
    if match is None:
        return None
    if match.group(2) is None or match.group(3) is None:
        return field_name, start, end
    index, key = int(match.group(2)), match.group(3)
    calls = message.tool_calls or []
    if index >= len(calls) or key not in calls[index].function.arguments:
        return None
    arguments = calls[index].function.arguments
    # json.dumps writes '{"k": v, "k2": v2}': the value of ``key`` starts after its predecessors.
    offset = 1
    for name, value in arguments.items():
        head = json.dumps(name, ensure_ascii=False) + ": "
        if name == key:
            offset += len(head)
            break
        offset += len(head) + len(json.dumps(value, ensure_ascii=False)) + 2
    value = arguments[key]
    if isinstance(value, str):
        # The raw string's character i sits after the escaped form of everything before it.
        def at(i: int) -> int:
            return offset + len(json.dumps(value[:i], ensure_ascii=False)) - 1

        return f"tool_calls[{index}].arguments", at(start), at(end)
    return f"tool_calls[{index}].arguments", offset + start, offset + end


def _words(trajectory: Trajectory, spans: list[tuple[int, str, int, int]]) -> set[Word]:
    out: set[Word] = set()
    for message_index, field_name, start, end in spans:
        if not 0 <= message_index < len(trajectory.messages):
            continue
        message = trajectory.messages[message_index]
        place = canonical(message, field_name, start, end)
        if place is None:
            continue
        name, lo, hi = place
        text = field_text(message, name) or ""
        for number, word in enumerate(WORD.finditer(text)):
            if word.start() < hi and lo < word.end():
                out.add((message_index, name, number))
    return out


def eligible_words(trajectory: Trajectory) -> int:
    total = 0
    for message in trajectory.messages:
        if message.role == "assistant" and message.generated:
            names = ["content", "reasoning_content", *(f"tool_calls[{i}].arguments" for i in range(len(message.tool_calls or [])))]
            total += sum(len(WORD.findall(field_text(message, name) or "")) for name in names)
    return total


def gold_words(case: BenchCase) -> set[Word]:
    return _words(case.trajectory, [(s.message_index, s.field, s.start, s.end) for e in case.gold.errors for s in e.spans])


def review_words(case: BenchCase, review: Review) -> set[Word]:
    return _words(case.trajectory, [(d.message_index, d.field, d.start, d.end) for d in review.defects])


@dataclass
class Counts:
    """What the figures are made of, summed over a group of cases."""

    cases: int = 0
    decisions_right: int = 0
    gold_decisions: list[str] = field(default_factory=list)
    review_decisions: list[str] = field(default_factory=list)
    step_tp: int = 0
    step_fp: int = 0
    step_fn: int = 0
    pair_tp: int = 0
    pair_fp: int = 0
    pair_fn: int = 0
    word_tp: int = 0
    word_fp: int = 0
    word_fn: int = 0
    gold_kept_words: int = 0
    span_cases: int = 0  # cases whose spans are scored (gold decision accept)
    minimality: list[float] = field(default_factory=list)
    outside_per_error: list[int] = field(default_factory=list)
    no_valid_target: int = 0
    grounding_failed_cases: int = 0
    quotes_grounded: int = 0
    quotes_rejected: int = 0
    judge_errors: int = 0
    cost_usd: list[float] = field(default_factory=list)
    prompt_tokens: list[int] = field(default_factory=list)
    measured: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))

    def add(self, row: dict[str, Any]) -> None:
        self.cases += 1
        self.decisions_right += row["decision"] == row["gold_decision"]
        self.gold_decisions.append(row["gold_decision"])
        self.review_decisions.append(row["decision"])
        for key in (
            "step_tp",
            "step_fp",
            "step_fn",
            "pair_tp",
            "pair_fp",
            "pair_fn",
            "word_tp",
            "word_fp",
            "word_fn",
            "gold_kept_words",
            "quotes_grounded",
            "quotes_rejected",
        ):
            setattr(self, key, getattr(self, key) + row[key])
        self.span_cases += row["spans_scored"]
        self.minimality += row["minimality"]
        self.outside_per_error += row["outside_per_error"]
        self.no_valid_target += row["no_valid_target"]
        self.grounding_failed_cases += row["quotes_rejected"] > 0
        self.judge_errors += row["judge_error"]
        self.cost_usd.append(row["cost_usd"])
        if row["prompt_tokens"] is not None:
            self.prompt_tokens.append(row["prompt_tokens"])
        for key in MEASURED:
            if row[key] is not None:
                self.measured[key].append(row[key])

    def figures(self) -> dict[str, Any]:
        n = self.cases
        precision = _ratio(self.word_tp, self.word_tp + self.word_fp)
        recall = _ratio(self.word_tp, self.word_tp + self.word_fn)
        quotes = self.quotes_grounded + self.quotes_rejected
        return {
            "cases": n,
            "decision_accuracy": _ratio(self.decisions_right, n),
            "decision_kappa": cohen_kappa(self.gold_decisions, self.review_decisions) if n else None,
            "step_precision": _ratio(self.step_tp, self.step_tp + self.step_fp),
            "step_recall": _ratio(self.step_tp, self.step_tp + self.step_fn),
            "category_precision": _ratio(self.pair_tp, self.pair_tp + self.pair_fp),
            "category_recall": _ratio(self.pair_tp, self.pair_tp + self.pair_fn),
            "span_precision": precision,
            "span_recall": recall,
            "span_f1": _f1(precision, recall),
            "minimality": statistics.fmean(self.minimality) if self.minimality else None,
            "outside_words_per_error": statistics.fmean(self.outside_per_error) if self.outside_per_error else None,
            "detected_errors_with_spans": len(self.minimality),
            "collateral_damage": _ratio(self.word_fp, self.gold_kept_words),
            "collateral_words_per_trajectory": _ratio(self.word_fp, self.span_cases),
            "no_valid_target_rate": _ratio(self.no_valid_target, n),
            "grounding_failure_case_rate": _ratio(self.grounding_failed_cases, n),
            "grounding_failure_quote_rate": _ratio(self.quotes_rejected, quotes),
            "judge_error_rate": _ratio(self.judge_errors, n),
            "cost_usd_per_trajectory": statistics.fmean(self.cost_usd) if self.cost_usd else None,
            "cost_usd_total": sum(self.cost_usd),
            "judge1_prompt_tokens_per_trajectory": statistics.fmean(self.prompt_tokens) if self.prompt_tokens else None,
            **{f"{key}_per_trajectory": statistics.fmean(self.measured[key]) if self.measured[key] else None for key in MEASURED},
        }


def _ratio(a: int, b: int) -> float | None:
    return a / b if b else None


def _f1(precision: float | None, recall: float | None) -> float | None:
    if recall is None:  # no gold words: nothing to find
        return None
    if precision is None:  # nothing excluded, so nothing of the gold found
        return 0.0
    return 2 * precision * recall / (precision + recall) if precision + recall else 0.0


def score_case(case: BenchCase, review: Review | None, measured: dict[str, float] | None = None) -> dict[str, Any]:
    """One case's row: the review's decision and the counts every figure is made of. A case
    without a review (the reviewer never answered) scores as a rejection that found nothing."""
    if review is None:
        review = Review(trajectory_id=case.trajectory.id, decision="reject", reason="not reviewed")
    extra = review.model_extra or {}
    gold_steps = {e.step for e in case.gold.errors}
    gold_pairs = {(e.step, e.category) for e in case.gold.errors}
    review_pairs = {(int(e["step"]), str(e.get("category", "other"))) for e in review.errors if isinstance(e.get("step"), int)}
    review_steps = {step for step, _category in review_pairs}
    # Where the defects lie matters only in a trajectory that is trained on: spans are scored on
    # the cases the gold accepts (a reviewer that rejects one of them keeps its defects, if any).
    spans_scored = case.gold.decision == "accept"
    gold = gold_words(case) if spans_scored else set()
    excluded = review_words(case, review) if spans_scored else set()
    steps_by_message = {e.spans[0].message_index: e.step for e in case.gold.errors}
    minimality: list[float] = []
    outside: list[int] = []
    groups: dict[tuple[int, str], list[tuple[int, str, int, int]]] = defaultdict(list)
    for defect in review.defects:
        groups[(defect.message_index, defect.category)].append((defect.message_index, defect.field, defect.start, defect.end))
    for (message_index, _category), spans in sorted(groups.items()):
        if not spans_scored or message_index not in steps_by_message:
            continue  # a false detection: counted by precision and collateral damage, not here
        words = _words(case.trajectory, spans)
        if words:
            minimality.append(len(words & gold) / len(words))
            outside.append(len(words - gold))
    grounding = extra.get("grounding") if isinstance(extra.get("grounding"), dict) else {}
    reading = extra.get("reading") if isinstance(extra.get("reading"), dict) else {}
    reason = review.reason or ""
    return {
        "case": case.id,
        "kind": case.kind,
        "long": case.long,
        "trajectory_id": case.trajectory.id,
        "gold_decision": case.gold.decision,
        "decision": review.decision,
        "reason": reason,
        "gold_errors": sorted([step, category] for step, category in gold_pairs),
        "errors": sorted([step, category] for step, category in review_pairs),
        "step_tp": len(review_steps & gold_steps),
        "step_fp": len(review_steps - gold_steps),
        "step_fn": len(gold_steps - review_steps),
        "pair_tp": len(review_pairs & gold_pairs),
        "pair_fp": len(review_pairs - gold_pairs),
        "pair_fn": len(gold_pairs - review_pairs),
        "word_tp": len(excluded & gold),
        "word_fp": len(excluded - gold),
        "word_fn": len(gold - excluded),
        "spans_scored": spans_scored,
        "gold_kept_words": eligible_words(case.trajectory) - len(gold) if spans_scored else 0,
        "minimality": minimality,
        "outside_per_error": outside,
        "no_valid_target": reason.startswith("no_valid_target"),
        "judge_error": reason.startswith("judge_error") or reason == "not reviewed",
        "quotes_grounded": int(grounding.get("grounded", len(review.defects)) or 0),
        "quotes_rejected": int(grounding.get("rejected", 0) or 0),
        "cost_usd": float(extra.get("cost_usd") or 0.0),
        "prompt_tokens": reading.get("tokens") if isinstance(reading.get("tokens"), int) else None,
        **{key: (measured or {}).get(key) for key in MEASURED},
    }


def score(cases: list[BenchCase], reviews: dict[str, Review], measured: dict[str, dict[str, float]] | None = None) -> dict[str, Any]:
    """Overall figures, figures per case kind, per gold error category, and one row per case."""
    measured = measured or {}
    rows = [score_case(case, reviews.get(case.trajectory.id), measured.get(case.trajectory.id)) for case in cases]
    overall = Counts()
    by_kind: dict[str, Counts] = defaultdict(Counts)
    for row in rows:
        overall.add(row)
        by_kind[row["kind"]].add(row)
        if row["long"]:
            by_kind["(long)"].add(row)
    pairs = {"tp": Counter[str](), "fp": Counter[str](), "fn": Counter[str]()}
    for row in rows:
        gold_pairs = {tuple(p) for p in row["gold_errors"]}
        review_pairs = {tuple(p) for p in row["errors"]}
        for step, category in review_pairs:
            pairs["tp" if (step, category) in gold_pairs else "fp"][category] += 1
        for _step, category in gold_pairs - review_pairs:
            pairs["fn"][category] += 1
    categories = sorted(set(pairs["tp"]) | set(pairs["fp"]) | set(pairs["fn"]))
    by_category = {
        c: {
            "gold": pairs["tp"][c] + pairs["fn"][c],
            "found": pairs["tp"][c] + pairs["fp"][c],
            "precision": _ratio(pairs["tp"][c], pairs["tp"][c] + pairs["fp"][c]),
            "recall": _ratio(pairs["tp"][c], pairs["tp"][c] + pairs["fn"][c]),
        }
        for c in categories
    }
    return {
        "overall": overall.figures(),
        "by_kind": {kind: counts.figures() for kind, counts in sorted(by_kind.items())},
        "by_category": by_category,
        "cases": rows,
    }
