"""Named pools: ``--pool historical=a.jsonl --pool current=b.jsonl``, read record by record
with the line each record came from, so that every rejection can name its file and line."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from harness.jsonl import RecordError, iter_lines, parse_json_line, parse_trajectory
from harness.trajectory import Trajectory

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")


class PoolSpecError(ValueError):
    """A ``--pool`` argument that names no usable pool."""


@dataclass(frozen=True)
class NamedPool:
    name: str
    path: Path


def default_name(path: Path) -> str:
    name = path.name
    for suffix in (".zst", ".jsonl", ".json"):
        name = name.removesuffix(suffix)
    return name or path.name


def parse_pool(spec: str) -> NamedPool:
    """``NAME=PATH``, or a bare ``PATH`` named after its file. A path that itself contains
    ``=`` is taken whole when it exists, so such files need no quoting tricks."""
    name, sep, rest = spec.partition("=")
    if sep and NAME.match(name) and not Path(spec).exists():
        path = Path(rest)
    else:
        path, name = Path(spec), default_name(Path(spec))
        if not NAME.match(name):
            raise PoolSpecError(f"--pool {spec!r}: give it a name, as NAME=PATH (letters, digits, _ . + -)")
    if not path.is_file():
        raise PoolSpecError(f"--pool {spec!r}: no such file: {path}")
    return NamedPool(name, path)


def parse_pools(specs: list[str]) -> list[NamedPool]:
    if not specs:
        raise PoolSpecError("give at least one --pool NAME=PATH")
    pools = [parse_pool(spec) for spec in specs]
    seen: set[str] = set()
    for pool in pools:
        if pool.name in seen:
            raise PoolSpecError(f"two pools are named {pool.name!r}; name them apart with NAME=PATH")
        seen.add(pool.name)
    return pools


def iter_pool(path: Path, errors: list[RecordError], limit: int | None = None) -> Iterator[tuple[int, Trajectory]]:
    """``(line, trajectory)`` for each readable record among the first ``limit`` records; a bad
    record goes to ``errors`` (located) and the rest of the pool goes on."""
    seen = 0
    try:
        for number, text in iter_lines(path):
            if limit is not None and seen >= limit:
                return
            seen += 1
            try:
                yield number, parse_trajectory(path, number, parse_json_line(path, number, text))
            except RecordError as exc:
                errors.append(exc)
    except RecordError as exc:  # an unreadable file (not UTF-8, broken zstd): what was read stands
        errors.append(exc)


def count_records(path: Path, limit: int | None = None) -> int:
    """Records the progress bar will see (an unreadable file counts what can be read)."""
    count = 0
    try:
        for _ in iter_lines(path):
            count += 1
            if limit is not None and count >= limit:
                break
    except RecordError:
        pass
    return count
