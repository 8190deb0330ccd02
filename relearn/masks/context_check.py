"""Is the context a turn is trained under the one the model saw?

``relearn masks`` trains each generated turn after the template's render of the history before
it. Where the policy's calls recorded their prompt ids (``extra.prompt_token_ids`` on the
generated message: vLLM's ``return_token_ids``, ``relearn serve``, NeMo Gym's rollouts), that
render is checked token by token against them: a turn whose rendered prefix tokenises to other
ids was trained under a context the model never saw. Where no ids exist, the trajectory's
protocol decides, and the rule that applied is named (``RULES``):

- ``prompt_ids``: checked against the recorded prompt ids;
- ``no_reasoning``: no generated turn carries reasoning, so keeping or dropping earlier
  reasoning renders the same history;
- ``reasoning_not_sent``: the harness sends only text back (mini-swe-agent, SWE-agent), so
  the model saw the history without its reasoning;
- ``user_observations``: observations came back as ``user`` turns, after which the Qwen
  templates drop earlier reasoning from what they send;
- ``tool_observations``: one query, observations as ``tool`` turns, reasoning sent back: the
  render with ``preserve_thinking`` is the context the model had.

Under ``preserve_thinking`` (the masks' default), the two middle rules mean the render differs
from what the model saw (``differs`` is True); ``relearn masks`` compiles such trajectories, and
those whose recorded prompt ids disagree with the render, per turn under the context as sent.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from records.trajectory import Trajectory
from relearn.masks.template import Rendered, RenderError, TemplateShape, Turn, context_segments, per_turn_renders, probe, render
from relearn.masks.tokens import encode_texts

RULES = ("prompt_ids", "no_reasoning", "reasoning_not_sent", "user_observations", "tool_observations")
# The rules of a history sent without its reasoning: ``relearn masks`` compiles such a
# trajectory per turn under the context as sent (as it does one whose recorded prompt ids
# disagree with the render).
NOT_SENT_RULES = ("reasoning_not_sent", "user_observations")

# Import formats whose agents send the model only text back: no reasoning in the history.
TEXT_ONLY_FORMATS = frozenset({"mini-swe-agent", "swe-agent"})

AROUND = 4  # tokens decoded either side of the first difference


@dataclass
class TurnDifference:
    """Where a turn's rendered context first departs from its recorded prompt ids."""

    message_index: int
    position: int  # token index of the first difference
    recorded: str  # decoded recorded ids around it
    rendered: str  # decoded rendered ids around it
    recorded_tokens: int
    rendered_tokens: int


@dataclass
class ContextCheck:
    """One trajectory's verdict."""

    trajectory_id: str
    rule: str  # one of RULES
    differs: bool  # the trained context departs (or, by its rule, is expected to depart) from what the model saw
    turns_checked: int = 0  # generated turns with recorded prompt ids
    turns_differ: int = 0
    first: TurnDifference | None = None
    error: str | None = None  # the template could not render the trajectory


def prompt_ids(message: Any) -> list[int] | None:
    ids = (message.extra or {}).get("prompt_token_ids")
    return list(ids) if isinstance(ids, list) and ids else None


def context_rule(trajectory: Trajectory) -> str:
    """The rule that decides a trajectory's context (``RULES``), without checking it:
    ``prompt_ids`` where a generated turn recorded them, else its protocol's."""
    return "prompt_ids" if any(m.generated and prompt_ids(m) for m in trajectory.messages) else protocol_rule(trajectory)


def protocol_rule(trajectory: Trajectory) -> str:
    """The rule that decides a trajectory without recorded prompt ids (see the module text)."""
    generated = {i for i, m in enumerate(trajectory.messages) if m.role == "assistant" and m.generated}
    if not any(trajectory.messages[i].reasoning_content for i in generated):
        return "no_reasoning"
    if trajectory.source is not None and trajectory.source.format in TEXT_ONLY_FORMATS:
        return "reasoning_not_sent"
    # Within each context the model had: a reset's summary, given as a user turn, opens its
    # context and is no observation.
    for segment in context_segments(trajectory):
        roles = [trajectory.messages[i].role for i in segment]
        first = next((k for k, i in enumerate(segment) if i in generated), None)
        if first is not None and "user" in roles[first + 1 :]:
            return "user_observations"
    return "tool_observations"


def _decode(tokenizer: Any, ids: list[int]) -> str:
    return tokenizer.decode(ids, skip_special_tokens=False)


def _difference(tokenizer: Any, index: int, recorded: list[int], rendered: list[int]) -> TurnDifference | None:
    if recorded == rendered:
        return None
    position = next((p for p, (a, b) in enumerate(zip(recorded, rendered, strict=False)) if a != b), min(len(recorded), len(rendered)))
    window = slice(max(0, position - AROUND), position + AROUND + 1)
    return TurnDifference(
        index, position, _decode(tokenizer, recorded[window]), _decode(tokenizer, rendered[window]), len(recorded), len(rendered)
    )


def _renders(
    trajectory: Trajectory, tokenizer: Any, template_kwargs: dict[str, Any], per_turn: bool, shape: TemplateShape
) -> list[Rendered]:
    """What ``relearn masks`` trains on: one render per context segment, or with ``per_turn``
    one per generated turn."""
    out: list[Rendered] = []
    for segment in context_segments(trajectory):
        if per_turn:
            out += per_turn_renders(trajectory, tokenizer, template_kwargs=template_kwargs, segment=segment, shape=shape)
        else:
            out.append(render(trajectory, tokenizer, template_kwargs=template_kwargs, prefix_check="off", segment=segment, shape=shape))
    return out


def _tokenised(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _contexts(tokenizer: Any, rendered: Rendered, shape: TemplateShape, trajectory: Trajectory) -> Iterator[tuple[Turn, list[int]]]:
    """Each generated turn that recorded its prompt ids, with the render before it tokenised
    as an engine tokenises the prompt it is sent: alone. The render is tokenised once whole:
    where the turn's role header opens with an added token (``<|im_start|>``), which the
    tokenizer splits the text at before anything else, the whole render's tokens before the
    header are the prompt's, and only the header and generation prompt are tokenised again; a
    linear cost where tokenising every prefix would be quadratic in the turns."""
    turns = [t for t in rendered.turns if prompt_ids(trajectory.messages[t.message_index]) is not None]
    if not turns:
        return
    splits = any(shape.role_header.startswith(token) for token in tokenizer.get_added_vocab())
    whole = encode_texts(tokenizer, [rendered.text])[0] if splits else None
    for turn in turns:
        opening = rendered.text.rfind(shape.role_header, 0, turn.start)
        if whole is None or opening < 0:
            yield turn, _tokenised(tokenizer, rendered.text[: turn.start])
            continue
        before = int(np.searchsorted(whole.offsets[:, 1], opening, side="right"))  # tokens that end by the header
        if before < len(whole.ids) and whole.offsets[before, 0] < opening:  # one straddles it: no split there
            yield turn, _tokenised(tokenizer, rendered.text[: turn.start])
            continue
        yield turn, whole.ids[:before].tolist() + _tokenised(tokenizer, rendered.text[opening : turn.start])


def compiled_as_sent(check: ContextCheck) -> bool:
    """Whether ``relearn masks`` (``--context as-sent``) compiles the trajectory per turn under
    the context as sent: recorded prompt ids that disagree with its render, or, whatever the
    template would do, a history its harness sent without reasoning."""
    return check.error is None and (check.rule in NOT_SENT_RULES or check.differs)


def check_trajectory(
    trajectory: Trajectory, tokenizer: Any, template_kwargs: dict[str, Any], shape: TemplateShape | None = None, per_turn: bool = False
) -> ContextCheck:
    """Compare each generated turn's context, as ``relearn masks`` renders it with these template
    arguments (and ``per_turn``), with its recorded prompt ids; or name the protocol rule where
    none are recorded. A trajectory the template cannot render is an ``error`` (the masks
    reject it too)."""
    rule = context_rule(trajectory)
    if rule != "prompt_ids":
        return ContextCheck(trajectory.id, rule, differs=bool(template_kwargs.get("preserve_thinking")) and rule in NOT_SENT_RULES)
    check = ContextCheck(trajectory.id, rule, differs=False)
    shape = shape or probe(tokenizer, template_kwargs)
    try:
        for rendered in _renders(trajectory, tokenizer, template_kwargs, per_turn, shape):
            for turn, ids in _contexts(tokenizer, rendered, shape, trajectory):
                recorded = prompt_ids(trajectory.messages[turn.message_index])
                assert recorded is not None
                check.turns_checked += 1
                difference = _difference(tokenizer, turn.message_index, recorded, ids)
                if difference is not None:
                    check.turns_differ += 1
                    check.first = check.first or difference
    except RenderError as exc:
        check.error = str(exc)
    check.differs = check.turns_differ > 0 or check.error is not None
    return check


@dataclass
class ContextReport:
    """Counts over a pool: trajectories by rule, turns checked against recorded ids, the
    first few differences (``EXAMPLES``)."""

    trajectories: int = 0
    by_rule: Counter[str] = field(default_factory=Counter)
    differs_by_rule: Counter[str] = field(default_factory=Counter)
    turns_checked: int = 0
    turns_differ: int = 0
    render_errors: int = 0
    as_sent: int = 0  # trajectories `relearn masks --context as-sent` compiles per turn as sent
    examples: list[dict[str, Any]] = field(default_factory=list)

    EXAMPLES = 5

    def add(self, check: ContextCheck) -> None:
        self.trajectories += 1
        self.by_rule[check.rule] += 1
        self.differs_by_rule[check.rule] += check.differs
        self.turns_checked += check.turns_checked
        self.turns_differ += check.turns_differ
        self.render_errors += check.error is not None
        self.as_sent += compiled_as_sent(check)
        if (check.first is not None or check.error is not None) and len(self.examples) < self.EXAMPLES:
            example: dict[str, Any] = {"trajectory": check.trajectory_id}
            if check.first is not None:
                example |= {
                    "message": check.first.message_index,
                    "position": check.first.position,
                    "recorded": check.first.recorded,
                    "rendered": check.first.rendered,
                    "recorded_tokens": check.first.recorded_tokens,
                    "rendered_tokens": check.first.rendered_tokens,
                }
                if check.first.position == 0:
                    example["hint"] = "differs from the first token: the ids likely come from another tokenizer (give the policy's)"
            if check.error is not None:
                example["error"] = check.error
            self.examples.append(example)

    def as_dict(self) -> dict[str, Any]:
        return {
            "trajectories": self.trajectories,
            "by_rule": {rule: self.by_rule[rule] for rule in RULES if self.by_rule[rule]},
            "differs_by_rule": {rule: self.differs_by_rule[rule] for rule in RULES if self.by_rule[rule]},
            "turns_checked": self.turns_checked,
            "turns_differ": self.turns_differ,
            "render_errors": self.render_errors,
            "as_sent": self.as_sent,
            "examples": self.examples,
        }


def check_context(
    trajectories: Iterable[Trajectory], tokenizer: Any, template_kwargs: dict[str, Any], per_turn: bool = False
) -> ContextReport:
    """One pass over ``trajectories`` (a stream: nothing is held but the counts)."""
    shape = probe(tokenizer, template_kwargs)
    report = ContextReport()
    for trajectory in trajectories:
        report.add(check_trajectory(trajectory, tokenizer, template_kwargs, shape, per_turn))
    return report
