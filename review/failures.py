"""Failed actions, and which of them are mistakes.

A failing action is a mistake unless the agent had reason to expect the failure. The rule:

- A tool the harness refused (a patch that does not apply) is always a mistake.
- A command that broke as an invocation is always a mistake, even when announced as a
  reproduction: it says nothing about the code. That is exit 126/127; a pytest usage error
  (exit 4) or a selection of no tests (exit 5); output such as "command not found", "No such
  file or directory", "unrecognized arguments", "No module named"; a SyntaxError, a NameError
  or a missing module raised in the agent's own ``python -c``/stdin snippet; or a failure the very next
  action retypes (a similar command of the same program that then succeeds, nothing changed
  in between, and not merely the failed command with more arguments).
- Otherwise the failure is expected, and signalled as ``expected_failure`` (a hint for the
  judges, never a defect), when it ran the code under test (a test run, an interpreter, a
  script) before the agent's first edit of the code; or when the step's own text predicts it
  (``_PREDICTS_FAILURE``, at any point); or, before that first edit, when the text says the
  step reproduces the bug (``_REPRODUCING``, for commands not recognised as running code).
- Anything else, in particular a failure after an edit of the code, is a corrected mistake.

"The code" is every file except test files, files under /tmp and files the agent brought
into being itself (a reproduction script, a new test): writing those is how a reproduction
is set up, not the start of the fix. Environment changes (installs, mkdir) are not edits.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from difflib import SequenceMatcher
from pathlib import PurePosixPath

from records.trajectory import Message
from review.actions import (
    Action,
    changes_state,
    is_test_run,
    norm_path,
    output_files,
    patch_changes,
    same_path,
    split_segments,
    split_words,
)
from review.signals import Signal, describe, excerpt, signal_at

# Exit status 1 of these means "no match" or "differs", a normal answer to a question.
_NO_MATCH_IS_ONE = {"grep", "egrep", "fgrep", "rg", "ag", "ack", "diff", "cmp", "test", "[", "[[", "which"}
_TRACEBACK = "Traceback (most recent call last):"
# These print files: a traceback in what they show was not raised by the command.
_READERS = {"cat", "head", "tail", "less", "more", "nl", "bat", "grep", "egrep", "rg", "sed", "awk", "git", "ls", "find", "echo", "printf"}

# Output that shows the command itself was wrong, whatever the code does.
_BROKEN_OUTPUT = re.compile(
    r"command not found|No such file|can't open file|cannot access|cannot stat|unrecognized arguments?|invalid option|unknown option|illegal option"
    r"|unknown command|No rule to make target|No module named|syntax error near unexpected token|unexpected EOF while looking|ERROR: (file or directory )?not found",
    re.IGNORECASE,
)
_BROKEN_EXIT = {126: "not executable", 127: "command not found"}
_PYTEST = re.compile(r"\bpy\.?test\b")
_PYTEST_BROKEN_EXIT = {4: "pytest usage error", 5: "no tests collected"}
_COLLECT_ONLY = re.compile(r"(^|\s)(--collect-only|--co)\b")
# A test report means the tests ran: its failures are the code's, not the command's.
_TEST_REPORT = re.compile(r"\b\d+ (failed|passed|errors?)\b|^(FAILED|ERROR) \S", re.MULTILINE)
_FRAME = re.compile(r'^\s*File "([^"]*)", line \d+', re.MULTILINE)
_EXCEPTION = re.compile(r"^(?:[\w.]+\.)?(\w+(?:Error|Exception))\b", re.MULTILINE)
# Raised in the agent's own -c/stdin snippet, these are typos in it (or an import of a
# module that is not there); other errors there (an AssertionError, a TypeError from the
# code) may be the bug showing.
_SNIPPET_TYPOS = {"SyntaxError", "IndentationError", "TabError", "NameError", "ModuleNotFoundError"}
RETYPE_SIMILARITY = 0.6  # difflib ratio above which a command counts as the same one retyped

# Kept small on purpose: each phrase must be hard to say about a run meant to pass.
# Said before the first edit of the code: the step is there to watch the bug happen.
_REPRODUCING = re.compile(
    r"\breproduc\w*|\brepro\b|\bconfirm (that )?(the |this )?(bug|failure|issue|error|problem)\b|\bbefore (the|my|any) (fix|change)",
    re.IGNORECASE,
)
# Said at any point: the failure is the outcome the agent predicted.
_PREDICTS_FAILURE = re.compile(
    r"\b(should|will|must) (still )?fail\b|\bexpect(ed|s|ing)? (\w+ ){0,2}to fail\b|\bfails? (as expected|without the fix)\b", re.IGNORECASE
)
# A sentence that negates or also predicts a pass is no prediction of this failure.
_HEDGED = re.compile(r"\b(not|no longer|never|pass\w*)\b|n't", re.IGNORECASE)
_SENTENCE = re.compile(r"(?<=[.!?;:])\s+|\n+")
_CODE = re.compile(r"```.*?(```|$)|`[^`\n]*`", re.DOTALL)

# Programs whose failure is the behaviour of the code they run.
_INTERPRETER = re.compile(r"^(python[\d.]*|pypy[\d.]*|node|deno|bun|ruby|php|java|Rscript|julia|lua|perl)$")
_RUNNERS = {
    ("go", "run"),
    ("cargo", "run"),
    ("uv", "run"),
    ("poetry", "run"),
    ("pipenv", "run"),
    ("npm", "run"),
    ("npm", "start"),
    ("yarn", "run"),
    ("pnpm", "run"),
}
_WRAPPERS = {"env", "time", "nice", "command", "exec", "xvfb-run"}
# Commands that set the environment up: not an edit of the code, and not a run of it.
_INSTALL = re.compile(
    r"\b(pip3?|uv|poetry|conda|mamba|npm|yarn|pnpm|apt-get|apt|gem|cargo)\s+(pip\s+)?(install|add|remove|uninstall|sync)\b|\bsetup\.py\s+(develop|install)\b"
)
_SETUP_PROGRAMS = {"cd", "pushd", "popd", "export", "unset", "source", ".", "mkdir", "touch", "chmod", "ulimit", "set", "true"}
_TEST_PATH = re.compile(
    r"(^|/)(tests?|testing|__tests__|spec)/|(^|/)(test_[^/]*|[^/]*_test\.\w+|[^/]*\.(test|spec)\.\w+|tests?\.py|conftest\.py)$"
)


@dataclass
class _Failure:
    kind: str  # "traceback" or "failed_command"
    what: str
    evidence: str


@dataclass
class _Progress:
    """What the agent has done to the repository so far."""

    fixing: bool = False  # it has edited the code (see the module docstring)
    created: set[str] = field(default_factory=set)  # files it brought into being itself
    seen: list[str] = field(default_factory=list)  # every earlier command and observation

    def record(self, action: Action) -> None:
        if action.succeeded:
            self.created |= _created_files(action, self.seen)
            self.fixing = self.fixing or (changes_state(action) and _edits_code(action, self.created))
        self.seen += [action.script or action.patch or "", action.output]


def failures(actions: list[Action], messages: list[Message]) -> list[Signal]:
    signals = []
    progress = _Progress()
    for n, action in enumerate(actions):
        if action.tool_error:
            signals.append(
                signal_at(action, "tool_error", "corrected_mistake", f"the tool refused {describe(action)}", excerpt(action.output))
            )
        else:
            failure = _failure(action)
            if failure is not None:
                text = _step_text(messages, action.message_index)
                signals.append(_classify(action, failure, _broken(action) or _retyped(actions, n), progress.fixing, text))
        progress.record(action)
    return signals


def _classify(action: Action, failure: _Failure, broken: str | None, fixing: bool, text: str) -> Signal:
    where = describe(action)
    expected = None if broken else _expectation(action, failure, fixing, text)
    if expected is not None:
        return signal_at(action, "expected_failure", "other", f"{failure.what} from {where}, expected: {expected}", failure.evidence)
    when = "after an edit" if fixing else "before any edit"
    why = f": {broken}" if broken else ""
    if failure.kind == "traceback":
        return signal_at(action, "traceback", "corrected_mistake", f"Python traceback {when} from {where}{why}", failure.evidence)
    return signal_at(action, "failed_command", "corrected_mistake", f"{failure.what} from {where}{why}", failure.evidence)


def _failure(action: Action) -> _Failure | None:
    traceback = _TRACEBACK in action.output and _program(action.script) not in _READERS
    if action.exit_code in (0, None):
        # A traceback behind exit 0 is a failure a pipe (`python x.py | tail`) or a caught
        # exception hid; one in what `cat` shows was not raised by the command.
        return _traceback(action) if traceback else None
    if _no_match(action):
        return None
    return _traceback(action) if traceback else _Failure("failed_command", f"exit code {action.exit_code}", excerpt(action.output))


def _traceback(action: Action) -> _Failure:
    tail = action.output[action.output.index(_TRACEBACK) :]
    return _Failure("traceback", "Python traceback", excerpt(tail, last_lines=3))


def _no_match(action: Action) -> bool:
    if action.script is None:
        return False
    if action.exit_code == 5 and _PYTEST.search(action.script) and _COLLECT_ONLY.search(action.script):
        return True  # "which tests are there?" answered "none"
    if action.exit_code != 1:
        return False
    segments = split_segments(action.script)
    # The exit status of a chain is that of its last command.
    words = _command_words(segments[-1]) if segments else []
    if words[:2] in (["git", "grep"], ["git", "diff"]):
        return True
    return bool(words) and words[0] in _NO_MATCH_IS_ONE


def _broken(action: Action) -> str | None:
    """Why the command failed as an invocation, if it did (see the module docstring)."""
    output = action.output
    if action.exit_code in _BROKEN_EXIT:
        return _BROKEN_EXIT[action.exit_code]
    if is_test_run(action.script) and _PYTEST.search(action.script or ""):
        if action.exit_code in _PYTEST_BROKEN_EXIT:
            return _PYTEST_BROKEN_EXIT[action.exit_code]
        if _TEST_REPORT.search(output):
            return None
    frames, exceptions = _FRAME.findall(output), _EXCEPTION.findall(output)
    if frames and frames[-1] in ("<string>", "<stdin>") and exceptions and exceptions[-1] in _SNIPPET_TYPOS:
        return f"{exceptions[-1]} in the agent's own snippet"
    if _TRACEBACK in output:
        return None  # raised inside the code it ran: whatever the message says, it is the code's
    match = _BROKEN_OUTPUT.search(output)
    return f'"{match.group(0)}"' if match else None


def _retyped(actions: list[Action], n: int) -> str | None:
    """Whether the next action is the failed command typed again, and working: then the
    failure was the command's fault. Test runs are left out: a narrower or another test
    selection after a failing run is exploration, and broken test commands show in pytest's
    exit status."""
    action = actions[n]
    later = next((a for a in actions[n + 1 :] if a.tool != "update_plan"), None)
    if later is None or action.script is None or later.script is None or is_test_run(action.script):
        return None
    if later.key == action.key or not later.succeeded or changes_state(later) or _program(action.script) != _program(later.script):
        return None
    if _extends(action.script, later.script):
        return None  # the same command with more arguments asks another question
    similarity = SequenceMatcher(None, " ".join(action.script.split()), " ".join(later.script.split())).ratio()
    return f"retyped at message {later.message_index}" if similarity >= RETYPE_SIMILARITY else None


def _extends(script: str, later: str) -> bool:
    """Each word of ``script``, in order, begins a word of ``later``."""
    words = iter(split_words(" ".join(later.split())))
    return all(any(w.startswith(v) for w in words) for v in split_words(" ".join(script.split())))


def _expectation(action: Action, failure: _Failure, fixing: bool, text: str) -> str | None:
    """Why the failure was to be expected, or None (see the module docstring)."""
    sentences = [s for s in _SENTENCE.split(text) if s.strip() and not _HEDGED.search(s)]
    if any(_PREDICTS_FAILURE.search(s) for s in sentences):
        return "the agent predicted it"
    if fixing:
        return None
    if failure.kind == "traceback" or _runs_code(action):
        return "it ran the code before any edit of it (a reproduction)"
    if any(_REPRODUCING.search(s) for s in sentences):
        return "the agent said it reproduces the bug, before any edit"
    return None


def _step_text(messages: list[Message], index: int) -> str:
    """The step's own words: reasoning and content, without code (a script named
    reproduce.py says nothing about what the agent expects of it)."""
    if not 0 <= index < len(messages):
        return ""
    message = messages[index]
    return "\n".join(_CODE.sub(" ", text) for text in (message.reasoning_content, message.content) if isinstance(text, str))


def _runs_code(action: Action) -> bool:
    """Whether the command runs code whose failure is the code's behaviour: a test run, an
    interpreter, a script. Builds and installs are not reproductions."""
    if action.script is None or _INSTALL.search(action.script):
        return False
    if is_test_run(action.script):
        return True
    for segment in split_segments(action.script):
        words = _command_words(segment)
        if not words:
            continue
        program = words[0]
        if _INTERPRETER.match(PurePosixPath(program).name) and not (
            program == "perl" and any(w.startswith("-") and "i" in w for w in words[1:])
        ):
            return True
        if program.startswith("./") or tuple(words[:2]) in _RUNNERS or program == "npx":
            return True
        if program in ("bash", "sh", "zsh") and len(words) > 1 and not words[1].startswith("-"):
            return True
    return False


def _program(script: str | None) -> str | None:
    """The first program a script runs, past `cd` and the like."""
    for segment in split_segments(script or ""):
        words = _command_words(segment)
        if words and words[0] not in _SETUP_PROGRAMS:
            return words[0]
    return None


def _command_words(segment: str) -> list[str]:
    """A command's words without leading variable assignments and wrappers (env, timeout N)."""
    words = split_words(segment)
    while words:
        if re.match(r"^\w+=", words[0]) or words[0] in _WRAPPERS:
            words = words[1:]
        elif words[0] == "timeout":
            words = words[1:]
            while words and (words[0].startswith("-") or re.match(r"^\d", words[0])):
                words = words[1:]
        else:
            break
    return words


def _created_files(action: Action, seen: list[str]) -> set[str]:
    """Files this action brings into being: added by a patch, or written by a redirection
    or tee to a name no earlier command or observation mentioned."""
    if action.tool == "apply_patch" and action.patch is not None:
        return {path for path, change in patch_changes(action.patch).items() if change.added}
    if action.script is None:
        return set()
    return {f for f in output_files(action.script) if not any(PurePosixPath(f).name in text for text in seen)}


def _edits_code(action: Action, created: set[str]) -> bool:
    """Whether a state-changing action edits the code (see the module docstring)."""
    if not action.files:
        return not _is_setup(action.script)
    return any(not _is_own_file(f, created) for f in action.files)


def _is_own_file(path: str, created: set[str]) -> bool:
    path = norm_path(path)
    return path.startswith("/tmp/") or _TEST_PATH.search(path) is not None or any(same_path(path, c) for c in created)


def _is_setup(script: str | None) -> bool:
    segments = split_segments(script or "")
    return bool(segments) and all(_INSTALL.search(s) or (_command_words(s) or [""])[0] in _SETUP_PROGRAMS for s in segments)
