"""One episode of the real Codex CLI in a task container (``--agent codex-cli``).

    gateway (host, Unix socket) <- relay <- internal network -> task container: codex exec

1. The gateway starts for the episode with the budget; the internal network and the
   relay come up; the task container starts attached to that network only.
2. The cached Codex binary (and ripgrep, which Codex's npm launcher puts on PATH) is
   streamed into the container; ``CODEX_HOME`` gets a ``config.toml`` (our provider at
   the relay, reasoning effort, no retries, no web search, no plugins or skills) and a
   model catalog entry for the policy's model name, made from the binary's own entry for
   a GPT-5-class model, so that Codex offers the intended tools: ``exec_command``,
   ``write_stdin``, ``update_plan`` and ``apply_patch`` (freeform, with its grammar).
3. ``codex exec --json`` runs the task instruction under a timeout (the time budget, or
   ``exec_timeout_s``); the gateway refuses calls past the other budgets.
4. The rollout file is copied out and imported (harness.importers.codex) into our
   trajectory format; the final patch is the repository's diff, as for our own loop, and
   the verdict comes from a fresh container (harness.collect).

The exit status comes from what stopped the episode: a budget the gateway enforced, the
timeout, a policy server error, or Codex finishing its turn (``submitted``).
"""

from __future__ import annotations

import json
import shutil
import tarfile
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker

from envs.docker_backend import DEFAULT_LIMITS, Container, Limits
from envs.tasks import Task
from harness.agent import now, task_prompt
from harness.budget import Budget
from harness.codex_cli.config import (
    AGENT,
    CODEX_BIN,
    CODEX_HOME,
    CODEX_PATH,
    KEY_ENV,
    CodexCliConfig,
    catalog_entry,
    chat_tools,
    codex_config,
    toml,
    tools_digest,
)
from harness.codex_cli.gateway import Gateway
from harness.codex_cli.network import open_route
from harness.importers import codex as codex_importer
from harness.policies.base import PolicySpec
from harness.recorder import EpisodeRecorder
from records.trajectory import ExitStatus, Message, Source, Trajectory, Usage

# ---- one episode ------------------------------------------------------------------------


@dataclass
class Timings:
    """Where an episode's time went (seconds), for the benchmark and the record."""

    route: float = 0.0  # internal network + relay up
    container: float = 0.0  # task container started
    copy: float = 0.0  # binary and CODEX_HOME in
    codex: float = 0.0  # codex exec, start to exit
    startup: float = 0.0  # of which: codex exec start to its first model call
    exit: float = 0.0  # of which: the last answer to codex's exit
    rollout: float = 0.0  # rollout out and imported
    teardown: float = 0.0

    def to_dict(self) -> dict[str, float]:
        return {k: round(v, 3) for k, v in self.__dict__.items()}


def run_codex_episode(
    client: docker.DockerClient,
    task: Task,
    image: str,
    spec: PolicySpec,
    budget: Budget,
    config: CodexCliConfig,
    header: Trajectory,
    *,
    recorder: EpisodeRecorder | None = None,
    artifacts: Path | None = None,
    limits: Limits = DEFAULT_LIMITS,
) -> Trajectory:
    """Run one episode; returns the trajectory with exit status and final patch (not yet
    verified). ``artifacts``: a folder for the gateway record (``gateway.jsonl``), the
    rollout (``rollout.jsonl``) and Codex's ``--json`` output (``exec.jsonl``)."""
    timings = Timings()
    workspace = Path(tempfile.mkdtemp(prefix="relearn-gw-"))
    record_path = artifacts / "gateway.jsonl" if artifacts is not None else None
    relay_image = config.relay_image or image
    gateway = Gateway(
        spec, budget, record_path=record_path, socket_path=workspace / "gateway.sock", request_token_ids=config.request_token_ids
    )
    gateway.start()
    trajectory = header.model_copy(deep=True)
    trajectory.started_at = trajectory.started_at or now()
    try:
        clock = time.monotonic()
        with open_route(client, relay_image, workspace / "gateway.sock") as route:
            timings.route = time.monotonic() - clock
            clock = time.monotonic()
            with Container.start(client, image, limits=limits, workdir=task.workdir, network=route.network_name) as container:
                timings.container = time.monotonic() - clock
                _run_in(container, task, spec, budget, config, gateway, route.base_url, trajectory, timings, artifacts)
                clock = time.monotonic()
            timings.teardown = time.monotonic() - clock
    finally:
        gateway.close()
        shutil.rmtree(workspace, ignore_errors=True)
    trajectory.finished_at = now()
    meta = dict(trajectory.source.meta or {}) if trajectory.source else {}
    meta["timings"] = timings.to_dict()
    if trajectory.source is not None:
        trajectory.source.meta = meta
    if recorder is not None:
        for message in trajectory.messages:
            recorder.message(message)
    return trajectory


def _run_in(
    container: Container,
    task: Task,
    spec: PolicySpec,
    budget: Budget,
    config: CodexCliConfig,
    gateway: Gateway,
    base_url: str,
    trajectory: Trajectory,
    timings: Timings,
    artifacts: Path | None,
) -> None:
    clock = time.monotonic()
    base_commit = task.base_commit or container.sh("git rev-parse HEAD", workdir=task.workdir).stdout.strip()
    install = config.install
    container.handle.put_archive("/", _tar_stream([(install.binary, CODEX_BIN), (install.rg, f"{CODEX_PATH}/rg")]))
    settings = codex_config(config, spec.model, base_url, CODEX_HOME, spec.timeout_s * (spec.max_retries + 1) + 60)
    container.put_file(f"{CODEX_HOME}/config.toml", toml(settings))
    container.put_file(f"{CODEX_HOME}/catalog.json", json.dumps({"models": [catalog_entry(config, spec.model)]}))
    timings.copy = time.monotonic() - clock

    limit = budget.max_seconds if budget.max_seconds is not None else config.exec_timeout_s
    prompt = task_prompt(task)
    # PATH is the image's own (a task image may put its Python first), with ripgrep added
    # the way Codex's npm launcher adds it.
    command = ["/bin/sh", "-c", f'PATH="{CODEX_PATH}:$PATH" exec "$0" "$@"', CODEX_BIN, "exec", "--json", "--skip-git-repo-check",
               "--dangerously-bypass-approvals-and-sandbox", "-C", task.workdir, prompt]  # fmt: skip
    gateway.begin()
    clock = time.monotonic()
    # A short grace past the time budget lets a refused call reach Codex and end it cleanly.
    result = container.exec(
        command, timeout_s=limit + 2.0, env={"CODEX_HOME": CODEX_HOME, KEY_ENV: gateway.token}, stdin=b"", output_cap=16 << 20
    )
    ended = time.monotonic()
    timings.codex = ended - clock
    if gateway.first_request is not None and gateway.last_answer is not None:
        timings.startup = gateway.first_request - clock
        timings.exit = max(ended - gateway.last_answer, 0.0)

    clock = time.monotonic()
    rollout_text = _rollout(container)
    if artifacts is not None:
        artifacts.mkdir(parents=True, exist_ok=True)
        (artifacts / "exec.jsonl").write_text(result.stdout)
        if rollout_text is not None:
            (artifacts / "rollout.jsonl").write_text(rollout_text)
    imported, import_error = _import(rollout_text, artifacts)
    timings.rollout = time.monotonic() - clock

    status = _exit_status(gateway, result.timed_out, result.exit_code, imported, import_error)
    trajectory.exit_status = status
    trajectory.tools = chat_tools(gateway.tools)
    meta: dict[str, Any] = dict((trajectory.source.meta if trajectory.source else None) or {})
    if imported is not None:
        _attach_call_data(imported.messages, gateway, spec)
        trajectory.messages = imported.messages
        trajectory.context_resets = imported.context_resets
        source = imported.source
        assert source is not None
        meta.update({k: v for k, v in (source.meta or {}).items() if k != "layout"})
        if imported.id.startswith("codex-"):
            meta["codex_session_id"] = imported.id.removeprefix("codex-")
        trajectory.source = Source(format="codex", format_version=source.format_version, path=str(artifacts / "rollout.jsonl") if artifacts else None,
                                   records=source.records, warnings=source.warnings, meta=meta)  # fmt: skip
    else:
        trajectory.source = Source(format="codex", format_version=install.version, meta=meta)
    meta.update(
        agent=AGENT,
        codex={
            "version": install.version_string,
            "exit_code": result.exit_code,
            "timed_out": result.timed_out,
            "stderr_tail": result.stderr[-2000:] or None,
        },
        gateway=gateway.summary(),
        ledger=gateway.ledger.to_dict(),
        budget=budget.to_dict(),
        tools_digest=tools_digest(gateway.tools) if gateway.tools else None,
    )
    if import_error:
        meta["rollout_error"] = import_error
    trajectory.source.meta = meta
    trajectory.usage = _usage(trajectory.messages, gateway)
    try:
        trajectory.final_patch = container.diff(base_commit, repo=task.workdir)
    except (docker.errors.DockerException, RuntimeError) as exc:
        trajectory.final_patch = None
        meta["final_patch_error"] = str(exc)


def _rollout(container: Container) -> str | None:
    found = container.exec(["sh", "-c", f"ls {CODEX_HOME}/sessions/*/*/*/rollout-*.jsonl 2>/dev/null"], timeout_s=30)
    paths = found.stdout.split()
    if not paths:
        return None
    # codex exec runs one thread; a second file would be a sub-agent, which we disable.
    return b"".join(container.get_file(path) for path in sorted(paths)[:1]).decode("utf-8", errors="replace")


def _import(text: str | None, artifacts: Path | None) -> tuple[Trajectory | None, str | None]:
    if text is None:
        return None, "codex wrote no rollout file"
    folder = artifacts or Path(tempfile.mkdtemp(prefix="relearn-rollout-"))
    path = folder / "rollout.jsonl"
    if artifacts is None:
        path.write_text(text)
    try:
        results = list(codex_importer.read(path, salvage=True))
    finally:
        if artifacts is None:
            shutil.rmtree(folder, ignore_errors=True)
    result = results[0]
    if result.trajectory is None:
        return None, str(result.error)
    return result.trajectory, None


def _exit_status(
    gateway: Gateway, timed_out: bool, exit_code: int | None, imported: Trajectory | None, import_error: str | None
) -> ExitStatus:
    if gateway.refused is not None:
        return gateway.refused
    if timed_out:
        return ExitStatus.time_exhausted
    if gateway.upstream_error is not None:
        return ExitStatus(gateway.upstream_error["exit_status"])
    if exit_code == 0 and imported is not None and imported.exit_status is ExitStatus.submitted:
        return ExitStatus.submitted
    if gateway.cut_off is not None:  # Codex gave up on an answer the server cut short
        return ExitStatus.policy_error
    return ExitStatus.env_error


def _attach_call_data(messages: list[Message], gateway: Gateway, spec: PolicySpec) -> None:
    """Per model call: its cost (the gateway's prices) and, where the server returned
    them, the generated token ids (on the call's one assistant message) and the prompt's (in
    the first message's ``extra.prompt_token_ids``)."""
    by_response: dict[str, list[Message]] = {}
    for message in messages:
        if message.role != "assistant" or not message.generated:
            continue
        response_id = (message.extra or {}).get("response_id")
        if response_id:
            by_response.setdefault(response_id, []).append(message)
        if message.usage is not None:
            message.usage.cost_usd = spec.cost_usd(message.usage)
    for response_id, group in by_response.items():
        prompt = gateway.prompt_ids.get(response_id)
        if prompt is not None:  # what the call was given (relearn masks trains under it)
            group[0].extra = {**(group[0].extra or {}), "prompt_token_ids": prompt}
        ids = gateway.token_ids.get(response_id)
        if ids is None:
            continue
        if len(group) == 1:
            group[0].token_ids = ids
        else:  # one call split over several messages: the ids cannot be divided honestly
            group[0].extra = {**(group[0].extra or {}), "call_token_ids": ids}


def _usage(messages: list[Message], gateway: Gateway) -> Usage:
    usage = Usage(
        input_tokens=0, cached_input_tokens=0, output_tokens=0, reasoning_output_tokens=0, cost_usd=0.0, api_calls=gateway.ledger.turns
    )
    for message in messages:
        if message.usage is None:
            continue
        for key in ("input_tokens", "cached_input_tokens", "output_tokens", "reasoning_output_tokens"):
            setattr(usage, key, (getattr(usage, key) or 0) + (getattr(message.usage, key) or 0))
    usage.total_tokens = (usage.input_tokens or 0) + (usage.output_tokens or 0)
    usage.cost_usd = round(gateway.ledger.cost_usd, 9)
    return usage


def _tar_stream(files: list[tuple[Path, str]]) -> Iterator[bytes]:
    """A tar archive of ``files`` (local path, absolute path in the container), made as
    it is sent: the 315 MB binary is never held in memory or copied on disk."""
    made: set[str] = set()
    for local, remote in files:
        parts = remote.strip("/").split("/")
        for depth in range(1, len(parts)):
            folder = "/".join(parts[:depth])
            if folder not in made:
                made.add(folder)
                info = tarfile.TarInfo(folder)
                info.type = tarfile.DIRTYPE
                info.mode = 0o755
                info.mtime = int(time.time())
                yield info.tobuf(format=tarfile.GNU_FORMAT)
        info = tarfile.TarInfo("/".join(parts))
        info.size = local.stat().st_size
        info.mode = 0o755
        info.mtime = int(local.stat().st_mtime)
        yield info.tobuf(format=tarfile.GNU_FORMAT)
        with local.open("rb") as handle:
            yield from iter(lambda: handle.read(1 << 20), b"")
        padding = -info.size % tarfile.BLOCKSIZE
        if padding:
            yield b"\0" * padding
    yield b"\0" * (tarfile.BLOCKSIZE * 2)
