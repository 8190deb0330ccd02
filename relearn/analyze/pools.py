"""Named pools on the command line: ``--pool historical=a.jsonl --pool current=b.jsonl``
(read with ``records.pools.iter_pool``, which gives each record's line)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

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
