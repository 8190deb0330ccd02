"""Importers: other tools' trajectory files into our Trajectory records.

Each importer module offers ``discover(root) -> paths`` (which files in a directory
tree are its own) and ``read(path, salvage=...) -> ImportResult...`` (one result per
trajectory, or one error that rejects the file; row formats give one per row).
"""

from __future__ import annotations

from harness.importers import atif, chat, codex, harbor, mini_swe_agent, nemo_gym, openhands, swe_agent, verl
from harness.importers.base import Importer

FORMATS: dict[str, Importer] = {
    "codex": codex,
    "mini-swe-agent": mini_swe_agent,
    "swe-agent": swe_agent,
    "atif": atif,
    "openhands": openhands,
    "chat": chat,
    "nemo-gym": nemo_gym,
    "verl": verl,
    "harbor": harbor,
}
