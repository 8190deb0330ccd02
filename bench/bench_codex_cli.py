"""What running the real Codex CLI costs per episode, against our built-in loop, on the
same scripted episode (the mini calc task: read, patch, run the tests, answer; 4 model
calls, 3 tool calls) served over HTTP by a scripted model server.

    python bench/bench_codex_cli.py [--episodes 3] [--calls 50]

1. Per episode (medians): container start; for codex-cli also the internal network and
   relay, the binary and CODEX_HOME copy, Codex's start-up (exec start to its first
   model call) and exit, the rollout copy and import; the agent's own time between
   model calls and commands; teardown; the whole episode (verification excluded: it
   is the same for both).
2. Gateway latency per call: from inside a task container, a streamed POST
   /v1/responses through the relay and the gateway to the scripted server, against the
   same streamed request from the host straight to the server on loopback (which then
   sends the event stream itself).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from envs.docker_backend import Container, client_from_env
from envs.images import build_base, task_image
from envs.tasks import load_tasks
from harness.agent import AgentConfig, run_episode
from harness.budget import Budget
from harness.codex_cli.backend import run_codex_episode
from harness.codex_cli.config import CodexCliConfig
from harness.codex_cli.gateway import Gateway
from harness.codex_cli.install import install
from harness.codex_cli.network import RELAY_PORT, open_route
from harness.policies.base import PolicySpec
from harness.policies.make import make_policy
from harness.scripted.servers import ModelServer, ScriptedTurn
from harness.scripted.solutions import solving_script, to_apply_patch
from harness.tools.output import default_encoding
from records.trajectory import Source, Trajectory

MINI_SUITE = Path(__file__).resolve().parent.parent / "envs" / "mini_tasks"

# Runs inside the task container: n POSTs to the relay, one connection each (as Codex's
# first call after a pause would), printing the median round trip in ms.
CLIENT = r"""
import http.client, json, statistics, sys, time
host, port, token, n = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
body = json.dumps({"model": "scripted", "stream": True, "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}]})
times = []
for _ in range(n):
    started = time.perf_counter()
    connection = http.client.HTTPConnection(host, port, timeout=30)
    connection.request("POST", "/v1/responses", body, {"Authorization": "Bearer " + token, "Content-Type": "application/json"})
    response = connection.getresponse(); response.read(); connection.close()
    assert response.status == 200, response.status
    times.append((time.perf_counter() - started) * 1000)
print(json.dumps({"median_ms": statistics.median(times)}))
"""


def codex_script(task):  # noqa: ANN001, ANN201
    tests = "python3 -m pytest -q -p no:cacheprovider " + " ".join(task.test_files)

    def answer(request: dict) -> ScriptedTurn:
        done = sum(1 for item in request["input"] if item.get("type") in ("function_call_output", "custom_tool_call_output"))
        script = [
            ScriptedTurn(reasoning="Look at the code first.", tool_calls=[("exec_command", {"cmd": "ls -R . | head -50"})]),
            ScriptedTurn(content="Fixing it.", custom_tool_calls=[("apply_patch", to_apply_patch(task.patch))]),
            ScriptedTurn(tool_calls=[("exec_command", {"cmd": tests})]),
            ScriptedTurn(content="The fix is in place and the tests pass."),
        ]
        return script[min(done, len(script) - 1)]

    return answer


def builtin_episode(client, task, image: str) -> dict[str, float]:  # noqa: ANN001
    with ModelServer("chat", solving_script(task)) as server:
        spec = PolicySpec(kind="chat", model="scripted", base_url=server.base_url)
        header = Trajectory(id="bench", task_id=task.instance_id, messages=[], source=Source(format="relearn"))
        started = time.perf_counter()
        container = Container.start(client, image, workdir=task.workdir)
        up = time.perf_counter()
        trajectory = run_episode(task, make_policy(spec), container, AgentConfig(budget=Budget(max_turns=10)), header)
        ran = time.perf_counter()
        container.remove()
        done = time.perf_counter()
    assert trajectory.exit_status.value == "submitted", trajectory.exit_status
    model = sum((m.duration_ms or 0) for m in trajectory.messages if m.role == "assistant") / 1000
    tools = sum((m.duration_ms or 0) for m in trajectory.messages if m.role == "tool") / 1000
    return {
        "container": up - started,
        "episode": ran - up,
        "model": model,
        "tools": tools,
        "agent": ran - up - model - tools,
        "teardown": done - ran,
        "total": done - started,
    }


def codex_episode(client, task, image: str, config: CodexCliConfig) -> dict[str, float]:  # noqa: ANN001
    with ModelServer("responses", codex_script(task)) as server, tempfile.TemporaryDirectory() as tmp:
        spec = PolicySpec(kind="responses", model="scripted", base_url=server.base_url)
        header = Trajectory(id="bench", task_id=task.instance_id, messages=[], source=Source(format="codex"))
        started = time.perf_counter()
        trajectory = run_codex_episode(client, task, image, spec, Budget(max_turns=10), config, header, artifacts=Path(tmp))
        total = time.perf_counter() - started
        calls = [json.loads(line) for line in (Path(tmp) / "gateway.jsonl").read_text().splitlines()]
    assert trajectory.exit_status.value == "submitted", trajectory.source.meta
    t = trajectory.source.meta["timings"]
    model = sum(c["upstream_ms"] for c in calls) / 1000
    gateway = sum(c["gateway_ms"] for c in calls) / 1000
    tools = sum((m.metadata or {}).get("duration_seconds", 0.0) for m in trajectory.messages if m.role == "tool")
    between = t["codex"] - t["startup"] - t["exit"]
    return {
        "route": t["route"], "container": t["container"], "copy": t["copy"], "startup": t["startup"], "exit": t["exit"],
        "episode": between, "model": model, "gateway": gateway, "tools": tools, "agent": between - model - gateway - tools,
        "rollout": t["rollout"], "teardown": t["teardown"], "total": total,
        "gateway_ms_per_call": statistics.median(c["gateway_ms"] for c in calls),
    }  # fmt: skip


def gateway_latency(client, image: str, base: str, calls: int) -> tuple[float, float]:  # noqa: ANN001
    """(median ms per call from the container through relay and gateway, median ms from
    the host straight to the server)."""
    import http.client

    with ModelServer("responses", lambda _r: ScriptedTurn(content="ok")) as server, tempfile.TemporaryDirectory() as tmp:
        spec = PolicySpec(kind="responses", model="scripted", base_url=server.base_url)
        direct = []
        host, port = server.base_url.removeprefix("http://").split("/")[0].split(":")
        body = json.dumps({"model": "scripted", "stream": True, "input": []})
        for _ in range(calls):
            started = time.perf_counter()
            connection = http.client.HTTPConnection(host, int(port), timeout=30)
            connection.request("POST", "/v1/responses", body, {"Content-Type": "application/json"})
            connection.getresponse().read()
            connection.close()
            direct.append((time.perf_counter() - started) * 1000)
        folder = Path(tmp)
        with (
            Gateway(spec, Budget(max_turns=None), socket_path=folder / "gateway.sock") as gateway,
            open_route(client, base, folder / "gateway.sock") as route,
        ):
            with Container.start(client, image, network=route.network_name) as container:
                result = container.exec(["python3", "-c", CLIENT, route.address, str(RELAY_PORT), gateway.token, str(calls)], timeout_s=300)
    return json.loads(result.stdout)["median_ms"], statistics.median(direct)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=3)
    parser.add_argument("--calls", type=int, default=50)
    args = parser.parse_args()
    client = client_from_env()
    base = build_base(client, log=lambda _m: None)
    task = {t.instance_id: t for t in load_tasks(MINI_SUITE)[0]}["mini__calc-1"]
    image = task_image(client, task, base)
    codex = install(log=lambda m: print(m, file=sys.stderr))
    config = CodexCliConfig(install=codex, relay_image=base)
    default_encoding()  # the builtin loop's token counter loads once per process, not per episode
    builtin_episode(client, task, image)  # warm both paths once (page cache, image layers)
    codex_episode(client, task, image, config)
    builtin: list[dict[str, float]] = []
    codex_runs: list[dict[str, float]] = []
    for _ in range(args.episodes):
        builtin.append(builtin_episode(client, task, image))
        codex_runs.append(codex_episode(client, task, image, config))

    def median(runs: list[dict[str, Any]], key: str) -> str:
        return f"{statistics.median(r[key] for r in runs):7.2f} s" if key in runs[0] else "      -  "

    rows = [
        ("container start", "container"),
        ("internal network + relay", "route"),
        ("binary + CODEX_HOME copy (315 MB)", "copy"),
        ("agent start-up (to its first model call)", "startup"),
        ("model calls (scripted server, loopback)", "model"),
        ("gateway, in-process, all calls", "gateway"),
        ("commands in the container", "tools"),
        ("agent's own time between calls", "agent"),
        ("agent exit after its last call", "exit"),
        ("rollout copy + import", "rollout"),
        ("teardown", "teardown"),
        ("whole episode (verification excluded)", "total"),
    ]
    print(f"\n{task.instance_id}, same scripted episode (4 model calls, 3 tool calls); medians of {args.episodes} episodes each\n")
    print(f"{'':44s} {'builtin':>10s} {'codex-cli':>10s}")
    for label, key in rows:
        print(f"{label:44s} {median(builtin, key):>10s} {median(codex_runs, key):>10s}")
    extra = statistics.median(r["total"] for r in codex_runs) - statistics.median(r["total"] for r in builtin)
    print(
        f"\ncodex-cli costs {extra:.2f} s more per episode; the gateway's own time per call: {statistics.median(r['gateway_ms_per_call'] for r in codex_runs):.1f} ms (median)"
    )
    through, direct = gateway_latency(client, image, base, args.calls)
    print(
        f"one call, {args.calls} calls' median: container -> relay -> gateway -> server {through:.1f} ms; host -> server directly {direct:.1f} ms; gateway + relay add {through - direct:.1f} ms"
    )


if __name__ == "__main__":
    main()
