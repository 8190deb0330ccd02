"""``relearn envs audit``: task images whose .git exposes future commits or the fix itself."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

from records.pools import JsonlWriter
from relearn.ops.containers import container_limits, container_session, load_task_list
from relearn.ops.envs._engine import _here_only
from relearn.ops.outputs import RELEARN_RECORD, JsonlKind, check_jsonl_output
from relearn.ops.reporting import SILENT, Reporter, check_writable, stage
from relearn.verbs.envs import AuditOptions

# What `relearn envs audit -o` appends to (envs.audit.AuditRecord lines; a verdicts file, whose
# lines have instance_id too, carries schema_version and is refused).
AUDIT_RECORDS = JsonlKind("an audit file of `relearn envs audit -o`", frozenset({"instance_id", "verdict"}), RELEARN_RECORD)


@dataclass
class ImageAudit:
    instance_id: str
    image: str | None  # None: the image could not be had
    verdict: Literal["exposed", "clean", "error"]
    why: str


@dataclass
class AuditSummary:
    audits: list[ImageAudit]
    unreadable: list[str]  # task records that could not be read
    image_problems: list[str]  # what preparing the images (pulls) could not do

    @property
    def exposed(self) -> int:
        return sum(a.verdict == "exposed" for a in self.audits)

    @property
    def unavailable(self) -> int:
        return sum(a.image is None for a in self.audits)


def run_audit(options: AuditOptions, reporter: Reporter = SILENT) -> AuditSummary:
    from envs.audit import audit
    from envs.images import task_image

    _here_only("audit", options.containers)
    limits = container_limits(options.containers)
    chosen, unreadable = load_task_list(options.tasks, options.ids)
    audits: list[ImageAudit] = []
    if options.output is not None:
        check_jsonl_output(options.output, AUDIT_RECORDS, flag="--output")
        check_writable(options.output, "--output", appended=True)
    with container_session(options.containers, reporter) as session, _audit_writer(options.output) as write:
        prepared = session.prepare(chosen, need_base=False)  # builds the base when a mini task needs it
        with stage(reporter, "auditing task images", len(prepared.tasks)):
            for task in prepared.tasks:
                try:
                    image = task_image(session.client, task, prepared.base, leaky=options.leaky)
                except (RuntimeError, ValueError) as exc:
                    audits.append(ImageAudit(task.instance_id, None, "error", str(exc)))
                else:
                    report = audit(session.client, task, image, limits=limits)
                    verdict = "exposed" if report.flagged else ("error" if report.error else "clean")
                    audits.append(ImageAudit(task.instance_id, image, verdict, "; ".join(report.reasons()) or (report.error or "")))
                write(audits[-1])
                reporter.advance()
    return AuditSummary(audits, unreadable, prepared.problems)


@contextmanager
def _audit_writer(path: Path | None) -> Iterator[Callable[[ImageAudit], None]]:
    """Append each task's audit to ``path`` as it is made (nothing when None)."""
    if path is None:
        yield lambda _audit: None
        return
    with JsonlWriter(path) as writer:
        yield lambda audit: writer.write(asdict(audit))
