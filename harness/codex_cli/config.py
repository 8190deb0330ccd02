"""How Codex is set up for an episode: the ``config.toml`` (our provider at the relay, no
retries, no web search, no plugins) and the model catalog entry that makes it offer the
intended tools; and what a run's manifest records of that set-up (``probe``, ``scaffold``)."""

from __future__ import annotations

import copy
import hashlib
import json
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from harness.codex_cli.install import CodexInstall
from harness.codex_cli.responses_api import events

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
            raise ValueError(
                f"reasoning effort {self.reasoning_effort!r} is not one Codex {self.install.version} offers for this model entry: {', '.join(levels)}"
            )


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


def probe(config: CodexCliConfig, model: str) -> dict[str, Any]:
    """Run the binary once on this host against a stub that ends the episode at once, to
    learn exactly which tool schemas and instructions Codex offers with this config:
    the manifest records them before any episode runs. Runs no command."""
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        raise RuntimeError(
            f"the codex-cli agent needs a Linux x86_64 host (the binary is {config.install.binary}); this is {platform.system()} {platform.machine()}"
        )
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
        command = [
            str(config.install.binary),
            "exec",
            "--json",
            "--skip-git-repo-check",
            "--dangerously-bypass-approvals-and-sandbox",
            "-C",
            str(work),
            "probe",
        ]
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
    instructions = [
        [part.get("text") for part in item.get("content") or []] for item in request.get("input", []) if item.get("role") == "developer"
    ]
    return {
        "tools": request.get("tools") or [],
        "instructions_digest": hashlib.sha256(json.dumps(instructions, sort_keys=True).encode()).hexdigest()[:16],
        "request_keys": sorted(request),
    }


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
