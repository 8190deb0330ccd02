"""``relearn.serve``: a tiny random Qwen3 with the real Qwen3.6 tokenizer, served over HTTP and
talked to by the real ``openai`` SDK and our ``ChatPolicy``, the path an evaluation uses; and
the completion parser, checked against what the real chat template renders."""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import openai
import pytest
import typer
from typer.testing import CliRunner

from harness.policies.base import ContextOverflow, PolicySpec
from harness.policies.make import make_policy
from harness.policies.openai_chat import chat_messages
from records.trajectory import FunctionCall, Message, ToolCall
from relearn.cli.serve import register
from relearn.masks.tokenizers import QWEN3_6, load_tokenizer
from relearn.serve.parsers import parameter_value, parse_completion
from relearn.serve.server import Server, serve
from relearn.train.model import build_model

NAME = "tiny-qwen3"
MAX_CONTEXT = 512

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "shell",
            "description": "Run a command.",
            "parameters": {
                "type": "object",
                "properties": {"cmd": {"type": "string"}, "timeout": {"type": "integer"}, "env": {"type": "object"}},
                "required": ["cmd"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "update_plan",
            "description": "Record the plan.",
            "parameters": {
                "type": "object",
                "properties": {
                    "steps": {"type": "array", "items": {"type": "string"}},
                    "explanation": {"type": "string"},
                    "done": {"type": "boolean"},
                },
            },
        },
    },
]


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return load_tokenizer(QWEN3_6)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory, tokenizer: Any) -> Path:
    """What `relearn train` leaves in RUN/model: Hugging Face weights with the tokenizer beside them."""
    folder = tmp_path_factory.mktemp("run") / "model"
    build_model(tiny="qwen3").save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def server(model_dir: Path, tokenizer: Any) -> Any:
    # The tokenizer object saves loading it again (seconds); the command's test loads the folder's.
    with serve(model_dir, tokenizer, model_name=NAME, max_context=MAX_CONTEXT) as running:
        yield running


def _policy(server: Server, **sampling: Any) -> Any:
    return make_policy(PolicySpec(kind="chat", model=NAME, base_url=server.url, sampling=sampling, max_retries=0, timeout_s=120))


def _client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url, api_key="EMPTY", max_retries=0, timeout=120)


def _prompt_ids(tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> list[int]:
    return list(tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=True)["input_ids"])


def _post(server: Server, path: str, body: bytes) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(server.url.removesuffix("/v1") + path, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _calls(parsed: Any) -> list[tuple[str, dict[str, Any]]]:
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in parsed.tool_calls]


# --- through the client path an evaluation uses ----------------------------------------------


def test_chat_policy_gets_a_greedy_completion_counted_as_the_tokenizer_counts(server: Server, tokenizer: Any) -> None:
    policy = _policy(server, temperature=0, max_tokens=6)
    messages = [Message(role="system", content="You are terse."), Message(role="user", content="Fix the failing test.")]
    first = policy.complete(messages, TOOLS)
    reply = first.message
    assert first.finish_reason == "length"
    assert reply.usage is not None and reply.token_ids is not None and reply.logprobs is not None
    assert reply.usage.input_tokens == len(_prompt_ids(tokenizer, chat_messages(messages), TOOLS))
    # The context as the model was given it, recorded beside the generated ids.
    assert reply.extra is not None and reply.extra["prompt_token_ids"] == _prompt_ids(tokenizer, chat_messages(messages), TOOLS)
    assert reply.usage.output_tokens == len(reply.token_ids) == len(reply.logprobs) == 6
    assert all(lp <= 0 for lp in reply.logprobs)
    # The message is the parse of exactly the tokens it reports.
    parsed = parse_completion(tokenizer.decode(reply.token_ids, skip_special_tokens=True), TOOLS)
    assert (reply.content, reply.reasoning_content) == (parsed.content, parsed.reasoning_content)
    assert reply.reasoning_content or reply.content

    second = policy.complete(messages, TOOLS).message
    assert second.token_ids == reply.token_ids
    assert (second.content, second.reasoning_content) == (reply.content, reply.reasoning_content)


def test_sdk_gets_vllm_token_ids_and_logprobs_of_the_tokens_chosen(server: Server, tokenizer: Any) -> None:
    messages = [{"role": "user", "content": "Say hello."}]
    response = _client(server).chat.completions.create(
        model=NAME, messages=messages, max_completion_tokens=4, temperature=0, logprobs=True, top_logprobs=3, extra_body={"return_token_ids": True}
    )  # fmt: skip
    choice = response.choices[0]
    token_ids = choice.model_extra["token_ids"]
    assert response.model_extra["prompt_token_ids"] == _prompt_ids(tokenizer, messages)
    assert response.usage.prompt_tokens == len(response.model_extra["prompt_token_ids"])
    assert response.usage.completion_tokens == len(token_ids) == 4
    assert response.usage.total_tokens == response.usage.prompt_tokens + 4
    assert choice.finish_reason == "length" and response.model == NAME
    assert choice.logprobs is not None and choice.logprobs.content is not None
    for token_id, entry in zip(token_ids, choice.logprobs.content, strict=True):
        assert entry.token == tokenizer.decode([token_id])
        assert len(entry.top_logprobs) == 3
        # Greedy decoding picks the most probable token, so its logprob heads the top list.
        assert entry.top_logprobs[0].token == entry.token and entry.top_logprobs[0].logprob == pytest.approx(entry.logprob)
        assert entry.top_logprobs[0].logprob >= entry.top_logprobs[1].logprob >= entry.top_logprobs[2].logprob


def test_sampling_follows_the_seed(server: Server) -> None:
    client = _client(server)

    def sample(seed: int) -> list[int]:
        response = client.chat.completions.create(
            model=NAME, messages=[{"role": "user", "content": "Go."}], max_tokens=8, temperature=1.0, seed=seed, extra_body={"return_token_ids": True}
        )  # fmt: skip
        return response.choices[0].model_extra["token_ids"]

    assert sample(7) == sample(7)
    assert sample(7) != sample(8)


def test_without_max_tokens_the_output_fills_the_context_left(server: Server, tokenizer: Any) -> None:
    words = 1
    while len(_prompt_ids(tokenizer, [{"role": "user", "content": "go " * words}])) < MAX_CONTEXT - 5:
        words += 1
    messages = [{"role": "user", "content": "go " * words}]
    prompt = len(_prompt_ids(tokenizer, messages))
    assert MAX_CONTEXT - prompt in range(1, 6)
    response = _client(server).chat.completions.create(model=NAME, messages=messages, temperature=0)
    assert response.usage.completion_tokens == MAX_CONTEXT - prompt
    assert response.choices[0].finish_reason == "length"


def test_a_prompt_over_the_context_is_a_context_overflow(server: Server) -> None:
    with pytest.raises(ContextOverflow) as too_long:
        _policy(server, temperature=0).complete([Message(role="user", content="word " * 2 * MAX_CONTEXT)], [])
    assert too_long.value.status == 400 and f"maximum context length is {MAX_CONTEXT} tokens" in str(too_long.value)
    # As vLLM: an explicit max_tokens that cannot fit is refused too, not cut short.
    with pytest.raises(ContextOverflow):
        _policy(server, temperature=0, max_tokens=MAX_CONTEXT).complete([Message(role="user", content="hi")], [])


def test_history_with_tool_calls_and_reasoning_renders_as_the_template_does(server: Server, tokenizer: Any) -> None:
    call = ToolCall(id="call_1", function=FunctionCall(name="shell", arguments={"cmd": "pytest -x", "timeout": 60, "env": {"CI": "1"}}))
    messages = [
        Message(role="user", content="Run the tests."),
        Message(
            role="assistant", content="Running them.", reasoning_content="The user wants the tests run.", tool_calls=[call], generated=True
        ),
        Message(role="tool", tool_call_id="call_1", content="1 failed"),
    ]
    turn = _policy(server, temperature=0, max_tokens=1).complete(messages, TOOLS)
    # ChatPolicy sends the arguments as a JSON string; the template needs the mapping and the reasoning.
    history = [
        {"role": "user", "content": "Run the tests."},
        {"role": "assistant", "content": "Running them.", "reasoning_content": "The user wants the tests run.", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "shell", "arguments": {"cmd": "pytest -x", "timeout": 60, "env": {"CI": "1"}}}}
        ]},
        {"role": "tool", "tool_call_id": "call_1", "content": "1 failed"},
    ]  # fmt: skip
    assert turn.message.usage is not None
    assert turn.message.usage.input_tokens == len(_prompt_ids(tokenizer, history, TOOLS))
    without_reasoning = [dict(history[0]), {**history[1], "reasoning_content": ""}, history[2]]
    assert turn.message.usage.input_tokens != len(_prompt_ids(tokenizer, without_reasoning, TOOLS))


def test_a_tool_call_reaches_the_policy_as_a_tool_call(server: Server, tokenizer: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the model is scripted here (a random one writes no tool calls): it "generates" the
    tokens of a rendered turn; the server's decoding, parsing and answer are the real ones."""
    ids = _rendered_ids(tokenizer, "Run them.", None, [("shell", {"cmd": "pytest -x", "timeout": 30}), ("update_plan", {"steps": ["fix"]})])
    monkeypatch.setattr(server.engine, "_generate", lambda prompt, max_new, request, seed: (ids, None))
    policy = make_policy(PolicySpec(kind="chat", model=NAME, base_url=server.url, max_retries=0, request_token_ids=False))
    turn = policy.complete([Message(role="user", content="Fix the bug.")], TOOLS)
    reply = turn.message
    assert turn.finish_reason == "tool_calls"
    assert reply.reasoning_content == "Run them." and reply.content is None
    assert reply.tool_calls is not None
    assert [(c.function.name, c.function.arguments, c.raw_arguments) for c in reply.tool_calls] == [
        ("shell", {"cmd": "pytest -x", "timeout": 30}, None),
        ("update_plan", {"steps": ["fix"]}, None),
    ]
    assert reply.usage is not None and reply.usage.output_tokens == len(ids)


def test_a_stop_string_ends_the_output_before_it(server: Server, tokenizer: Any) -> None:
    client = _client(server)
    request: dict[str, Any] = {"model": NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "temperature": 0}
    ids = client.chat.completions.create(**request, extra_body={"return_token_ids": True}).choices[0].model_extra["token_ids"]
    # A stop string that first shows up in the text of some token k.
    k = next(
        k for k in range(2, len(ids)) if (piece := tokenizer.decode(ids[k : k + 1]).strip()) and piece not in tokenizer.decode(ids[:k])
    )
    stop = tokenizer.decode(ids[k : k + 1]).strip()
    choice = client.chat.completions.create(**request, stop=[stop], extra_body={"return_token_ids": True}).choices[0]
    assert choice.finish_reason == "stop" and choice.model_extra["stop_reason"] == stop
    assert choice.model_extra["token_ids"] == ids[: k + 1]
    text = tokenizer.decode(ids, skip_special_tokens=True)
    expected = parse_completion(text[: text.index(stop)])
    assert (choice.message.reasoning_content, choice.message.content) == (expected.reasoning_content, expected.content)


def test_stream_is_refused(server: Server) -> None:
    with pytest.raises(openai.BadRequestError, match="stream"):
        _client(server).chat.completions.create(model=NAME, messages=[{"role": "user", "content": "hi"}], stream=True)


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"model": NAME}, 400, "messages"),
        ({"model": NAME, "messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}, 400, "temperature"),
        ({"model": NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}, 400, "max_tokens"),
        ({"model": NAME, "messages": [{"role": "user", "content": "hi"}], "n": 2}, 400, "n"),
        (
            {"model": NAME, "messages": [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "", "tool_calls": [{"id": "a", "type": "function", "function": {"name": "shell", "arguments": "{not json"}}]},
            ]},
            400,
            "messages[1].tool_calls[0].function.arguments",
        ),
        ({"model": NAME, "messages": [{"role": "assistant", "content": "no user turn"}]}, 400, "messages"),
        ({"model": "some-other-model", "messages": [{"role": "user", "content": "hi"}]}, 404, "model"),
    ],
)  # fmt: skip
def test_a_malformed_request_is_refused_naming_the_field(server: Server, body: dict[str, Any], status: int, param: str) -> None:
    code, answer = _post(server, "/v1/chat/completions", json.dumps(body).encode())
    assert code == status
    assert answer["error"]["param"] == param and answer["error"]["message"]


def test_a_body_that_is_not_json_is_refused(server: Server) -> None:
    code, answer = _post(server, "/v1/chat/completions", b"{model: ")
    assert code == 400 and "not JSON" in answer["error"]["message"]


def test_models_and_health(server: Server) -> None:
    models = _client(server).models.list()
    assert [m.id for m in models.data] == [NAME]
    assert models.data[0].model_extra["max_model_len"] == MAX_CONTEXT
    with urllib.request.urlopen(server.url.removesuffix("/v1") + "/health", timeout=10) as response:
        assert response.status == 200


# --- the parser, against what the real template renders ---------------------------------------


def _rendered_ids(tokenizer: Any, reasoning: str | None, content: str | None, calls: list[tuple[str, dict[str, Any]]]) -> list[int]:
    """The tokens of a model that writes exactly this assistant turn, through <|im_end|>."""
    history = [{"role": "user", "content": "Fix the bug."}]
    turn: dict[str, Any] = {"role": "assistant", "content": content or ""}
    if reasoning is not None:
        turn["reasoning_content"] = reasoning
    if calls:
        turn["tool_calls"] = [
            {"id": f"c{i}", "type": "function", "function": {"name": n, "arguments": a}} for i, (n, a) in enumerate(calls)
        ]
    prompt = tokenizer.apply_chat_template(history, tools=TOOLS, add_generation_prompt=True, tokenize=False)
    full = tokenizer.apply_chat_template([*history, turn], tools=TOOLS, tokenize=False)
    assert full.startswith(prompt)
    generated = full[len(prompt) :].removesuffix("\n")
    assert generated.endswith("<|im_end|>")
    return tokenizer(generated, add_special_tokens=False)["input_ids"]


def _rendered_completion(tokenizer: Any, reasoning: str | None, content: str | None, calls: list[tuple[str, dict[str, Any]]]) -> str:
    """The text a server parses when the model writes exactly this assistant turn."""
    return tokenizer.decode(_rendered_ids(tokenizer, reasoning, content, calls), skip_special_tokens=True)


ROUND_TRIPS = [
    pytest.param(
        "The test expects an int.\nCheck the env first.",
        "Let me look.",
        [
            ("shell", {"cmd": "cd repo && pytest -x\necho done", "timeout": 30, "env": {"CI": "1", "DEPTH": 2}}),
            ("shell", {"cmd": "git diff"}),
        ],
        id="reasoning-content-two-calls",
    ),
    pytest.param("Nothing left to do.", "The fix is in place: `x = int(y)`.", [], id="content-only"),
    pytest.param(
        None, None, [("update_plan", {"steps": ["read", "fix"], "explanation": "two steps", "done": False})], id="call-only-array-bool"
    ),
    pytest.param("Keep the newlines.", None, [("shell", {"cmd": "\nprintf 'a\\n'\n"})], id="value-with-edge-newlines"),
]


@pytest.mark.parametrize(("reasoning", "content", "calls"), ROUND_TRIPS)
def test_a_rendered_assistant_turn_parses_back(
    tokenizer: Any, reasoning: str | None, content: str | None, calls: list[tuple[str, dict[str, Any]]]
) -> None:
    parsed = parse_completion(_rendered_completion(tokenizer, reasoning, content, calls), TOOLS)
    assert parsed.reasoning_content == reasoning
    assert parsed.content == content
    assert _calls(parsed) == calls
    assert all(c["id"].startswith("call_") and c["type"] == "function" for c in parsed.tool_calls)
    assert len({c["id"] for c in parsed.tool_calls}) == len(calls)


@pytest.mark.parametrize(
    "rest",
    [
        # Hermes-style JSON inside <tool_call>: another template's format, not this model's.
        'Calling it.\n\n<tool_call>\n{"name": "shell", "arguments": {"cmd": "ls"}}\n</tool_call>',
        # <function= without the closing ">": no name can be read.
        "Calling it.\n\n<tool_call>\n<function=shell\n</tool_call>",
    ],
)
def test_a_malformed_tool_call_stays_content(rest: str) -> None:
    parsed = parse_completion("Thinking.\n</think>\n\n" + rest, TOOLS)
    assert parsed.tool_calls == []
    assert parsed.reasoning_content == "Thinking."
    assert parsed.content == rest


def test_how_reasoning_ends() -> None:
    call = "<tool_call>\n<function=shell>\n<parameter=cmd>\nls\n</parameter>\n</function>\n</tool_call>"
    # Cut off before </think>: all of it is reasoning.
    assert parse_completion("Still thinking", TOOLS) == parse_completion("Still thinking", TOOLS, parse_tools=False)
    cut = parse_completion("Still thinking", TOOLS)
    assert (cut.reasoning_content, cut.content, cut.tool_calls) == ("Still thinking", None, [])
    # A call straight out of reasoning, without </think>, ends the reasoning.
    direct = parse_completion("I should list files.\n" + call, TOOLS)
    assert direct.reasoning_content == "I should list files." and _calls(direct) == [("shell", {"cmd": "ls"})]
    # A model that opens <think> itself (older templates).
    assert parse_completion("<think>\nhm\n</think>\n\nhello", TOOLS).reasoning_content == "hm"
    # enable_thinking=false: no reasoning to look for.
    plain = parse_completion("hello", TOOLS, thinking=False)
    assert (plain.reasoning_content, plain.content) == (None, "hello")
    # Without tools in the request the call stays text, as in vLLM.
    untouched = parse_completion("ok\n</think>\n\n" + call, None, parse_tools=False)
    assert untouched.tool_calls == [] and untouched.content == call
    # Cut inside a call: read up to where it stops, as qwen3_coder does.
    truncated = parse_completion("ok\n</think>\n\n<tool_call>\n<function=shell>\n<parameter=cmd>\nls -l", TOOLS)
    assert _calls(truncated) == [("shell", {"cmd": "ls -l"})] and truncated.content is None


@pytest.mark.parametrize(
    ("raw", "schema", "value"),
    [
        ("42", {"type": "integer"}, 42),
        ("4x", {"type": "integer"}, "4x"),
        ("7", {"type": ["integer", "null"]}, 7),
        ("null", {"type": "integer"}, None),
        ("null", {"type": "string"}, "null"),
        ("2.5", {"type": "number"}, 2.5),
        ("3.0", {"type": "number"}, 3),
        ("true", {"type": "boolean"}, True),
        ("yes", {"type": "boolean"}, "yes"),
        ('{"a": [1, 2]}', {"type": "object"}, {"a": [1, 2]}),
        ("{'a': 1}", {"type": "object"}, {"a": 1}),
        ("{1, 2}", {"type": "object"}, "{1, 2}"),
        ('["x", "y"]', {"type": "array"}, ["x", "y"]),
        ("[unclosed", {"type": "array"}, "[unclosed"),
        ("42", {}, "42"),
    ],
)
def test_parameter_values_follow_the_schema(raw: str, schema: dict[str, Any], value: Any) -> None:
    assert parameter_value(raw, schema) == value
    assert type(parameter_value(raw, schema)) is type(value)


def test_a_parameter_the_schema_lacks_stays_text() -> None:
    parsed = parse_completion(
        "</think>\n\n<tool_call>\n<function=shell>\n<parameter=retries>\n3\n</parameter>\n</function>\n</tool_call>", TOOLS
    )
    assert _calls(parsed) == [("shell", {"retries": "3"})]


# --- the command ---------------------------------------------------------------------------


def test_serve_refuses_an_unusable_model_folder(tmp_path: Path, model_dir: Path) -> None:
    app = typer.Typer(add_completion=False)
    register(app)
    runner = CliRunner()
    missing = runner.invoke(app, [str(tmp_path / "nope")])
    assert missing.exit_code == 2 and "no such model folder" in missing.output
    empty = runner.invoke(app, [str(tmp_path)])
    assert empty.exit_code == 2 and "config.json" in empty.output
    weights_only = tmp_path / "weights"
    weights_only.mkdir()
    for name in ("config.json", "model.safetensors"):
        (weights_only / name).symlink_to(model_dir / name)
    no_tokenizer = runner.invoke(app, [str(weights_only)])
    assert no_tokenizer.exit_code == 2 and "--tokenizer" in no_tokenizer.output


def test_serve_command_serves_until_interrupted(model_dir: Path) -> None:
    """The command in this process (a subprocess would pay the imports again): it serves the
    folder with the tokenizer saved there until SIGINT, then exits 0."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}/v1"
    seen: dict[str, Any] = {}

    def client() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(url.removesuffix("/v1") + "/health", timeout=2).close()
                break
            except OSError:
                time.sleep(0.1)
        else:
            return  # never came up: the command failed, and its result says why
        try:
            seen["response"] = openai.OpenAI(base_url=url, api_key="EMPTY", max_retries=0, timeout=60).chat.completions.create(
                model=NAME, messages=[{"role": "user", "content": "hi"}], max_tokens=2, temperature=0
            )
        finally:
            os.kill(os.getpid(), signal.SIGINT)  # what Ctrl-C sends

    app = typer.Typer(add_completion=False)
    register(app)
    thread = threading.Thread(target=client, daemon=True)
    thread.start()
    result = CliRunner().invoke(app, [str(model_dir), "--port", str(port), "--model-name", NAME, "--max-context", "256"])
    thread.join(timeout=10)
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[0] == url
    assert seen["response"].usage.completion_tokens == 2
