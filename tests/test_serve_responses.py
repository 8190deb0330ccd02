"""``relearn serve`` on ``POST /v1/responses``: a tiny random Qwen3 with the real Qwen3.6
tokenizer, talked to by the real ``openai`` SDK (``client.responses.create``, streamed and
not), by our ``ResponsesPolicy`` (what ``relearn collect --policy responses`` uses), and by
the real Codex CLI through the project's gateway in a mini-task container.

Where a test needs the model to say something in particular (a tool call, a patch), a hook
on the real model's ``lm_head`` adds a large logit to each token of a scripted answer, chosen
from the prompt the model was given: the server, template, parsers and clients are the real
ones; only the model's choice of tokens is steered."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
import torch

from harness.budget import Budget
from harness.policies.base import ContextOverflow, PolicySpec
from harness.policies.make import make_policy
from harness.policies.openai_responses import responses_tool
from harness.scripted.solutions import to_apply_patch
from records.trajectory import ExitStatus, FunctionCall, Message, ToolCall
from relearn.masks.tokenizers import QWEN3_6, load_tokenizer
from relearn.serve.server import Server, serve
from relearn.train.model import build_model

NAME = "tiny-qwen3"
MAX_CONTEXT = 16384  # Codex's first prompt (instructions, tools) is about 7k tokens

SHELL = {
    "type": "function",
    "name": "exec_command",
    "description": "Run a command.",
    "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}, "yield_time_ms": {"type": "integer"}}, "required": ["cmd"]},
    "strict": False,
}
PATCH = {
    "type": "custom",
    "name": "apply_patch",
    "description": "Edit files with a patch.",
    "format": {"type": "grammar", "syntax": "lark", "definition": 'start: "*** Begin Patch" /(.|\\n)*/'},
}
TOOLS = [SHELL, PATCH]


class Steer:
    """Steers the model to a scripted answer: ``script(prompt text)`` gives the text to write
    (None: the model's own choice). Generation is one request at a time, so one state will do."""

    def __init__(self, model: Any, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.script: Callable[[str], str | None] | None = None
        self.forced: list[int] = []
        self.step = 0
        self.end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        model.register_forward_pre_hook(self._before, with_kwargs=True)
        model.lm_head.register_forward_hook(self._after)

    def _before(self, _module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is not None and ids.shape[1] > 1:  # the prompt: a new request
            text = None if self.script is None else self.script(self.tokenizer.decode(ids[0].tolist()))
            self.forced = [] if text is None else [*self.tokenizer(text, add_special_tokens=False)["input_ids"], self.end]
            self.step = 0

    def _after(self, _module: Any, _args: Any, logits: torch.Tensor) -> torch.Tensor:
        if self.step < len(self.forced):
            logits = logits.clone()
            logits[:, -1, self.forced[self.step]] += 1e4
        self.step += 1
        return logits


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return load_tokenizer(QWEN3_6)


@pytest.fixture(scope="module")
def steered(tokenizer: Any) -> Iterator[tuple[Server, Steer]]:
    model = build_model(tiny="qwen3")
    steer = Steer(model, tokenizer)
    # One thread: a model this small decodes several times faster so than with threads that
    # wait on each other (and on a loaded machine, far faster).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with serve(model, tokenizer, model_name=NAME, max_context=MAX_CONTEXT) as running:
            yield running, steer
    finally:
        torch.set_num_threads(threads)


@pytest.fixture
def server(steered: tuple[Server, Steer]) -> Iterator[Server]:
    yield steered[0]
    steered[1].script = None


@pytest.fixture
def steer(steered: tuple[Server, Steer]) -> Steer:
    return steered[1]


def _client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url, api_key="EMPTY", max_retries=0, timeout=120)


def _render(tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[int]:
    return list(tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=True)["input_ids"])


# The chat shape Codex trajectories record tools in (harness.codex_cli.config.chat_tools).
CHAT_TOOLS = [{"type": "function", "function": {k: v for k, v in SHELL.items() if k != "type"}}, {"type": "custom", "custom": {k: v for k, v in PATCH.items() if k != "type"}}]  # fmt: skip


def test_history_renders_as_the_trajectory_is_trained_and_ids_come_back(server: Server, tokenizer: Any) -> None:
    """Codex's item kinds, in the order it sends them, become the chat conversation a Codex
    trajectory holds; the prompt's ids and the output's come back as vLLM returns them."""
    patch = "*** Begin Patch\n*** Update File: a.py\n@@\n-x = 1\n+x = 2\n*** End Patch\n"
    items: list[dict[str, Any]] = [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Sandbox: none."}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Fix a.py."}]},
        {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "Look first."}], "encrypted_content": None},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Reading."}]},
        {"type": "function_call", "call_id": "c1", "name": "exec_command", "arguments": '{"cmd": "cat a.py"}'},
        {"type": "function_call_output", "call_id": "c1", "output": "x = 1\n"},
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "Patch it."}]},
        {"type": "custom_tool_call", "call_id": "c2", "name": "apply_patch", "input": patch},
        {"type": "custom_tool_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "Success."}]},
        {"role": "user", "content": "And now?"},
    ]
    response = _client(server).responses.create(
        model=NAME,
        instructions="You are Codex.",
        input=items,  # type: ignore[arg-type]
        tools=TOOLS,  # type: ignore[list-item]
        max_output_tokens=5,
        temperature=0,
        store=False,
        extra_body={"enable_response_messages": True},
    )
    expected = [
        {"role": "system", "content": "You are Codex.\n\nSandbox: none."},
        {"role": "user", "content": "Fix a.py."},
        {
            "role": "assistant",
            "content": "Reading.",
            "reasoning_content": "Look first.",
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "exec_command", "arguments": {"cmd": "cat a.py"}}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "x = 1\n"},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "Patch it.",
            "tool_calls": [{"id": "c2", "type": "function", "function": {"name": "apply_patch", "arguments": {"input": patch}}}],
        },
        {"role": "tool", "tool_call_id": "c2", "content": "Success."},
        {"role": "user", "content": "And now?"},
    ]
    prompt = _render(tokenizer, expected, CHAT_TOOLS)
    raw = response.model_extra or {}
    assert raw["input_messages"][0]["tokens"] == prompt
    ids = raw["output_messages"][0]["tokens"]
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
    assert response.usage.input_tokens == len(prompt) and response.usage.output_tokens == len(ids) == 5
    assert response.usage.total_tokens == len(prompt) + 5
    # Cut inside reasoning (the prompt opened <think>): one reasoning item holding every token.
    (item,) = response.output
    assert item.type == "reasoning" and item.content[0].text == tokenizer.decode(ids, skip_special_tokens=True).strip()
    assert response.usage.output_tokens_details.reasoning_tokens == 5
    assert response.id.startswith("resp_") and response.model == NAME and response.tools[1].type == "custom"


def test_a_scripted_answer_comes_back_as_items_streamed_and_not(server: Server, steer: Steer) -> None:
    patch = "*** Begin Patch\n*** End Patch\n"
    steer.script = lambda _prompt: (
        "Wrong.\n</think>\n\nPatching.\n\n"
        f"<tool_call>\n<function=apply_patch>\n<parameter=input>\n{patch}\n</parameter>\n</function>\n</tool_call>\n"
        "<tool_call>\n<function=exec_command>\n<parameter=cmd>\nls\n</parameter>\n<parameter=yield_time_ms>\n5\n</parameter>\n"
        "</function>\n</tool_call>"
    )
    client = _client(server)
    request: dict[str, Any] = {"model": NAME, "input": "Fix a.py.", "tools": TOOLS, "temperature": 0}
    whole = client.responses.create(**request)
    assert whole.status == "completed" and [o.type for o in whole.output] == ["reasoning", "message", "custom_tool_call", "function_call"]
    reasoning, message, patching, listing = whole.output
    assert reasoning.content[0].text == "Wrong." and message.content[0].text == "Patching."
    assert patching.name == "apply_patch" and patching.input == patch and patching.call_id.startswith("call_")
    assert listing.name == "exec_command" and json.loads(listing.arguments) == {"cmd": "ls", "yield_time_ms": 5}
    assert 0 < whole.usage.output_tokens_details.reasoning_tokens < whole.usage.output_tokens

    with client.responses.stream(**request) as stream:
        events = list(stream)
        final = stream.get_final_response()  # the SDK's own accumulation of the events
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert [e.item.type for e in events if e.type == "response.output_item.done"] == [o.type for o in whole.output]
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "Patching."
    assert "".join(e.delta for e in events if e.type == "response.reasoning_text.delta") == "Wrong."
    assert "".join(e.delta for e in events if e.type == "response.custom_tool_call_input.delta") == patch
    assert json.loads("".join(e.delta for e in events if e.type == "response.function_call_arguments.delta"))["cmd"] == "ls"
    assert final.usage.output_tokens == whole.usage.output_tokens and final.id == events[0].response.id
    assert [o.type for o in final.output] == [o.type for o in whole.output]
    assert final.output[1].content[0].text == "Patching." and final.output[2].input == patch


def test_responses_policy_records_the_ids_the_chat_policy_would(server: Server, steer: Steer, tokenizer: Any) -> None:
    """What `relearn collect --policy responses` does against `relearn serve`: ids recorded,
    and the same prompt as the chat policy renders for the same conversation."""
    steer.script = lambda prompt: "Done.\n</think>\n\nAll fixed." if "<tool_response>" in prompt else None
    messages = [
        Message(role="system", content="You are terse."),
        Message(role="user", content="Fix it."),
        Message(
            role="assistant",
            content="Looking.",
            tool_calls=[ToolCall(id="c1", function=FunctionCall(name="exec_command", arguments={"cmd": "ls"}))],
        ),
        Message(role="tool", tool_call_id="c1", content="a.py"),
    ]
    chat_tools = [{"type": "function", "function": {k: v for k, v in SHELL.items() if k not in ("type", "strict")}}]
    spec = PolicySpec(kind="responses", model=NAME, base_url=server.url, sampling={"temperature": 0}, max_retries=0, timeout_s=120)
    turn = make_policy(spec).complete(messages, chat_tools)
    reply = turn.message
    assert turn.finish_reason == "stop" and reply.content == "All fixed." and reply.reasoning_content == "Done."
    assert reply.token_ids == [*tokenizer("Done.\n</think>\n\nAll fixed.", add_special_tokens=False)["input_ids"], steer.end]
    assert reply.usage.output_tokens == len(reply.token_ids)
    # The tools as the policy sends them (strict=false added), in the chat shape.
    sent_tools = [{"type": "function", "function": {k: v for k, v in responses_tool(chat_tools[0]).items() if k != "type"}}]
    chat = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Fix it."},
        {
            "role": "assistant",
            "content": "Looking.",
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "exec_command", "arguments": {"cmd": "ls"}}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "a.py"},
    ]
    assert reply.extra["prompt_token_ids"] == _render(tokenizer, chat, sent_tools)
    assert reply.usage.input_tokens == len(reply.extra["prompt_token_ids"])


@pytest.mark.parametrize(
    ("body", "status", "param", "words"),
    [
        ({"input": "hi", "previous_response_id": "resp_1"}, 400, "previous_response_id", "stores no responses"),
        ({"input": [{"type": "item_reference", "id": "rs_1"}]}, 400, "input[0]", "stores no items"),
        ({"input": [{"type": "web_search_call"}]}, 400, "input[0].type", "'web_search_call' are not supported"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            400,
            "input[0].content[0]",
            "'input_image' part",
        ),
        (
            {"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{"}]},
            400,
            "input[0].arguments",
            "not valid JSON",
        ),
        ({"input": [{"type": "function_call_output", "output": "x"}]}, 400, "input[0].call_id", "non-empty string"),
        ({"input": "hi", "tools": [{"type": "web_search"}]}, 400, "tools[0]", "no built-in tools"),
        ({"input": "hi", "tool_choice": "required"}, 400, "tool_choice", "auto or none"),
        ({"input": "hi", "text": {"format": {"type": "json_schema", "name": "x", "schema": {}}}}, 400, "text.format", "guided decoding"),
        ({"input": "hi", "max_output_tokens": 0}, 400, "max_output_tokens", "at least 1"),
        ({"input": []}, 400, "input", "no message"),
        ({"input": "hi", "model": "other"}, 404, "model", "does not exist"),
    ],
)
def test_a_request_it_cannot_serve_is_refused_in_the_responses_error_shape(
    server: Server, body: dict[str, Any], status: int, param: str, words: str
) -> None:
    with pytest.raises(openai.APIStatusError) as caught:
        _client(server).responses.create(**{"model": NAME, **body})
    error = caught.value
    assert error.status_code == status and isinstance(error.body, dict)
    assert error.body["param"] == param and words in error.body["message"] and error.body["type"] == "invalid_request_error"


def test_an_unknown_route_names_both_routes(server: Server) -> None:
    request = urllib.request.Request(server.url + "/completions", data=b"{}", headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=30)
    assert caught.value.code == 404
    message = json.loads(caught.value.read())["error"]["message"]
    assert "POST /v1/chat/completions and POST /v1/responses" in message


def test_a_prompt_over_the_context_is_a_context_overflow(server: Server) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        _client(server).responses.create(model=NAME, input="word " * MAX_CONTEXT, max_output_tokens=4)
    assert caught.value.body["code"] == "context_length_exceeded"
    spec = PolicySpec(kind="responses", model=NAME, base_url=server.url, max_retries=0, timeout_s=120)
    with pytest.raises(ContextOverflow):
        make_policy(spec).complete([Message(role="user", content="word " * MAX_CONTEXT)], [])


@pytest.mark.slow
def test_the_codex_cli_runs_an_episode_against_relearn_serve(
    server: Server, steer: Steer, docker_client: Any, base_image: str, tmp_path: Path
) -> None:
    """The real Codex CLI, through the project's gateway, evaluated on a mini task against a
    model served here: it patches with the freeform apply_patch, runs the tests with
    exec_command, answers; every call is answered (no 404) with the token ids recorded."""
    from envs.images import task_image
    from envs.tasks import load_tasks
    from envs.verify import verify
    from harness.codex_cli import install as codex_install
    from harness.codex_cli.backend import run_codex_episode
    from harness.codex_cli.config import CodexCliConfig
    from harness.codex_cli.responses_api import requests
    from records.trajectory import Source, Trajectory

    task = next(t for t in load_tasks(Path(__file__).resolve().parent.parent / "envs" / "mini_tasks")[0] if t.instance_id == "mini__calc-1")
    image = task_image(docker_client, task, base_image)
    tests = "python3 -m pytest -q -p no:cacheprovider " + " ".join(task.test_files)

    def script(prompt: str) -> str:
        answered = prompt.count("<tool_response>")
        if answered == 0:
            return (
                "The power rule is wrong.\n</think>\n\n"
                f"<tool_call>\n<function=apply_patch>\n<parameter=input>\n{to_apply_patch(task.patch)}\n</parameter>\n</function>\n</tool_call>"
            )
        if answered == 1:
            return f"Now the tests.\n</think>\n\n<tool_call>\n<function=exec_command>\n<parameter=cmd>\n{tests}\n</parameter>\n</function>\n</tool_call>"
        return "They pass.\n</think>\n\nFixed the power rule; the tests pass."

    steer.script = script
    config = CodexCliConfig(install=codex_install.installed(), relay_image=base_image, request_token_ids=True)
    spec = PolicySpec(kind="responses", model=NAME, base_url=server.url, sampling={"temperature": 0}, max_retries=0, timeout_s=300)
    header = Trajectory(
        id=f"{task.instance_id}:codex-cli:{NAME}:-:0", task_id=task.instance_id, attempt=0, messages=[], source=Source(format="codex")
    )
    trajectory = run_codex_episode(docker_client, task, image, spec, Budget(max_turns=6), config, header, artifacts=tmp_path / "codex")
    calls = list(requests(tmp_path / "codex" / "gateway.jsonl"))
    assert [c["status"] for c in calls] == [200, 200, 200], [c.get("error") for c in calls]
    assert trajectory.exit_status is ExitStatus.submitted, trajectory.source.meta
    generated = [m for m in trajectory.messages if m.role == "assistant"]
    assert [m.tool_calls[0].function.name if m.tool_calls else None for m in generated] == ["apply_patch", "exec_command", None]
    assert generated[0].tool_calls[0].type == "custom" and generated[-1].content == "Fixed the power rule; the tests pass."
    assert any("passed" in (m.content or "") for m in trajectory.messages if m.role == "tool")
    # Token ids as the gateway asked for them: exactly the steered answer, and the prompt the model saw.
    assert all(m.token_ids and m.token_ids[-1] == steer.end for m in generated)
    assert all(len(m.extra["prompt_token_ids"]) == m.usage.input_tokens for m in generated)
    assert verify(docker_client, task, trajectory.final_patch, image).resolved
