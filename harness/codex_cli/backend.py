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

import copy
import hashlib
import json
import os
import platform
import shutil
import subprocess
import tarfile
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import docker

from envs.docker_backend import DEFAULT_LIMITS, Container, Limits
from envs.tasks import Task
from harness.agent import now, task_prompt
from harness.budget import Budget
from harness.codex_cli.gateway import Gateway, events
from harness.codex_cli.install import CodexInstall
from harness.codex_cli.network import open_route
from harness.importers import codex as codex_importer
from harness.policies import PolicySpec
from harness.recorder import EpisodeRecorder
from harness.trajectory import ExitStatus, Message, Source, Trajectory, Usage

AGENT = "codex-cli"
CODEX_DIR = "/opt/relearn-codex"
CODEX_BIN = f"{CODEX_DIR}/bin/codex"
CODEX_PATH = f"{CODEX_DIR}/path"
CODEX_HOME = f"{CODEX_DIR}/home"
PROVIDER = "relearn"
KEY_ENV = "RELEARN_GATEWAY_KEY"
# Features of this Codex version that would add tools, instructions or network calls an
# SWE episode must not have (goals, sub-agents, apps and plugins, hooks, memories,
# images, tool suggestions). Listed by `codex features list`.
DISABLED_FEATURES = ("goals", "multi_agent", "apps", "plugins", "hooks", "memories", "view_image", "image_generation", "tool_suggest")
# What the catalog entry changes on the template entry: a text-only model served through
# the gateway, with no search tool, no product instructions and no upgrade prompt.
CATALOG_OVERRIDES: dict[str, Any] = {
    "visibility": "list",
    "supported_in_api": True,
    "upgrade": None,
    "availability_nux": None,
    "additional_speed_tiers": [],
    "service_tiers": [],
    "supports_search_tool": False,
    "input_modalities": ["text"],
    "include_skills_usage_instructions": False,
    "include_plugin_usage_instructions": False,
    "include_apps_usage_instructions": False,
    "experimental_supported_tools": [],
}


@dataclass
class CodexCliConfig:
    install: CodexInstall
    reasoning_effort: str | None = "medium"  # low | medium | high | xhigh; None: the model's default
    reasoning_summary: str | None = "auto"  # auto | concise | detailed | none
    context_window: int | None = None  # None: the template entry's (272,000)
    # vLLM only: ask for the generated token ids (enable_response_messages).
    request_token_ids: bool = False
    relay_image: str | None = None  # any image with python3; collect passes the base image
    exec_timeout_s: float = 3600.0  # when the budget sets no time limit
    # Extra config.toml keys, dotted ("features.shell_snapshot": False), applied last.
    overrides: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        levels = [level.get("effort") for level in self.install.catalog_template().get("supported_reasoning_levels") or []]
        if self.reasoning_effort is not None and levels and self.reasoning_effort not in levels:
            raise ValueError(f"reasoning effort {self.reasoning_effort!r} is not one Codex {self.install.version} offers for this model entry: {', '.join(levels)}")


def catalog_entry(config: CodexCliConfig, model: str) -> dict[str, Any]:
    entry = copy.deepcopy(config.install.catalog_template())
    entry.update(CATALOG_OVERRIDES)
    # apply_patch stays the template's freeform grammar tool: this Codex version's catalog
    # accepts no other apply_patch_tool_type.
    entry.update(slug=model, display_name=model, description="A policy served through the relearn gateway.")
    entry.pop("default_service_tier", None)
    if config.context_window is not None:
        entry["context_window"] = entry["max_context_window"] = config.context_window
    return entry


def codex_config(config: CodexCliConfig, model: str, base_url: str, home: str, stream_idle_timeout_s: float) -> dict[str, Any]:
    settings: dict[str, Any] = {
        "model": model,
        "model_provider": PROVIDER,
        "model_catalog_json": f"{home}/catalog.json",
        "approval_policy": "never",
        "sandbox_mode": "danger-full-access",  # the container is the sandbox
        "web_search": "disabled",
        "check_for_update_on_startup": False,
        "analytics": {"enabled": False},
        "history": {"persistence": "none"},
        "skills": {"include_instructions": False},
        "tools": {"update_plan": {"enabled": True}, "experimental_request_user_input": {"enabled": False}},
        "features": dict.fromkeys(DISABLED_FEATURES, False),
        "model_providers": {
            PROVIDER: {
                "name": "relearn gateway",
                "base_url": base_url,
                "env_key": KEY_ENV,
                "wire_api": "responses",
                # The gateway retries the policy server itself; a Codex retry would be a
                # model call the budget did not admit.
                "request_max_retries": 0,
                "stream_max_retries": 0,
                "stream_idle_timeout_ms": int(stream_idle_timeout_s * 1000),
                "supports_websockets": False,
            }
        },
    }
    if config.reasoning_effort is not None:
        settings["model_reasoning_effort"] = config.reasoning_effort
    if config.reasoning_summary is not None:
        settings["model_reasoning_summary"] = config.reasoning_summary
    for dotted, value in config.overrides.items():
        *parents, last = dotted.split(".")
        table = settings
        for key in parents:
            table = table.setdefault(key, {})
        table[last] = value
    return settings


def toml(settings: dict[str, Any]) -> str:
    """The few TOML shapes a Codex config needs: scalars, lists of scalars, tables."""
    lines: list[str] = []

    def table(values: dict[str, Any], prefix: str) -> None:
        scalars = {k: v for k, v in values.items() if not isinstance(v, dict)}
        tables = {k: v for k, v in values.items() if isinstance(v, dict)}
        if prefix and scalars:
            lines.append(f"\n[{prefix}]")
        for key, value in scalars.items():
            lines.append(f"{_key(key)} = {_value(value)}")
        for key, value in tables.items():
            table(value, f"{prefix}.{_key(key)}" if prefix else _key(key))

    table(settings, "")
    return "\n".join(lines).lstrip("\n") + "\n"


def _key(key: str) -> str:
    return key if key.replace("_", "").replace("-", "").isalnum() else json.dumps(key)


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a valid TOML basic string
    if isinstance(value, list):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {type(value).__name__} to a Codex config")


def chat_tools(offered: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Tools as Codex offered them (Responses shape) in the chat shape our trajectories
    and chat templates use: function tools as ``{type: function, function: {...}}``,
    freeform tools as ``{type: custom, custom: {name, description, format}}``."""
    if offered is None:
        return None
    out = []
    for tool in offered:
        kind = tool.get("type")
        body = {k: v for k, v in tool.items() if k != "type"}
        if kind == "function":
            out.append({"type": "function", "function": body})
        elif kind == "custom":
            out.append({"type": "custom", "custom": body})
        else:
            out.append(tool)
    return out


def tools_digest(offered: list[dict[str, Any]]) -> str:
    return hashlib.sha256(json.dumps(offered, sort_keys=True).encode()).hexdigest()[:16]


# ---- what a run's manifest says about the scaffold ------------------------------------


def probe(config: CodexCliConfig, model: str) -> dict[str, Any]:
    """Run the binary once on this host against a stub that ends the episode at once, to
    learn exactly which tool schemas and instructions Codex offers with this config:
    the manifest records them before any episode runs. Runs no command."""
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        raise RuntimeError(f"the codex-cli agent needs a Linux x86_64 host (the binary is {config.install.binary}); this is {platform.system()} {platform.machine()}")
    seen: list[dict[str, Any]] = []

    class Stub(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:  # noqa: N802
            seen.append(json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0))))
            answer = {"id": "resp_probe", "object": "response", "status": "completed", "model": model,
                      "output": [{"type": "message", "id": "msg_probe", "role": "assistant", "status": "completed", "content": [{"type": "output_text", "text": "ok", "annotations": []}]}],
                      "usage": {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0}}  # fmt: skip
            data = b"".join(f"data: {json.dumps(e)}\n\n".encode() for e in events(answer))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Stub)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    root = Path(tempfile.mkdtemp(prefix="relearn-codex-probe-", dir=config.install.folder.parent))
    try:
        home, work = root / "home", root / "work"
        home.mkdir()
        work.mkdir()
        url = f"http://127.0.0.1:{server.server_address[1]}/v1"
        (home / "config.toml").write_text(toml(codex_config(config, model, url, str(home), 60)))
        (home / "catalog.json").write_text(json.dumps({"models": [catalog_entry(config, model)]}))
        command = [str(config.install.binary), "exec", "--json", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox", "-C", str(work), "probe"]
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "CODEX_HOME": str(home), KEY_ENV: "probe"}
        result = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, text=True, env=env, timeout=120)
    finally:
        server.shutdown()
        server.server_close()
        shutil.rmtree(root, ignore_errors=True)
    if not seen:
        raise RuntimeError(f"codex made no model call in the probe (exit {result.returncode}): {result.stderr[-1500:]}")
    request = seen[0]
    # The text only: each message item also carries a fresh id.
    instructions = [[part.get("text") for part in item.get("content") or []] for item in request.get("input", []) if item.get("role") == "developer"]
    return {"tools": request.get("tools") or [], "instructions_digest": hashlib.sha256(json.dumps(instructions, sort_keys=True).encode()).hexdigest()[:16], "request_keys": sorted(request)}


def scaffold(config: CodexCliConfig, model: str, probed: dict[str, Any]) -> dict[str, Any]:
    """The manifest's ``scaffold`` for codex-cli runs: what must match for two runs to be
    the same run or comparable."""
    settings = codex_config(config, model, "http://gateway/v1", CODEX_HOME, 0)
    settings["model_providers"][PROVIDER].pop("stream_idle_timeout_ms")
    tools = probed["tools"]
    return {
        "agent": AGENT,
        "version": config.install.version_string,
        "package_integrity": config.install.integrity,
        "config_digest": hashlib.sha256(toml(settings).encode()).hexdigest()[:16],
        "catalog_digest": hashlib.sha256(json.dumps(catalog_entry(config, model), sort_keys=True).encode()).hexdigest()[:16],
        "instructions_digest": probed["instructions_digest"],
        "tools_digest": tools_digest(tools),
        "tools": [t.get("name") or t.get("type") for t in tools],
        "reasoning_effort": config.reasoning_effort,
        "reasoning_summary": config.reasoning_summary,
    }


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
    gateway = Gateway(spec, budget, record_path=record_path, socket_path=workspace / "gateway.sock", request_token_ids=config.request_token_ids)
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
    result = container.exec(command, timeout_s=limit + 2.0, env={"CODEX_HOME": CODEX_HOME, KEY_ENV: gateway.token}, stdin=b"", output_cap=16 << 20)
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
        codex={"version": install.version_string, "exit_code": result.exit_code, "timed_out": result.timed_out, "stderr_tail": result.stderr[-2000:] or None},
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


def _exit_status(gateway: Gateway, timed_out: bool, exit_code: int | None, imported: Trajectory | None, import_error: str | None) -> ExitStatus:
    if gateway.refused is not None:
        return gateway.refused
    if timed_out:
        return ExitStatus.time_exhausted
    if gateway.upstream_error is not None:
        return ExitStatus(gateway.upstream_error["exit_status"])
    if imported is None:
        return ExitStatus.env_error
    if exit_code == 0 and imported.exit_status is ExitStatus.submitted:
        return ExitStatus.submitted
    return ExitStatus.env_error


def _attach_call_data(messages: list[Message], gateway: Gateway, spec: PolicySpec) -> None:
    """Per model call: its cost (the gateway's prices) and, where the server returned
    them, the generated token ids (on the call's one assistant message)."""
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
        ids = gateway.token_ids.get(response_id)
        if ids is None:
            continue
        if len(group) == 1:
            group[0].token_ids = ids
        else:  # one call split over several messages: the ids cannot be divided honestly
            group[0].extra = {**(group[0].extra or {}), "call_token_ids": ids}


def _usage(messages: list[Message], gateway: Gateway) -> Usage:
    usage = Usage(input_tokens=0, cached_input_tokens=0, output_tokens=0, reasoning_output_tokens=0, cost_usd=0.0, api_calls=gateway.ledger.turns)
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
