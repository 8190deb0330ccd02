"""The scripted model servers the Harbor fixture jobs run against (see make.sh).

    .venv/bin/python scripts/harbor_fixtures/servers.py --urls FILE --responses-host ADDR [--log DIR]

Starts four servers from ``harness.scripted.servers.ModelServer`` and writes their base URLs
to FILE as JSON, then serves until SIGTERM:

- ``solve``, ``flail``, ``sleep``: OpenAI Chat Completions as vLLM answers it, for Harbor's
  terminus-2 agent (which runs in the harbor process, so 127.0.0.1 is enough). Each speaks
  terminus-2's JSON reply format and answers with vLLM's rollout fields when asked
  (``return_token_ids``, ``logprobs``): ``prompt_token_ids`` beside the choices, ``token_ids``
  and ``logprobs.content`` on the choice. The ids are real: the prompt is the request's
  messages through the built-in qwen3.6 chat template (what vLLM tokenizes; it ends in the
  generation prompt ``<|im_start|>assistant\n<think>\n``), the completion is what a Qwen
  model writes from there (reasoning, ``</think>``, the reply), then ``<|im_end|>``. The
  logprobs are made up (deterministic), since no model sampled them.
- ``codex``: OpenAI Responses, streamed, for the Codex CLI inside the task container; it
  listens on ADDR (the docker bridge's address, which the container reaches as
  ``host.docker.internal``).

Every turn is chosen from the request alone (how many replies the conversation already
holds), so a retried or re-sent request gets the same answer.
"""

from __future__ import annotations

import argparse
import json
import signal
import threading
from pathlib import Path
from typing import Any

from harness.scripted.servers import ModelServer, ScriptedTurn
from relearn.masks.tokenizers import load_tokenizer

TOKENIZER = "qwen3.6"

LOOK = {
    "analysis": "I am in /app, a small Python repository. I need to see the code and the failing test first.",
    "plan": "List the files, read calc.py and run the test suite to see what fails.",
    "commands": [
        {"keystrokes": "ls\n", "duration": 0.1},
        {"keystrokes": "cat calc.py\n", "duration": 0.1},
        {"keystrokes": "python3 -m pytest -q -p no:cacheprovider 2>&1 | tail -5\n", "duration": 3},
    ],
    "task_complete": False,
}


def _reply(analysis: str, plan: str, commands: list[dict[str, Any]], done: bool) -> dict[str, Any]:
    return {"analysis": analysis, "plan": plan, "commands": commands, "task_complete": done}


DONE = _reply("The tests pass now.", "Nothing is left to do; the task is complete.", [], True)

# (reasoning, terminus-2 JSON reply) per turn; the last one repeats.
SCRIPTS: dict[str, list[tuple[str, dict[str, Any]]]] = {
    "solve": [
        ("Start by reading the code.", LOOK),
        (
            "add() returns a - b; test_add expects a + b. A one-character fix.",
            _reply(
                "add() in calc.py subtracts instead of adding, so test_add fails.",
                "Fix the operator with sed and rerun the tests.",
                [
                    {"keystrokes": "sed -i 's/return a - b/return a + b/' calc.py\n", "duration": 0.1},
                    {"keystrokes": "python3 -m pytest -q -p no:cacheprovider 2>&1 | tail -3\n", "duration": 3},
                ],
                False,
            ),
        ),
        ("All tests passed.", DONE),
        ("Confirmed: the fix is in and the tests pass.", DONE),
    ],
    # Three turns: a policy that patches without looking (and wrongly), then stops.
    "flail": [
        (
            "add(1, 2) probably comes out negative; taking the absolute value should do.",
            _reply(
                "/app holds calc.py; add() looks like it can return a negative number.",
                "Wrap the difference in abs() and call it done.",
                [{"keystrokes": "sed -i 's/return a - b/return abs(a - b)/' calc.py\n", "duration": 0.1}],
                False,
            ),
        ),
        ("That should be it.", _reply("calc.add now returns a non-negative value.", "Mark the task complete.", [], True)),
        ("Yes, complete.", _reply("calc.add now returns a non-negative value.", "Mark the task complete.", [], True)),
    ],
    "sleep": [
        ("Start by reading the code.", LOOK),
        (
            "Run a long benchmark before changing anything.",
            _reply(
                "Before fixing add() I want to time the module.",
                "Run a (very) long benchmark and wait for it.",
                [{"keystrokes": "python3 -c 'import time; time.sleep(600)'\n", "duration": 60}],
                False,
            ),
        ),
        (
            "Still running; keep waiting.",
            _reply("The benchmark is still running.", "Wait for it.", [{"keystrokes": "", "duration": 60}], False),
        ),
    ],
}

# The Codex CLI's turns: read, patch (its freeform apply_patch tool), test, answer.
CODEX_PATCH = """*** Begin Patch
*** Update File: calc.py
@@
 def add(a, b):
-    return a - b
+    return a + b
*** End Patch"""
CODEX_SCRIPT = [
    ScriptedTurn(
        reasoning="Read the code and run the tests first.",
        content="Reading the repository.",
        tool_calls=[("exec_command", {"cmd": "cat calc.py && python3 -m pytest -q -p no:cacheprovider 2>&1 | tail -5"})],
        input_tokens=2400,
        output_tokens=60,
    ),
    ScriptedTurn(
        reasoning="add() subtracts; fix the operator.",
        custom_tool_calls=[("apply_patch", CODEX_PATCH)],
        input_tokens=2700,
        cached_input_tokens=2304,
        output_tokens=45,
    ),
    ScriptedTurn(
        tool_calls=[("exec_command", {"cmd": "python3 -m pytest -q -p no:cacheprovider 2>&1 | tail -3"})],
        input_tokens=2900,
        cached_input_tokens=2688,
        output_tokens=30,
    ),
    ScriptedTurn(
        content="Fixed `add` in calc.py (it subtracted); the test suite passes.",
        input_tokens=3000,
        cached_input_tokens=2816,
        output_tokens=20,
    ),
]
OUTPUT_ITEMS = ("function_call_output", "custom_tool_call_output")


class TerminusPolicy:
    """A chat-completions script for terminus-2 that returns real token ids."""

    def __init__(self, name: str, tokenizer: Any) -> None:
        self.script = SCRIPTS[name]
        self.tok = tokenizer
        self.im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")

    def __call__(self, body: dict[str, Any]) -> ScriptedTurn:
        messages = body.get("messages") or []
        turn = sum(1 for m in messages if m.get("role") == "assistant")
        reasoning, reply = self.script[min(turn, len(self.script) - 1)]
        content = json.dumps(reply, indent=2)
        # As vLLM does: render the template to text, then tokenize that text.
        prompt = self.tok.apply_chat_template(_plain(messages), tokenize=False, add_generation_prompt=True)
        prompt_ids = self.tok.encode(prompt, add_special_tokens=False)
        # qwen3.6's generation prompt already opens the think block; the model goes on from it.
        opening = "" if prompt.endswith("<think>\n") else "<think>\n"
        completion = f"{opening}{reasoning}\n</think>\n\n{content}"
        completion_ids = self.tok.encode(completion, add_special_tokens=False) + [self.im_end]
        # No model sampled these: a deterministic stand-in with a plausible spread.
        logprobs = [-round(((i * 7919 + len(prompt_ids)) % 1000) / 4000, 4) for i in range(len(completion_ids))]
        return ScriptedTurn(
            content=content,
            reasoning=reasoning,
            input_tokens=len(prompt_ids),
            output_tokens=len(completion_ids),
            prompt_token_ids=[int(i) for i in prompt_ids],
            token_ids=[int(i) for i in completion_ids],
            logprobs=logprobs,
        )


def _plain(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages as the chat template takes them: text content only."""
    out = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):
            content = "".join(part.get("text", "") for part in content if isinstance(part, dict))
        out.append({"role": m["role"], "content": content or ""})
    return out


def codex_policy(body: dict[str, Any]) -> ScriptedTurn:
    done = sum(1 for item in body.get("input") or [] if item.get("type") in OUTPUT_ITEMS)
    return CODEX_SCRIPT[min(done, len(CODEX_SCRIPT) - 1)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--urls", type=Path, required=True, help="Where to write the servers' base URLs (JSON).")
    parser.add_argument("--responses-host", required=True, help="Address the Responses server listens on.")
    parser.add_argument("--log", type=Path, help="Folder to write every request each server got, at exit.")
    args = parser.parse_args()

    tok = load_tokenizer(TOKENIZER)
    started: dict[str, ModelServer] = {name: ModelServer("chat", TerminusPolicy(name, tok)).start() for name in SCRIPTS}
    started["codex"] = ModelServer("responses", codex_policy, host=args.responses_host).start()
    urls = {name: server.base_url for name, server in started.items()}
    tmp = args.urls.with_suffix(".tmp")
    tmp.write_text(json.dumps(urls, indent=1))
    tmp.rename(args.urls)

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait()
    for name, server in started.items():
        if args.log is not None:
            args.log.mkdir(parents=True, exist_ok=True)
            (args.log / f"{name}.json").write_text(json.dumps(server.requests, indent=1))
        server.close()


if __name__ == "__main__":
    main()
