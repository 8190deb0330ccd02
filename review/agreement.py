"""How far two reviews of the same pool agree: Cohen's kappa on decisions and on each
trajectory's primary error category, span F1 over the tokens they exclude, and the
share of tokens the reference keeps that the other wrongly excludes.

Tokens here are whitespace-separated words of each assistant field, so the measure
needs no model tokenizer and counts a word as excluded when a defect touches it.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

from records.review import Review, field_text, primary_category
from records.trajectory import Trajectory

WORD = re.compile(r"\S+")


def cohen_kappa(a: list[str], b: list[str]) -> float:
    n = len(a)
    if n == 0:
        return 1.0
    observed = sum(x == y for x, y in zip(a, b, strict=True)) / n
    ca, cb = Counter(a), Counter(b)
    expected = sum(ca[label] * cb[label] for label in set(ca) | set(cb)) / (n * n)
    return 1.0 if expected == 1.0 else (observed - expected) / (1 - expected)


def excluded_words(trajectory: Trajectory, review: Review) -> set[tuple[int, str, int]]:
    """(message, field, word index) of every word a defect touches."""
    out: set[tuple[int, str, int]] = set()
    for defect in review.defects:
        text = field_text(trajectory.messages[defect.message_index], defect.field) or ""
        for number, match in enumerate(WORD.finditer(text)):
            if match.start() < defect.end and defect.start < match.end():
                out.add((defect.message_index, defect.field, number))
    return out


def eligible_words(trajectory: Trajectory) -> int:
    total = 0
    for message in trajectory.messages:
        if message.role == "assistant" and message.generated:
            for name in ("content", "reasoning_content"):
                total += len(WORD.findall(field_text(message, name) or ""))
            for number in range(len(message.tool_calls or [])):
                total += len(WORD.findall(field_text(message, f"tool_calls[{number}].arguments") or ""))
    return total


def agreement(reference: dict[str, Review], other: dict[str, Review], trajectories: dict[str, Trajectory]) -> dict[str, Any]:
    ids = sorted(set(reference) & set(other))
    decisions_a = [reference[i].decision for i in ids]
    decisions_b = [other[i].decision for i in ids]
    categories_a = [primary_category(reference[i]) for i in ids]
    categories_b = [primary_category(other[i]) for i in ids]
    true_positive = false_positive = false_negative = kept_by_reference = wrongly_excluded = 0
    for i in ids:
        trajectory = trajectories.get(i)
        if trajectory is None:
            continue
        a, b = excluded_words(trajectory, reference[i]), excluded_words(trajectory, other[i])
        true_positive += len(a & b)
        false_positive += len(b - a)
        false_negative += len(a - b)
        kept = eligible_words(trajectory) - len(a)
        kept_by_reference += kept
        wrongly_excluded += len(b - a)
    precision = true_positive / (true_positive + false_positive) if true_positive + false_positive else 1.0
    recall = true_positive / (true_positive + false_negative) if true_positive + false_negative else 1.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {
        "trajectories": len(ids),
        "decision_agreement": sum(x == y for x, y in zip(decisions_a, decisions_b, strict=True)) / len(ids) if ids else 1.0,
        "decision_kappa": cohen_kappa(decisions_a, decisions_b),
        "category_kappa": cohen_kappa(categories_a, categories_b),
        "span_precision": precision,
        "span_recall": recall,
        "span_f1": f1,
        "wrongly_excluded_share": wrongly_excluded / kept_by_reference if kept_by_reference else 0.0,
    }
