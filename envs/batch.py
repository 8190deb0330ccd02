"""Verifying many patches: predictions in, verdicts appended, resumable.

Predictions use SWE-bench's format (``instance_id``, ``model_name_or_path``,
``model_patch``) as JSON Lines, a JSON list, or a ``{instance_id: prediction}`` map
(mini-swe-agent's ``preds.json``). A verdict is keyed by (instance_id, patch hash):
a rerun skips every pair already in the output, so no container runs twice.

Every prediction row that names its instance gets a verdict row: one refused when the file is
read (a ``model_patch`` or ``model_name_or_path`` of the wrong type, or a string UTF-8 cannot
write, such as a lone surrogate from a JSON ``\\ud800`` escape) is written as a refused verdict
with the file, line and field, without a container. Only a row with no usable ``instance_id``
(or a line that is not JSON) is reported without one: there is no task to key it by.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker

from envs.docker_backend import DEFAULT_LIMITS, Limits
from envs.executor import Backend, LocalBackend, NodeLost, run_units
from envs.images import image_name, node_image, task_image
from envs.tasks import Task
from envs.verify import Verdict, patch_hash, verify
from records.pools import JsonlWriter, RecordError, iter_lines, json_problem, parse_json_line


@dataclass
class Prediction:
    instance_id: str
    patch: str | None
    model_name_or_path: str | None = None
    # Why the row was refused when it was read (file:line: field: why): it gets a refused
    # verdict and is never applied. Its ``patch`` is then only hashed (for a field that is no
    # string, its JSON text), so that a rerun finds the verdict.
    refused: str | None = None


def load_predictions(path: Path) -> tuple[list[Prediction], list[RecordError]]:
    errors: list[RecordError] = []
    rows: list[tuple[int | None, Any]] = []
    if path.suffix == ".json":
        text = path.read_text()
        try:
            document = json.loads(text)
        except json.JSONDecodeError:
            line, message = json_problem(text)
            return [], [RecordError(str(path), line, None, message)]
        if isinstance(document, dict):
            for key, value in document.items():
                if not isinstance(value, dict):
                    errors.append(RecordError(str(path), None, f"{key!a}", f"expected an object, got {type(value).__name__}"))
            document = [
                dict(value, instance_id=value.get("instance_id", key)) for key, value in document.items() if isinstance(value, dict)
            ]
        rows = [(index, row) for index, row in enumerate(document, start=1)] if isinstance(document, list) else []
    else:
        try:
            for number, text in iter_lines(path):
                try:
                    rows.append((number, parse_json_line(path, number, text)))
                except RecordError as exc:
                    errors.append(exc)
        except RecordError as exc:
            errors.append(exc)
    predictions = []
    for line, row in rows:
        if not isinstance(row, dict) or not isinstance(row.get("instance_id"), str):
            errors.append(RecordError(str(path), line, "instance_id", "missing or not a string"))
            continue
        problem = _row_problem(row)
        if problem is not None and problem[0] == "instance_id":  # no task to key a verdict by
            errors.append(RecordError(str(path), line, problem[0], problem[1]))
            continue
        if problem is not None:  # refused alone, with a verdict that says where and why
            reason = str(RecordError(str(path), line, problem[0], problem[1]))
            patch, model = row.get("model_patch"), row.get("model_name_or_path")
            predictions.append(
                Prediction(
                    row["instance_id"],
                    patch if isinstance(patch, str) or patch is None else json.dumps(patch),
                    model if isinstance(model, str) else None,
                    refused=reason,
                )
            )
            continue
        predictions.append(Prediction(row["instance_id"], row.get("model_patch"), row.get("model_name_or_path")))
    return predictions, errors


def _row_problem(row: dict[str, Any]) -> tuple[str, str] | None:
    """(field, why) for a prediction row that cannot be graded, else None: a field of the
    wrong type, or a string UTF-8 cannot write (a lone surrogate from a JSON escape)."""
    for name in ("instance_id", "model_patch", "model_name_or_path"):
        value = row.get(name)
        if value is None:
            continue
        if not isinstance(value, str):
            return name, f"expected string, got {type(value).__name__}"
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            return name, f"not valid Unicode ({exc.reason} at offset {exc.start})"
    return None


def done_pairs(path: Path) -> set[tuple[str, str]]:
    pairs: set[tuple[str, str]] = set()
    if not path.exists():
        return pairs
    for _number, text in iter_lines(path):
        try:
            row = json.loads(text)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and "instance_id" in row and "patch_hash" in row:
            pairs.add((row["instance_id"], row["patch_hash"]))
    return pairs


@dataclass
class BatchSummary:
    verdicts: list[Verdict] = field(default_factory=list)
    skipped: int = 0
    errors: list[str] = field(default_factory=list)
    per_node: dict[str, int] = field(default_factory=dict)  # verdicts by node


def verify_batch(
    client: docker.DockerClient,
    tasks: dict[str, Task],
    predictions: list[Prediction],
    output: Path,
    *,
    workers: int = 1,
    timeout_s: float = 1800.0,
    log_dir: Path | None = None,
    limits: Limits = DEFAULT_LIMITS,
    base_image: str | None = None,
    on_done: Callable[[Verdict | None], None] | None = None,
    backend: Backend | None = None,
    infra_retries: int = 1,
    registry: str | None = None,
) -> BatchSummary:
    """Grade every prediction not yet in ``output`` on ``backend`` (default: ``workers``
    threads here; see envs.executor for a Ray cluster); only this process writes it.
    ``registry`` (HOST[/NS]): whoever grades pulls the task's image from there when it
    lacks it, and nothing is built here."""
    summary = BatchSummary()
    finished = done_pairs(output)
    todo = []
    refused: list[Verdict] = []  # written without a container
    for prediction in predictions:
        if prediction.instance_id not in tasks:
            summary.errors.append(f"{prediction.instance_id}: no such task")
            continue
        try:
            key = (prediction.instance_id, patch_hash(prediction.patch))
        except (TypeError, AttributeError, UnicodeError) as exc:  # a malformed prediction is refused alone
            summary.errors.append(f"{prediction.instance_id!a}: the prediction cannot be read ({type(exc).__name__}: {exc})")
            continue
        if key in finished:
            summary.skipped += 1
            continue
        problem = _row_problem({"model_name_or_path": prediction.model_name_or_path})
        if prediction.refused is not None or problem is not None:  # refused alone, with its verdict; the batch goes on
            reason = prediction.refused or f"{problem[0]}: {problem[1]}"  # type: ignore[index]
            refused.append(refused_verdict(tasks[prediction.instance_id], prediction, key[1], reason))
            finished.add(key)
            continue
        todo.append(prediction)

    # Images first, one at a time: builds share layers and Docker serialises them anyway.
    images: dict[str, str] = {}
    for instance_id in dict.fromkeys(p.instance_id for p in todo):
        try:
            task = tasks[instance_id]
            images[instance_id] = image_name(task) if registry is not None else task_image(client, task, base_image)
        except (RuntimeError, ValueError) as exc:
            summary.errors.append(f"{instance_id}: {exc}")

    runner = backend or LocalBackend(workers)
    grade = Grading(runner.engine(client), tasks, images, log_dir, timeout_s, limits, base_image, registry)
    try:
        with JsonlWriter(output, fsync=True) as writer:

            def finished(_prediction: Prediction | None, verdict: Verdict) -> None:
                writer.write(verdict.model_dump(mode="json"))
                summary.verdicts.append(verdict)
                if on_done:
                    on_done(verdict)

            for verdict in refused:
                finished(None, verdict)

            def failed(prediction: Prediction, exc: BaseException, _tries: int) -> bool:
                # One broken run must not stop the batch; a node lost mid-run is retried.
                if isinstance(exc, NodeLost) and _tries <= infra_retries:
                    return True
                summary.errors.append(f"{prediction.instance_id}: {type(exc).__name__}: {exc}")
                if on_done:
                    on_done(None)
                return False

            summary.per_node = run_units(
                runner, [p for p in todo if p.instance_id in images], grade, on_result=finished, on_error=failed
            ).per_node
    finally:
        if backend is None:
            runner.close()
    return summary


def refused_verdict(task: Task, prediction: Prediction, key: str, reason: str) -> Verdict:
    """The verdict of a prediction refused before grading: no container, the reason said."""
    try:
        image = image_name(task)
    except (RuntimeError, ValueError):
        image = ""
    model = prediction.model_name_or_path
    if model is not None and _row_problem({"model_name_or_path": model}) is not None:
        model = model.encode("utf-8", "backslashreplace").decode("utf-8")  # a label UTF-8 can write
    return Verdict(
        instance_id=task.instance_id,
        patch_hash=key,
        resolved=False,
        reward=0.0,
        patch_exists=bool(prediction.patch and prediction.patch.strip()),
        patch_applied=False,
        image=image,
        refused=[f"the prediction was refused: {reason}"],
        error=f"the prediction was refused: {reason}",
        model_name_or_path=model,
    )


@dataclass(frozen=True)
class Grading:
    """One verify work unit's function: a prediction in, its verdict out (picklable for a
    cluster, where ``engine`` opens the node's Docker engine and the image is made
    present there first)."""

    engine: Callable[[], docker.DockerClient]
    tasks: dict[str, Task]
    images: dict[str, str]
    log_dir: Path | None
    timeout_s: float
    limits: Limits
    base_image: str | None
    registry: str | None = None

    def __call__(self, prediction: Prediction) -> Verdict:
        client = self.engine()
        task, image = self.tasks[prediction.instance_id], self.images[prediction.instance_id]
        node_image(client, task, image, self.base_image, self.registry)
        return verify(
            client,
            task,
            prediction.patch,
            image,
            log_dir=self.log_dir,
            timeout_s=self.timeout_s,
            limits=self.limits,
            model_name_or_path=prediction.model_name_or_path,
        )
