"""verl rollout dumps (``trainer.rollout_data_dir`` / ``validation_data_dir``): one
``{step}.jsonl`` per training step, one line per sampled response.

A line holds ``input`` (the prompt as verl decoded it, chat template applied), ``output``
(the response text), ``gts`` (ground truth; older versions leave it out), ``score`` and
``step``, plus the reward function's extra keys (``acc``, ``pred``, ...). Each line is a
single-turn trajectory: the prompt, then one generated assistant message.

verl decodes with ``skip_special_tokens=True``, so the template's role markers are usually
gone and the prompt is kept as one user message (``extra.rendered_prompt`` says it holds
template text). Where the markers survived (ChatML ``<|im_start|>role ... <|im_end|>``) the
prompt is split back into its messages. A response's leading ``<think>...</think>`` becomes
its reasoning. The score is the outcome's reward (marked imported), ``step`` the policy's
step, and repeated samples of one prompt in one step are numbered by ``attempt``; the task
id is a digest of the prompt, so that those samples group as one task.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from harness.importers.base import Diagnostics, Fields, ImportResult, fail, imported_outcome, number
from harness.importers.rows import Row, read_rows
from records.trajectory import Message, Policy, Source, Trajectory

FORMAT = "verl"
KNOWN_FIELDS = {"input", "output", "gts", "score", "step"}
STEP_FILE = re.compile(r"^(\d+)\.jsonl(\.zst)?$")
CHATML = re.compile(r"<\|im_start\|>(\w+)\n(.*?)(?:<\|im_end\|>\n?|(?=<\|im_start\|>)|\Z)", re.S)
THINK = re.compile(r"^<think>(.*?)</think>(.*)$", re.S)


def discover(root: Path) -> list[Path]:
    """The step files (``{step}.jsonl``), in step order."""
    found = [p for p in root.rglob("*") if p.is_file() and STEP_FILE.match(p.name)]
    return sorted(found, key=lambda p: (str(p.parent), int(STEP_FILE.match(p.name).group(1))))  # type: ignore[union-attr]


def read(path: Path, *, salvage: bool = False) -> Iterator[ImportResult]:
    match = STEP_FILE.match(path.name)
    file_step = int(match.group(1)) if match else None
    samples: Counter[str] = Counter()  # prompt digest -> samples seen so far in this file
    return read_rows(path, lambda row, diagnostics: convert(row, str(path), file_step, samples, diagnostics), empty="no rollouts")


def convert(row: Row, path: str, file_step: int | None, samples: Counter[str], diag: Diagnostics) -> Trajectory:
    top = Fields(row.data, path, row.line, row.prefix)
    prompt = top.str("input", required=True) or ""
    output = top.str("output", required=True)
    assert output is not None
    step = top.get("step", int)
    if step is None:
        step = file_step
    elif file_step is not None and step != file_step:
        diag.warn(row.line, f"step {step} in a file named for step {file_step}; the line's step is kept")
    score = top.data.get("score")
    reward = number(score)
    if score is not None and reward is None:
        raise fail(path, row.line, top._name("score"), f"expected a number, got {type(score).__name__}")
    for key in top.data:
        if key not in KNOWN_FIELDS:
            diag.unknown_kind(row.line, f"reward field {key!r}")

    messages = _prompt_messages(prompt, diag, row.line)
    messages.append(_response(output))
    digest = hashlib.sha256(prompt.encode()).hexdigest()[:16]
    attempt = samples[digest]
    samples[digest] += 1
    details = {k: v for k, v in top.data.items() if k not in ("input", "output", "score", "step")}
    return Trajectory(
        task_id=f"prompt-{digest}",
        policy=Policy(step=step),
        attempt=attempt,
        messages=messages,
        outcome=imported_outcome(FORMAT, reward=reward, details=details or None),
        source=Source(format=FORMAT, path=path, meta={k: v for k, v in top.data.items() if k not in ("input", "output")}),
    )


def _prompt_messages(prompt: str, diag: Diagnostics, line: int | None) -> list[Message]:
    turns = CHATML.findall(prompt) if "<|im_start|>" in prompt else []
    if turns:
        head = prompt[: prompt.index("<|im_start|>")]
        if head.strip():
            diag.warn(line, "text before the first <|im_start|> in input (kept in the first message's extra)")
        messages = []
        for role, text in turns:
            if role == "assistant" and not text:
                continue  # the generation prompt the response continues
            mapped = role if role in ("system", "user", "assistant", "developer") else "user"
            extra: dict[str, Any] = {"chatml_role": role} if mapped != role else {}
            messages.append(Message(role=mapped, content=text, extra=extra or None))  # type: ignore[arg-type]
        if head.strip() and messages:
            messages[0].extra = {**(messages[0].extra or {}), "text_before": head}
        if messages:
            return messages
    return [Message(role="user", content=prompt, extra={"rendered_prompt": True})]


def _response(output: str) -> Message:
    match = THINK.match(output.lstrip())
    if match is None:
        return Message(role="assistant", content=output, generated=True)
    extra = {"leading_whitespace": output[: len(output) - len(output.lstrip())]} if output[:1].isspace() else None
    return Message(role="assistant", content=match.group(2), reasoning_content=match.group(1), generated=True, extra=extra)
