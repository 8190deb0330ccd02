"""Replay: re-execute a recorded trajectory's tool calls in a fresh container.

Each observation is compared with the recorded one, exactly and then normalised (wall
times, durations, temporary paths, addresses), and the first divergence is reported
with the message where it happened. The final repository state is diffed and verified,
which rebuilds final patches and verdicts for pools that saved only the conversation,
and shows whether a saved pool is reproducible.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import docker

from envs.docker_backend import DEFAULT_LIMITS, Container, Limits
from envs.tasks import Task
from envs.verify import Verdict, verify
from harness.tools.apply_patch import SEMANTICS, Semantics
from harness.tools.toolbox import Toolbox
from records.trajectory import Trajectory

VOLATILE = [
    (re.compile(r"^Wall time: [0-9.]+ seconds$", re.MULTILINE), "Wall time: <t> seconds"),
    (re.compile(r"\b\d+(\.\d+)?(ms|s)\b"), "<dur>"),
    (re.compile(r"/tmp/[A-Za-z0-9_.-]+"), "/tmp/<tmp>"),
    (re.compile(r"0x[0-9a-fA-F]{6,}"), "0x<addr>"),
    (re.compile(r"\b\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(\.\d+)?Z?\b"), "<timestamp>"),
]


def normalise(text: str) -> str:
    for pattern, replacement in VOLATILE:
        text = pattern.sub(replacement, text)
    return text.strip()


@dataclass
class Divergence:
    message_index: int  # the recorded tool message whose observation differs
    call_id: str
    tool: str
    recorded: str
    replayed: str


@dataclass
class ReplayReport:
    trajectory_id: str
    task_id: str
    calls: int = 0
    exact: int = 0
    normalised: int = 0
    divergence: Divergence | None = None
    final_patch: str | None = None
    patch_matches: bool | None = None  # None when the recording has no final patch
    verdict: Verdict | None = None

    @property
    def reproduced(self) -> bool:
        return self.divergence is None and self.patch_matches is not False


def recorded_semantics(trajectory: Trajectory) -> Semantics:
    """The apply_patch semantics the episode ran with: as recorded, else Codex's for Codex
    rollouts and the strict one for relearn episodes recorded before the choice existed."""
    meta = trajectory.source.meta if trajectory.source else None
    recorded = ((meta or {}).get("tools") or {}).get("apply_patch")
    if recorded in SEMANTICS:
        return recorded
    return "codex" if trajectory.source is not None and trajectory.source.format == "codex" else "strict"


def replay(
    client: docker.DockerClient,
    trajectory: Trajectory,
    task: Task,
    image: str,
    *,
    limits: Limits = DEFAULT_LIMITS,
    output_tokens: int = 10000,
    run_verifier: bool = True,
) -> ReplayReport:
    report = ReplayReport(trajectory.id, task.instance_id)
    results = {m.tool_call_id: (i, m) for i, m in enumerate(trajectory.messages) if m.role == "tool"}
    with Container.start(client, image, limits=limits, workdir=task.workdir) as container:
        base = task.base_commit or container.sh("git rev-parse HEAD").stdout.strip()
        toolbox = Toolbox(container, task.workdir, output_tokens, apply_patch_semantics=recorded_semantics(trajectory))
        for message in trajectory.messages:
            for call in message.tool_calls or []:
                report.calls += 1
                replayed = toolbox.run(call).output
                index, recorded = results.get(call.id, (-1, None))
                if recorded is None:
                    continue  # the recording ended during this call
                if replayed == recorded.content:
                    report.exact += 1
                elif normalise(replayed) == normalise(recorded.content or ""):
                    report.normalised += 1
                elif report.divergence is None:
                    report.divergence = Divergence(index, call.id, call.function.name, recorded.content or "", replayed)
        report.final_patch = container.diff(base, repo=task.workdir)
    if trajectory.final_patch is not None:
        report.patch_matches = report.final_patch == trajectory.final_patch
    if run_verifier:
        report.verdict = verify(client, task, report.final_patch, image, limits=limits)
    return report
