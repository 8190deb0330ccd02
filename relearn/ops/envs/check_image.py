"""``relearn envs check-image``: an image against the contract a task needs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from relearn.ops.containers import container_limits, container_session, load_task_list
from relearn.ops.envs._engine import _here_only
from relearn.ops.reporting import SILENT, OpError, Reporter, stage
from relearn.verbs.envs import CheckImageOptions

if TYPE_CHECKING:
    from envs.contract import ContractReport


@dataclass
class ImageCheck:
    instance_id: str
    image: str
    report: ContractReport | None  # None: the image could not be had (``error`` says why)
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.report is not None and self.report.ok


@dataclass
class CheckImageSummary:
    checks: list[ImageCheck]
    unreadable: list[str]
    image_problems: list[str]

    @property
    def failed(self) -> int:
        return sum(not c.ok for c in self.checks)


def run_check_image(options: CheckImageOptions, reporter: Reporter = SILENT) -> CheckImageSummary:
    from envs.contract import check_image
    from envs.images import task_image
    from envs.verify import mini_eval_script

    _here_only("check-image", options.containers)
    limits = container_limits(options.containers)
    chosen, unreadable = load_task_list(options.tasks, options.ids)
    if options.image is not None:
        if len(chosen) != 1:
            raise OpError(f"IMAGE is checked against one task: pick it with --id ({len(chosen)} selected)")
        chosen = [chosen[0].model_copy(update={"image": options.image, "image_source": "the command line"})]
    checks: list[ImageCheck] = []
    with container_session(options.containers, reporter) as session:
        prepared = session.prepare(chosen, need_base=False)
        with stage(reporter, "checking images", len(prepared.tasks)):
            for task in prepared.tasks:
                try:
                    name = task_image(session.client, task, prepared.base)
                except (RuntimeError, ValueError) as exc:
                    checks.append(ImageCheck(task.instance_id, task.image or "", None, str(exc)))
                    reporter.advance()
                    continue
                script = task.eval_script or mini_eval_script(task, task.base_commit or "HEAD")
                checks.append(ImageCheck(task.instance_id, name, check_image(session.client, task, name, script, limits=limits)))
                reporter.advance()
    return CheckImageSummary(checks, unreadable, prepared.problems)
