"""Which image a task runs in, when the user says so: an image map (instance id -> image)
and an image template (``registry/ns/sweb.eval.{arch}.{instance_key}:{tag}``).

Teams mirror the SWE-bench images into their own registry under their own names, or load
them from tarballs under names of their own; the dataset row's ``image`` column names
Docker Hub's. A map entry wins over the template, the template over the row. A task routed
this way runs in exactly the image named (never one built here), and remembers where the
name came from (``Task.image_source``) so that errors and manifests can say so.
"""

from __future__ import annotations

import hashlib
import json
import platform
import re
import string
from dataclasses import dataclass, field
from pathlib import Path

from envs.tasks import Task
from records.pools import RecordError, json_problem

TEMPLATE_FIELDS = {
    "arch": "x86_64 or arm64, this machine's (as SWE-bench names its images)",
    "instance_id": "the instance id as the dataset spells it",
    "instance_key": "the instance id as Docker Hub's SWE-bench images spell it: lower case, `__` as `_1776_`",
    "tag": "the tag of the row's image column, else `latest`",
    "version": "the row's version",
    "repo": "owner/name, as the row's repo column",
    "repo_key": "the repository as owner__name",
}
# Docker's reference grammar, loosely: lower-case path components, then an optional tag or
# digest; a registry host[:port] in front when the first component has a dot, a port or
# is localhost (Docker's own rule).
PATH_REFERENCE = re.compile(
    r"^[a-z0-9]+(?:[._-]+[a-z0-9]+)*(?:/[a-z0-9]+(?:[._-]+[a-z0-9]+)*)*(?::[\w][\w.-]{0,127})?(?:@sha256:[0-9a-f]{64})?$"
)
HOST = re.compile(r"^[a-zA-Z0-9.-]+(?::\d+)?$")
SOURCE_ROW = "the dataset row's image column"


def machine_arch() -> str:
    return "arm64" if platform.machine().lower() in ("aarch64", "arm64") else "x86_64"


def instance_key(instance_id: str) -> str:
    """Docker Hub's spelling of an instance id in SWE-bench image names (no dunders there)."""
    return instance_id.replace("__", "_1776_").lower()


def check_reference(image: str, where: str) -> str:
    first, _, rest = image.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        ok = bool(HOST.match(first) and PATH_REFERENCE.match(rest))
    else:
        ok = bool(PATH_REFERENCE.match(image))
    if not ok:
        raise ValueError(f"{where}: {image!r} is not a Docker image name (lower-case name[:tag], optionally registry/ in front)")
    return image


def check_template(template: str) -> str:
    """The template itself, or ValueError naming the placeholder it does not know."""
    try:
        names = {name for _text, name, _spec, _conv in string.Formatter().parse(template) if name is not None}
    except ValueError as exc:
        raise ValueError(f"--image-template {template!r}: {exc}") from None
    unknown = sorted(names - set(TEMPLATE_FIELDS))
    if unknown or "" in names:
        known = ", ".join("{" + name + "}" for name in TEMPLATE_FIELDS)
        raise ValueError(
            f"--image-template {template!r}: unknown placeholder {', '.join('{' + n + '}' for n in unknown) or '{}'}; it knows {known}"
        )
    return template


def render_template(template: str, task: Task, arch: str | None = None) -> str:
    row_tag = task.image.rsplit(":", 1)[1] if task.image and ":" in task.image.rsplit("/", 1)[-1] else "latest"
    values = {
        "arch": arch or machine_arch(),
        "instance_id": task.instance_id,
        "instance_key": instance_key(task.instance_id),
        "tag": row_tag,
        "version": task.version,
        "repo": task.repo,
        "repo_key": task.repo.replace("/", "__"),
    }
    return check_reference(template.format(**values), f"--image-template for {task.instance_id}")


def load_image_map(path: Path) -> dict[str, str]:
    """Instance id -> image from a JSON object, JSON Lines rows (``instance_id``, ``image``)
    or text lines ``INSTANCE_ID IMAGE`` (``#`` starts a comment). RecordError names the
    file, line and field of the first bad entry."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise RecordError(str(path), None, None, f"cannot read the image map: {exc.strerror or exc}") from None
    mapping: dict[str, str] = {}
    try:
        document = _whole_json(text)
    except RecordError as exc:
        raise RecordError(str(path), exc.line, None, exc.message) from None
    if isinstance(document, dict) and "instance_id" not in document:  # (a JSONL row has one: no map has it as a key)
        for key, value in document.items():
            if not isinstance(value, str):
                raise RecordError(str(path), None, key, f"expected an image name (string), got {type(value).__name__}")
            try:
                mapping[key] = check_reference(value, str(path))
            except ValueError as exc:
                raise RecordError(str(path), None, key, str(exc).split(": ", 1)[-1]) from None
        return mapping
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("{"):
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                raise RecordError(str(path), number, None, json_problem(line)[1]) from None
            for key in ("instance_id", "image"):
                if not isinstance(row.get(key), str):
                    raise RecordError(str(path), number, key, "missing or not a string")
            instance_id, image = row["instance_id"], row["image"]
        else:
            parts = line.split("#", 1)[0].split()  # an image name never holds a `#`
            if len(parts) != 2:
                raise RecordError(str(path), number, None, f"expected `INSTANCE_ID IMAGE`, got {len(parts)} field(s)")
            instance_id, image = parts
        if instance_id in mapping and mapping[instance_id] != image:
            raise RecordError(str(path), number, instance_id, f"mapped twice: {mapping[instance_id]} and {image}")
        try:
            mapping[instance_id] = check_reference(image, str(path))
        except ValueError as exc:
            raise RecordError(str(path), number, "image", str(exc).split(": ", 1)[-1]) from None
    if not mapping:
        raise RecordError(str(path), None, None, "the image map names no image")
    return mapping


def _whole_json(text: str) -> object:
    """The text as one JSON document, None when it is lines; a broken JSON object is an
    error at its own line (not at a line-by-line reading's first line)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        first = text.lstrip().split("\n", 1)[0].strip()
        if first.startswith("{") and not first.endswith("}"):
            raise RecordError("", exc.lineno, None, f"invalid JSON: {exc.msg}") from None
        return None


@dataclass(frozen=True)
class ImageChoice:
    """What the user said about images: a map file, a template, both or neither."""

    mapping: dict[str, str] = field(default_factory=dict)
    map_path: str | None = None
    map_digest: str | None = None
    template: str | None = None

    @classmethod
    def from_options(cls, image_map: Path | None, template: str | None) -> ImageChoice:
        mapping: dict[str, str] = {}
        digest = None
        if image_map is not None:
            mapping = load_image_map(image_map)
            digest = hashlib.sha256(image_map.read_bytes()).hexdigest()[:16]
        return cls(mapping, str(image_map) if image_map else None, digest, check_template(template) if template else None)

    @property
    def given(self) -> bool:
        return bool(self.mapping or self.template)

    def image_for(self, task: Task) -> tuple[str | None, str]:
        """(image, where the name came from); image None when nothing names one."""
        if task.instance_id in self.mapping:
            return self.mapping[task.instance_id], f"--image-map {self.map_path}"
        if self.template:
            return render_template(self.template, task), f"--image-template {self.template}"
        return task.image, SOURCE_ROW

    def route(self, tasks: list[Task]) -> list[Task]:
        """Copies of the tasks, each naming the image it runs in and where that came from.
        Tasks nothing routes are returned as they are."""
        routed = []
        for task in tasks:
            image, source = self.image_for(task)
            routed.append(task if source == SOURCE_ROW else task.model_copy(update={"image": image, "image_source": source}))
        return routed

    def to_manifest(self) -> dict[str, object]:
        return {"image_map": self.map_path, "image_map_sha256": self.map_digest, "image_template": self.template}
