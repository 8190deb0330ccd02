"""Does a task's image give the answer away? The ROSS training set left out tasks whose
repository exposed future commits or the fix itself through ``.git``; this finds them.

Checks, inside a container from the image:
- commits reachable from any ref or reflog that are not ancestors of the base commit
  (upstream history copied in: the fix is one ``git log --all`` away);
- unreachable commits still in the object store (``git fsck --unreachable``);
- the fixed version of each file the gold patch touches, present as a blob in the
  object store (found by hashing the patched file and asking ``git cat-file -e``);
- the row's ``end_commit`` (OpenSWE: the PR's last commit), present in the object store.

OpenSWE images are built from a full clone checked out at the base commit, so they hold the
upstream history after it, the PR's own commits included: the report says so in those
terms, naming ``end_commit`` where the row has it (the paper's training set excluded such
images).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import docker
from pydantic import BaseModel, ValidationError

from envs.docker_backend import DEFAULT_LIMITS, Container, Limits
from envs.tasks import Task, patch_files
from records.pools import RecordError, field_path, iter_lines, parse_json_line

# What the checks below look for: raised when one changes what it flags, so the pipeline's
# audit stage (part of its identity) audits again.
AUDIT_VERSION = 2  # 2: the row's end_commit, and OpenSWE images named as such


@dataclass
class AuditReport:
    instance_id: str
    image: str
    future_commits: list[str] = field(default_factory=list)
    unreachable_commits: list[str] = field(default_factory=list)
    fix_blobs: list[str] = field(default_factory=list)  # files whose fixed content is in .git
    end_commit: str | None = None  # the row's end_commit, when the object store holds it
    openswe: bool = False  # the task is an OpenSWE row (its image a full clone, as OpenSWE builds them)
    error: str | None = None

    @property
    def flagged(self) -> bool:
        return bool(self.future_commits or self.unreachable_commits or self.fix_blobs or self.end_commit)

    def reasons(self) -> list[str]:
        out = []
        if self.openswe and (self.end_commit or self.future_commits):
            held = f"the PR's final commit (end_commit {self.end_commit[:12]})" if self.end_commit else "commits after the base"
            out.append(
                f"an OpenSWE image: a full clone holding future commits, {held} among them (the paper's training set excluded such images)"
            )
        elif self.end_commit:
            out.append(f"the task's end_commit {self.end_commit[:12]} is in .git")
        if self.future_commits:
            out.append(f"{len(self.future_commits)} commit(s) after the base reachable from refs or reflogs")
        if self.unreachable_commits:
            out.append(f"{len(self.unreachable_commits)} unreachable commit(s) in the object store")
        if self.fix_blobs:
            out.append(f"the fixed content of {', '.join(self.fix_blobs)} is in .git")
        return out


def audit(client: docker.DockerClient, task: Task, image: str, *, limits: Limits = DEFAULT_LIMITS) -> AuditReport:
    report = AuditReport(task.instance_id, image, openswe=task.kind == "openswe")
    with Container.start(client, image, workdir=task.workdir, limits=limits) as container:
        probe = container.exec("git rev-parse --git-dir", timeout_s=60)
        if not probe.ok:
            report.error = "no git repository in the work directory"
            return report
        base = task.base_commit or container.sh("git rev-parse HEAD", timeout_s=60).stdout.strip()
        quoted = shlex.quote(base)
        future = container.exec(f"git rev-list --all --reflog --not {quoted}", timeout_s=120)
        report.future_commits = future.stdout.split()
        dangling = container.exec("git fsck --unreachable --no-reflogs 2>/dev/null | awk '$2 == \"commit\" {print $3}'", timeout_s=300)
        report.unreachable_commits = dangling.stdout.split()
        if task.end_commit:
            held = container.exec(f"git cat-file -e {shlex.quote(task.end_commit)}^{{commit}}", timeout_s=60)
            report.end_commit = task.end_commit if held.ok else None
        if task.patch.strip():
            report.fix_blobs = _fix_blobs(container, task, quoted)
    return report


def _fix_blobs(container: Container, task: Task, base: str) -> list[str]:
    container.put_file("/tmp/relearn/gold.patch", task.patch if task.patch.endswith("\n") else task.patch + "\n")
    script = (
        f"set -e; tmp=$(mktemp -d); git archive {base} | tar -x -C $tmp; cd $tmp && git apply /tmp/relearn/gold.patch && cd - >/dev/null; "
    )
    for path in patch_files(task.patch):
        q = shlex.quote(path)
        script += f"if [ -f $tmp/{q} ]; then h=$(git hash-object $tmp/{q}); git cat-file -e $h 2>/dev/null && echo {q}; fi; "
    result = container.exec(script + "true", timeout_s=300)
    return [line for line in result.stdout.splitlines() if line.strip()]


# --- the audit file (`relearn envs audit -o FILE`, read by `relearn masks --audit FILE`) --------


class AuditRecord(BaseModel):
    """One task's audit, one JSON line. The latest line of a task is its audit."""

    instance_id: str
    verdict: Literal["exposed", "clean", "error"]  # exposed: .git gives the fix away; error: not audited
    image: str | None = None
    why: str = ""


def read_latest(path: str | Path) -> dict[str, AuditRecord]:
    """Each task's latest audit record (the latest line of a task counts); raises RecordError,
    located by file, line and field, on a line that is not an audit record."""
    latest: dict[str, AuditRecord] = {}
    for number, text in iter_lines(path):
        data = parse_json_line(path, number, text)
        try:
            record = AuditRecord.model_validate(data)
        except ValidationError as exc:
            error = exc.errors()[0]
            raise RecordError(str(path), number, field_path(error["loc"]) or None, error["msg"]) from None
        latest[record.instance_id] = record
    return latest


def read_flagged(path: str | Path) -> tuple[dict[str, str], int]:
    """The tasks an audit file flags (task id -> why) and how many tasks it audited; raises
    RecordError on a line that is not an audit record: a flagged task missed would put its
    exposed fix into training."""
    latest = read_latest(path)
    flagged = {task: record.why or "its image exposes the fix" for task, record in latest.items() if record.verdict == "exposed"}
    return flagged, len(latest)
