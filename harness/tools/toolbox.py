"""The tools an episode offers, with Codex CLI's names, argument schemas and outputs:
``shell`` (argv list, workdir, timeout_ms), ``apply_patch`` (the JSON variant of Codex's
freeform tool: ``{"input": patch}``), ``update_plan``.

A tool never raises for what the model got wrong: bad arguments, a failing command, a
patch that does not apply all come back as text the model reads, with a non-zero exit
code. ``ToolResult.format_error`` marks calls the model could not have meant (unknown
tool, arguments that are not the schema), which the agent loop counts.
"""

from __future__ import annotations

import posixpath
import shlex
import time
from dataclasses import dataclass, field
from typing import Any

from envs.docker_backend import Container
from harness.tools.apply_patch import FileChange, Semantics, apply_patch, summary
from harness.tools.output import format_exec_output, truncate_middle
from harness.tools.patch_grammar import PatchError
from harness.tools.patch_heredoc import match_apply_patch_command
from records.trajectory import ToolCall

SHELL_SCHEMA = {
    "type": "function",
    "function": {
        "name": "shell",
        "description": "Runs a shell command and returns its output.",
        "parameters": {
            "type": "object",
            "properties": {
                "command": {
                    "type": "array",
                    "items": {"type": "string"},
                    "description": 'The command to execute, as an argv list (e.g. ["bash", "-lc", "ls"]).',
                },
                "workdir": {"type": "string", "description": "The working directory to execute the command in."},
                "timeout_ms": {"type": "number", "description": "The timeout for the command in milliseconds."},
            },
            "required": ["command"],
            "additionalProperties": False,
        },
    },
}
APPLY_PATCH_SCHEMA = {
    "type": "function",
    "function": {
        "name": "apply_patch",
        "description": (
            "Use the `apply_patch` tool to edit files. The patch language is a stripped-down, file-oriented diff format:\n"
            "*** Begin Patch\n[ one or more file sections ]\n*** End Patch\n"
            "Each file section is `*** Add File: <path>` (every following line starts with +), `*** Delete File: <path>`, "
            "or `*** Update File: <path>` (optionally followed by `*** Move to: <new path>`) and hunks that start with `@@` "
            "(optionally followed by a line of context such as a function signature), then lines starting with ' ' (context), "
            "'-' (remove) or '+' (add). Show 3 lines of context around each change. Paths are relative."
        ),
        "parameters": {
            "type": "object",
            "properties": {"input": {"type": "string", "description": "The entire contents of the apply_patch command."}},
            "required": ["input"],
            "additionalProperties": False,
        },
    },
}
UPDATE_PLAN_SCHEMA = {
    "type": "function",
    "function": {
        "name": "update_plan",
        "description": "Updates the task plan. Provide an optional explanation and a list of plan items, each with a step and status. At most one step can be in_progress at a time.",
        "parameters": {
            "type": "object",
            "properties": {
                "explanation": {"type": "string"},
                "plan": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "step": {"type": "string"},
                            "status": {"type": "string", "enum": ["pending", "in_progress", "completed"]},
                        },
                        "required": ["step", "status"],
                        "additionalProperties": False,
                    },
                },
            },
            "required": ["plan"],
            "additionalProperties": False,
        },
    },
}
SCHEMAS = [SHELL_SCHEMA, APPLY_PATCH_SCHEMA, UPDATE_PLAN_SCHEMA]


@dataclass
class ToolResult:
    output: str
    exit_code: int | None
    duration_ms: float
    format_error: bool = False
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass
class Toolbox:
    container: Container
    workdir: str
    output_tokens: int = 10000
    default_timeout_ms: int = 120_000
    max_timeout_ms: int = 1_800_000
    apply_patch_semantics: Semantics = "codex"  # or "strict" (harness.tools.apply_patch)

    def schemas(self) -> list[dict[str, Any]]:
        return SCHEMAS

    def run(self, call: ToolCall) -> ToolResult:
        started = time.monotonic()
        name = call.function.name
        arguments = call.function.arguments
        if call.raw_arguments is not None:
            result = _error(f"Error: the arguments of {name} are not valid JSON: {call.raw_arguments[:200]!r}", format_error=True)
        elif name == "shell":
            result = self._shell(arguments)
        elif name == "apply_patch":
            patch = arguments.get("input")
            result = (
                self._apply_patch(patch)
                if isinstance(patch, str)
                else _error("Error: apply_patch needs a string `input`.", format_error=True)
            )
        elif name == "update_plan":
            result = _update_plan(arguments)
        else:
            result = _error(f"Error: unknown tool {name!r}; the tools are shell, apply_patch, update_plan.", format_error=True)
        result.duration_ms = (time.monotonic() - started) * 1000
        return result

    def _path(self, relative: str, workdir: str | None = None) -> str:
        return posixpath.normpath(posixpath.join(workdir or self.workdir, relative))

    def _shell(self, arguments: dict[str, Any]) -> ToolResult:
        command = arguments.get("command")
        if isinstance(command, str):  # some models send a string; run it as bash would
            command = ["bash", "-lc", command]
        if not isinstance(command, list) or not command or not all(isinstance(part, str) for part in command):
            return _error('Error: `command` must be a non-empty list of strings, e.g. ["bash", "-lc", "ls"].', format_error=True)
        workdir = arguments.get("workdir")
        if workdir is not None and not isinstance(workdir, str):
            return _error("Error: `workdir` must be a string.", format_error=True)
        workdir = self._path(workdir) if workdir else self.workdir
        # Codex routes apply_patch invocations through the shell to the patch tool.
        if command[0] == "apply_patch" and len(command) == 2:
            return self._apply_patch(command[1], workdir)
        if command[:2] in (["bash", "-lc"], ["bash", "-c"]) and len(command) == 3:
            invocation = match_apply_patch_command(command[2])
            if invocation is not None:  # `apply_patch <<'EOF' ...`, also after `cd DIR &&`
                return self._apply_patch(invocation.patch, self._path(invocation.workdir, workdir) if invocation.workdir else workdir)
        timeout_ms = arguments.get("timeout_ms", self.default_timeout_ms)
        if not isinstance(timeout_ms, (int, float)) or timeout_ms <= 0:
            return _error("Error: `timeout_ms` must be a positive number.", format_error=True)
        timeout_s = min(float(timeout_ms), self.max_timeout_ms) / 1000
        run = self.container.exec(command, timeout_s=timeout_s, workdir=workdir)
        text = format_exec_output(run.exit_code, run.duration_s, run.output, self.output_tokens, timed_out=run.timed_out)
        return ToolResult(
            text,
            run.exit_code,
            0.0,
            metadata={"exit_code": run.exit_code, "duration_seconds": round(run.duration_s, 3), "timed_out": run.timed_out},
        )

    def _apply_patch(self, patch: str, workdir: str | None = None) -> ToolResult:
        base = workdir or self.workdir

        def read(relative: str) -> str | None:
            try:
                return self.container.get_file(self._path(relative, base)).decode("utf-8")
            except (FileNotFoundError, IsADirectoryError):
                return None
            except UnicodeDecodeError:
                raise PatchError(f"{relative} is not UTF-8 text; apply_patch edits text files only") from None

        try:
            changes = apply_patch(patch, read, semantics=self.apply_patch_semantics)
        except PatchError as exc:
            # Codex's texts as its binary prints them; with its semantics, what the operations
            # before the failing one changed is written, as Codex has written it by then.
            problem = self._write(exc.applied, base)
            return _error(str(exc) if problem is None else f"{exc}\n{problem}")
        problem = self._write(changes, base)
        if problem is not None:
            return _error(problem)
        text, _removed = truncate_middle(summary(changes), self.output_tokens)
        return ToolResult(text, 0, 0.0, metadata={"exit_code": 0, "files": [c.path for c in changes]})

    def _write(self, changes: list[FileChange], base: str) -> str | None:
        """Perform the changes in order; the error text of the first one that fails, or None."""
        for change in changes:
            path = self._path(change.path, base)
            if change.kind == "delete":
                self.container.sh(f"rm -f -- {shlex.quote(path)}")
                continue
            target = self._path(change.move_to, base) if change.move_to else path
            # Through stdin rather than an archive, so an edited file keeps its mode.
            quoted = shlex.quote(target)
            write = f"mkdir -p -- {shlex.quote(posixpath.dirname(target))} && cat > {quoted}"
            written = self.container.exec(["sh", "-c", write], stdin=(change.new_content or "").encode("utf-8"), timeout_s=60)
            if not written.ok:
                return f"Failed to write file {change.move_to or change.path}"
            if change.move_to and target != path:
                self.container.sh(f"rm -f -- {shlex.quote(path)}")
        return None


def _error(text: str, *, format_error: bool = False) -> ToolResult:
    return ToolResult(text, 1, 0.0, format_error=format_error, metadata={"exit_code": 1})


def _update_plan(arguments: dict[str, Any]) -> ToolResult:
    plan = arguments.get("plan")
    if not isinstance(plan, list) or not all(isinstance(item, dict) for item in plan):
        return _error("Error: `plan` must be a list of {step, status} objects.", format_error=True)
    statuses = [item.get("status") for item in plan]
    if any(status not in ("pending", "in_progress", "completed") for status in statuses):
        return _error("Error: each status must be pending, in_progress or completed.", format_error=True)
    if statuses.count("in_progress") > 1:
        return _error("Error: at most one step can be in_progress at a time.")
    return ToolResult("Plan updated", 0, 0.0, metadata={"exit_code": 0})
