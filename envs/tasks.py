"""Task records and their loaders: SWE-bench (4.x/5.x columns), OpenSWE, Harbor folders,
and the bundled mini suite.

A task says what the agent is asked (``problem_statement``), where it works (an image
with the repository at ``base_commit`` in ``workdir``), and how the result is graded:
SWE-bench's eval script and log parser (FAIL_TO_PASS / PASS_TO_PASS), OpenSWE's
``OPENSWE_EXIT_CODE`` marker, or a Harbor ``tests/test.sh`` writing a reward file.

An OpenSWE row (GAIR-NLP/OpenSWE: ``openswe_oss.jsonl``, ``openswe_other.jsonl``) names its
image in ``image_name`` and carries the ``Dockerfile`` that builds it and the ``eval_script``
that grades it; a row without an eval script is refused where it is read (relearn never
grades such a task by running the repository's whole test suite in its place).
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from records.pools import RecordError, iter_lines, json_problem, parse_json_line, validation_error

TaskKind = Literal["swebench", "openswe", "harbor"]
# What an OpenSWE eval script prints after its tests, and the columns only OpenSWE rows have
# (SWE-bench rows name their image `image` and carry no Dockerfile).
OPENSWE_MARKER = "OPENSWE_EXIT_CODE"
OPENSWE_COLUMNS = ("image_name", "Dockerfile")


class Task(BaseModel):
    model_config = ConfigDict(extra="allow")

    instance_id: str
    kind: TaskKind = "swebench"
    repo: str = ""
    base_commit: str | None = None
    problem_statement: str
    patch: str = ""  # the gold patch
    test_patch: str = ""
    FAIL_TO_PASS: list[str] = []
    PASS_TO_PASS: list[str] = []
    version: str = ""
    environment_setup_commit: str | None = None
    hints_text: str = ""
    created_at: str | None = None
    difficulty: str | None = None
    eval_script: str | None = None
    log_parser: str | None = None
    eval_type: str = "pass_and_fail"
    image: str | None = None
    # Where ``image`` came from when the user chose it (``envs.image_choice``): such a task
    # runs in exactly that image, never one built here. None: the task's own.
    image_source: str | None = None
    image_assets: Any = None
    workdir: str = "/testbed"
    # Files the grader resets before applying the test patch; edits a candidate makes
    # to them are reverted and flagged.
    test_files: list[str] = []
    # Harbor: the task folder, and verifier settings from task.toml.
    task_dir: str | None = None
    verifier_timeout_s: float | None = None
    network: bool = False
    cpus: float | None = None
    memory_mb: int | None = None
    # OpenSWE: the PR's last commit (an image that holds it gives the fix away: envs.audit) and
    # the row's Dockerfile, which builds the image when it is not on the engine (envs.images).
    end_commit: str | None = None
    dockerfile: str | None = None

    @field_validator("FAIL_TO_PASS", "PASS_TO_PASS", "test_files", mode="before")
    @classmethod
    def _json_list(cls, value: Any) -> Any:
        # SWE-bench ships these as JSON-encoded strings.
        if isinstance(value, str):
            try:
                return json.loads(value) if value.strip() else []
            except json.JSONDecodeError as exc:
                raise ValueError(f"not a JSON list: {exc.msg}") from None
        return value


def _task(path: Path, line: int | None, data: Any, kind: TaskKind | None = None) -> Task:
    if not isinstance(data, dict):
        raise RecordError(str(path), line, None, f"expected an object, got {type(data).__name__}")
    record = dict(data)
    if kind is None:
        kind = "openswe" if _is_openswe(record) else "swebench"
    record.setdefault("kind", kind)
    if record["kind"] == "openswe":
        record = _openswe_record(path, line, record)
    try:
        task = Task.model_validate(record)
    except ValidationError as exc:
        raise validation_error(path, line, exc) from None
    if task.kind == "swebench" and not (task.FAIL_TO_PASS or task.PASS_TO_PASS) and task.eval_type != "fail_only":
        raise RecordError(str(path), line, "FAIL_TO_PASS", "empty: a SWE-bench task needs tests to grade")
    if not task.test_files and task.test_patch:
        task.test_files = patch_files(task.test_patch)
    return task


def _is_openswe(record: dict[str, Any]) -> bool:
    script = record.get("eval_script")
    if isinstance(script, str) and OPENSWE_MARKER in script:
        return True
    if any(column in record for column in OPENSWE_COLUMNS):
        return True
    # OpenSWE's own schema (its README: instance_id ... end_commit, language) has no test lists;
    # released rows that carry FAIL_TO_PASS / PASS_TO_PASS leave them empty.
    return "end_commit" in record and not any(record.get(key) not in (None, "", "[]", []) for key in ("FAIL_TO_PASS", "PASS_TO_PASS"))


def _openswe_record(path: Path, line: int | None, record: dict[str, Any]) -> dict[str, Any]:
    """An OpenSWE row in Task's terms: ``image_name`` is its image, ``Dockerfile`` what builds
    it. RecordError for a row that cannot be graded: no eval script, or one that prints no
    ``OPENSWE_EXIT_CODE`` (the whole test suite is never run in its place)."""
    out = dict(record)
    name = out.pop("image_name", None)
    if name is not None:
        if not isinstance(name, str) or not name.strip():
            raise RecordError(str(path), line, "image_name", "empty: expected the name of the task's Docker image")
        out["image"] = openswe_image(name)
    if "Dockerfile" in out:
        out["dockerfile"] = out.pop("Dockerfile")
    script = out.get("eval_script")
    if not isinstance(script, str) or not script.strip():
        raise RecordError(
            str(path),
            line,
            "eval_script",
            "missing: an OpenSWE task is graded by the OPENSWE_EXIT_CODE its eval script prints; the task is refused "
            "(relearn does not run the repository's whole test suite in its place)",
        )
    if OPENSWE_MARKER not in script:
        raise RecordError(str(path), line, "eval_script", f"prints no {OPENSWE_MARKER}=<n> line: nothing grades the task")
    return out


def openswe_image(name: str) -> str:
    """``image_name`` as Docker names it: OpenSWE's aliases can be mixed case, and Docker takes
    repository names in lower case only (as verifiers' OpenSWE taskset lower-cases them); a
    tag keeps its case."""
    reference, at, digest = name.strip().partition("@")
    head, colon, tag = reference.rpartition(":")
    reference = f"{head.lower()}:{tag}" if colon and "/" not in tag else reference.lower()  # `host:5000/x` has no tag
    return reference + at + digest


def patch_files(patch: str) -> list[str]:
    """Paths a unified diff touches (both sides of renames, without a/ b/)."""
    files: list[str] = []
    for line in patch.splitlines():
        if line.startswith("diff --git "):
            parts = line.split(" ")
            for part in parts[2:4]:
                name = part[2:] if part[:2] in ("a/", "b/") else part
                if name not in files and name != "/dev/null":
                    files.append(name)
        elif line.startswith(("--- ", "+++ ")) and not files:
            name = line[4:].split("\t")[0]
            name = name[2:] if name[:2] in ("a/", "b/") else name
            if name != "/dev/null" and name not in files:
                files.append(name)
    return files


def load_harbor_task(folder: Path) -> Task:
    """A Harbor task folder: instruction.md, task.toml, environment/, tests/test.sh."""
    name = str(folder)
    instruction = folder / "instruction.md"
    if not instruction.is_file():
        raise RecordError(name, None, "instruction.md", "missing")
    if not (folder / "tests" / "test.sh").is_file():
        raise RecordError(name, None, "tests/test.sh", "missing")
    config: dict[str, Any] = {}
    toml_path = folder / "task.toml"
    if toml_path.is_file():
        try:
            config = tomllib.loads(toml_path.read_text())
        except tomllib.TOMLDecodeError as exc:
            raise RecordError(str(toml_path), None, None, f"invalid TOML: {exc}") from None
    environment = config.get("environment") or {}
    verifier = config.get("verifier") or {}
    agent = config.get("agent") or {}
    if not (folder / "environment" / "Dockerfile").is_file() and not environment.get("docker_image"):
        raise RecordError(name, None, "environment/Dockerfile", "missing, and task.toml names no environment.docker_image")
    metadata = config.get("metadata") or {}
    return Task(
        instance_id=(config.get("task") or {}).get("name") or folder.name,
        kind="harbor",
        repo=str(metadata.get("repo", "")),
        problem_statement=instruction.read_text(),
        image=environment.get("docker_image"),
        workdir=environment.get("workdir") or "/app",
        task_dir=str(folder.resolve()),
        verifier_timeout_s=float(verifier.get("timeout_sec", 600)),
        network=bool(environment.get("allow_internet", False)) or agent.get("network_mode") == "public",
        cpus=environment.get("cpus"),
        memory_mb=environment.get("memory_mb"),
        difficulty=metadata.get("difficulty"),
    )


def load_mini_task(folder: Path) -> Task:
    """A task of the bundled mini suite: task.json, repo/, gold.patch, test.patch."""
    meta_path = folder / "task.json"
    text = meta_path.read_text()
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        line, message = json_problem(text)
        raise RecordError(str(meta_path), line, None, message) from None
    for name in ("gold.patch", "test.patch"):
        if not (folder / name).is_file():
            raise RecordError(str(folder), None, name, "missing")
    data["patch"] = (folder / "gold.patch").read_text()
    data["test_patch"] = (folder / "test.patch").read_text()
    data["task_dir"] = str(folder.resolve())
    return _task(meta_path, None, data, "swebench")


def _iter_file(path: Path) -> Iterator[Task | RecordError]:
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            rows = pq.read_table(path).to_pylist()
        except Exception as exc:  # pyarrow raises several types for a bad file
            yield RecordError(str(path), None, None, f"not a readable Parquet file: {exc}")
            return
        for index, row in enumerate(rows, start=1):
            try:
                yield _task(path, index, row)
            except RecordError as exc:
                yield exc
    elif suffix == ".json":
        try:
            document = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            yield RecordError(str(path), None, None, f"invalid JSON: {exc}")
            return
        rows = document if isinstance(document, list) else [document]
        for index, row in enumerate(rows, start=1):
            try:
                yield _task(path, index, row)
            except RecordError as exc:
                yield exc
    else:
        try:
            for number, text in iter_lines(path):
                try:
                    yield _task(path, number, parse_json_line(path, number, text))
                except RecordError as exc:
                    yield exc
        except RecordError as exc:
            yield exc


def iter_tasks(path: Path) -> Iterator[Task | RecordError]:
    """Every task at ``path`` (a file, a task folder or a folder of task folders), and
    a located error for each that could not be read."""
    if path.is_file():
        yield from _iter_file(path)
        return
    if not path.is_dir():
        yield RecordError(str(path), None, None, "no such file or directory")
        return
    folders = [path] if _is_task_folder(path) else sorted(p for p in path.iterdir() if p.is_dir() and _is_task_folder(p))
    if not folders:
        yield RecordError(str(path), None, None, "no tasks: expected task.json (mini suite) or instruction.md (Harbor) folders")
    for folder in folders:
        try:
            yield load_mini_task(folder) if (folder / "task.json").is_file() else load_harbor_task(folder)
        except RecordError as exc:
            yield exc


def _is_task_folder(folder: Path) -> bool:
    return (folder / "task.json").is_file() or (folder / "instruction.md").is_file()


def load_tasks(path: Path) -> tuple[list[Task], list[RecordError]]:
    tasks: list[Task] = []
    errors: list[RecordError] = []
    for item in iter_tasks(path):
        (errors if isinstance(item, RecordError) else tasks).append(item)  # type: ignore[arg-type]
    return tasks, errors
