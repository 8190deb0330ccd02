"""The agent loop, tools, recording, collection and replay, with the real OpenAI and
Anthropic SDKs talking HTTP to local servers that play scripted model turns."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import docker
import pytest

from envs.docker_backend import Container
from envs.images import task_image
from envs.tasks import Task, load_tasks
from harness.agent import AgentConfig, run_episode
from harness.budget import Budget
from harness.collect import collect, trajectory_id
from harness.policies.base import PolicySpec
from harness.policies.make import make_policy
from harness.recorder import EpisodeRecorder, read_episode
from harness.replay import replay
from harness.scripted.servers import ModelServer, ScriptedTurn
from harness.scripted.solutions import solving_script
from harness.tools.toolbox import Toolbox
from records.passk import pass_at_k
from records.pools import read_trajectories
from records.trajectory import ExitStatus, FunctionCall, Source, ToolCall, Trajectory

MINI_SUITE = Path(__file__).resolve().parent.parent / "envs" / "mini_tasks"
TASKS = {t.instance_id: t for t in load_tasks(MINI_SUITE)[0]}
TASK = TASKS["mini__calc-1"]


def header(task: Task, spec: PolicySpec, attempt: int = 0) -> Trajectory:
    return Trajectory(
        id=trajectory_id(task.instance_id, spec, attempt),
        task_id=task.instance_id,
        attempt=attempt,
        messages=[],
        source=Source(format="relearn"),
    )


@pytest.fixture(scope="session")
def calc_image(docker_client: docker.DockerClient, base_image: str) -> str:
    return task_image(docker_client, TASK, base_image)


def episode(docker_client, image: str, server: ModelServer, budget: Budget, tmp_path: Path, kind: str = "chat", **spec_args):  # noqa: ANN001, ANN201
    spec = PolicySpec(kind=kind, model="scripted", base_url=server.base_url, **spec_args)  # type: ignore[arg-type]
    with Container.start(docker_client, image, workdir=TASK.workdir) as container:
        recorder = EpisodeRecorder(tmp_path / "episode.jsonl", header(TASK, spec))
        trajectory = run_episode(TASK, make_policy(spec), container, AgentConfig(budget=budget), header(TASK, spec), recorder)
        recorder.end(trajectory)
        recorder.close()
    return trajectory


@pytest.mark.parametrize("kind", ["chat", "responses", "anthropic"])
def test_a_scripted_policy_solves_a_mini_task(docker_client, calc_image: str, tmp_path: Path, kind: str) -> None:  # noqa: ANN001
    from envs.verify import verify

    with ModelServer(kind, solving_script(TASK)) as server:
        trajectory = episode(docker_client, calc_image, server, Budget(max_turns=10), tmp_path, kind=kind)
        sent = server.requests
    assert trajectory.exit_status is ExitStatus.submitted
    assert [m.role for m in trajectory.messages] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
        "tool",
        "assistant",
        "tool",
        "assistant",
    ]
    assert trajectory.messages[5].content.startswith("Success. Updated the following files:")
    assert "passed" in trajectory.messages[7].content and trajectory.messages[7].metadata["exit_code"] == 0
    assert "calc/evaluator.py" in trajectory.final_patch
    assert trajectory.usage.api_calls == 4 and trajectory.usage.input_tokens == 400
    assert len(sent) == 4  # and the last request carried the whole conversation back
    assert verify(docker_client, TASK, trajectory.final_patch, calc_image).resolved
    recorded = read_episode(tmp_path / "episode.jsonl")
    assert [m.role for m in recorded.messages] == [m.role for m in trajectory.messages]
    assert recorded.exit_status is ExitStatus.submitted and recorded.final_patch == trajectory.final_patch


def _flail(_request: dict) -> ScriptedTurn:
    return ScriptedTurn(
        content="Let me look around more.", tool_calls=[("shell", {"command": ["bash", "-lc", "ls"]})], input_tokens=1000, output_tokens=100
    )


@pytest.mark.parametrize(
    ("budget", "spec_args", "expected"),
    [
        (Budget(max_turns=3), {}, ExitStatus.turns_exhausted),
        (Budget(max_turns=100, max_tokens=3000), {}, ExitStatus.tokens_exhausted),
        (Budget(max_turns=100, max_cost_usd=0.01), {"price_in_per_mtok": 3.0, "price_out_per_mtok": 15.0}, ExitStatus.cost_exhausted),
        (Budget(max_turns=100, max_seconds=1.0), {}, ExitStatus.time_exhausted),
    ],
)
def test_a_flailing_policy_exhausts_each_budget(
    docker_client, calc_image: str, tmp_path: Path, budget: Budget, spec_args: dict, expected: ExitStatus
) -> None:  # noqa: ANN001
    with ModelServer("chat", _flail) as server:
        trajectory = episode(docker_client, calc_image, server, budget, tmp_path, **spec_args)
    assert trajectory.exit_status is expected
    ledger = trajectory.source.meta["ledger"]
    if expected is ExitStatus.turns_exhausted:
        assert ledger["turns"] == 3
    if expected is ExitStatus.tokens_exhausted:
        assert ledger["tokens"] >= 3000 and ledger["turns"] == 3
    if expected is ExitStatus.cost_exhausted:
        assert ledger["cost_usd"] >= 0.01 and ledger["turns"] == 3  # 0.0045 a call: 0.009 after two, 0.0135 after three
    assert trajectory.final_patch == ""


def test_malformed_tool_calls_end_in_format_error(docker_client, calc_image: str, tmp_path: Path) -> None:  # noqa: ANN001
    script = [
        ScriptedTurn(tool_calls=[("shell", '{"command": ["ls"')]),  # not JSON
        ScriptedTurn(tool_calls=[("teleport", {"where": "mars"})]),  # no such tool
        ScriptedTurn(tool_calls=[("shell", {"command": "ls", "timeout_ms": -5})]),  # wrong arguments
        ScriptedTurn(content="never reached"),
    ]
    with ModelServer("chat", script) as server:
        trajectory = episode(docker_client, calc_image, server, Budget(max_turns=10), tmp_path)
    assert trajectory.exit_status is ExitStatus.format_error
    tool_outputs = [m.content for m in trajectory.messages if m.role == "tool"]
    assert "not valid JSON" in tool_outputs[0] and "unknown tool 'teleport'" in tool_outputs[1] and "timeout_ms" in tool_outputs[2]
    assert trajectory.messages[2].tool_calls[0].raw_arguments == '{"command": ["ls"'


def test_server_errors_are_retried_then_reported(docker_client, calc_image: str, tmp_path: Path) -> None:  # noqa: ANN001
    flaky = [ScriptedTurn(error=429), ScriptedTurn(error=500), ScriptedTurn(content="Nothing to do.")]
    with ModelServer("chat", flaky) as server:
        trajectory = episode(docker_client, calc_image, server, Budget(max_turns=5), tmp_path)
    assert trajectory.exit_status is ExitStatus.submitted and len(server.requests) == 3
    broken = [ScriptedTurn(error=500)] * 10
    with ModelServer("chat", broken) as server:
        trajectory = episode(docker_client, calc_image, server, Budget(max_turns=5), tmp_path, max_retries=2)
    assert trajectory.exit_status is ExitStatus.policy_error and "500" in trajectory.source.meta["policy_error"]
    too_long = [
        ScriptedTurn(
            error=400,
            error_body={"error": {"message": "This model's maximum context length is 32768 tokens.", "code": "context_length_exceeded"}},
        )
    ]
    with ModelServer("chat", too_long) as server:
        trajectory = episode(docker_client, calc_image, server, Budget(max_turns=5), tmp_path)
    assert trajectory.exit_status is ExitStatus.context_overflow and len(server.requests) == 1


def test_tools_in_a_container(docker_client, calc_image: str) -> None:  # noqa: ANN001
    def run(toolbox: Toolbox, name: str, **arguments: object) -> str:
        return toolbox.run(ToolCall(id="c", function=FunctionCall(name=name, arguments=arguments))).output

    with Container.start(docker_client, calc_image, workdir=TASK.workdir) as container:
        toolbox = Toolbox(container, TASK.workdir, output_tokens=200)
        listing = run(toolbox, "shell", command=["bash", "-lc", "pwd; seq 1 5000"], workdir="calc")
        assert listing.startswith("Exit code: 0\nWall time:") and "/testbed/calc" in listing
        assert "tokens truncated" in listing and listing.rstrip().endswith("5000")
        assert "Exit code: none (killed)" in run(toolbox, "shell", command=["sleep", "30"], timeout_ms=500)
        patch = "*** Begin Patch\n*** Add File: notes/todo.txt\n+fix add\n*** End Patch\n"
        assert run(toolbox, "shell", command=["bash", "-lc", f"apply_patch <<'EOF'\n{patch}EOF"]).startswith("Success.")
        assert container.get_file("/testbed/notes/todo.txt") == b"fix add\n"
        failed = run(
            toolbox, "apply_patch", input="*** Begin Patch\n*** Update File: notes/todo.txt\n@@\n-no such line\n+x\n*** End Patch\n"
        )
        assert failed == "Failed to find expected lines in notes/todo.txt:\nno such line"  # Codex's text
        # Codex's semantics: what the operations before the failing one did stays written.
        partial = "*** Begin Patch\n*** Add File: created.txt\n+hello\n*** Update File: missing.txt\n@@\n-old\n+new\n*** End Patch\n"
        assert run(toolbox, "apply_patch", input=partial).startswith(
            "Failed to read file to update missing.txt: No such file or directory (os error 2)\n(applied before this error, and kept: A created.txt"
        )
        assert container.get_file("/testbed/created.txt") == b"hello\n"
        strict = Toolbox(container, TASK.workdir, output_tokens=200, apply_patch_semantics="strict")
        again = partial.replace("created.txt", "second.txt")
        assert (
            run(strict, "apply_patch", input=again).startswith("Failed to read file to update missing.txt")
            and not container.exec("test -e second.txt").ok
        )
        assert run(toolbox, "update_plan", plan=[{"step": "a", "status": "in_progress"}]) == "Plan updated"
        assert "at most one" in run(
            toolbox, "update_plan", plan=[{"step": "a", "status": "in_progress"}, {"step": "b", "status": "in_progress"}]
        )


def test_collection_survives_sigkill_and_resumes(docker_client, base_image: str, calc_image: str, tmp_path: Path, relearn_bin: str) -> None:  # noqa: ANN001
    """Kill a collection run mid-way; the rerun finishes the rest, redoing nothing finished."""

    def answer(request: dict) -> ScriptedTurn:
        # Stateless: the conversation so far decides the next step.
        tool_results = sum(1 for m in request["messages"] if m["role"] == "tool")
        if tool_results == 0:
            return ScriptedTurn(tool_calls=[("shell", {"command": ["bash", "-lc", "sleep 1; ls"]})], delay_s=0.3)
        return ScriptedTurn(content="Done.")

    out = tmp_path / "run"
    ids = sorted(TASKS)[:3]
    command = [relearn_bin, "collect", "--out", str(out), "--model", "scripted", "--attempts", "2", "--workers", "1", "--max-turns", "5"]
    command += [arg for task_id in ids for arg in ("--id", task_id)]
    with ModelServer("chat", answer) as server:
        env = {**os.environ, "OPENAI_API_KEY": "local"}
        process = subprocess.Popen(
            [*command, "--base-url", server.base_url], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
        )
        pool = out / "trajectories.jsonl"
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and (not pool.exists() or len(pool.read_text().splitlines()) < 2):
            time.sleep(0.2)
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        before = [json.loads(line) for line in pool.read_text().splitlines()]
        assert 2 <= len(before) < 6
        finished_ids = {t["id"] for t in before}
        rerun = subprocess.run([*command, "--base-url", server.base_url], env=env, capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    after = list(read_trajectories(pool))
    assert sorted(t.id for t in after) == sorted(
        trajectory_id(i, PolicySpec(kind="chat", model="scripted"), a) for i in ids for a in range(2)
    )
    assert [t.id for t in after[: len(before)]] == [t["id"] for t in before]  # the finished ones were not redone
    assert f"{len(before)} already done" in " ".join(rerun.stdout.split())
    assert all(t.exit_status is ExitStatus.submitted for t in after)
    # The killed episode's recording was kept beside the restarted one.
    partials = list((out / "episodes").glob("*.partial-*.jsonl"))
    assert all(p.name.split(".partial")[0] not in finished_ids for p in partials)
    for partial in partials:
        assert read_episode(partial).source.meta["incomplete"] is True
    # Leftover containers: none of this run's.
    assert not [
        c
        for c in docker_client.containers.list(all=True, filters={"label": "relearn.owner=relearn"})
        if c.labels.get("relearn.pid") == str(process.pid)
    ]


def test_collect_and_replay(docker_client, base_image: str, calc_image: str, tmp_path: Path) -> None:  # noqa: ANN001
    spec = PolicySpec(kind="chat", model="scripted", checkpoint="ckpt-7", step=700)
    with ModelServer("chat", solving_script(TASK)) as server:
        spec.base_url = server.base_url
        summary = collect(docker_client, [TASK], make_policy(spec), spec, tmp_path / "run", base_image=base_image)
    (trajectory,) = summary.finished
    assert trajectory.outcome.resolved and trajectory.policy.checkpoint == "ckpt-7" and trajectory.policy.step == 700
    assert trajectory.id == "mini__calc-1:scripted:ckpt-7:0"
    report = replay(docker_client, trajectory, TASK, calc_image)
    assert report.reproduced and report.calls == 3 and report.exact + report.normalised == 3
    assert report.patch_matches and report.verdict.resolved
    altered = trajectory.model_copy(deep=True)
    altered.messages[3].content = altered.messages[3].content.replace("calc", "kalk")
    divergent = replay(docker_client, altered, TASK, calc_image, run_verifier=False)
    assert not divergent.reproduced and divergent.divergence.message_index == 3 and divergent.divergence.tool == "shell"


def test_pass_at_k() -> None:
    assert pass_at_k(10, 0, 1) == 0.0 and pass_at_k(10, 10, 5) == 1.0
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        pass_at_k(2, 1, 3)


def test_killed_recordings_read_back_as_incomplete(tmp_path: Path) -> None:
    spec = PolicySpec(kind="chat", model="m")
    recorder = EpisodeRecorder(tmp_path / "e.jsonl", header(TASK, spec))
    from records.trajectory import Message

    recorder.message(Message(role="system", content="s"))
    recorder.message(Message(role="user", content="u"))
    recorder.close()
    with open(tmp_path / "e.jsonl", "a") as handle:
        handle.write('{"kind": "message", "message": {"role": "assis')  # torn by SIGKILL
    trajectory = read_episode(tmp_path / "e.jsonl")
    assert trajectory.exit_status is ExitStatus.aborted and trajectory.source.meta["incomplete"] is True
    assert [m.role for m in trajectory.messages] == ["system", "user"]
