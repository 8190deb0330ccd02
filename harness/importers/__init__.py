"""Importers: other tools' trajectory files into our Trajectory records.

Each importer module offers ``discover(root) -> paths`` (which files in a directory
tree are its own) and ``read(path, salvage=...) -> ImportResult...`` (one result per
trajectory, or one error that rejects the file).
"""

from __future__ import annotations

from types import ModuleType

from harness.importers import atif, codex, mini_swe_agent, swe_agent

FORMATS: dict[str, ModuleType] = {
    "codex": codex,
    "mini-swe-agent": mini_swe_agent,
    "swe-agent": swe_agent,
    "atif": atif,
}
