"""Single-turn RL rollouts (Math, Code, instruction following) from the row dumps RL frameworks
write: one JSONL line or Parquet row per sampled response, with a prompt, the response, its
reward and the RL step that sampled it.

Which column holds what is named by options (``prompt``, ``response``, ``reward``, ``step``,
``task_id``, ``id``, ``checkpoint``, ``token_ids``, ``logprobs``; dotted paths reach nested or
JSON-text columns) or by a preset:

- ``rows`` (the default, and the shipped mini suite's layout): ``prompt``, ``response``,
  ``reward``, ``step``, ``task_id``, ``checkpoint``.
- ``verl`` (a verl ``rollout_data_dir`` dump, ``{step}.jsonl``): ``input`` (the prompt with the
  chat template applied, split back into messages where ChatML markers survived), ``output``,
  ``score``, ``step``; the file's name gives the step when the line has none.
- ``openrlhf`` (an OpenRLHF-style sample dump): ``prompt``, ``output``, ``reward``,
  ``global_step``.

The response becomes one generated assistant message: a ``<think>...</think>`` block (or
text up to a lone ``</think>``, where the generation prompt opened the block) is its
reasoning, the rest its content (``split_thinking=False`` keeps the response whole as content
without the tags, for training in the template's no-thinking form). The reward is the
imported outcome (``verdict.imported_from``) until the single-turn verifiers grade the
response; a row without a task column gets the task ``prompt-<digest of the prompt>``, and
samples of one task at one step are numbered by ``attempt``. Recorded ``token_ids`` and
``logprobs`` stay on the response, and every other column under ``source.meta.columns``.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from harness.importers import verl
from harness.importers.base import Diagnostics, Fields, ImportResult, fail, imported_outcome, number
from harness.importers.rows import JSON_SUFFIXES, JSONL_SUFFIXES, PARQUET_SUFFIXES, Row, pick, read_rows
from records.trajectory import Message, Policy, Source, Trajectory

FORMAT = "single-turn"
THINK_BLOCK = re.compile(r"^\s*<think>(.*?)</think>(.*)$", re.S)
THINK_CLOSE = re.compile(r"^(.*?)</think>(.*)$", re.S)
STEP_FILE = re.compile(r"^(\d+)\.jsonl(\.zst)?$")


@dataclass(frozen=True)
class SingleTurnOptions:
    preset: str = "rows"
    prompt: str = "prompt"
    response: str = "response"
    reward: str | None = "reward"
    step: str | None = "step"
    task_id: str | None = "task_id"
    id: str | None = None
    checkpoint: str | None = "checkpoint"
    token_ids: str | None = "token_ids"
    logprobs: str | None = "logprobs"
    split_thinking: bool = True
    chat_prompt: bool = False  # the prompt column holds a chat-template render (verl)


PRESETS = {
    "rows": SingleTurnOptions(),
    "verl": SingleTurnOptions(
        preset="verl", prompt="input", response="output", reward="score", task_id=None, checkpoint=None, chat_prompt=True
    ),
    "openrlhf": SingleTurnOptions(
        preset="openrlhf", prompt="prompt", response="output", reward="reward", step="global_step", task_id=None, checkpoint=None
    ),
}


def options_for(preset: str | None = None, **overrides: Any) -> SingleTurnOptions:
    if preset is not None and preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; known: {', '.join(PRESETS)}")
    base = PRESETS[preset or "rows"]
    given = {k: v for k, v in overrides.items() if v is not None}
    return replace(base, **given) if given else base


class SingleTurnImporter:
    """The importer configured with its columns, for ``import_files(..., importer=...)``."""

    def __init__(self, options: SingleTurnOptions) -> None:
        self.options = options

    def discover(self, root: Path) -> list[Path]:
        suffixes = (*JSONL_SUFFIXES, *JSON_SUFFIXES, *PARQUET_SUFFIXES)
        return sorted(p for p in root.rglob("*") if p.is_file() and p.name.lower().endswith(suffixes))

    def read(self, path: Path, *, salvage: bool = False) -> Iterator[ImportResult]:
        match = STEP_FILE.match(path.name)
        file_step = int(match.group(1)) if match else None
        samples: Counter[tuple[str, int | None]] = Counter()
        return read_rows(path, lambda row, diag: convert(row, str(path), self.options, file_step, samples, diag), empty="no rollouts")


def convert(
    row: Row, path: str, options: SingleTurnOptions, file_step: int | None, samples: Counter[tuple[str, int | None]], diag: Diagnostics
) -> Trajectory:
    top = Fields(row.data, path, row.line, row.prefix)
    prompt = _text(top, options.prompt, required=True)
    response = _text(top, options.response, required=True)
    assert prompt is not None and response is not None
    step = _integer(top, options.step)
    if step is None:
        step = file_step
    reward = None
    if options.reward:
        raw = pick(top.data, options.reward)
        reward = number(raw)
        if raw is not None and reward is None:
            raise fail(path, row.line, top._name(options.reward), f"expected a number, got {type(raw).__name__}")
    task_id = _text(top, options.task_id) or f"prompt-{hashlib.sha256(prompt.encode()).hexdigest()[:16]}"
    attempt = samples[(task_id, step)]
    samples[(task_id, step)] += 1
    messages = verl._prompt_messages(prompt, diag, row.line) if options.chat_prompt else [Message(role="user", content=prompt)]
    answer = _response(response, options.split_thinking)
    answer.token_ids = _numbers(top, options.token_ids, int)
    answer.logprobs = _numbers(top, options.logprobs, float)
    messages.append(answer)
    used = {
        options.prompt,
        options.response,
        options.reward,
        options.step,
        options.task_id,
        options.id,
        options.checkpoint,
        options.token_ids,
        options.logprobs,
    }
    columns = {k: v for k, v in top.data.items() if k not in used}
    checkpoint = _text(top, options.checkpoint)
    return Trajectory(
        id=_text(top, options.id) or "",
        task_id=task_id,
        policy=Policy(step=step, checkpoint=checkpoint),
        attempt=attempt,
        messages=messages,
        outcome=imported_outcome(FORMAT, reward=reward),
        source=Source(format=FORMAT, format_version=options.preset, path=path, meta={"columns": columns} if columns else None),
    )


def split_response(response: str, split_thinking: bool = True) -> tuple[str | None, str]:
    """(reasoning, final answer) of a response's text."""
    match = THINK_BLOCK.match(response) or (THINK_CLOSE.match(response) if "<think>" not in response else None)
    if match is None:
        return None, response
    reasoning, answer = match.group(1).strip("\n"), match.group(2).lstrip("\n")
    if not split_thinking:
        return None, f"{reasoning}\n\n{answer}" if reasoning.strip() else answer
    return reasoning, answer


def _response(response: str, split_thinking: bool) -> Message:
    reasoning, answer = split_response(response, split_thinking)
    return Message(role="assistant", content=answer, reasoning_content=reasoning, generated=True)


def _text(top: Fields, column: str | None, *, required: bool = False) -> str | None:
    if not column:
        return None
    value = pick(top.data, column)
    if value is None:
        if required:
            raise fail(top.path, top.line, top._name(column), "missing")
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool) and not required:
        return str(value)
    if not isinstance(value, str):
        raise fail(top.path, top.line, top._name(column), f"expected a string, got {type(value).__name__}")
    return value


def _integer(top: Fields, column: str | None) -> int | None:
    value = pick(top.data, column) if column else None
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value:
        raise fail(top.path, top.line, top._name(column or ""), f"expected an integer step, got {value!r}")
    return int(value)


def _numbers(top: Fields, column: str | None, kind: type) -> list[Any] | None:
    value = pick(top.data, column) if column else None
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
        raise fail(top.path, top.line, top._name(column or ""), "expected a list of numbers")
    return [kind(v) for v in value]
