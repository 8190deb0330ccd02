"""Cheap signals without an LLM: failed actions, repeats, loops and reverted edits.

Signals seed judge 1 with candidate steps and drive the offline heuristic reviewer. They
are candidates, not verdicts: a failing test run before a fix is often a legitimate step.
The actions they look at come from ``review.actions``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from records.trajectory import Trajectory
from review.actions import Action, FileEdits, extract_actions, patch_changes, same_path, split_segments, split_words

KINDS = ("failed_command", "tool_error", "traceback", "reverted_edit", "repeated_command", "repeated_test_run", "stuck_loop", "abab")
STUCK_REPEATS = 3  # OpenHands' StuckDetector uses 3-4 identical action/observation pairs
ALL_FILES = "*"


@dataclass
class Signal:
    message_index: int  # the assistant message (step) the signal points at
    kind: str
    category: str  # one of records.review.CATEGORIES
    detail: str
    call_index: int | None = None  # which tool call of that message; None for text-protocol steps
    evidence: str = ""  # what in the observation shows it (an excerpt)


def prefilter(trajectory: Trajectory) -> list[Signal]:
    actions = extract_actions(trajectory)
    signals = _failures(actions) + _repetitions(actions) + _reverts(actions)
    return sorted(signals, key=lambda s: (s.message_index, s.call_index if s.call_index is not None else -1, KINDS.index(s.kind)))


# ---- failures ----------------------------------------------------------------------------

# Exit status 1 of these means "no match" or "differs", a normal answer to a question.
_NO_MATCH_IS_ONE = {"grep", "egrep", "fgrep", "rg", "ag", "ack", "diff", "cmp", "test", "[", "[["}
_TRACEBACK = "Traceback (most recent call last):"


def _failures(actions: list[Action]) -> list[Signal]:
    signals = []
    edited = False
    for action in actions:
        where = _describe(action)
        if action.tool_error:
            signals.append(_signal(action, "tool_error", "corrected_mistake", f"the tool refused {where}", _excerpt(action.output)))
        elif _TRACEBACK in action.output:
            # A traceback before any edit is usually a reproduction of the bug; after our own
            # edit it is a mistake we then had to correct.
            category, when = ("corrected_mistake", "after an edit") if edited else ("other", "before any edit")
            tail = action.output[action.output.index(_TRACEBACK) :]
            signals.append(_signal(action, "traceback", category, f"Python traceback {when} from {where}", _excerpt(tail, last_lines=3)))
        elif action.exit_code not in (0, None) and not _no_match(action):
            signals.append(_signal(action, "failed_command", "corrected_mistake", f"exit code {action.exit_code} from {where}", _excerpt(action.output)))
        edited = edited or (_changes_state(action) and action.succeeded)
    return signals


def _no_match(action: Action) -> bool:
    if action.exit_code != 1 or action.script is None:
        return False
    segments = split_segments(action.script)
    # The exit status of a chain is that of its last command.
    words = split_words(segments[-1]) if segments else []
    words = [w for w in words if not re.match(r"^\w+=", w)]  # FOO=1 grep ...
    if words[:2] in (["git", "grep"], ["git", "diff"]):
        return True
    return bool(words) and words[0] in _NO_MATCH_IS_ONE


# ---- repetitions -------------------------------------------------------------------------

_TEST = re.compile(
    r"(\bpy\.?test\b|-m\s+(pytest|unittest)\b|\btox\b|\bnox\b|\b(npm|yarn|pnpm)\s+(run\s+)?test\b|\bgo\s+test\b|\bcargo\s+test\b"
    r"|\bmake\s+(test|check)\b|\bmanage\.py\s+test\b|\bruntests\.py\b|\bbin/test\b|\bphpunit\b|\bmvn\s+test\b|\bgradle\w*\s+test\b)"
)


def is_test_run(script: str | None) -> bool:
    return script is not None and _TEST.search(script) is not None


def _repetitions(actions: list[Action]) -> list[Signal]:
    """One repetition signal per repeated action: stuck_loop (3+ identical action and
    observation in a row) over abab (two actions alternating with the same observations)
    over repeated_test_run / repeated_command (an action seen since the last state change).
    The first occurrence is fine; the repeats are the signal."""
    found: dict[int, tuple[str, int]] = {}  # position -> (kind, position it repeats)
    first: dict[str, int] = {}  # key -> first position since the last state change
    observed = [_observation(a.output) for a in actions]
    run = 0
    for n, action in enumerate(actions):
        if action.tool == "update_plan":  # bookkeeping, not an action on the repository
            continue
        same_as_previous = n > 0 and actions[n - 1].key == action.key and observed[n - 1] == observed[n]
        run = run + 1 if same_as_previous else 1
        if run >= STUCK_REPEATS:
            for m in range(n - run + 2, n + 1):
                found[m] = ("stuck_loop", n - run + 1)
        elif (
            n >= 3
            and action.key == actions[n - 2].key
            and actions[n - 1].key == actions[n - 3].key
            and action.key != actions[n - 1].key
            and observed[n] == observed[n - 2]
            and observed[n - 1] == observed[n - 3]
        ):
            for m in (n - 1, n):
                if found.get(m, ("",))[0] != "stuck_loop":
                    found[m] = ("abab", m - 2)
        elif action.key in first and not _changes_state(action):
            found[n] = ("repeated_test_run" if is_test_run(action.script) else "repeated_command", first[action.key])
        if _changes_state(action):
            # A changed file or environment makes the same command a new question.
            first.clear()
        else:
            first.setdefault(action.key, n)
    signals = []
    for n, (kind, earlier) in sorted(found.items()):
        action = actions[n]
        what = _describe(action)
        since = f" (as at message {actions[earlier].message_index})"
        detail = {
            "stuck_loop": f"the same action and observation {STUCK_REPEATS}+ times in a row: {what}",
            "abab": f"alternating between two actions with unchanged results: {what}{since}",
            "repeated_test_run": f"the same test run again with no edit in between: {what}{since}",
            "repeated_command": f"the same command again with no change in between: {what}{since}",
        }[kind]
        signals.append(_signal(action, kind, "redundant_exploration", detail, _excerpt(action.output)))
    return signals


def _observation(output: str) -> str:
    # Wall time differs between otherwise identical runs.
    return re.sub(r"^Wall time: .*$", "", output, flags=re.MULTILINE).strip()


# ---- edits and reverts --------------------------------------------------------------------

# Shell commands that write files or change the environment (conservative: treating a
# read as a write only hides a repeat; the reverse would flag a legitimate re-run).
_WRITES = re.compile(
    r"(\bsed\s+(-\w*\s+)*-i|\bperl\s+(-\w+\s+)*-\w*i|\btee\b|\bcp\b|\bmv\b|\brm\b|\btouch\b|\bmkdir\b|\bln\b|\bpatch\b|\bgit\s+(apply|am|checkout|restore|stash|reset|commit|merge|rebase|cherry-pick|revert|mv|rm)\b"
    r"|\b(pip3?|uv|poetry|conda|npm|yarn|pnpm|apt-get|apt|gem|cargo)\s+(install|add|remove|uninstall)\b|\bsetup\.py\s+(develop|install)\b|\bdd\b|\btruncate\b"
    r"|(?<![-=<>&\d])\d?>>?(?!&)\s*(?!/dev/null)[^\s&|;>]"
    r"|open\([^)]*['\"][wa]\+?['\"]|\.write_text\(|\.write\()"
)


def _changes_state(action: Action) -> bool:
    if action.tool == "apply_patch":
        return action.succeeded
    return action.script is not None and _WRITES.search(action.script) is not None


def _is_inverse(later: dict[str, FileEdits], earlier: dict[str, FileEdits]) -> bool:
    """``later`` undoes (part of) ``earlier``: per file it adds only lines ``earlier``
    removed and removes only lines it added, or deletes a file ``earlier`` created."""
    if not later or not set(later) <= set(earlier):
        return False
    for path, change in later.items():
        before = earlier[path]
        if change.deleted:
            if not before.added:
                return False
            continue
        if not change.plus and not change.minus:
            return False
        if change.plus - before.minus or change.minus - before.plus:
            return False
    return True


def _reverts(actions: list[Action]) -> list[Signal]:
    """Edits later undone, by an inverse patch or by git checkout/restore/stash/reset.
    The signal points at the abandoned edit; the undoing step is a correct recovery."""
    live: list[tuple[int, Action]] = []  # successful edits not yet reverted
    reverted: dict[int, Action] = {}
    for n, action in enumerate(actions):
        undone: list[int] = []
        if action.tool == "apply_patch" and action.succeeded and action.patch is not None:
            changes = patch_changes(action.patch)
            for m, earlier in reversed(live):
                if earlier.patch is not None and _is_inverse(changes, patch_changes(earlier.patch)):
                    undone = [m]
                    break
        elif action.script is not None:
            targets = _git_reverted_files(action.script)
            if targets:
                undone = [m for m, earlier in live if earlier.files and (ALL_FILES in targets or any(same_path(f, t) for f in earlier.files for t in targets))]
        for m in undone:
            reverted[m] = action
        live = [(m, a) for m, a in live if m not in undone]
        if not undone and _changes_state(action) and action.succeeded and action.files:
            live.append((n, action))
    signals = []
    for m, by in sorted(reverted.items()):
        edit = actions[m]
        detail = f"edit of {', '.join(edit.files)} undone at message {by.message_index} ({_describe(by)})"
        signals.append(_signal(edit, "reverted_edit", "abandoned_attempt", detail, _describe(by)))
    return signals


def _git_reverted_files(script: str) -> set[str]:
    """Files a git command in ``script`` puts back to their committed state (ALL_FILES for all)."""
    targets: set[str] = set()
    for segment in split_segments(script):
        words = split_words(segment)
        if len(words) < 2 or words[0] != "git":
            continue
        verb, rest = words[1], words[2:]
        paths = rest[rest.index("--") + 1 :] if "--" in rest else [w for w in rest if not w.startswith("-")]
        if verb == "checkout" and "-b" not in rest and "-B" not in rest:
            # Without "--", a bare name may be a branch; it only counts if it names an edited file.
            targets.update(ALL_FILES if p == "." else p for p in paths)
        elif verb == "restore" and ("--staged" not in rest or "--worktree" in rest or "-W" in rest):
            targets.update(ALL_FILES if p == "." else p for p in paths)
        elif verb == "stash" and (not rest or rest[0] in ("push", "save") or rest[0].startswith("-")):
            # `git stash [push] -- PATHS` stashes those paths; otherwise every change.
            targets.update(rest[rest.index("--") + 1 :] if "--" in rest else [ALL_FILES])
        elif verb == "reset" and "--hard" in rest:
            targets.add(ALL_FILES)
    return targets


# ---- helpers ----------------------------------------------------------------------------


def _signal(action: Action, kind: str, category: str, detail: str, evidence: str) -> Signal:
    return Signal(action.message_index, kind, category, detail, action.call_index, evidence)


def _describe(action: Action) -> str:
    if action.tool == "apply_patch":
        return f"apply_patch on {', '.join(sorted(action.files)) or 'unparsed patch'}"
    if action.script is not None:
        text = " ".join(action.script.split())
        return f"`{text[:100]}{'…' if len(text) > 100 else ''}`"
    return action.tool


def _excerpt(output: str, last_lines: int = 0, limit: int = 300) -> str:
    lines = [line for line in output.strip().splitlines() if line.strip() and not line.startswith("Wall time:")]
    text = "\n".join(lines[-last_lines:] if last_lines else lines[:6])
    return text[:limit]
