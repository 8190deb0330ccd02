"""The real Codex CLI as the agent: the pinned binary (fetched by set-up, cached), the
gateway between Codex and a scripted Responses server, the internal network with its
relay, and whole episodes in mini-task containers, verified in fresh ones."""

from __future__ import annotations

import base64
import hashlib
import http.client
import io
import ipaddress
import json
import os
import socket
import subprocess
import tarfile
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import docker
import pytest

from envs.docker_backend import Container
from envs.images import task_image
from envs.tasks import Task, load_tasks
from envs.verify import verify
from harness.budget import Budget
from harness.codex_cli import install as codex_install
from harness.codex_cli.backend import run_codex_episode
from harness.codex_cli.config import CodexCliConfig, probe
from harness.codex_cli.config import scaffold as scaffold_of
from harness.codex_cli.gateway import Gateway
from harness.codex_cli.network import RELAY_PORT, open_route
from harness.codex_cli.responses_api import requests
from harness.collect import collect
from harness.exporters.atif import to_atif
from harness.exporters.hf_chat import to_chat_record
from harness.importers import atif as atif_importer
from harness.importers import codex as codex_importer
from harness.policies.base import PolicySpec
from harness.policies.make import make_policy
from harness.scripted.servers import ModelServer, ScriptedTurn
from harness.scripted.solutions import solving_script, to_apply_patch
from records.pools import JsonlWriter, read_trajectories
from records.trajectory import ExitStatus, Source, Trajectory, tool_call_pairs
from relearn.ops.collect import resolve_agent
from relearn.ops.reporting import OpError
from relearn.ops.validate import check_trajectory
from relearn.verbs.collect import AgentOptions

MINI_SUITE = Path(__file__).resolve().parent.parent / "envs" / "mini_tasks"
TASKS = {t.instance_id: t for t in load_tasks(MINI_SUITE)[0]}
TASK = TASKS["mini__calc-1"]
SECRET = "sk-relearn-test-upstream-secret"
OUTPUT_ITEMS = ("function_call_output", "custom_tool_call_output")


@pytest.fixture(scope="session")
def codex() -> codex_install.CodexInstall:
    # Set-up fetched it (make); on a fresh machine this fetches from the npm registry once.
    return codex_install.install(log=print)


@pytest.fixture(scope="session")
def calc_image(docker_client: docker.DockerClient, base_image: str) -> str:
    return task_image(docker_client, TASK, base_image)


@pytest.fixture
def codex_config(codex: codex_install.CodexInstall, base_image: str) -> CodexCliConfig:
    return CodexCliConfig(install=codex, relay_image=base_image)


# ---- scripted policies speaking Codex's tools ------------------------------------------------


def task_of(request: dict[str, Any]) -> Task:
    """Which task a Responses request is about: a user message quotes its problem statement."""
    texts = [part.get("text", "") for item in request["input"] if item.get("role") == "user" for part in item.get("content", [])]
    return next(t for t in TASKS.values() if any(t.problem_statement.strip() in text for text in texts))


def answered(request: dict[str, Any]) -> int:
    return sum(1 for item in request["input"] if item.get("type") in OUTPUT_ITEMS)


def codex_solver(request: dict[str, Any]) -> ScriptedTurn:
    """Read, patch (freeform apply_patch), test, answer: stateless, as Codex re-sends the history."""
    task = task_of(request)
    tests = "python3 -m pytest -q -p no:cacheprovider " + " ".join(task.test_files)
    script = [
        ScriptedTurn(
            reasoning="Look at the code first.",
            content="Reading the repository.",
            tool_calls=[("exec_command", {"cmd": "ls -R . | head -40; env"})],
            token_ids=[11, 12, 13],
            prompt_token_ids=[1, 2, 3, 4],
        ),
        ScriptedTurn(
            reasoning="The power rule is wrong.",
            custom_tool_calls=[("apply_patch", to_apply_patch(task.patch))],
            input_tokens=200,
            output_tokens=40,
            token_ids=[21, 22],
        ),
        ScriptedTurn(tool_calls=[("exec_command", {"cmd": tests})], input_tokens=300, output_tokens=30),
        ScriptedTurn(content="The fix is in place and the tests pass.", input_tokens=400, output_tokens=10),
    ]
    return script[min(answered(request), len(script) - 1)]


def flailer(command: str) -> Callable[[dict[str, Any]], ScriptedTurn]:
    def answer(_request: dict[str, Any]) -> ScriptedTurn:
        return ScriptedTurn(
            content="Let me look around more.", tool_calls=[("exec_command", {"cmd": command})], input_tokens=1000, output_tokens=100
        )

    return answer


def header(task: Task, model: str = "scripted") -> Trajectory:
    return Trajectory(
        id=f"{task.instance_id}:codex-cli:{model}:-:0", task_id=task.instance_id, attempt=0, messages=[], source=Source(format="codex")
    )


# ---- install ---------------------------------------------------------------------------------


def test_the_pinned_binary_is_verified_cached_and_runs(codex: codex_install.CodexInstall, tmp_path: Path) -> None:
    assert codex.version == codex_install.CODEX_VERSION and codex.pinned
    assert codex.integrity == codex_install.INTEGRITY[codex_install.CODEX_VERSION]
    said = subprocess.run([str(codex.binary), "--version"], capture_output=True, text=True, timeout=60)
    assert said.stdout.strip() == f"codex-cli {codex_install.CODEX_VERSION}"
    started = time.monotonic()
    again = codex_install.installed()  # what runs use: never a download
    assert again == codex and time.monotonic() - started < 10
    assert codex.catalog_template()["slug"] == codex_install.CATALOG_TEMPLATE
    # A cached file that no longer matches its recorded sha256 is refused, naming it.
    fake = tmp_path / "9.9.9"
    fake.mkdir()
    (fake / "codex").write_bytes(b"#!/bin/sh\necho tampered\n")
    record = {"layout": codex_install.LAYOUT, "version": "9.9.9", "integrity": "sha512-x", "pinned": True, "sha256": {"codex": "0" * 64}}
    (fake / "install.json").write_text(json.dumps(record))
    with pytest.raises(codex_install.InstallError, match=r"9\.9\.9/codex: sha256 .* differs from 0{64} recorded at install"):
        codex_install.load(fake)
    with pytest.raises(codex_install.InstallError, match="not installed .* run `python -m harness.codex_cli.install`"):
        codex_install.installed("9.9.8", cache=tmp_path)


FAKE_CODEX = """#!/bin/sh
case "$1" in
  --version) echo "codex-cli 9.9.9" ;;
  debug) echo '{"models": [{"slug": "gpt-5.5", "display_name": "t"}]}' ;;
esac
"""


def _package(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(f"package/vendor/{codex_install.TARGET}/{name}")
            info.size, info.mode = len(data), 0o755
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


class _Registry:
    """A registry on loopback serving one package description and its tarball."""

    def __init__(self, tarball: bytes) -> None:
        integrity = "sha512-" + base64.b64encode(hashlib.sha512(tarball).digest()).decode()
        self.integrity = integrity
        self.hits: list[str] = []
        registry = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                registry.hits.append(self.path)
                host = f"http://127.0.0.1:{self.server.server_address[1]}"
                if self.path == "/@openai%2Fcodex/9.9.9-linux-x64" or self.path == "/@openai/codex/9.9.9-linux-x64":
                    body = json.dumps(
                        {
                            "name": "@openai/codex",
                            "version": "9.9.9-linux-x64",
                            "dist": {"tarball": f"{host}/codex.tgz", "integrity": integrity},
                        }
                    ).encode()
                elif self.path == "/codex.tgz":
                    body = tarball
                else:
                    self.send_response(404)
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_install_fetches_verifies_against_the_pin_and_never_refetches(tmp_path: Path) -> None:
    registry = _Registry(_package({"bin/codex": FAKE_CODEX.encode(), "codex-path/rg": b"rg"}))
    try:
        cache = tmp_path / "cache"
        with pytest.raises(codex_install.InstallError, match="integrity sha512-.* differs from the pinned sha512-bogus"):
            codex_install.install("9.9.9", integrity="sha512-bogus", registry=registry.url, cache=cache, use_npm=False)
        assert not (cache / "9.9.9").exists()  # nothing of a refused package is kept
        done = codex_install.install("9.9.9", integrity=registry.integrity, registry=registry.url, cache=cache, use_npm=False)
        assert done.pinned and done.binary.read_text() == FAKE_CODEX and done.rg.read_bytes() == b"rg"
        assert done.bundled_models()[0]["slug"] == "gpt-5.5"
    finally:
        registry.close()
    hits = len(registry.hits)
    assert codex_install.install("9.9.9", integrity=registry.integrity, cache=cache) == done  # the registry is gone: cached
    assert len(registry.hits) == hits
    registry = _Registry(_package({"bin/codex": FAKE_CODEX.encode()}))  # no ripgrep in this one
    try:
        with pytest.raises(codex_install.InstallError, match="the package has no package/vendor/.*/codex-path/rg"):
            codex_install.install("9.9.9", integrity=registry.integrity, registry=registry.url, cache=tmp_path / "other", use_npm=False)
    finally:
        registry.close()


# ---- the gateway, without containers ---------------------------------------------------------


def _post(gateway: Gateway, body: dict[str, Any], token: str | None = None) -> tuple[int, str]:
    host, port = gateway.base_url.removeprefix("http://").split("/")[0].split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    connection.request(
        "POST", "/v1/responses", json.dumps(body), {"Authorization": f"Bearer {token or gateway.token}", "Content-Type": "application/json"}
    )
    response = connection.getresponse()
    text = response.read().decode()
    connection.close()
    return response.status, text


def _events(text: str) -> list[dict[str, Any]]:
    return [json.loads(line[len("data: ") :]) for line in text.splitlines() if line.startswith("data: ")]


def _request(turn: int) -> dict[str, Any]:
    """What Codex sends on call ``turn``: the whole history so far, streamed."""
    items = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "go"}]}]
    for n in range(turn):
        items += [
            {"type": "function_call", "call_id": f"c{n}", "name": "exec_command", "arguments": "{}"},
            {"type": "function_call_output", "call_id": f"c{n}", "output": "ok"},
        ]
    return {
        "model": "scripted",
        "stream": True,
        "store": False,
        "input": items,
        "tools": [{"type": "function", "name": "exec_command", "parameters": {}}],
    }


def test_gateway_forwards_with_the_real_key_and_streams_events(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RELEARN_TEST_KEY", SECRET)
    script = [
        ScriptedTurn(reasoning="thinking", content="hi", tool_calls=[("exec_command", {"cmd": "ls"})], token_ids=[5, 6, 7]),
        ScriptedTurn(content="done"),
    ]
    with ModelServer("responses", script) as server:
        spec = PolicySpec(
            kind="responses",
            model="scripted",
            base_url=server.base_url,
            api_key_env="RELEARN_TEST_KEY",
            sampling={"temperature": 0.3, "max_tokens": 512, "top_k": 20},
        )
        with Gateway(spec, Budget(max_turns=5), record_path=tmp_path / "gateway.jsonl", request_token_ids=True) as gateway:
            status, _ = _post(gateway, _request(0), token="wrong")
            assert status == 401 and server.requests == []  # an unknown key never reaches the policy server
            status, text = _post(gateway, _request(0))
            assert status == 200
            stream = _events(text)
            assert [e["type"] for e in stream] == [
                "response.created",
                *["response.output_item.added", "response.output_item.done"] * 3,
                "response.completed",
            ]
            assert [e["sequence_number"] for e in stream] == list(range(len(stream)))
            completed = stream[-1]["response"]
            assert completed["id"] == "resp_0" and completed["usage"]["input_tokens"] == 100
            assert [e["item"]["type"] for e in stream if e["type"] == "response.output_item.done"] == [
                "reasoning",
                "message",
                "function_call",
            ]
            assert _post(gateway, _request(1))[0] == 200
            upstream = server.requests[0]
            assert (
                upstream["stream"] is False
                and upstream["temperature"] == 0.3
                and upstream["max_output_tokens"] == 512
                and upstream["top_k"] == 20
            )
            assert upstream["enable_response_messages"] is True and upstream["input"] == _request(0)["input"]
            assert server.headers[0]["authorization"] == f"Bearer {SECRET}" and SECRET not in gateway.token
            assert gateway.token_ids == {"resp_0": [5, 6, 7]}
            assert gateway.tools == _request(0)["tools"]
    records = list(requests(tmp_path / "gateway.jsonl"))
    assert [r["status"] for r in records] == [401, 200, 200]
    # Stored as a delta (the second request re-sends the first's input), rebuilt whole.
    raw = [json.loads(line) for line in (tmp_path / "gateway.jsonl").read_text().splitlines()]
    assert raw[2]["request"]["input_continues"] == 1 and raw[2]["request"]["tools_unchanged"] is True
    assert records[1]["request"] == _request(0) and records[2]["request"] == _request(1)
    assert records[1]["token_ids"] == [5, 6, 7] and records[1]["upstream"]["overrides"]["stream"] is False
    assert records[1]["usage"]["input_tokens"] == 100 and records[1]["gateway_ms"] >= 0


@pytest.mark.parametrize(
    ("budget", "prices", "expected", "forwarded"),
    [
        (Budget(max_turns=3), {}, ExitStatus.turns_exhausted, 3),
        (Budget(max_turns=100, max_tokens=3000), {}, ExitStatus.tokens_exhausted, 3),  # 1,100 a call
        (
            Budget(max_turns=100, max_cost_usd=0.01),
            {"price_in_per_mtok": 3.0, "price_out_per_mtok": 15.0},
            ExitStatus.cost_exhausted,
            3,
        ),  # $0.0045 a call
        (Budget(max_turns=100, max_seconds=0.45), {}, ExitStatus.time_exhausted, 2),  # 0.3 s between calls
    ],
)
def test_gateway_refuses_calls_past_each_budget(budget: Budget, prices: dict[str, float], expected: ExitStatus, forwarded: int) -> None:
    with ModelServer("responses", flailer("ls")) as server:
        spec = PolicySpec(kind="responses", model="scripted", base_url=server.base_url, **prices)
        with Gateway(spec, budget) as gateway:
            gateway.begin()
            statuses = []
            for turn in range(6):
                status, text = _post(gateway, _request(turn))
                statuses.append(status)
                if status != 200:
                    break
                time.sleep(0.3 if budget.max_seconds else 0)
    assert statuses == [200] * forwarded + [400]
    assert len(server.requests) == forwarded  # the refused call never reached the policy server
    error = json.loads(text)["error"]
    assert error["type"] == "budget_exhausted" and error["code"] == expected.value
    field = {
        "turns_exhausted": "max_turns",
        "tokens_exhausted": "max_tokens",
        "cost_exhausted": "max_cost_usd",
        "time_exhausted": "max_seconds",
    }[expected.value]
    assert field in error["message"] and "no further model calls" in error["message"]
    assert gateway.refused is expected and gateway.summary()["forwarded"] == forwarded


def test_gateway_retries_the_policy_server_then_passes_its_error_on() -> None:
    flaky = [ScriptedTurn(error=500), ScriptedTurn(error=429), ScriptedTurn(content="ok")]
    with ModelServer("responses", flaky) as server:
        spec = PolicySpec(kind="responses", model="scripted", base_url=server.base_url, backoff_base_s=0.01)
        with Gateway(spec, Budget(max_turns=5)) as gateway:
            assert _post(gateway, _request(0))[0] == 200 and len(server.requests) == 3
            assert gateway.ledger.turns == 1 and gateway.upstream_error is None
    overflow = [
        ScriptedTurn(
            error=400,
            error_body={"error": {"message": "Your input exceeds the context window of this model.", "code": "context_length_exceeded"}},
        )
    ]
    with ModelServer("responses", overflow) as server:
        spec = PolicySpec(kind="responses", model="scripted", base_url=server.base_url)
        with Gateway(spec, Budget(max_turns=5)) as gateway:
            status, text = _post(gateway, _request(0))
    assert status == 400 and "context window" in text and len(server.requests) == 1
    assert gateway.upstream_error["exit_status"] == "context_overflow"
    with pytest.raises(ValueError, match="kind 'responses', not 'chat'"):
        Gateway(PolicySpec(kind="chat", model="m", base_url="http://x"), Budget())


def test_an_answer_cut_at_max_output_tokens_ends_the_episode_as_the_policys() -> None:
    from harness.codex_cli.backend import _exit_status

    with ModelServer("responses", [ScriptedTurn(content="half an ans", finish_reason="length")]) as server:
        spec = PolicySpec(kind="responses", model="scripted", base_url=server.base_url)
        with Gateway(spec, Budget(max_turns=5)) as gateway:
            assert _post(gateway, _request(0))[0] == 200
    assert gateway.cut_off == "max_output_tokens"
    # Codex then exits 1 ("Incomplete response returned"): the policy's end, not the environment's.
    assert _exit_status(gateway, False, 1, None, "codex wrote no rollout file") is ExitStatus.policy_error
    gateway.cut_off = None
    assert _exit_status(gateway, False, 1, None, "codex wrote no rollout file") is ExitStatus.env_error


def test_new_rollout_records_give_each_call_its_usage_and_exit_codes(tmp_path: Path) -> None:
    """Codex 0.171 writes a token_usage_record right after each call and its token_count
    only after the tool output; a CommandExecution item_completed carries the exit code."""
    ts = "2026-11-30T15:28:14.000Z"

    def line(kind: str, payload: dict[str, Any]) -> str:
        return json.dumps({"timestamp": ts, "type": kind, "payload": payload})

    usage = {"input_tokens": 100, "cached_input_tokens": 40, "output_tokens": 20, "reasoning_output_tokens": 5, "total_tokens": 120}
    lines = [
        line("session_meta", {"id": "s1", "cli_version": "0.171.0", "base_instructions": {"text": "sys"}}),
        line("response_item", {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "fix"}]}),
        line("world_state", {"full": True, "state": {}}),
        line("event_msg", {"type": "thread_settings_applied", "thread_settings": {"model": "m"}}),
        line("response_item", {"type": "reasoning", "id": "rs_0", "summary": [{"type": "summary_text", "text": "plan"}], "content": None}),
        line("response_item", {"type": "function_call", "name": "exec_command", "arguments": '{"cmd": "ls"}', "call_id": "c0"}),
        line("token_usage_record", {"response_id": "resp_0", "usage": usage}),
        line(
            "event_msg",
            {
                "type": "item_completed",
                "item": {
                    "type": "CommandExecution",
                    "id": "c0",
                    "exit_code": 2,
                    "status": "failed",
                    "duration": {"secs": 1, "nanos": 500000000},
                },
            },
        ),
        line("response_item", {"type": "function_call_output", "call_id": "c0", "output": "Process exited with code 2"}),
        line(
            "event_msg", {"type": "token_count", "info": {"last_token_usage": {**usage, "input_tokens": 999}, "total_token_usage": usage}}
        ),
        line("response_item", {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "done"}]}),
        line("token_usage_record", {"response_id": "resp_1", "usage": {**usage, "input_tokens": 200}}),
        line("event_msg", {"type": "task_complete", "last_agent_message": "done"}),
    ]
    path = tmp_path / "rollout.jsonl"
    path.write_text("\n".join(lines) + "\n")
    (result,) = list(codex_importer.read(path))
    t = result.trajectory
    assert [m.role for m in t.messages] == ["system", "user", "assistant", "tool", "assistant"]
    call, output, final = t.messages[2], t.messages[3], t.messages[4]
    assert call.reasoning_content == "plan" and call.usage.input_tokens == 100 and call.extra["response_id"] == "resp_0"
    assert output.metadata == {"exit_code": 2, "status": "failed", "duration_seconds": 1.5}
    assert final.usage.input_tokens == 200 and final.extra["response_id"] == "resp_1"
    kept = sorted({r["record"]["type"] + "/" + str(r["record"]["payload"].get("type", "")) for r in t.source.records})
    assert kept == [
        "event_msg/item_completed",
        "event_msg/task_complete",
        "event_msg/thread_settings_applied",
        "event_msg/token_count",
        "session_meta/",
        "token_usage_record/",
        "world_state/",
    ]
    assert t.exit_status is ExitStatus.submitted and not result.diagnostics.warnings


# ---- the route out of a container ------------------------------------------------------------

PROBE = r"""
import json, socket, sys, threading
results = {}
def connect(host, port):
    s = socket.socket(); s.settimeout(8)
    try:
        s.connect((host, port)); results[f"{host}:{port}"] = "connected"
        if port == %(relay_port)d:
            s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
            results["relay_answer"] = s.recv(200).decode(errors="replace").split("\r\n")[0]
    except OSError as exc:
        results[f"{host}:{port}"] = type(exc).__name__ + ": " + str(exc)
    finally:
        s.close()
targets = json.loads(sys.argv[1])
threads = [threading.Thread(target=connect, args=(h, p)) for h, p in targets]
[t.start() for t in threads]; [t.join() for t in threads]
print(json.dumps(results))
"""


def _host_addresses(docker_client: docker.DockerClient, internal_gateway: str) -> list[str]:
    """The host's addresses a container might try: its own route's source address,
    docker0's gateway, and the address Docker would have given the internal bridge."""
    probe_socket = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    probe_socket.connect(("192.0.2.123", 9))  # no packet is sent: this only picks the route
    primary = probe_socket.getsockname()[0]
    probe_socket.close()
    bridge = _gateway_of(docker_client.networks.get("bridge"))
    return sorted({primary, bridge, internal_gateway})


def _gateway_of(network: docker.models.networks.Network) -> str:
    """The host's address on a Docker network. Docker 20.10 leaves ``Gateway`` out of the
    default bridge's IPAM config; the bridge then holds the subnet's first address."""
    config = network.attrs["IPAM"]["Config"][0]
    return config.get("Gateway") or str(next(ipaddress.ip_network(config["Subnet"]).hosts()))


def test_the_container_reaches_the_gateway_and_nothing_else(docker_client, base_image: str, calc_image: str, tmp_path: Path) -> None:  # noqa: ANN001
    # A service listening on every host address: a container that can reach the host at
    # all would connect to it.
    listener = socket.create_server(("0.0.0.0", 0))
    port = listener.getsockname()[1]
    spec = PolicySpec(kind="responses", model="scripted", base_url="http://127.0.0.1:9/v1")
    folder = tmp_path / "gw"
    folder.mkdir()
    try:
        with (
            Gateway(spec, Budget(), socket_path=folder / "gateway.sock") as gateway,
            open_route(docker_client, base_image, folder / "gateway.sock") as route,
        ):
            internal_gateway = _gateway_of(route.network)
            assert route.network.attrs["Internal"] is True
            targets = [(route.address, RELAY_PORT), ("1.1.1.1", 443), ("8.8.8.8", 53)] + [
                (address, port) for address in _host_addresses(docker_client, internal_gateway)
            ]
            with Container.start(docker_client, calc_image, workdir=TASK.workdir, network=route.network_name) as container:
                result = container.exec(["python3", "-c", PROBE % {"relay_port": RELAY_PORT}, json.dumps(targets)], timeout_s=60)
            assert gateway.calls and gateway.calls[0]["status"] == 404  # the probe's GET came through the relay
        results = json.loads(result.stdout)
        assert results.pop(f"{route.address}:{RELAY_PORT}") == "connected"
        assert results.pop("relay_answer") == "HTTP/1.1 404 Not Found"
        assert len(results) == len(targets) - 1
        for target, outcome in results.items():
            assert outcome.startswith(("OSError: [Errno 113]", "TimeoutError", "OSError: [Errno 101]")), f"{target}: {outcome}"
        # The network and the relay are gone with the route.
        assert not docker_client.networks.list(names=[route.network_name])
    finally:
        listener.close()


# ---- whole episodes with the real binary -----------------------------------------------------


def test_codex_solves_a_mini_task(
    docker_client, calc_image: str, codex_config: CodexCliConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # noqa: ANN001
    monkeypatch.setenv("RELEARN_TEST_KEY", SECRET)
    config = CodexCliConfig(install=codex_config.install, relay_image=codex_config.relay_image, request_token_ids=True)
    with ModelServer("responses", codex_solver) as server:
        spec = PolicySpec(
            kind="responses",
            model="scripted",
            base_url=server.base_url,
            api_key_env="RELEARN_TEST_KEY",
            price_in_per_mtok=1.0,
            price_out_per_mtok=2.0,
        )
        trajectory = run_codex_episode(
            docker_client, TASK, calc_image, spec, Budget(max_turns=10), config, header(TASK), artifacts=tmp_path / "codex"
        )
        sent, headers = server.requests, server.headers
    assert trajectory.exit_status is ExitStatus.submitted, trajectory.source.meta
    roles = [m.role for m in trajectory.messages]
    assert roles == ["system", "developer", "user", "user", "assistant", "tool", "assistant", "tool", "assistant", "tool", "assistant"]
    assert trajectory.messages[0].content.startswith("You are Codex") and TASK.problem_statement.strip() in trajectory.messages[3].content
    # exec_command and the freeform apply_patch, each paired with its output.
    calls, results = tool_call_pairs(trajectory.messages)
    assert set(calls) == set(results) and len(calls) == 3
    listing, patching, testing = (trajectory.messages[i].tool_calls[0] for i in (4, 6, 8))
    assert listing.function.name == "exec_command" and listing.function.arguments == {"cmd": "ls -R . | head -40; env"}
    assert (
        patching.type == "custom"
        and patching.function.name == "apply_patch"
        and patching.function.arguments["input"].startswith("*** Begin Patch")
    )
    assert trajectory.messages[7].content.endswith("Success. Updated the following files:\nM calc/evaluator.py\n")
    assert "Process exited with code 0" in trajectory.messages[9].content and "passed" in trajectory.messages[9].content
    assert trajectory.messages[9].metadata["exit_code"] == 0
    # Reasoning summaries, usage per call, token ids and cost from the gateway.
    assert (
        trajectory.messages[4].reasoning_content == "Look at the code first."
        and trajectory.messages[6].reasoning_content == "The power rule is wrong."
    )
    assert [m.usage.input_tokens for m in trajectory.messages if m.role == "assistant"] == [100, 200, 300, 400]
    assert (
        trajectory.messages[4].token_ids == [11, 12, 13]
        and trajectory.messages[4].extra["prompt_token_ids"] == [1, 2, 3, 4]
        and "prompt_token_ids" not in (trajectory.messages[6].extra or {})
        and trajectory.messages[6].token_ids == [21, 22]
        and trajectory.messages[8].token_ids is None
    )
    assert trajectory.usage.api_calls == 4 and trajectory.usage.input_tokens == 1000
    assert trajectory.usage.cost_usd == pytest.approx((1000 * 1.0 + 100 * 2.0) / 1e6)
    # Unknown record kinds of this Codex version are kept under source.
    kept = [r["record"] for r in trajectory.source.records if "record" in r]
    kinds = {r["type"] + ("/" + r["payload"]["type"] if r["type"] == "event_msg" else "") for r in kept}
    assert {
        "world_state",
        "token_usage_record",
        "event_msg/item_completed",
        "event_msg/thread_settings_applied",
        "turn_context",
        "session_meta",
    } <= kinds
    # This version numbers its lines (``ordinal``): every number is kept, on lines kept whole or
    # beside the messages the other lines became.
    fields = [r["line_fields"] for r in trajectory.source.records if "line_fields" in r]
    ordinals = sorted([r["ordinal"] for r in kept if "ordinal" in r] + [f["ordinal"] for f in fields if "ordinal" in f])
    assert ordinals and ordinals == sorted(set(ordinals)) and len(ordinals) == max(ordinals) - min(ordinals) + 1
    assert trajectory.source.format == "codex" and trajectory.source.format_version == codex_config.install.version
    # The intended tool set, exactly as the probe (what a run's manifest records) says.
    offered = [t.get("function", t.get("custom", {})).get("name") for t in trajectory.tools]
    assert offered == ["exec_command", "write_stdin", "update_plan", "apply_patch"]
    assert trajectory.tools[3]["type"] == "custom" and trajectory.tools[3]["custom"]["format"]["syntax"] == "lark"
    assert probe(codex_config, "scripted")["tools"] == sent[0]["tools"]
    # The key: the policy server got the real one; the container only ever saw a dummy.
    assert all(h["authorization"] == f"Bearer {SECRET}" for h in headers)
    assert "RELEARN_GATEWAY_KEY=relearn-" in trajectory.messages[5].content and SECRET not in trajectory.messages[5].content
    artifacts = tmp_path / "codex"
    assert all(SECRET not in (artifacts / name).read_text() for name in ("rollout.jsonl", "exec.jsonl", "gateway.jsonl"))
    assert [r["status"] for r in requests(artifacts / "gateway.jsonl")] == [200] * 4
    # Final patch and verdict as for our own loop: graded in a fresh container.
    assert "calc/evaluator.py" in trajectory.final_patch
    assert verify(docker_client, TASK, trajectory.final_patch, calc_image).resolved
    timings = trajectory.source.meta["timings"]
    assert (
        set(timings) == {"route", "container", "copy", "codex", "startup", "exit", "rollout", "teardown"}
        and 0 < timings["startup"] < timings["codex"]
    )

    # One format: the pool round-trips byte for byte, and exports keep what they define.
    pool = tmp_path / "pool.jsonl"
    with JsonlWriter(pool) as writer:
        writer.write(trajectory)
    (again,) = list(read_trajectories(pool))
    assert again.to_dict() == trajectory.to_dict()
    document = to_atif(again)
    (atif_path := tmp_path / "trajectory.json").write_text(json.dumps(document))
    (back,) = list(atif_importer.read(atif_path))
    assert back.error is None
    generated = [m for m in trajectory.messages if m.role == "assistant"]
    returned = [m for m in back.trajectory.messages if m.role == "assistant"]
    assert [
        (m.content or "", m.reasoning_content, [(c.id, c.function.name, c.function.arguments) for c in m.tool_calls or []])
        for m in returned
    ] == [
        (m.content or "", m.reasoning_content, [(c.id, c.function.name, c.function.arguments) for c in m.tool_calls or []])
        for m in generated
    ]
    assert [(m.usage.input_tokens, m.usage.output_tokens, m.usage.cached_input_tokens, m.token_ids) for m in returned] == [
        (m.usage.input_tokens, m.usage.output_tokens, m.usage.cached_input_tokens, m.token_ids) for m in generated
    ]
    assert [(m.tool_call_id, m.content) for m in back.trajectory.messages if m.role == "tool"] == [
        (m.tool_call_id, m.content) for m in trajectory.messages if m.role == "tool"
    ]
    record = to_chat_record(again)
    assert record["tools"] == trajectory.tools and sum(len(m.get("tool_calls") or []) for m in record["messages"]) == 3


@pytest.mark.parametrize(
    ("budget", "prices", "command", "expected"),
    [
        (Budget(max_turns=3), {}, "ls", ExitStatus.turns_exhausted),
        (Budget(max_turns=100, max_tokens=3000), {}, "ls", ExitStatus.tokens_exhausted),
        (Budget(max_turns=100, max_cost_usd=0.01), {"price_in_per_mtok": 3.0, "price_out_per_mtok": 15.0}, "ls", ExitStatus.cost_exhausted),
        (Budget(max_turns=100, max_seconds=4.0), {}, "sleep 1.5", ExitStatus.time_exhausted),
    ],
)
def test_codex_is_cut_off_by_each_budget(
    docker_client,
    calc_image: str,
    codex_config: CodexCliConfig,
    budget: Budget,
    prices: dict[str, float],
    command: str,
    expected: ExitStatus,
) -> None:  # noqa: ANN001
    with ModelServer("responses", flailer(command)) as server:
        spec = PolicySpec(kind="responses", model="scripted", base_url=server.base_url, **prices)
        started = time.monotonic()
        trajectory = run_codex_episode(docker_client, TASK, calc_image, spec, budget, codex_config, header(TASK))
        took = time.monotonic() - started
        forwarded = len(server.requests)
    meta = trajectory.source.meta
    assert trajectory.exit_status is expected, meta
    gateway = meta["gateway"]
    if expected is not ExitStatus.time_exhausted:
        assert forwarded == 3 and gateway["refused"] == expected.value and gateway["calls"] == 4  # the 4th was refused
        assert meta["codex"]["exit_code"] != 0 and not meta["codex"]["timed_out"]
    else:
        assert 2 <= forwarded <= 4 and meta["ledger"]["seconds"] >= 4.0 and took < 30
    # Every call that was answered is in the trajectory, paired with its command's output.
    assert sum(1 for m in trajectory.messages if m.role == "assistant") == forwarded
    calls, results = tool_call_pairs(trajectory.messages)
    assert set(results) <= set(calls) and len(calls) - len(results) <= 1
    assert trajectory.final_patch == ""


def test_collect_and_eval_with_either_agent_into_one_format(
    docker_client, base_image: str, relearn_bin: str, calc_image: str, codex: codex_install.CodexInstall, tmp_path: Path
) -> None:  # noqa: ANN001
    """Our loop and `relearn collect --agent codex-cli` fill one pool in one format;
    `relearn eval run --agent codex-cli` records the Codex version and the tool schemas
    offered. (Each `relearn` start costs seconds of imports, so the builtin side runs
    in-process.)"""
    env = {**os.environ, "OPENAI_API_KEY": "local"}
    out = tmp_path / "pool"
    with ModelServer("chat", solving_script(TASK)) as chat:
        spec = PolicySpec(kind="chat", model="scripted", base_url=chat.base_url)
        collect(docker_client, [TASK], make_policy(spec), spec, out, base_image=base_image)
    with ModelServer("responses", codex_solver) as responses:
        command = [
            relearn_bin,
            "collect",
            "--out",
            str(out),
            "--model",
            "scripted",
            "--id",
            TASK.instance_id,
            "--max-turns",
            "8",
            "--agent",
            "codex-cli",
            "--base-url",
            responses.base_url,
        ]
        collected = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
        assert collected.returncode == 0, collected.stderr[-3000:]
        run = tmp_path / "eval"
        command = [
            relearn_bin,
            "eval",
            "run",
            "--out",
            str(run),
            "--model",
            "scripted",
            "--agent",
            "codex-cli",
            "--reasoning-effort",
            "high",
            "--id",
            TASK.instance_id,
            "--base-url",
            responses.base_url,
        ]
        evaluated = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
        assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    pool = list(read_trajectories(out / "trajectories.jsonl"))
    assert [t.id for t in pool] == [f"{TASK.instance_id}:scripted:-:0", f"{TASK.instance_id}:codex-cli:scripted:-:0"]
    assert [t.source.format for t in pool] == ["relearn", "codex"] and all(t.outcome.resolved for t in pool)
    assert all(t.exit_status is ExitStatus.submitted for t in pool)
    assert [check_trajectory(t) for t in pool] == [[], []]  # what `relearn validate` checks
    assert all(to_chat_record(t)["messages"][-1]["role"] == "assistant" for t in pool)
    assert (out / "episodes" / f"{pool[1].id}.codex" / "rollout.jsonl").is_file()
    assert (out / "episodes" / f"{pool[1].id}.codex" / "gateway.jsonl").is_file()
    manifest = json.loads((run / "manifest.json").read_text())
    scaffold = manifest["scaffold"]
    assert (
        scaffold["agent"] == "codex-cli" and scaffold["version"] == f"codex-cli {codex.version}" and scaffold["reasoning_effort"] == "high"
    )
    assert scaffold["tools"] == ["exec_command", "write_stdin", "update_plan", "apply_patch"]
    assert [t["name"] for t in manifest["codex"]["tool_schemas"]] == scaffold["tools"]
    assert 'model_reasoning_effort = "high"' in manifest["codex"]["config_toml"]
    # A rerun probes again and must agree, or the run could never be resumed.
    again = CodexCliConfig(install=codex, reasoning_effort="high")
    assert scaffold_of(again, "scripted", probe(again, "scripted")) == scaffold
    (evaluated_trajectory,) = list(read_trajectories(run / "trajectories.jsonl"))
    assert evaluated_trajectory.source.meta["tools_digest"] == scaffold["tools_digest"] and evaluated_trajectory.outcome.resolved
    assert json.loads((run / "report.json").read_text())["resolved"] == 1
    # The agent options refuse what cannot work, before any container starts.
    with pytest.raises(OpError, match="codex-cli speaks the Responses API"):
        resolve_agent(AgentOptions("codex-cli", "chat"))
