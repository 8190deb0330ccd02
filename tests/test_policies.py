"""Policy clients against local model servers: the real SDKs over real HTTP."""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request
from typing import Any

import pytest

from harness.policies.base import ContextOverflow, PolicyError, PolicySpec
from harness.policies.make import make_policy
from harness.scripted.servers import ModelServer, ScriptedTurn, context_overflow
from records.trajectory import FunctionCall, Message, ToolCall

PROTOCOLS = ["chat", "responses", "anthropic"]

SHELL = {
    "type": "function",
    "function": {
        "name": "shell",
        "description": "Run a command.",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "array", "items": {"type": "string"}}},
            "required": ["command"],
        },
    },
}
TASK = [Message(role="system", content="You are terse."), Message(role="user", content="List the files.")]


def spec_for(server: ModelServer, **overrides: Any) -> PolicySpec:
    values: dict[str, Any] = {
        "kind": server.protocol,
        "model": "test-model",
        "base_url": server.base_url,
        "api_key_env": "RELEARN_TEST_NO_SUCH_KEY",
        "backoff_base_s": 0.001,  # retries stay fast
        "timeout_s": 10.0,
    }
    values.update(overrides)
    return PolicySpec(**values)


def sent_key(headers: dict[str, str]) -> str | None:
    # anthropic 2.x sends the key as a bearer token; older SDKs used x-api-key.
    if "x-api-key" in headers:
        return headers["x-api-key"]
    auth = headers.get("authorization", "")
    return auth.removeprefix("Bearer ") if auth else None


def complete(server: ModelServer, messages: list[Message] = TASK, tools: list[dict[str, Any]] | None = None, **overrides: Any):
    return make_policy(spec_for(server, **overrides)).complete(messages, [SHELL] if tools is None else tools)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_text_answer(protocol: str) -> None:
    with ModelServer(protocol, [ScriptedTurn(content="Nothing to do.")]) as server:
        turn = complete(server)
    message = turn.message
    assert message.role == "assistant" and message.generated
    assert message.content == "Nothing to do."
    assert message.tool_calls is None and message.reasoning_content is None
    assert turn.finish_reason == "stop" and turn.attempts == 1
    assert message.timestamp is not None and message.timestamp.endswith("Z")
    assert message.duration_ms is not None and message.duration_ms > 0
    assert message.extra is not None and message.extra["model"] == "test-model"


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_tool_call_arguments_parsed(protocol: str) -> None:
    script = [ScriptedTurn(tool_calls=[("shell", {"command": ["ls", "-a"]}), ("shell", {"command": ["pwd"]})])]
    with ModelServer(protocol, script) as server:
        turn = complete(server)
    calls = turn.message.tool_calls
    assert turn.finish_reason == "tool_calls"
    assert calls is not None and [c.function.arguments for c in calls] == [{"command": ["ls", "-a"]}, {"command": ["pwd"]}]
    assert all(c.function.name == "shell" and c.raw_arguments is None for c in calls)
    assert len({c.id for c in calls}) == 2 and all(c.id for c in calls)
    assert not turn.message.content


@pytest.mark.parametrize(
    ("protocol", "field"), [("chat", "reasoning_content"), ("chat", "reasoning"), ("responses", None), ("anthropic", None)]
)
def test_reasoning_captured(protocol: str, field: str | None) -> None:
    options = {"chat_reasoning_field": field} if field else {}
    with ModelServer(protocol, [ScriptedTurn(content="Done.", reasoning="The user wants a listing.")], **options) as server:
        turn = complete(server)
    assert turn.message.reasoning_content == "The user wants a listing."
    assert turn.message.content == "Done."


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_usage_and_cost(protocol: str) -> None:
    script = [ScriptedTurn(content="a", input_tokens=1000, cached_input_tokens=400, output_tokens=200)] * 2
    with ModelServer(protocol, script) as server:
        full = complete(server, price_in_per_mtok=3.0, price_out_per_mtok=15.0)
        discounted = complete(server, price_in_per_mtok=3.0, price_out_per_mtok=15.0, price_cached_in_per_mtok=0.3)
    usage = full.message.usage
    assert usage is not None
    assert (usage.input_tokens, usage.cached_input_tokens, usage.output_tokens, usage.total_tokens) == (1000, 400, 200, 1200)
    assert usage.cost_usd == pytest.approx((1000 * 3.0 + 200 * 15.0) / 1e6)
    assert discounted.message.usage is not None
    assert discounted.message.usage.cost_usd == pytest.approx((600 * 3.0 + 400 * 0.3 + 200 * 15.0) / 1e6)


def test_local_model_costs_nothing() -> None:
    with ModelServer("chat", [ScriptedTurn(content="a")]) as server:
        turn = complete(server)
    assert turn.message.usage is not None and turn.message.usage.cost_usd == 0.0


def conversation() -> list[Message]:
    """A task, one assistant turn with reasoning and two tool calls, their results, a nudge."""
    calls = [
        ToolCall(id="call_a", function=FunctionCall(name="shell", arguments={"command": ["ls"]})),
        ToolCall(id="call_b", function=FunctionCall(name="shell", arguments={"command": ["pwd"]})),
    ]
    return [
        *TASK,
        Message(role="assistant", content="Looking.", reasoning_content="Two commands.", tool_calls=calls, generated=True),
        Message(role="tool", tool_call_id="call_a", name="shell", content="a.py\nb.py"),
        Message(role="tool", tool_call_id="call_b", name="shell", content="/repo"),
        Message(role="user", content="Go on."),
    ]


def test_chat_request_body() -> None:
    sampling = {"temperature": 0.2, "top_p": 0.9, "max_tokens": 512, "seed": 7, "top_k": 20}
    with ModelServer("chat", [ScriptedTurn(content="ok")]) as server:
        complete(server, messages=conversation(), sampling=sampling)
    body = server.requests[0]
    assert body["messages"] == [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "List the files."},
        {
            "role": "assistant",
            "content": "Looking.",
            "reasoning_content": "Two commands.",
            "tool_calls": [
                {"id": "call_a", "type": "function", "function": {"name": "shell", "arguments": '{"command": ["ls"]}'}},
                {"id": "call_b", "type": "function", "function": {"name": "shell", "arguments": '{"command": ["pwd"]}'}},
            ],
        },
        {"role": "tool", "tool_call_id": "call_a", "content": "a.py\nb.py"},
        {"role": "tool", "tool_call_id": "call_b", "content": "/repo"},
        {"role": "user", "content": "Go on."},
    ]
    assert body["tools"] == [SHELL]
    assert body["model"] == "test-model"
    # Known sampling arguments by name, vLLM's extras (top_k) in the body all the same.
    assert {k: body[k] for k in sampling} == sampling
    assert body["return_token_ids"] is True and body["logprobs"] is True
    assert "stream" not in body or body["stream"] is False


def test_responses_request_body() -> None:
    with ModelServer("responses", [ScriptedTurn(content="ok")]) as server:
        complete(server, messages=conversation(), sampling={"temperature": 0.2, "max_tokens": 512})
    body = server.requests[0]
    assert body["instructions"] == "You are terse."
    assert body["store"] is False
    assert body["max_output_tokens"] == 512 and "max_tokens" not in body
    assert body["temperature"] == 0.2
    assert body["input"] == [
        {"type": "message", "role": "user", "content": "List the files."},
        # Reasoning from a message that carries no encrypted reasoning item is not sent.
        {"type": "message", "role": "assistant", "content": "Looking."},
        {"type": "function_call", "call_id": "call_a", "name": "shell", "arguments": '{"command": ["ls"]}'},
        {"type": "function_call", "call_id": "call_b", "name": "shell", "arguments": '{"command": ["pwd"]}'},
        {"type": "function_call_output", "call_id": "call_a", "output": "a.py\nb.py"},
        {"type": "function_call_output", "call_id": "call_b", "output": "/repo"},
        {"type": "message", "role": "user", "content": "Go on."},
    ]
    function = SHELL["function"]
    assert body["tools"] == [
        {"type": "function", "name": "shell", "description": function["description"], "parameters": function["parameters"], "strict": False}
    ]
    assert "return_token_ids" not in body
    assert body["enable_response_messages"] is True  # vLLM's raw messages, with their token ids


def test_anthropic_request_body() -> None:
    with ModelServer("anthropic", [ScriptedTurn(content="ok")]) as server:
        complete(server, messages=conversation(), sampling={"temperature": 0.2, "top_k": 5})
    body = server.requests[0]
    assert body["system"] == "You are terse."
    assert body["max_tokens"] == 4096
    assert body["temperature"] == 0.2 and body["top_k"] == 5
    assert body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "List the files."}]},
        # No thinking block: this reasoning has no Anthropic signature.
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Looking."},
                {"type": "tool_use", "id": "call_a", "name": "shell", "input": {"command": ["ls"]}},
                {"type": "tool_use", "id": "call_b", "name": "shell", "input": {"command": ["pwd"]}},
            ],
        },
        # Both results and the next user text in the one user turn that follows.
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "call_a", "content": "a.py\nb.py"},
                {"type": "tool_result", "tool_use_id": "call_b", "content": "/repo"},
                {"type": "text", "text": "Go on."},
            ],
        },
    ]
    function = SHELL["function"]
    assert body["tools"] == [{"name": "shell", "description": function["description"], "input_schema": function["parameters"]}]
    assert sent_key(server.headers[0]) == "EMPTY"


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_generated_turn_round_trips(protocol: str) -> None:
    """A generated message sent back as history: reasoning in each protocol's own form."""
    script = [
        ScriptedTurn(reasoning="Check first.", content="Checking.", tool_calls=[("shell", {"command": ["ls"]})]),
        ScriptedTurn(content="Done."),
    ]
    with ModelServer(protocol, script) as server:
        policy = make_policy(spec_for(server))
        first = policy.complete(TASK, [SHELL])
        call = first.message.tool_calls[0]
        history = [*TASK, first.message, Message(role="tool", tool_call_id=call.id, content="a.py")]
        second = policy.complete(history, [SHELL])
    assert second.message.content == "Done."
    sent = server.requests[1]
    if protocol == "chat":
        assert sent["messages"][2]["reasoning_content"] == "Check first."
        assert sent["messages"][3] == {"role": "tool", "tool_call_id": call.id, "content": "a.py"}
    elif protocol == "responses":
        reasoning, text, function_call, output = sent["input"][1:]
        assert reasoning == {
            "type": "reasoning",
            "id": "rs_0",
            "summary": [{"type": "summary_text", "text": "Check first."}],
            "encrypted_content": "enc_0",
        }
        assert text == {"type": "message", "role": "assistant", "content": "Checking."}
        assert function_call["call_id"] == call.id == output["call_id"]
    else:
        assistant = sent["messages"][1]
        assert assistant["content"][0] == {"type": "thinking", "thinking": "Check first.", "signature": "sig_0"}
        assert [b["type"] for b in assistant["content"]] == ["thinking", "text", "tool_use"]
        assert sent["messages"][2]["content"] == [{"type": "tool_result", "tool_use_id": call.id, "content": "a.py"}]


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("raw", ['{"command": ["ls"', '["ls"]'])
def test_malformed_tool_arguments_kept_raw(protocol: str, raw: str) -> None:
    with ModelServer(protocol, [ScriptedTurn(tool_calls=[("shell", raw)])]) as server:
        turn = complete(server)
    call = turn.message.tool_calls[0]
    assert call.function.name == "shell"
    assert call.function.arguments == {}
    assert call.raw_arguments == raw


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_finish_reason_length(protocol: str) -> None:
    with ModelServer(protocol, [ScriptedTurn(content="trunc", finish_reason="length")]) as server:
        turn = complete(server)
    assert turn.finish_reason == "length"


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_429_then_500_then_success(protocol: str) -> None:
    script = [ScriptedTurn(error=429), ScriptedTurn(error=500), ScriptedTurn(content="finally")]
    with ModelServer(protocol, script) as server:
        turn = complete(server)
    assert turn.message.content == "finally"
    assert turn.attempts == 3
    assert len(server.requests) == 3


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_persistent_500_gives_up(protocol: str) -> None:
    with ModelServer(protocol, [ScriptedTurn(error=500)] * 3 + [ScriptedTurn(content="too late")]) as server:
        with pytest.raises(PolicyError) as caught:
            complete(server, max_retries=2)
    assert not isinstance(caught.value, ContextOverflow)
    assert caught.value.attempts == 3 and caught.value.status == 500
    assert "after 3 attempts" in str(caught.value) and "500" in str(caught.value)
    assert len(server.requests) == 3


def test_retry_after_is_honoured() -> None:
    script = [ScriptedTurn(error=429, headers={"Retry-After": "0.4"}), ScriptedTurn(content="ok")]
    with ModelServer("chat", script) as server:
        started = time.monotonic()
        turn = complete(server)
        elapsed = time.monotonic() - started
    assert turn.attempts == 2
    assert elapsed >= 0.4


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_timeout_is_retried_then_fails(protocol: str) -> None:
    script = [ScriptedTurn(content="slow", delay_s=5.0)] * 2
    with ModelServer(protocol, script) as server:
        started = time.monotonic()
        with pytest.raises(PolicyError) as caught:
            complete(server, timeout_s=0.3, max_retries=1)
        elapsed = time.monotonic() - started
    assert caught.value.attempts == 2
    assert "timed out" in str(caught.value)
    assert len(server.requests) == 2
    assert elapsed < 3.0


def test_timeout_then_success() -> None:
    with ModelServer("chat", [ScriptedTurn(content="slow", delay_s=5.0), ScriptedTurn(content="fast")]) as server:
        turn = complete(server, timeout_s=0.3)
    assert turn.message.content == "fast" and turn.attempts == 2


def test_connection_refused_is_retried_then_fails() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed once we leave: nothing listens there
    spec = PolicySpec(kind="chat", model="m", base_url=f"http://127.0.0.1:{port}/v1", max_retries=1, backoff_base_s=0.001, timeout_s=2.0)
    with pytest.raises(PolicyError) as caught:
        make_policy(spec).complete(TASK, [])
    assert caught.value.attempts == 2 and "connection error" in str(caught.value)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_context_overflow_is_not_retried(protocol: str) -> None:
    with ModelServer(protocol, [context_overflow(protocol), ScriptedTurn(content="never")]) as server:
        with pytest.raises(ContextOverflow) as caught:
            complete(server)
    assert caught.value.attempts == 1 and caught.value.status == 400
    assert len(server.requests) == 1


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_other_4xx_is_not_retried(protocol: str) -> None:
    with ModelServer(protocol, [ScriptedTurn(error=401), ScriptedTurn(content="never")]) as server:
        with pytest.raises(PolicyError) as caught:
            complete(server)
    assert not isinstance(caught.value, ContextOverflow)
    assert caught.value.status == 401 and caught.value.attempts == 1
    assert "non-retryable" in str(caught.value) and "RELEARN_TEST_NO_SUCH_KEY is not set" in str(caught.value)
    assert len(server.requests) == 1


def test_chat_token_ids_and_logprobs() -> None:
    script = [ScriptedTurn(content="hi", token_ids=[11, 12, 13], logprobs=[-0.1, -0.2, -0.3]), ScriptedTurn(content="hi")]
    with ModelServer("chat", script) as server:
        returned = complete(server)
        absent = complete(server)  # a server that ignores the request (older vLLM, SGLang)
    assert returned.message.token_ids == [11, 12, 13]
    assert returned.message.logprobs == pytest.approx([-0.1, -0.2, -0.3])
    assert absent.message.token_ids is None and absent.message.logprobs is None


def test_chat_keeps_the_prompt_ids_vllm_returns_beside_the_choices() -> None:
    script = [ScriptedTurn(content="hi", token_ids=[11], prompt_token_ids=[5, 6, 7]), ScriptedTurn(content="hi")]
    with ModelServer("chat", script) as server:
        returned = complete(server)
        absent = complete(server)
    assert server.requests[0]["return_token_ids"] is True
    assert returned.message.extra is not None and returned.message.extra["prompt_token_ids"] == [5, 6, 7]
    # Recorded with the message: it survives the trajectory's JSON round trip.
    again = Message.model_validate_json(returned.message.model_dump_json())
    assert again.extra is not None and again.extra["prompt_token_ids"] == [5, 6, 7]
    assert absent.message.extra is not None and "prompt_token_ids" not in absent.message.extra


def test_chat_token_ids_not_requested() -> None:
    with ModelServer("chat", [ScriptedTurn(content="hi", token_ids=[1], logprobs=[-1.0])]) as server:
        turn = complete(server, request_token_ids=False)
    body = server.requests[0]
    assert "return_token_ids" not in body and "logprobs" not in body
    assert turn.message.token_ids is None and turn.message.logprobs is None


def test_responses_keeps_the_token_ids_of_vllms_raw_messages() -> None:
    """vLLM answers enable_response_messages with the engine's raw messages beside the output:
    the generated ids become the message's token_ids, the prompt's its extra.prompt_token_ids,
    as the chat protocol records them; a server that sends none leaves both out."""
    script = [
        ScriptedTurn(content="hi", token_ids=[11, 12, 13], prompt_token_ids=[5, 6, 7]),
        ScriptedTurn(content="hi", token_ids=[21]),
        ScriptedTurn(content="hi"),
    ]
    with ModelServer("responses", script) as server:
        returned, no_prompt, absent = complete(server), complete(server), complete(server)
    assert all(body["enable_response_messages"] is True for body in server.requests)
    assert returned.message.token_ids == [11, 12, 13]
    assert returned.message.extra is not None and returned.message.extra["prompt_token_ids"] == [5, 6, 7]
    again = Message.model_validate_json(returned.message.model_dump_json())
    assert again.token_ids == [11, 12, 13] and again.extra is not None and again.extra["prompt_token_ids"] == [5, 6, 7]
    assert no_prompt.message.token_ids == [21] and "prompt_token_ids" not in (no_prompt.message.extra or {})
    assert absent.message.token_ids is None and "prompt_token_ids" not in (absent.message.extra or {})


def test_responses_token_ids_not_requested() -> None:
    with ModelServer("responses", [ScriptedTurn(content="hi", token_ids=[1], prompt_token_ids=[2])]) as server:
        turn = complete(server, request_token_ids=False)
    assert "enable_response_messages" not in server.requests[0]
    assert turn.message.token_ids is None and "prompt_token_ids" not in (turn.message.extra or {})


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_api_key_from_env(protocol: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RELEARN_TEST_KEY", "sk-test")
    with ModelServer(protocol, [ScriptedTurn(content="hi")]) as server:
        complete(server, api_key_env="RELEARN_TEST_KEY")
    assert sent_key(server.headers[0]) == "sk-test"


def test_default_key_variable_follows_the_vendor() -> None:
    assert PolicySpec(kind="anthropic", model="m").key_env == "ANTHROPIC_API_KEY"
    assert PolicySpec(kind="chat", model="m").key_env == "OPENAI_API_KEY"
    assert PolicySpec(kind="responses", model="m", api_key_env="MY_KEY").key_env == "MY_KEY"


def test_spec_rejects_reserved_sampling() -> None:
    with pytest.raises(ValueError, match="stream"):
        PolicySpec(kind="chat", model="m", sampling={"stream": True})
    with pytest.raises(ValueError, match="kind"):
        PolicySpec(kind="completions", model="m")  # type: ignore[arg-type]


def test_server_says_when_the_script_is_exhausted() -> None:
    with ModelServer("chat", []) as server:
        request = urllib.request.Request(
            server.base_url + "/chat/completions", data=b'{"model": "m"}', headers={"Content-Type": "application/json"}
        )
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(request, timeout=5)
    assert caught.value.code == 500
    assert "script exhausted" in json.loads(caught.value.read())["error"]["message"]


def test_server_takes_a_function_as_script() -> None:
    def answer(body: dict[str, Any]) -> ScriptedTurn:
        return ScriptedTurn(content=f"{len(body['messages'])} messages")

    with ModelServer("chat", answer) as server:
        assert complete(server).message.content == "2 messages"
        assert complete(server, messages=conversation()).message.content == "6 messages"
