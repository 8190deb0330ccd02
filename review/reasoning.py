"""A judge's reasoning and sampling settings, as each vendor's API documents them.

``JudgeSettings`` is what the user gave (``--reasoning-effort``, ``--thinking-budget``,
``--temperature``, ``--extra-body``, each also for judge 2); ``sampling`` turns it into the
request fields of one backend, or refuses a combination the API would reject, with one line
naming the options, before anything is paid:

- Anthropic Messages: ``thinking: {"type": "enabled", "budget_tokens": N}`` (N at least 1,024
  and below ``max_tokens``, which becomes N plus the usual 4,096 answer tokens), the effort as
  ``output_config.effort``; thinking takes no ``temperature`` and no ``top_k``, and ``top_p``
  only from 0.95 to 1;
- OpenAI Chat Completions: ``reasoning_effort``;
- OpenAI Responses: ``reasoning: {"effort": ...}``;
- every backend: ``temperature``, and the extra fields merged into the request body through the
  SDKs' ``extra_body`` (``{"chat_template_kwargs": {"enable_thinking": true}}`` for vLLM or
  SGLang serving an open model).

The fields land in the judge's ``PolicySpec.sampling``, so they are part of the call cache's
key (``review.judges.request_key``) and of every batched request; with no setting the sampling
is empty and the keys are what they were before these settings existed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

from harness.policies.base import RESERVED_SAMPLING

# OpenAI's reasoning efforts (the SDK's ReasoningEffort; which a model takes varies) and
# Anthropic's output_config.effort values.
Effort = Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"]
ANTHROPIC_EFFORTS = ("low", "medium", "high", "xhigh", "max")
MIN_THINKING_BUDGET = 1024  # Anthropic's minimum budget_tokens
# The request field each backend's structured output sets (review.judges.structured_output):
# an extra field of that name would replace the judge's answer format.
STRUCTURED_FIELD = {"anthropic": "output_config", "chat": "response_format", "responses": "text"}


class SettingsError(ValueError):
    """A setting, or a combination, the backend's API would refuse."""


@dataclass(frozen=True)
class JudgeSettings:
    """One judge's reasoning and sampling settings, as given; ``flag`` prefixes the options'
    names in refusals (``--`` for judge 1, ``--judge2-`` for judge 2)."""

    reasoning_effort: str | None = None
    thinking_budget: int | None = None  # 0: no thinking
    temperature: float | None = None
    extra_body: dict[str, Any] = field(default_factory=dict)
    flag: str = "--"

    def name(self, option: str) -> str:
        return self.flag + option.replace("_", "-")


def parse_extra_body(value: str | dict[str, Any] | None, flag: str) -> dict[str, Any]:
    """The extra request fields: a JSON object as text (the command line) or already a table
    (the pipeline file)."""
    if value is None:
        return {}
    if isinstance(value, dict):
        return dict(value)
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as exc:
        raise SettingsError(f"{flag} is not JSON: {exc.msg} at character {exc.pos} of {value!r}") from None
    if not isinstance(parsed, dict):
        raise SettingsError(f'{flag} must be a JSON object ({{"field": value, ...}}), not {value!r}')
    return parsed


def sampling(kind: str, settings: JudgeSettings) -> dict[str, Any]:
    """The ``PolicySpec.sampling`` of a judge with ``settings`` on backend ``kind`` (empty for
    no setting); ``SettingsError`` for what the API would refuse."""
    from harness.policies.anthropic_messages import ANTHROPIC_DEFAULT_MAX_TOKENS  # the SDK: loaded only with judges

    s, extra = settings, settings.extra_body
    out: dict[str, Any] = {}
    owned = sorted((RESERVED_SAMPLING | {"extra_body", STRUCTURED_FIELD[kind]}) & set(extra))
    if owned:
        raise SettingsError(f"{s.name('extra_body')} may not set {', '.join(owned)}: the judge's client sets it")
    budget = s.thinking_budget or 0
    if budget and kind != "anthropic":
        raise SettingsError(
            f"{s.name('thinking_budget')} is Anthropic's extended thinking (--backend anthropic); with {kind}, give "
            f"{s.name('reasoning_effort')}, or a server's own field in {s.name('extra_body')}"
        )
    if budget and budget < MIN_THINKING_BUDGET:
        raise SettingsError(
            f"{s.name('thinking_budget')} {budget}: Anthropic's thinking budget is at least {MIN_THINKING_BUDGET} tokens (0: no thinking)"
        )
    fields = {
        "anthropic": {"thinking": "thinking_budget"},  # its effort's output_config is the judge's own (refused above)
        "chat": {"reasoning_effort": "reasoning_effort"},
        "responses": {"reasoning": "reasoning_effort"},
    }[kind]
    given = {"thinking_budget": bool(budget), "reasoning_effort": s.reasoning_effort is not None, "temperature": s.temperature is not None}
    for key, option in {**fields, "temperature": "temperature"}.items():
        if key in extra and given[option]:
            raise SettingsError(f"{s.name('extra_body')} sets {key}, which {s.name(option)} sets too: give it once")
    if s.reasoning_effort is not None:
        if kind == "anthropic":
            if s.reasoning_effort not in ANTHROPIC_EFFORTS:
                raise SettingsError(
                    f"{s.name('reasoning_effort')} {s.reasoning_effort}: Anthropic's effort is one of {', '.join(ANTHROPIC_EFFORTS)}"
                )
            out["output_config"] = {"effort": s.reasoning_effort}
        elif kind == "chat":
            out["reasoning_effort"] = s.reasoning_effort
        else:
            out["reasoning"] = {"effort": s.reasoning_effort}
    if kind == "anthropic":
        _check_anthropic_thinking(s, budget)
    if budget:
        out["thinking"] = {"type": "enabled", "budget_tokens": budget}
        if "max_tokens" not in extra:
            out["max_tokens"] = budget + ANTHROPIC_DEFAULT_MAX_TOKENS  # the thinking, then the usual room for the answer
    if s.temperature is not None:
        if kind == "anthropic" and s.temperature > 1:
            raise SettingsError(f"{s.name('temperature')} {s.temperature:g}: Anthropic's temperature is from 0 to 1")
        out["temperature"] = s.temperature
    if extra:
        out["extra_body"] = dict(extra)
    return out


def _check_anthropic_thinking(s: JudgeSettings, budget: int) -> None:
    extra = s.extra_body
    thinking = extra.get("thinking")
    thinks = bool(budget) or (isinstance(thinking, dict) and thinking.get("type") not in (None, "disabled"))
    if not thinks:
        return
    why = s.name("thinking_budget") if budget else f"thinking in {s.name('extra_body')}"
    if s.temperature is not None or "temperature" in extra:
        said = s.name("temperature") if s.temperature is not None else f"temperature in {s.name('extra_body')}"
        raise SettingsError(f"{said} with {why}: Anthropic's extended thinking takes no temperature; drop one of them")
    if "top_k" in extra:
        raise SettingsError(f"top_k in {s.name('extra_body')} with {why}: Anthropic's extended thinking takes no top_k")
    top_p = extra.get("top_p")
    if isinstance(top_p, int | float) and not 0.95 <= top_p <= 1:
        raise SettingsError(f"top_p {top_p:g} in {s.name('extra_body')} with {why}: with extended thinking top_p is from 0.95 to 1")
    max_tokens = extra.get("max_tokens")
    if budget and isinstance(max_tokens, int) and max_tokens <= budget:
        raise SettingsError(
            f"max_tokens {max_tokens} in {s.name('extra_body')} is not above {s.name('thinking_budget')} {budget}: "
            "Anthropic's thinking budget must be below max_tokens"
        )


# ---- what reasoning costs ---------------------------------------------------------------------


def assumed_reasoning(spec_sampling: dict[str, Any], effort_tokens: dict[str, int], budget_share: float) -> tuple[int, str]:
    """The reasoning tokens a request of this sampling is assumed to spend (billed as output),
    and how that was assumed: a share of a thinking budget; else the tokens assumed for its
    effort level; else none. Reasoning switched on through other extra fields is not known."""
    thinking = spec_sampling.get("thinking")
    if isinstance(thinking, dict) and thinking.get("budget_tokens"):
        budget = int(thinking["budget_tokens"])
        return round(budget * budget_share), f"{budget_share:g} of the {budget:,}-token thinking budget"
    effort = spec_sampling.get("reasoning_effort")
    for key in ("reasoning", "output_config"):
        value = spec_sampling.get(key)
        if isinstance(value, dict) and value.get("effort"):
            effort = value["effort"]
    if effort is None:
        return 0, ""
    return effort_tokens.get(str(effort), 0), f"effort {effort}"
