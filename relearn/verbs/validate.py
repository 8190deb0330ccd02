"""What `relearn validate` accepts; the work is ``relearn.ops.validate``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from relearn.options import option


@dataclass
class ValidateOptions:
    """Check pools: records parse, ids are unique, tool results answer earlier calls.

    Reads each pool once, one trajectory at a time. Lists each problem with its file, line and field; exits 1 when there is any, 2 when a pool file is missing.
    """

    pools: list[Path] = option(help="Pool files (.jsonl or .jsonl.zst).", argument=True, metavar="POOL")
