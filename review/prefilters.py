"""Cheap signals without an LLM: failed actions, repeats, loops and reverted edits.

Signals seed judge 1 with candidate steps and drive the offline heuristic reviewer. The
actions they look at come from ``review.actions``.

Failures, and the rule that tells an expected failure from a mistake, are ``review.failures``;
the repetitions and reverts are here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from records.trajectory import Trajectory
from review.actions import (
    Action,
    FileEdits,
    changes_state,
    extract_actions,
    is_test_run,
    patch_changes,
    same_path,
    split_segments,
    split_words,
)
from review.failures import failures
from review.signals import KINDS, Signal, describe, excerpt, signal_at

STUCK_REPEATS = 3  # OpenHands' StuckDetector uses 3-4 identical action/observation pairs
ALL_FILES = "*"


def prefilter(trajectory: Trajectory) -> list[Signal]:
    actions = extract_actions(trajectory)
    signals = failures(actions, trajectory.messages) + _repetitions(actions) + _reverts(actions)
    return sorted(signals, key=lambda s: (s.message_index, s.call_index if s.call_index is not None else -1, KINDS.index(s.kind)))


# ---- repetitions -------------------------------------------------------------------------


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
        elif action.key in first and not changes_state(action):
            found[n] = ("repeated_test_run" if is_test_run(action.script) else "repeated_command", first[action.key])
        if changes_state(action):
            # A changed file or environment makes the same command a new question.
            first.clear()
        else:
            first.setdefault(action.key, n)
    signals = []
    for n, (kind, earlier) in sorted(found.items()):
        action = actions[n]
        what = describe(action)
        since = f" (as at message {actions[earlier].message_index})"
        detail = {
            "stuck_loop": f"the same action and observation {STUCK_REPEATS}+ times in a row: {what}",
            "abab": f"alternating between two actions with unchanged results: {what}{since}",
            "repeated_test_run": f"the same test run again with no edit in between: {what}{since}",
            "repeated_command": f"the same command again with no change in between: {what}{since}",
        }[kind]
        signals.append(signal_at(action, kind, "redundant_exploration", detail, excerpt(action.output)))
    return signals


def _observation(output: str) -> str:
    # Wall time differs between otherwise identical runs.
    return re.sub(r"^Wall time: .*$", "", output, flags=re.MULTILINE).strip()


# ---- edits and reverts --------------------------------------------------------------------


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
    The signal points at the abandoned edit; the undoing step is a correct recovery.
    Edits a `git stash` put aside and a later `git stash pop`/`apply` brought back were
    not abandoned (stashing to run the tests on the original code is a check)."""
    live: list[tuple[int, Action]] = []  # successful edits not yet reverted
    reverted: dict[int, Action] = {}
    stashed: list[int] = []  # reverted by a stash that may still be popped
    for n, action in enumerate(actions):
        undone: list[int] = []
        if action.tool == "apply_patch" and action.succeeded and action.patch is not None:
            changes = patch_changes(action.patch)
            for m, earlier in reversed(live):
                if earlier.patch is not None and _is_inverse(changes, patch_changes(earlier.patch)):
                    undone = [m]
                    break
        elif action.script is not None:
            undo = _git_undo(action.script)
            if undo.pops_stash and action.succeeded:
                for m in stashed:
                    reverted.pop(m, None)
                live = sorted(live + [(m, actions[m]) for m in stashed], key=lambda pair: pair[0])
                stashed = []
            if undo.targets:
                undone = [
                    m
                    for m, earlier in live
                    if earlier.files and (ALL_FILES in undo.targets or any(same_path(f, t) for f in earlier.files for t in undo.targets))
                ]
                if undo.by_stash:
                    stashed += undone
        for m in undone:
            reverted[m] = action
        live = [(m, a) for m, a in live if m not in undone]
        if not undone and changes_state(action) and action.succeeded and action.files:
            live.append((n, action))
    signals = []
    for m, by in sorted(reverted.items()):
        edit = actions[m]
        detail = f"edit of {', '.join(edit.files)} undone at message {by.message_index} ({describe(by)})"
        signals.append(signal_at(edit, "reverted_edit", "abandoned_attempt", detail, describe(by)))
    return signals


@dataclass
class _Undo:
    targets: set[str] = field(default_factory=set)  # files put back to their committed state (ALL_FILES: all)
    by_stash: bool = False  # only by a stash, which a later pop can bring back
    pops_stash: bool = False  # brings back what an earlier command stashed


def _git_undo(script: str) -> _Undo:
    """What the git commands in ``script`` put back to the committed state."""
    undo = _Undo()
    stash: set[str] = set()  # stashed and not popped again in this script
    for segment in split_segments(script):
        words = split_words(segment)
        if len(words) < 2 or words[0] != "git":
            continue
        verb, rest = words[1], words[2:]
        paths = rest[rest.index("--") + 1 :] if "--" in rest else [w for w in rest if not w.startswith("-")]
        if verb == "checkout" and "-b" not in rest and "-B" not in rest:
            # Without "--", a bare name may be a branch; it only counts if it names an edited file.
            undo.targets.update(ALL_FILES if p == "." else p for p in paths)
        elif verb == "restore" and ("--staged" not in rest or "--worktree" in rest or "-W" in rest):
            undo.targets.update(ALL_FILES if p == "." else p for p in paths)
        elif verb == "stash" and (not rest or rest[0] in ("push", "save") or rest[0].startswith("-")):
            # `git stash [push] -- PATHS` stashes those paths; otherwise every change.
            stash.update(rest[rest.index("--") + 1 :] if "--" in rest else [ALL_FILES])
        elif verb == "stash" and rest[0] in ("pop", "apply"):
            if stash:
                stash = set()  # `git stash && pytest; git stash pop`: put back in the same command
            else:
                undo.pops_stash = True
        elif verb == "reset" and "--hard" in rest:
            undo.targets.add(ALL_FILES)
    undo.by_stash = bool(stash) and not undo.targets
    undo.targets |= stash
    return undo
