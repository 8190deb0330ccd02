"""Recording an episode as it happens.

An episode file is JSON Lines: a ``header`` (the trajectory's fields but messages),
then one ``message`` line per message, appended and flushed the moment it exists, then
an ``end`` line (exit status, final patch, outcome). A run killed at any point leaves a
file that ``read_episode`` turns into a valid trajectory, marked incomplete.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from records.pools import JsonlWriter, RecordError, iter_lines
from records.trajectory import ExitStatus, Message, Outcome, Trajectory, Usage


class EpisodeRecorder:
    def __init__(self, path: Path, header: Trajectory) -> None:
        self.path = path
        # Flushed per line: a killed process loses nothing; fsync would cost ~10 ms a line.
        self._writer = JsonlWriter(path)
        data = header.to_dict()
        data.pop("messages", None)
        self._writer.write({"kind": "header", "trajectory": data})

    def message(self, message: Message) -> None:
        self._writer.write({"kind": "message", "message": message.to_dict()})

    def end(self, trajectory: Trajectory, extra: dict[str, Any] | None = None) -> None:
        end: dict[str, Any] = {
            "kind": "end",
            "exit_status": trajectory.exit_status.value,
            "final_patch": trajectory.final_patch,
            "finished_at": trajectory.finished_at,
        }
        if trajectory.outcome is not None:
            end["outcome"] = trajectory.outcome.to_dict()
        if trajectory.usage is not None:
            end["usage"] = trajectory.usage.to_dict()
        end.update(extra or {})
        self._writer.write(end)

    def close(self) -> None:
        self._writer.close()


def read_episode(path: Path) -> Trajectory:
    """The trajectory an episode file holds; incomplete (``source.meta.incomplete``,
    exit status ``aborted``) when the run did not reach its end line."""
    header: dict[str, Any] | None = None
    messages: list[dict[str, Any]] = []
    end: dict[str, Any] | None = None
    for number, text in iter_lines(path):
        try:
            line = json.loads(text)
        except json.JSONDecodeError:
            continue  # the torn last line of a killed writer
        kind = line.get("kind") if isinstance(line, dict) else None
        if kind == "header":
            header = line["trajectory"]
        elif kind == "message":
            messages.append(line["message"])
        elif kind == "end":
            end = line
        else:
            raise RecordError(str(path), number, "kind", f"unknown episode line {kind!r}")
    if header is None:
        raise RecordError(str(path), None, None, "no header: not an episode file")
    trajectory = Trajectory.model_validate({**header, "messages": messages})
    meta = dict((trajectory.source.meta if trajectory.source else None) or {})
    if end is None:
        trajectory.exit_status = ExitStatus.aborted
        meta["incomplete"] = True
    else:
        trajectory.exit_status = ExitStatus(end["exit_status"])
        trajectory.final_patch = end.get("final_patch")
        trajectory.finished_at = end.get("finished_at")
        if end.get("outcome") is not None:
            trajectory.outcome = Outcome.model_validate(end["outcome"])
        if end.get("usage") is not None:
            trajectory.usage = Usage.model_validate(end["usage"])
        for key in ("budget", "ledger", "verdict_error"):
            if key in end:
                meta[key] = end[key]
    if trajectory.source is not None:
        trajectory.source.meta = meta
    return trajectory
