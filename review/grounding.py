"""Deterministic quote grounding: a judge's quote → an exact character span of one field.

Judges paraphrase, re-indent and drop characters; the mask compiler needs the exact text
at exact offsets. We try, in order: (1) the exact substring, (2) a match after collapsing
whitespace runs on both sides, mapped back to raw offsets, (3) a strict fuzzy re-anchor
(rapidfuzz) re-checked on the aligned substring. More than one candidate is resolved with
the quote's context (as a W3C ``TextQuoteSelector`` prefix/suffix) or rejected: a span
is never guessed, because excluding the wrong text silently trains on the real error.

The returned defect's ``quote`` is always ``field_text(message, field)[start:end]``.
"""

from __future__ import annotations

import json
import math
import re
import shlex
from dataclasses import dataclass

from rapidfuzz import fuzz

from records.review import FIELD, Defect, field_is_json, field_text
from records.trajectory import Message, Trajectory

MIN_FUZZY_CHARS = 12  # shorter quotes re-anchor by chance; they must match exactly
_NEAR_MISS = 20.0  # a best score within this of the threshold is "below threshold", else "not found"
_CONTEXT_WINDOW = 256
_MIN_PART = 4  # each side of a straddling quote, so a stray character does not count

Span = tuple[str, int, int]  # (field, start, end)


@dataclass
class GroundingResult:
    defect: Defect | None
    method: str  # "exact" | "whitespace" | "fuzzy" | "rejected"
    reason: str | None = None


def ground(
    trajectory: Trajectory,
    message_index: int,
    field: str,
    quote: str,
    *,
    context_before: str = "",
    context_after: str = "",
    category: str = "other",
    description: str = "",
    fuzzy_threshold: float = 92.0,
) -> GroundingResult:
    """Ground ``quote`` in ``field`` of message ``message_index`` ("auto", "" or a field the message
    lacks searches every field of the message)."""
    if not quote or not quote.strip():
        return _reject("empty quote")
    if not 0 <= message_index < len(trajectory.messages):
        return _reject("no such message")
    message = trajectory.messages[message_index]
    # Only generated assistant text is ever supervised; a span elsewhere would make the
    # mask compiler refuse the whole trajectory.
    if message.role != "assistant" or not message.generated:
        return _reject("not a generated assistant message")
    auto = _auto_tiers(message)
    text = field_text(message, field) if FIELD.match(field) else None
    if text is None:
        # No such field ("", "auto", a misspelt key, a call index past the last): judges name
        # fields loosely, so search every field of the step; uniqueness decides.
        plans = [auto]
    else:
        # The named field first, through every method; the other fields only if it has no
        # candidate at all (judges often name content for text that sits in
        # reasoning_content). Uniqueness is required there as everywhere.
        others = [[(f, t) for f, t in tier if f != field] for tier in auto]
        plans = [[[(field, text)]], [tier for tier in others if tier]]
    best_fuzzy = 0.0
    for tiers in plans:
        result, score = _locate(message, tiers, quote, context_before, context_after, fuzzy_threshold)
        best_fuzzy = max(best_fuzzy, score)
        if isinstance(result, str):
            return _reject(result)
        if result is not None:
            (name, start, end), method, source = result
            defect = Defect(
                message_index=message_index,
                field=name,
                start=start,
                end=end,
                quote=source[start:end],
                category=category,
                description=description,
            )
            return GroundingResult(defect, method)
    reason = _why_not_found(trajectory, message_index, quote)
    if reason == "not found" and len(quote.strip()) >= MIN_FUZZY_CHARS and best_fuzzy >= fuzzy_threshold - _NEAR_MISS:
        reason = "below threshold"
    return _reject(reason)


def _locate(
    message: Message, tiers: list[list[tuple[str, str]]], quote: str, before: str, after: str, threshold: float
) -> tuple[tuple[Span, str, str] | str | None, float]:
    """((span, method, field text) | "ambiguous" | None, best fuzzy score): methods in
    order, and within a method the tiers in order; the first with candidates decides."""
    texts = {f: t for tier in tiers for f, t in tier}
    best = 0.0
    for method in ("exact", "whitespace", "fuzzy"):
        if method == "fuzzy" and len(quote.strip()) < MIN_FUZZY_CHARS:
            break
        for tier in tiers:
            spans: list[Span] = []
            for name, text in tier:
                found, score = _search(method, text, name, _forms(text, field_is_json(message, name), quote), threshold)
                spans += found
                best = max(best, score)
            if spans:
                chosen = _disambiguate(sorted(set(spans)), texts, before, after)
                return ("ambiguous" if chosen is None else (chosen, method, texts[chosen[0]])), best
    return None, best


def _reject(reason: str) -> GroundingResult:
    return GroundingResult(None, "rejected", reason)


def _auto_tiers(message: Message) -> list[list[tuple[str, str]]]:
    """Fields to search: text fields and argument string values first; the JSON text of
    each call's arguments only after, since it repeats those values (escaped)."""
    primary: list[tuple[str, str]] = []
    for name in ("content", "reasoning_content"):
        text = field_text(message, name)
        if text:
            primary.append((name, text))
    json_texts: list[tuple[str, str]] = []
    for i, call in enumerate(message.tool_calls or []):
        for key, value in call.function.arguments.items():
            name = f"tool_calls[{i}].arguments.{key}"
            text = field_text(message, name) if FIELD.match(name) else None
            if text and value not in ("", None):
                primary.append((name, text))
        json_texts.append((f"tool_calls[{i}].arguments", json.dumps(call.function.arguments, ensure_ascii=False)))
    return [tier for tier in (primary, json_texts) if tier]


def _forms(text: str, is_json: bool, quote: str) -> list[str]:
    """The quote as written, then as it would read in the field's own encoding. Judges read
    arguments as JSON and quote them every way: a quote of JSON text (the arguments object,
    an argv list) may be unescaped, re-indented, or the whole object; a quote of a raw string
    value may still carry JSON escapes; an argv list may be quoted as the command line it
    runs (``bash -lc 'ls -R'``)."""
    forms = [quote]
    if is_json:
        forms.append(json.dumps(quote, ensure_ascii=False)[1:-1])
        forms += _as_json_text(quote)
        forms += _argv_forms(text, quote)
    elif "\\" in quote:
        try:
            decoded = json.loads(f'"{quote}"')
        except json.JSONDecodeError:
            decoded = None
        if isinstance(decoded, str):
            forms.append(decoded)
    return [f for i, f in enumerate(forms) if f and f not in forms[:i]]


def _as_json_text(quote: str) -> list[str]:
    """A quote that is itself a JSON object or list (a whole arguments object, pretty-printed
    as the judge read it) in the compact form the field holds."""
    stripped = quote.strip()
    if not stripped.startswith(("{", "[")):
        return []
    try:
        value = json.loads(stripped)
    except json.JSONDecodeError:
        return []
    return [json.dumps(value, ensure_ascii=False)]


def _argv_forms(text: str, quote: str) -> list[str]:
    """An argv list quoted as the command line it runs: the whole list's JSON text."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return []
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        return []
    said = _squash(quote)
    if said in (_squash(" ".join(value)), _squash(shlex.join(value))):
        return [text]
    return []


def _search(method: str, text: str, field: str, forms: list[str], threshold: float) -> tuple[list[Span], float]:
    """Candidate spans of the first of ``forms`` that has any, and the best fuzzy score."""
    best = 0.0
    for form in forms:
        if method == "exact":
            found = _exact(text, form)
        elif method == "whitespace":
            found = _whitespace(text, form)
        else:
            found, score = _fuzzy(text, form, threshold)
            best = max(best, score)
        if found:
            return [(field, s, e) for s, e in found], best
    return [], best


def _exact(text: str, quote: str) -> list[tuple[int, int]]:
    spans, at = [], text.find(quote)
    while at != -1:
        spans.append((at, at + len(quote)))
        at = text.find(quote, at + 1)
    return spans


def collapse(text: str) -> tuple[str, list[int]]:
    """Whitespace runs → one space, with the raw offset of each kept character."""
    out: list[str] = []
    index: list[int] = []
    in_space = False
    for i, ch in enumerate(text):
        if ch.isspace():
            if not in_space:
                out.append(" ")
                index.append(i)
            in_space = True
        else:
            out.append(ch)
            index.append(i)
            in_space = False
    return "".join(out), index


def _whitespace(text: str, quote: str) -> list[tuple[int, int]]:
    needle, _ = collapse(quote.strip())
    if not needle:
        return []
    haystack, index = collapse(text)
    # The needle starts and ends on non-space characters, so both ends map back exactly.
    return [(index[p], index[p + len(needle) - 1] + 1) for p, _ in _exact(haystack, needle)]


def _fuzzy(text: str, quote: str, threshold: float) -> tuple[list[tuple[int, int]], float]:
    """Non-overlapping alignments whose exact substring scores >= threshold, and the best
    score seen. Each found span is blanked out before looking for another, so a second
    hit means ambiguity, not the same place twice."""
    needle = quote.strip()
    work = text
    spans: list[tuple[int, int]] = []
    best = 0.0
    for _ in range(4):
        alignment = fuzz.partial_ratio_alignment(needle, work)
        if alignment is None or alignment.dest_end <= alignment.dest_start:
            break
        start, end, score = _refine(needle, work, alignment.dest_start, alignment.dest_end, threshold)
        best = max(best, score)
        if score < threshold:
            break
        spans.append((start, end))
        work = work[:start] + "\x00" * (end - start) + work[end:]
    return spans, best


def _refine(needle: str, text: str, start: int, end: int, threshold: float) -> tuple[int, int, float]:
    """partial_ratio aligns a window as long as the quote; a quote with dropped or added
    characters fits a shorter or longer span. Move each edge to the best ``ratio`` of the
    whole span (not partial: the span must not spill into other text). A span scoring
    ``threshold`` differs in length from the quote by at most ``2 * (1 - threshold/100) * len``."""
    reach = min(24, 2 + math.ceil(2 * (1 - threshold / 100) * len(needle)))
    best = (fuzz.ratio(needle, text[start:end]), 0, start, end)
    for a in range(max(0, start - reach), min(len(text), start + reach) + 1):
        for b in range(max(a + 1, end - reach), min(len(text), end + reach) + 1):
            candidate = (fuzz.ratio(needle, text[a:b]), -(abs(a - start) + abs(b - end)), a, b)
            if candidate[:2] > best[:2]:
                best = candidate
    _, _, a, b = best
    while a < b and text[a].isspace():
        a += 1
    while b > a and text[b - 1].isspace():
        b -= 1
    return a, b, fuzz.ratio(needle, text[a:b])


def _disambiguate(spans: list[Span], texts: dict[str, str], before: str, after: str) -> Span | None:
    """The one candidate whose surroundings match the context, else None (ambiguous)."""
    if len(spans) == 1:
        return spans[0]
    want_before = collapse(before)[0].strip()
    want_after = collapse(after)[0].strip()
    if not want_before and not want_after:
        return None
    strict: list[Span] = []
    scores: list[int] = []
    for name, start, end in spans:
        text = texts[name]
        window = max(_CONTEXT_WINDOW, 4 * max(len(before), len(after)))
        have_before = collapse(text[max(0, start - window) : start])[0].rstrip()
        have_after = collapse(text[end : end + window])[0].lstrip()
        if have_before.endswith(want_before) and have_after.startswith(want_after):
            strict.append((name, start, end))
        scores.append(_common_suffix(have_before, want_before) + _common_prefix(have_after, want_after))
    if strict:
        return strict[0] if len(strict) == 1 else None
    # No candidate matches the context exactly (judges trim or misquote it): accept the
    # single best only if it matches at least half of the context and beats every other.
    top = max(scores)
    if scores.count(top) == 1 and 2 * top >= len(want_before) + len(want_after):
        return spans[scores.index(top)]
    return None


def _common_suffix(a: str, b: str) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[-1 - n] == b[-1 - n]:
        n += 1
    return n


def _common_prefix(a: str, b: str) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def _message_texts(message: Message) -> list[str]:
    texts = [message.reasoning_content or "", message.content or ""]
    texts += [json.dumps(c.function.arguments, ensure_ascii=False) for c in message.tool_calls or []]
    texts += [v for c in message.tool_calls or [] for v in c.function.arguments.values() if isinstance(v, str)]
    return [t for t in texts if t]


def _why_not_found(trajectory: Trajectory, message_index: int, quote: str) -> str:
    """Tell a quote that sits in another message, or straddles two fields or messages,
    from one that is nowhere: the reasons are counted, and point at different judge mistakes."""
    needle = _squash(quote)
    per_message = [[_squash(t) for t in _message_texts(m)] for m in trajectory.messages]
    for i, texts in enumerate(per_message):
        if i != message_index and any(needle in text for text in texts):
            return "in another message"
    # Straddling: a head of the quote ends one text and the rest starts another.
    texts = [t for ts in per_message for t in ts if t]
    heads: set[int] = set()
    for text in texts:
        at = text.find(needle[:_MIN_PART], max(0, len(text) - len(needle)))
        while at != -1:
            if needle.startswith(text[at:]):
                heads.add(len(text) - at)
            at = text.find(needle[:_MIN_PART], at + 1)
    for k in sorted(heads):
        tail = needle[k:].lstrip()
        if k >= _MIN_PART and len(tail) >= _MIN_PART and any(t.startswith(tail) for t in texts):
            return "spans fields"
    return "not found"


def _squash(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()
