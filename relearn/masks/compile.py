"""Mask compilation: m = A \\ E over the rendered trajectory, and VALIDATE.

A: tokens lying wholly inside a generated assistant turn (after the generation prompt,
through the end-of-turn token). A token that straddles the turn's edge is not eligible.
E: tokens overlapping any character of a grounded defect (a token half inside a defect
is excluded: excluding correct text costs little, imitating an error costs a lot).

Modes (DESIGN.md): ``ross`` = A \\ E on accepted trajectories; ``positive`` = A on every
verifier-positive trajectory (Positive-Rollout SFT); ``ross-nomask`` = A on the accepted
subset (filtering without masking): its defects are validated as in ``ross``, so both hold
the same trajectories. Defect scope (``CompileOptions.defect_scope``): ``action`` (default) maps
a defect in a tool call to the whole call as rendered; ``minimal`` to the quoted text only.

VALIDATE fails closed, per trajectory, with a reason: the rendered text re-tokenizes to
the same ids; every defect's quote is at its offsets, in its field and in the render;
every supervised token is in A; no supervised token touches a defect character; the
template is prefix-stable at each generated turn (or per-turn rendering was chosen).

What the model saw and did (``CompileOptions.context``, ``CompileOptions.recorded_ids``): a
trajectory whose trained context would differ from the one the model had (its recorded prompt
ids disagree with the render, or its protocol says the history was sent without reasoning,
``relearn.masks.context_check``) is compiled one sample per turn under the context as sent; a
generated turn that recorded its ids is trained on them (``relearn.masks.tokens``).
"""

from __future__ import annotations

import os
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

import numpy as np

from records.review import CATEGORIES, FIELD, Defect, Review, field_text
from records.trajectory import Trajectory, is_verified_positive
from relearn.masks.byte_level import byte_table
from relearn.masks.context_check import check_trajectory, compiled_as_sent, context_rule, prompt_ids
from relearn.masks.rows import supervised_targets
from relearn.masks.scopes import ACTION_SCOPE, SCOPES, DefectScope, action_block, excluded_by_scope, text_protocol
from relearn.masks.template import (
    PrefixCheck,
    Rendered,
    RenderError,
    TemplateShape,
    context_segments,
    nfc,
    nfc_offset,
    per_turn_renders,
    probe,
    render,
)
from relearn.masks.tokens import Encoded, PromptMismatch, as_sent, encode_render, encode_texts, tokenised_whole

Mode = Literal["ross", "positive", "ross-nomask"]
MODES: tuple[Mode, ...] = get_args(Mode)
# ``action``: a defect in a tool call covers the whole call as rendered (its wrapper tags,
# function name, every argument, and the end of turn after a turn's last call), since the
# error is the decision to call; ``minimal``: only the quoted characters (the ablation).
DEFECT_SCOPES = SCOPES  # (relearn.masks.scopes, which reports TER under each)
# The longest sample in tokens, for everything that reads a trajectory whole (masks, training,
# NLL scoring, the pipeline): longer ones are dropped and counted, never cut.
CONTEXT_TOKENS = 65536
Context = Literal["as-sent", "render"]
CONTEXTS: tuple[Context, ...] = get_args(Context)


# The rejection of a success whose task image the audit flags (.git exposes the fix).
FLAGGED_BY_AUDIT = "task image flagged by the audit"


class Rejected(Exception):
    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


@dataclass
class Sample:
    """One training sequence (a whole trajectory, or one turn in per-turn mode)."""

    sample_id: str
    trajectory_id: str
    input_ids: np.ndarray  # int32
    loss_mask: np.ndarray  # uint8
    eligible: int
    excluded: int
    supervised: int  # supervised targets (relearn.masks.rows.supervised_targets)
    # Per token: 1 where eligible (A), and the index in ``records.review.CATEGORIES`` of the
    # defect that excludes it (-1 where none does); for analyses that split A into kept and E.
    # A token under defects of two categories is counted under both in ``excluded_by_category``
    # (excluded for either reason) but named once here, by the first of those defects.
    eligible_mask: np.ndarray  # uint8
    excluded_category: np.ndarray  # int8
    excluded_by_category: Counter[str] = field(default_factory=Counter)
    # Eligible tokens excluded under each defect scope (``excluded`` is the trained scope's).
    excluded_by_scope: dict[str, int] = field(default_factory=dict)
    targets: str = "text"  # one of relearn.masks.tokens.TARGETS
    targets_detail: str = ""  # why recorded ids were not used (``ids_disagree``)
    context_rule: str = ""  # relearn.masks.context_check.RULES: what decided the trajectory's context
    as_sent: bool = False  # compiled per turn under the context as sent

    @property
    def ter(self) -> float:
        return self.excluded / self.eligible if self.eligible else 0.0


@dataclass
class CompileOptions:
    mode: Mode = "ross"
    ctx: int = CONTEXT_TOKENS
    template_kwargs: dict[str, Any] = field(default_factory=lambda: {"preserve_thinking": True})
    prefix_check: PrefixCheck = "header"
    per_turn: bool = False
    include_suspicious: bool = False  # successes the verifier found suspicious (records.trajectory.Outcome)
    defect_scope: DefectScope = ACTION_SCOPE
    # Tasks whose images the audit flags (``relearn envs audit -o``), task id -> why: their
    # trajectories are left out of every mode, counted (``relearn.ops.masks`` reads the file).
    flagged_tasks: dict[str, str] = field(default_factory=dict)
    # ``as-sent``: a trajectory whose render departs from what the model saw (by its recorded
    # prompt ids, or by its protocol's rule) is compiled per turn under the context as sent;
    # ``render``: the template's render is trusted.
    context: Context = "as-sent"
    # Generated turns that recorded their ids are trained on them, not on their text tokenised
    # again (relearn.masks.tokens).
    recorded_ids: bool = True


def select(
    trajectory: Trajectory,
    review: Review | None,
    mode: str,
    *,
    include_suspicious: bool = False,
    flagged_tasks: dict[str, str] | None = None,
) -> list[Defect]:
    """Whether a trajectory enters the dataset in ``mode``, and the defects to check (and,
    in ``ross``, to exclude)."""
    if not is_verified_positive(trajectory, allow_suspicious=include_suspicious):
        if is_verified_positive(trajectory, allow_suspicious=True):
            raise Rejected("suspicious verdict", "; ".join((trajectory.outcome.suspicious or [])[:3]) if trajectory.outcome else "")
        raise Rejected("not verified positive", "no outcome with resolved or reward > 0")
    # Before the review: every mode leaves out the same successes of a flagged task.
    if flagged_tasks and trajectory.task_id in flagged_tasks:
        raise Rejected(FLAGGED_BY_AUDIT, f"task {trajectory.task_id}: {flagged_tasks[trajectory.task_id]}")
    if mode == "positive":
        return []
    if review is None:
        raise Rejected("no review")
    if review.decision != "accept":
        raise Rejected("review rejected", review.reason or "")
    # ross-nomask gets the defects too: they are validated as for ross and then not excluded,
    # so that both contrasts hold the same trajectories (the masking contrast is the same
    # subset with and without the mask).
    keep = (review.model_extra or {}).get("keep")
    if keep is not None:
        _check_keep(trajectory, keep, review.defects)
    return list(review.defects)


def _check_keep(trajectory: Trajectory, keep: Any, defects: list[Defect]) -> None:
    """VALIDATE for a single-turn keep review (``review.keep``): its defects must be exactly
    the response text outside the keep intervals K, so that A \\ E is A ∩ K. Every interval's
    quote is at its offsets, no defect touches K, and no text outside K (but whitespace) is
    left unexcluded."""
    if not isinstance(keep, list):
        raise Rejected("keep intervals unreadable", "review.keep is not a list")
    covered: dict[tuple[int, str], np.ndarray] = {}
    kept: dict[tuple[int, str], np.ndarray] = {}
    for item in keep:
        try:
            span = Defect.model_validate({**item, "category": "other"})
        except (TypeError, ValueError) as exc:
            raise Rejected("keep intervals unreadable", str(exc)[:200]) from None
        where = f"keep interval in message {span.message_index} {span.field} [{span.start}, {span.end})"
        if not 0 <= span.message_index < len(trajectory.messages) or span.field not in ("content", "reasoning_content"):
            raise Rejected("keep interval outside the response", where)
        text = field_text(trajectory.messages[span.message_index], span.field) or ""
        if text[span.start : span.end] != span.quote:
            raise Rejected("keep interval not at its offsets", where)
        key = (span.message_index, span.field)
        kept.setdefault(key, np.zeros(len(text), dtype=bool))[span.start : span.end] = True
    messages = {index for index, _field in kept}
    for defect in defects:
        key = (defect.message_index, defect.field)
        text = (
            field_text(trajectory.messages[defect.message_index], defect.field)
            if 0 <= defect.message_index < len(trajectory.messages)
            else None
        )
        if text is None:
            continue  # _defect_render_span rejects it with its location
        covered.setdefault(key, np.zeros(len(text), dtype=bool))[defect.start : defect.end] = True
        if key in kept and np.any(kept[key][defect.start : defect.end]):
            raise Rejected(
                "keep interval overlaps an excluded span", f"message {defect.message_index} {defect.field} [{defect.start}, {defect.end})"
            )
    for index in messages:
        for name in ("reasoning_content", "content"):
            text = field_text(trajectory.messages[index], name) or ""
            inside = kept.get((index, name), np.zeros(len(text), dtype=bool)) | covered.get((index, name), np.zeros(len(text), dtype=bool))
            loose = [i for i in np.flatnonzero(~inside) if not text[i].isspace()]
            if loose:
                raise Rejected(
                    "text outside the keep intervals is not excluded",
                    f"message {index} {name} at {loose[0]}: {text[loose[0] : loose[0] + 40]!r}",
                )


def _defect_render_span(rendered: Rendered, trajectory: Trajectory, defect: Defect, scope: str = ACTION_SCOPE) -> tuple[int, int] | None:
    """Map a defect to rendered characters; None when it covers only text the template
    does not render (trimmed whitespace, JSON punctuation). Raises Rejected when the
    quote is not where the defect says. Under ``action`` scope a defect in a tool call maps
    to the call's whole region, once its quote is checked where it says."""
    where = f"defect in message {defect.message_index} {defect.field} [{defect.start}, {defect.end})"
    if not 0 <= defect.message_index < len(trajectory.messages):
        raise Rejected("defect outside the trajectory", where)
    raw_message = trajectory.messages[defect.message_index]
    raw_text = field_text(raw_message, defect.field)
    if raw_text is None or defect.end > len(raw_text):
        raise Rejected("defect outside its field", where)
    if raw_text[defect.start : defect.end] != defect.quote:
        raise Rejected("quote not at its offsets", f"{where}: field has {raw_text[defect.start : defect.end]!r}, quote is {defect.quote!r}")
    turn = next((t for t in rendered.turns if t.message_index == defect.message_index), None)
    if turn is None:
        raise Rejected("defect in a message that is not a generated turn", where)
    if defect.field in turn.left_out:
        raise Rejected("defect in text the template does not render", where)
    start, end = nfc_offset(raw_text, defect.start), nfc_offset(raw_text, defect.end)
    quote = nfc(defect.quote)
    text = rendered.text
    match = FIELD.match(defect.field)
    assert match is not None
    if match.group(2) is None:  # content or reasoning_content
        span = turn.fields.get(defect.field)
        if span is None:
            return None  # the field renders as nothing (empty after trim)
        lo, hi = max(start, span.lead), min(end, span.lead + span.kept)
        if lo >= hi:
            return None
        at = span.start + lo - span.lead
        expected = quote[lo - start : hi - start]
        if text[at : at + hi - lo] != expected:
            raise Rejected("quote not in the render", where)
        if scope == ACTION_SCOPE and defect.field == "content" and text_protocol(trajectory):
            block = action_block(rendered.messages[defect.message_index].content or "", lo, hi)
            if block is not None:
                first, last = max(block[0], span.lead), min(block[1], span.lead + span.kept)
                block_end = span.start + last - span.lead
                # The action ends the turn: its end of turn is the decision to stop and run it.
                if not text[block_end : turn.end].removesuffix(rendered.end_of_turn).strip():
                    block_end = turn.end
                return span.start + first - span.lead, block_end
        return at, at + hi - lo
    call = turn.calls[int(match.group(2))]
    key = match.group(3)
    if key is not None and key in call.escaped:
        # The template escapes this value: each character's rendered position, checked by
        # the character it shows (an escape's first character is its backslash or quote).
        positions = call.escaped[key][start:end]
        found = (min(positions), max(positions) + 1) if positions else None
    elif key is not None:
        span = call.values[key]
        if text[span.start + start : span.start + end] != quote:
            raise Rejected("quote not in the render", where)
        found = (span.start + start, span.start + end) if end > start else None
    else:
        positions = [call.json_to_render[j] for j in range(start, end) if j in call.json_to_render]
        found = (min(positions), max(positions) + 1) if positions else None
    return call.region if scope == ACTION_SCOPE and end > start else found


def compile_one(
    rendered: Rendered,
    trajectory: Trajectory,
    defects: list[Defect],
    tokenizer: Any,
    sample_id: str,
    *,
    scope: str = ACTION_SCOPE,
    exclude: bool = True,
    encoded: Encoded | None = None,
    recorded_ids: bool = True,
) -> Sample:
    """One sample's ids and mask. ``exclude=False`` (ross-nomask) validates the defects as
    ``ross`` does and then supervises all of A. ``encoded``: the render already through the
    tokenizer (``relearn.masks.tokens.encode_render``), when the caller tokenized many renders
    at once; else it is encoded here, on recorded ids where ``recorded_ids`` and the turns have
    them."""
    if scope not in DEFECT_SCOPES:
        raise ValueError(f"defect scope {scope!r} is not one of {', '.join(DEFECT_SCOPES)}")
    text = rendered.text
    encoded = encoded or encode_render(tokenizer, rendered, recorded_ids)
    ids, offsets = encoded.ids, encoded.offsets
    # VALIDATE: the ids decode to the render. For a render tokenised whole: once the ids decode
    # to the very text they came from, encoding that text again would give the same ids (the
    # tokenizer is a function of its input), so one encode and one decode check it. For recorded
    # ids: each token's characters are where the mask takes them from.
    if encoded.decoded != text:
        raise Rejected("render does not round-trip through the tokenizer")

    eligible_chars = np.zeros(len(text) + 1, dtype=np.int64)
    for turn in rendered.turns:
        eligible_chars[turn.start] += 1
        eligible_chars[turn.end] -= 1
    inside = np.cumsum(eligible_chars)[:-1] > 0
    defect_chars = np.zeros(len(text), dtype=bool)
    spans_by_category: list[tuple[int, int, str]] = []
    for defect in defects:
        span = _defect_render_span(rendered, trajectory, defect, scope)
        if span is not None and exclude:
            defect_chars[span[0] : span[1]] = True
            spans_by_category.append((span[0], span[1], defect.category))

    starts, ends = offsets[:, 0], offsets[:, 1]
    inside_sum = np.concatenate([[0], np.cumsum(inside)])
    defect_sum = np.concatenate([[0], np.cumsum(defect_chars)])
    width = ends - starts
    eligible = (width > 0) & (inside_sum[ends] - inside_sum[starts] == width)
    touches = (defect_sum[ends] - defect_sum[starts]) > 0
    supervised = eligible & ~touches

    # VALIDATE: by construction, and checked, because a wrong mask costs a training run.
    if np.any(supervised & ~eligible) or np.any(supervised & touches):
        raise Rejected("internal: supervised token outside A or on a defect")

    by_category: Counter[str] = Counter()
    excluded_tokens = eligible & touches
    token_category = np.full(len(ids), -1, dtype=np.int8)
    for lo, hi, category in spans_by_category:
        hit = excluded_tokens & (starts < hi) & (ends > lo)
        by_category[category] += int(np.sum(hit))
        code = CATEGORIES.index(category) if category in CATEGORIES else CATEGORIES.index("other")
        token_category[hit & (token_category < 0)] = code
    trained = (scope, int(excluded_tokens.sum()))
    by_scope = (
        excluded_by_scope(rendered, trajectory, defects, (starts, ends), eligible, trained, _defect_render_span)
        if exclude and defects
        else dict.fromkeys(SCOPES, 0)
    )
    return Sample(
        sample_id=sample_id,
        trajectory_id=trajectory.id,
        input_ids=ids,
        loss_mask=supervised.astype(np.uint8),
        eligible=int(eligible.sum()),
        excluded=int(excluded_tokens.sum()),
        supervised=supervised_targets(supervised),
        excluded_by_category=by_category,
        eligible_mask=eligible.astype(np.uint8),
        excluded_category=token_category,
        excluded_by_scope=by_scope,
        targets=encoded.targets,
        targets_detail=encoded.detail,
    )


@dataclass
class Prepared:
    """A trajectory selected and rendered, before tokenization: its defects and its renders
    (one per context, or per turn), each with the suffix of its sample id."""

    trajectory: Trajectory
    defects: list[Defect]
    contexts: Contexts


def prepare(
    trajectory: Trajectory, review: Review | None, tokenizer: Any, options: CompileOptions, *, shape: TemplateShape | None = None
) -> Prepared:
    """Select and render one trajectory, or Rejected with the reason."""
    defects = select(trajectory, review, options.mode, include_suspicious=options.include_suspicious, flagged_tasks=options.flagged_tasks)
    contexts = context_renders(trajectory, tokenizer, options, shape=shape)
    if not any(r.turns for _suffix, r in contexts.renders):
        raise Rejected("no generated assistant turn")
    return Prepared(trajectory, defects, contexts)


@dataclass
class Contexts:
    """The renders a trajectory's samples are made of, each with its sample id's suffix."""

    renders: list[tuple[str, Rendered]]
    split: bool  # more than one sample: each excludes the defects of its own turns only
    rule: str  # what decided the context (relearn.masks.context_check.RULES)
    as_sent: bool  # one render per turn under the context as sent


def context_renders(trajectory: Trajectory, tokenizer: Any, options: CompileOptions, *, shape: TemplateShape | None = None) -> Contexts:
    """The contexts the model had, rendered: one per context segment (``#r{k}``), or one per
    turn (``#m{i}``) in per-turn mode or where the render departs from what the model saw
    (``options.context``). What ``relearn analyze nll`` scores too. Rejected with the reason."""
    unknown = _unknown_context(trajectory)
    if unknown is not None:
        raise Rejected("context reset without a known replacement", unknown)
    shape = shape or _probe(tokenizer, options)
    # Reasoning the harness never sent back is left out of each turn's history whatever the
    # template would do with it (a template that drops it rewrites the earlier turns instead).
    # Trusting the template (``render``), the rule is named but nothing is checked.
    if options.context == "as-sent":
        check = check_trajectory(trajectory, tokenizer, options.template_kwargs, shape, options.per_turn)
        rule, sent = check.rule, compiled_as_sent(check)
    else:
        rule, sent = context_rule(trajectory), False
    segments = context_segments(trajectory)
    try:
        renders: list[tuple[str, Rendered]] = []
        for number, segment in enumerate(segments):
            prefix = f"#r{number}" if len(segments) > 1 else ""
            if sent:
                renders += [
                    (f"{prefix}#m{r.turns[0].message_index}", r)
                    for r in _as_sent_renders(trajectory, tokenizer, options, segment, shape, rule)
                ]
            elif options.per_turn:
                renders += [
                    (f"{prefix}#m{r.turns[0].message_index}", r)
                    for r in per_turn_renders(trajectory, tokenizer, template_kwargs=options.template_kwargs, segment=segment, shape=shape)
                ]
            else:
                rendered = render(
                    trajectory,
                    tokenizer,
                    template_kwargs=options.template_kwargs,
                    prefix_check=options.prefix_check,
                    segment=segment,
                    shape=shape,
                )
                if rendered.turns or len(segments) == 1:
                    renders.append((prefix, rendered))
    except RenderError as exc:
        raise Rejected(f"render: {exc.reason}", exc.detail) from None
    return Contexts(renders, sent or options.per_turn or len(segments) > 1, rule, sent)


def _probe(tokenizer: Any, options: CompileOptions) -> TemplateShape:
    try:
        return probe(tokenizer, options.template_kwargs)
    except RenderError as exc:
        raise Rejected(f"render: {exc.reason}", exc.detail) from None


def _as_sent_renders(
    trajectory: Trajectory, tokenizer: Any, options: CompileOptions, segment: list[int], shape: TemplateShape, rule: str
) -> list[Rendered]:
    """One render per generated turn under the history the call was sent: its recorded prompt
    ids where it has them, else the template's history, without the reasoning the harness
    never sent back where the ``rule`` says so."""
    renders = per_turn_renders(
        trajectory,
        tokenizer,
        template_kwargs=options.template_kwargs,
        segment=segment,
        shape=shape,
        history_reasoning=rule == "prompt_ids",
    )
    out = []
    for rendered in renders:
        ids = prompt_ids(trajectory.messages[rendered.turns[0].message_index])
        if ids is None:
            out.append(rendered)
            continue
        try:
            out.append(as_sent(rendered, ids, tokenizer, shape.generation_prompt))
        except PromptMismatch as exc:
            raise Rejected("recorded prompt ids do not end with the generation prompt", str(exc)) from None
    return out


def compile_prepared(prepared: Prepared, tokenizer: Any, options: CompileOptions, encoded: list[Encoded]) -> list[Sample]:
    """The samples of a prepared trajectory, given each render's ``encoded`` tokens."""
    trajectory, defects = prepared.trajectory, prepared.defects
    samples = []
    contexts = prepared.contexts
    for (suffix, rendered), tokens in zip(contexts.renders, encoded, strict=True):
        own = [d for d in defects if any(t.message_index == d.message_index for t in rendered.turns)] if contexts.split else defects
        sample = compile_one(
            rendered,
            trajectory,
            own,
            tokenizer,
            trajectory.id + suffix,
            scope=options.defect_scope,
            exclude=options.mode == "ross",
            encoded=tokens,
        )
        if len(sample.input_ids) > options.ctx:
            raise Rejected("longer than ctx", f"{len(sample.input_ids)} tokens > {options.ctx}")
        sample.context_rule, sample.as_sent = contexts.rule, contexts.as_sent
        samples.append(sample)
    return samples


def encode_prepared(tokenizer: Any, prepared: Prepared, recorded_ids: bool) -> list[Encoded]:
    """Each render of a prepared trajectory through the tokenizer: the renders trained on
    their text in one batch call, the others on their recorded ids."""
    renders = [rendered for _suffix, rendered in prepared.contexts.renders]
    plain = [i for i, r in enumerate(renders) if tokenised_whole(r, recorded_ids)]
    texts = dict(zip(plain, encode_texts(tokenizer, [renders[i].text for i in plain]), strict=True))
    return [texts[i] if i in texts else encode_render(tokenizer, r, recorded_ids) for i, r in enumerate(renders)]


def compile_trajectory(
    trajectory: Trajectory, review: Review | None, tokenizer: Any, options: CompileOptions, *, shape: TemplateShape | None = None
) -> list[Sample]:
    """The samples one trajectory contributes, or Rejected with the reason. A trajectory with
    context resets gives one sample per context (ids ``#r{k}``); per-turn mode, or a trajectory
    compiled under the context as sent, one per turn (``#m{i}``). ``shape``: the template probed
    once by a caller compiling many trajectories."""
    prepared = prepare(trajectory, review, tokenizer, options, shape=shape)
    return compile_prepared(prepared, tokenizer, options, encode_prepared(tokenizer, prepared, options.recorded_ids))


def compile_batch(
    items: list[tuple[Trajectory, Review | None]], tokenizer: Any, options: CompileOptions, *, shape: TemplateShape | None = None
) -> list[list[Sample] | Rejected]:
    """``compile_trajectory`` of each item, in order. A fast tokenizer encodes each trajectory's
    renders on a pool of threads as soon as they are rendered: its Rust backend releases the GIL,
    so the cores tokenize while this thread renders the next trajectories and masks those already
    tokenized, and none waits for the whole batch. The results are the same as item by item."""
    if getattr(tokenizer, "backend_tokenizer", None) is None:  # a slow tokenizer is Python: nothing to overlap
        return [_compile_or_rejected(trajectory, review, tokenizer, options, shape) for trajectory, review in items]
    byte_table(tokenizer)  # built here once, not by the encoding threads at once
    pending: list[tuple[Prepared, Future[list[Encoded]]] | Rejected] = []
    out: list[list[Sample] | Rejected] = []

    def finish(block: bool) -> None:
        """Mask the pending trajectories in order, while they are tokenized (all when ``block``)."""
        while len(out) < len(pending):
            item = pending[len(out)]
            if isinstance(item, Rejected):
                out.append(item)
                continue
            prepared, encoded = item
            if not block and not encoded.done():
                return
            try:
                out.append(compile_prepared(prepared, tokenizer, options, encoded.result()))
            except Rejected as exc:
                out.append(exc)

    with ThreadPoolExecutor(max_workers=_encode_threads()) as encoders:
        for trajectory, review in items:
            try:
                prepared = prepare(trajectory, review, tokenizer, options, shape=shape)
            except Rejected as exc:
                pending.append(exc)
                continue
            pending.append((prepared, encoders.submit(encode_prepared, tokenizer, prepared, options.recorded_ids)))
            finish(block=False)
        finish(block=True)
    return out


def _compile_or_rejected(
    trajectory: Trajectory, review: Review | None, tokenizer: Any, options: CompileOptions, shape: TemplateShape | None
) -> list[Sample] | Rejected:
    try:
        return compile_trajectory(trajectory, review, tokenizer, options, shape=shape)
    except Rejected as exc:
        return exc


def _encode_threads() -> int:
    """One encoding thread per core this process may run on, or as many as the tokenizer's own
    thread pool is limited to (``RAYON_NUM_THREADS``: a worker process's share, envs.executor)."""
    limit = os.environ.get("RAYON_NUM_THREADS", "")
    if limit.isdigit() and int(limit) > 0:
        return int(limit)
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _unknown_context(trajectory: Trajectory) -> str | None:
    """A generated turn after a reset whose new context the source does not give: what the
    model saw there cannot be rendered, so nothing of the trajectory is trained on."""
    count = len(trajectory.messages)
    starts = sorted({r.message_index for r in trajectory.context_resets or []} | {count})
    for reset in trajectory.context_resets or []:
        if reset.replacement_known:
            continue
        stop = next((s for s in starts if s > reset.message_index), count)
        turns = [
            i for i in range(reset.message_index, stop) if trajectory.messages[i].role == "assistant" and trajectory.messages[i].generated
        ]
        if turns:
            return f"the context was rebuilt at message {reset.message_index} ({reset.reason}) into something the source does not record; generated turns {turns[:5]} follow"
    return None
