"""What a trajectory did: its executed actions (shell commands, patches) with what came back,
and the files each one edits. The pre-filters read trajectories through these.

Two trajectory shapes are read: tool-calling ones as the harness records them (assistant
``tool_calls`` for ``shell``/``apply_patch``, then ``tool`` messages with "Exit code: N" or
"Error: ..." text and ``metadata.exit_code``), and text-protocol ones (mini-swe-agent: one
```bash block per assistant message, observed in the next user message as
``<returncode>N</returncode>``).
"""

from __future__ import annotations

import json
import re
import shlex
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from harness.tools.patch_grammar import AddFile, DeleteFile, PatchError, UpdateFile, parse_patch
from harness.tools.patch_heredoc import match_apply_patch_command
from records.trajectory import Message, Trajectory

SHELL_TOOLS = ("shell", "shell_command", "exec_command", "local_shell", "bash", "execute_bash")


SHELLS = ("bash", "sh", "zsh", "/bin/bash", "/bin/sh", "/usr/bin/bash")


@dataclass
class Action:
    """One executed action and what came back."""

    message_index: int
    call_index: int | None
    tool: str
    key: str  # identity for repeat detection: tool, working directory, normalised command
    script: str | None = None  # the shell command text
    patch: str | None = None  # apply_patch input
    output: str = ""
    exit_code: int | None = None
    tool_error: bool = False
    files: list[str] = field(default_factory=list)  # files this action edits, when known

    @property
    def succeeded(self) -> bool:
        return not self.tool_error and self.exit_code in (0, None)


# mini-swe-agent's own action regex: the language tag is required.
_BASH_BLOCK = re.compile(r"```(?:bash|sh)\s*\n(.*?)\n```", re.DOTALL)


_RETURNCODE = re.compile(r"<returncode>\s*(-?\d+)\s*</returncode>")


_EXIT_CODE = re.compile(r"^Exit code: (-?\d+)", re.MULTILINE)


def extract_actions(trajectory: Trajectory) -> list[Action]:
    messages = trajectory.messages
    if any(m.tool_calls for m in messages):
        return _tool_actions(messages)
    return _text_actions(messages)


def _tool_actions(messages: list[Message]) -> list[Action]:
    results: dict[str, Message] = {}
    for message in messages:
        if message.role == "tool" and message.tool_call_id and message.tool_call_id not in results:
            results[message.tool_call_id] = message
    actions = []
    for i, message in enumerate(messages):
        for j, call in enumerate(message.tool_calls or []):
            action = _tool_action(i, j, call.function.name, call.function.arguments)
            result = results.get(call.id)
            if result is not None:
                action.output = result.content or ""
                action.exit_code = _exit_code(result)
                action.tool_error = action.output.lstrip().startswith("Error:")
            actions.append(action)
    return actions


def _tool_action(i: int, j: int, name: str, arguments: dict[str, Any]) -> Action:
    if name == "apply_patch":
        patch = arguments.get("input")
        return _patch_action(i, j, patch if isinstance(patch, str) else "")
    if name in SHELL_TOOLS:
        command = arguments.get(command_key(arguments))
        workdir = arguments.get("workdir") if isinstance(arguments.get("workdir"), str) else ""
        script = shell_script(command)
        if script is not None:
            # Codex routes `apply_patch PATCH` and `bash -lc "apply_patch <<EOF ..."` to the patch tool.
            if isinstance(command, list) and len(command) == 2 and command[0] in ("apply_patch", "applypatch"):
                return _patch_action(i, j, command[1])
            invocation = match_apply_patch_command(script)
            if invocation is not None:
                return _patch_action(i, j, invocation.patch)
            return _shell_action(i, j, script, workdir)
    return Action(i, j, name, f"{name}\0{json.dumps(arguments, sort_keys=True)}")


def command_key(arguments: dict[str, Any]) -> str:
    """Where a shell call keeps its command: ``command`` (our shell, Codex shell_command),
    or ``cmd`` (Codex exec_command)."""
    return "cmd" if "command" not in arguments and "cmd" in arguments else "command"


def is_inline_script(command: Any) -> bool:
    """``[bash, -lc, SCRIPT]``: the third element is the whole command."""
    return (
        isinstance(command, list)
        and len(command) == 3
        and command[0] in SHELLS
        and command[1] in ("-lc", "-c")
        and isinstance(command[2], str)
    )


def shell_script(command: Any) -> str | None:
    """The command text a shell call runs: the script after ``bash -lc``, else the argv joined."""
    if isinstance(command, str):
        return command
    if not isinstance(command, list) or not command or not all(isinstance(c, str) for c in command):
        return None
    return command[2] if is_inline_script(command) else shlex.join(command)


def _patch_action(i: int, j: int | None, patch: str) -> Action:
    return Action(i, j, "apply_patch", f"apply_patch\0{patch.strip()}", patch=patch, files=list(_patch_files(patch)))


def _shell_action(i: int, j: int | None, script: str, workdir: str) -> Action:
    return Action(i, j, "shell", f"shell\0{workdir}\0{' '.join(script.split())}", script=script, files=_written_files(script))


def _exit_code(result: Message) -> int | None:
    code = (result.metadata or {}).get("exit_code")
    if isinstance(code, int):
        return code
    text = result.content or ""
    match = _EXIT_CODE.search(text[:200]) or _RETURNCODE.search(text[:200])
    return int(match.group(1)) if match else None


def _text_actions(messages: list[Message]) -> list[Action]:
    actions = []
    for i, message in enumerate(messages):
        if message.role != "assistant" or not message.content:
            continue
        blocks = _BASH_BLOCK.findall(message.content)
        if len(blocks) != 1:  # mini-swe-agent runs exactly one block; anything else was a format error
            continue
        action = _shell_action(i, None, blocks[0], "")
        following = messages[i + 1] if i + 1 < len(messages) else None
        if following is not None and following.role in ("user", "tool"):
            action.output = following.content or ""
            action.exit_code = _exit_code(following)
        actions.append(action)
    return actions


def _patch_files(patch: str) -> set[str]:
    return set(patch_changes(patch))


@dataclass
class FileEdits:
    plus: Counter[str] = field(default_factory=Counter)
    minus: Counter[str] = field(default_factory=Counter)
    added: bool = False
    deleted: bool = False


def patch_changes(patch: str) -> dict[str, FileEdits]:
    try:
        ops = parse_patch(patch)
    except PatchError:
        return {}
    changes: dict[str, FileEdits] = {}
    for op in ops:
        change = changes.setdefault(norm_path(op.path), FileEdits())
        if isinstance(op, AddFile):
            change.added = True
            change.plus.update(line for line in op.content.split("\n") if line.strip())
        elif isinstance(op, DeleteFile):
            change.deleted = True
        elif isinstance(op, UpdateFile):
            for chunk in op.chunks:
                for mark, text in chunk.lines:
                    if text.strip() and mark in "+-":
                        (change.plus if mark == "+" else change.minus)[text] += 1
            if op.move_to:
                changes.setdefault(norm_path(op.move_to), FileEdits())
    return changes


_REDIRECT_TARGET = re.compile(r"(?<![-=<>&\d])\d?>>?\s*([^\s&|;<>]+)")


def _written_files(script: str) -> list[str]:
    """Files a shell command writes, best effort: redirection targets and the file
    arguments of sed -i, perl -i and tee."""
    files = output_files(script)
    for segment in split_segments(script):
        words = split_words(segment)
        if words and words[0] in ("sed", "perl") and any(w.startswith("-") and "i" in w for w in words[1:]):
            operands = [w for w in words[1:] if not w.startswith("-")]
            files += [norm_path(f) for f in operands[1:]]  # the first operand is the script
    return list(dict.fromkeys(files))


def output_files(script: str) -> list[str]:
    """Files a shell command sends output to (redirection targets, tee arguments, cp's
    destination): the writes that can bring a file into being, unlike sed -i and perl -i,
    which need it."""
    files = [m.group(1) for m in _REDIRECT_TARGET.finditer(script) if not m.group(1).startswith(("/dev/", "&"))]
    for segment in split_segments(script):
        words = split_words(segment)
        operands = [w for w in words[1:] if not w.startswith("-")]
        if words and words[0] == "tee":
            files += operands
        elif words and words[0] == "cp" and len(operands) >= 2:
            files.append(operands[-1])
    return [norm_path(f) for f in dict.fromkeys(files)]


def split_segments(script: str) -> list[str]:
    return [s.strip() for s in re.split(r"&&|\|\||[;|\n]", script) if s.strip()]


def split_words(segment: str) -> list[str]:
    try:
        return shlex.split(segment)
    except ValueError:
        return segment.split()


def norm_path(path: str) -> str:
    path = path.strip().strip("'\"")
    while path.startswith("./"):
        path = path[2:]
    return path.rstrip("/")


def same_path(a: str, b: str) -> bool:
    # Patches name files relative to the workdir, git commands sometimes absolutely.
    a, b = norm_path(a), norm_path(b)
    return a == b or a.endswith("/" + b) or b.endswith("/" + a)


_TEST = re.compile(
    r"(\bpy\.?test\b|-m\s+(pytest|unittest)\b|\btox\b|\bnox\b|\b(npm|yarn|pnpm)\s+(run\s+)?test\b|\bgo\s+test\b|\bcargo\s+test\b"
    r"|\bmake\s+(test|check)\b|\bmanage\.py\s+test\b|\bruntests\.py\b|\bbin/test\b|\bphpunit\b|\bmvn\s+test\b|\bgradle\w*\s+test\b)"
)


def is_test_run(script: str | None) -> bool:
    return script is not None and _TEST.search(script) is not None


# Shell commands that write files or change the environment (conservative: treating a
# read as a write only hides a repeat; the reverse would flag a legitimate re-run).
_WRITES = re.compile(
    r"(\bsed\s+(-\w*\s+)*-i|\bperl\s+(-\w+\s+)*-\w*i|\btee\b|\bcp\b|\bmv\b|\brm\b|\btouch\b|\bmkdir\b|\bln\b|\bpatch\b|\bgit\s+(apply|am|checkout|restore|stash|reset|commit|merge|rebase|cherry-pick|revert|mv|rm)\b"
    r"|\b(pip3?|uv|poetry|conda|npm|yarn|pnpm|apt-get|apt|gem|cargo)\s+(install|add|remove|uninstall)\b|\bsetup\.py\s+(develop|install)\b|\bdd\b|\btruncate\b"
    r"|(?<![-=<>&\d])\d?>>?(?!&)\s*(?!/dev/null)[^\s&|;>]"
    r"|open\([^)]*['\"][wa]\+?['\"]|\.write_text\(|\.write\()"
)


def changes_state(action: Action) -> bool:
    if action.tool == "apply_patch":
        return action.succeeded
    return action.script is not None and _WRITES.search(action.script) is not None
