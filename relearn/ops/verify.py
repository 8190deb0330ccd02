"""Grading patches in fresh containers with the tasks' tests: ``relearn verify`` (predictions in,
verdicts out) and the pipeline's verify stage (a pool in, the pool with outcomes out). Both
grade through ``envs.batch.verify_batch`` on the executor: threads here (``workers``) or units
on a Ray cluster (``containers.ray``), images routed, pulled or taken from a registry as every
container verb does (``relearn.ops.containers``)."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from envs.executor import LocalBackend, Needs
from records.pools import JsonlWriter, RecordError, count_records, iter_lines, iter_pool, read_trajectories_lenient
from records.trajectory import Trajectory
from relearn.ops.containers import ContainerSession, container_limits, container_session, load_task_list, node_counts
from relearn.ops.outputs import VERDICTS, check_jsonl_output, prepare_parent
from relearn.ops.reporting import SILENT, OpError, Reporter, stage
from relearn.verbs.containers import ContainerOptions
from relearn.verbs.verify import PoolVerifyOptions, VerifyOptions

if TYPE_CHECKING:
    from envs.limits import Limits
    from envs.tasks import Task
    from envs.verify import Verdict


@dataclass
class VerifySummary:
    output: Path
    verdicts: list[Verdict]  # graded now (the verb shows them all; a batch of predictions, not a pool)
    skipped: int  # already in the output
    errors: list[str]  # predictions that could not be graded (no such task, image, infrastructure)
    unreadable: list[str]  # prediction lines and task records that could not be read
    image_problems: list[str]
    per_node: dict[str, int]
    network: bool = False  # graded with the network on

    @property
    def resolved(self) -> int:
        return sum(v.resolved for v in self.verdicts)

    @property
    def network_needed(self) -> int:
        """Graded unresolved offline with listed tests that failed for want of the network."""
        return sum(bool(v.network_needed) for v in self.verdicts if not v.resolved)

    @property
    def partial(self) -> bool:
        return bool(self.errors or self.unreadable or self.image_problems)


def grading_limits(containers: ContainerOptions, network: bool) -> Limits:
    """The containers' limits, with the network on where the grading asks for it (collect's
    agent containers keep theirs off: only the grading turns it on)."""
    return dataclasses.replace(container_limits(containers), network=network)


def run_verify(options: VerifyOptions, reporter: Reporter = SILENT) -> VerifySummary:
    """Grade every prediction of ``options.patches`` not yet in ``options.output``."""
    from envs.batch import load_predictions, verify_batch  # swebench: seconds to import

    check_jsonl_output(options.output, VERDICTS)
    with container_session(options.containers, reporter) as session:
        task_list, task_problems = load_task_list(options.tasks)
        predictions, errors = load_predictions(options.patches)
        unreadable = task_problems + [str(e) for e in errors]
        if not predictions:
            raise OpError(f"no predictions in {options.patches}" + (f"; first problem: {errors[0]}" if errors else ""))
        prepare_parent(options.output, reporter)
        wanted = {p.instance_id for p in predictions}
        prepared = session.prepare([t for t in task_list if t.instance_id in wanted], need_base=False)
        routed = {t.instance_id: t for t in task_list} | {t.instance_id: t for t in prepared.tasks}
        # Graded again: into a scratch file (which resumes an interrupted run), then appended.
        graded_into = options.output.with_name(options.output.name + ".again") if options.again else options.output
        with session.backend(Needs(docker=1)) as backend, stage(reporter, "verifying", len(predictions)):
            batch = verify_batch(
                session.client, routed, predictions, graded_into, workers=options.workers, timeout_s=options.timeout,
                log_dir=options.log_dir, limits=grading_limits(options.containers, options.network), base_image=prepared.base,
                on_done=lambda _v: reporter.advance(**node_counts(backend)), backend=backend, registry=options.containers.registry,
            )  # fmt: skip
    if options.again and not batch.errors:
        _append_verdicts(graded_into, options.output)
    return VerifySummary(
        options.output, batch.verdicts, batch.skipped, batch.errors, unreadable, prepared.problems, batch.per_node, options.network
    )


def _append_verdicts(scratch: Path, output: Path) -> None:
    """A finished run's verdicts join the output's; the scratch file goes."""
    if not scratch.exists():
        return
    with JsonlWriter(output, fsync=True) as writer:
        for _number, text in iter_lines(scratch):
            writer.write(json.loads(text))
    scratch.unlink()


# ---------------------------------------------------------------- a pool


@dataclass
class PoolVerifySummary:
    counts: Counter[str]  # what happened to each trajectory read this time, by what
    resolved: int  # in the whole output (also the trajectories a previous run wrote)
    unreadable: list[str]  # pool lines that are not trajectories (left out of the output)
    errors: list[str]  # gradings that failed: those trajectories are not written, a rerun grades them
    image_problems: list[str]
    per_node: dict[str, int]
    network_needed: int = 0  # graded now, unresolved offline with tests that needed the network
    network: bool = False  # graded with the network on


GRADED_WHEN_COLLECTED = "graded when collected"
GRADED_NOW = "graded now"
KEPT_IMPORTED = "kept the imported grade (no task or no final patch)"
IMPORTED_NOT_REVERIFIED = "kept the imported grade, not re-verified ([verify] again = true grades it)"
UNGRADABLE = "ungradable (no task or no final patch)"


def imported_grade(trajectory: Trajectory) -> bool:
    """The outcome is the source's own grade (``verdict.imported_from``), never verified here."""
    verdict = trajectory.outcome.verdict if trajectory.outcome is not None else None
    return bool(verdict and verdict.get("imported_from") and not verdict.get("re_verified"))


def needs_grading(trajectory: Trajectory, *, again: bool = False) -> bool:
    """Never graded; or, ``again``, only graded by the source it was imported from. A
    trajectory graded right after its episode (collect) keeps its outcome, and so does an
    imported grade unless asked (``[verify] again``)."""
    outcome = trajectory.outcome
    if outcome is None or (outcome.resolved is None and outcome.reward is None):
        return True
    return again and imported_grade(trajectory)


def _resumed(partial: Path) -> tuple[set[str], int]:
    """Ids and resolved count of what an interrupted run already wrote."""
    done: set[str] = set()
    resolved = 0
    if partial.exists():
        for trajectory in read_trajectories_lenient(partial, []):
            done.add(trajectory.id)
            resolved += bool(trajectory.outcome and trajectory.outcome.resolved)
    return done, resolved


@dataclass
class _PoolGrader:
    """One chunk at a time: route and prepare the chunk's new tasks, grade its distinct
    (task, patch) pairs through verify_batch into a scratch file (which a crashed run leaves
    behind and the next one resumes from), then hand back each pair's verdict."""

    options: PoolVerifyOptions
    session: ContainerSession
    backend: object
    tasks: dict[str, Task] | None = None  # loaded when the first trajectory needs grading
    routed: dict[str, Task] = field(default_factory=dict)
    base: str | None = None
    problems: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    per_node: Counter[str] = field(default_factory=Counter)
    network_needed: int = 0

    @property
    def scratch(self) -> Path:
        return self.options.verdicts.with_name(self.options.verdicts.name + ".chunk")

    def task(self, task_id: str | None) -> Task | None:
        if self.tasks is None:
            task_list, problems = load_task_list(self.options.tasks)
            self.tasks = {t.instance_id: t for t in task_list}
            self.problems += problems
        return self.tasks.get(task_id or "")

    def grade(self, pairs: dict[tuple[str, str], str]) -> dict[tuple[str, str], Verdict]:
        from envs.batch import Prediction, verify_batch
        from envs.verify import Verdict

        assert self.tasks is not None
        new = [self.tasks[iid] for iid in dict.fromkeys(iid for iid, _ in pairs) if iid not in self.routed]
        if new:
            prepared = self.session.prepare(new, need_base=False)
            self.routed.update({t.instance_id: t for t in prepared.tasks})
            self.base = self.base or prepared.base
            self.problems += [p for p in prepared.problems if p not in self.problems]
        batch = verify_batch(
            self.session.client, self.routed, [Prediction(iid, patch) for (iid, _), patch in pairs.items()], self.scratch,
            timeout_s=self.options.timeout, log_dir=self.options.log_dir, limits=grading_limits(self.options.containers, self.options.network),
            base_image=self.base, backend=self.backend, registry=self.options.containers.registry,  # type: ignore[arg-type]
        )  # fmt: skip
        self.errors += batch.errors
        self.per_node.update(batch.per_node)
        graded: dict[tuple[str, str], Verdict] = {}
        for _number, text in iter_lines(self.scratch):
            verdict = Verdict.model_validate_json(text)
            graded[(verdict.instance_id, verdict.patch_hash)] = verdict
        self.network_needed += sum(bool(v.network_needed) and not v.resolved for v in graded.values())
        return graded

    def keep(self) -> None:
        """The chunk's verdicts join the others; the scratch file goes."""
        if not self.scratch.exists():
            return
        with JsonlWriter(self.options.verdicts, fsync=True) as writer:
            for _number, text in iter_lines(self.scratch):
                writer.write(json.loads(text))
        self.scratch.unlink()


def verify_pool(options: PoolVerifyOptions, reporter: Reporter = SILENT) -> PoolVerifySummary:
    """Grade the trajectories of ``options.pool`` that need it (``needs_grading``) and write
    every readable one to ``options.output`` in the pool's order. Imported grades are kept (counted
    as not re-verified); with ``options.again`` they are graded again where the task and a final
    patch exist, and kept where not. When a grading fails,
    the output stays ``.partial`` and a rerun grades what is left."""
    from envs.verify import patch_hash
    from harness.collect import outcome_of

    partial = options.output.with_name(options.output.name + ".partial")
    done, resolved = _resumed(partial)
    counts: Counter[str] = Counter()
    unreadable: list[RecordError] = []
    with container_session(options.containers, reporter) as session, session.backend(Needs(docker=1)) as cluster:
        backend = cluster or LocalBackend(options.workers)
        grader = _PoolGrader(options, session, backend)
        chunk_size = options.chunk or max(64, 8 * backend.slots())
        chunk: list[tuple[Trajectory, tuple[str, str] | None]] = []  # with its (task, patch hash) when graded now
        pairs: dict[tuple[str, str], str] = {}

        def flush(writer: JsonlWriter) -> None:
            nonlocal resolved
            graded = grader.grade(pairs) if pairs else {}
            for trajectory, key in chunk:
                if key is not None:
                    if key not in graded:
                        continue  # its grading failed (grader.errors says why): a rerun grades it
                    trajectory.outcome = outcome_of(graded[key])
                    counts[GRADED_NOW] += 1
                writer.write(trajectory)
                resolved += bool(trajectory.outcome and trajectory.outcome.resolved)
                reporter.advance(**node_counts(cluster))
            grader.keep()
            chunk.clear()
            pairs.clear()

        try:
            with JsonlWriter(partial, fsync=True) as writer, stage(reporter, "verifying", count_records(options.pool) - len(done)):
                for _line, trajectory in iter_pool(options.pool, unreadable):
                    if trajectory.id in done:
                        continue
                    key = None
                    if not needs_grading(trajectory, again=options.again):
                        counts[IMPORTED_NOT_REVERIFIED if imported_grade(trajectory) else GRADED_WHEN_COLLECTED] += 1
                    elif not trajectory.final_patch or grader.task(trajectory.task_id) is None:
                        counts[KEPT_IMPORTED if imported_grade(trajectory) else UNGRADABLE] += 1
                    else:
                        key = (trajectory.task_id or "", patch_hash(trajectory.final_patch))
                        pairs[key] = trajectory.final_patch
                    chunk.append((trajectory, key))
                    if len(chunk) >= chunk_size:
                        flush(writer)
                flush(writer)
        finally:
            if cluster is None:
                backend.close()
    if not grader.errors:
        partial.replace(options.output)
    return PoolVerifySummary(
        counts, resolved, [str(e) for e in unreadable], grader.errors, grader.problems, dict(grader.per_node), grader.network_needed,
        options.network,
    )  # fmt: skip
