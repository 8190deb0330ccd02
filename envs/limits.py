"""What one container may use, apart from the engine that enforces it (``envs.docker_backend``),
so that the verbs' declarations can name the defaults without importing the Docker SDK."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Limits:
    # Two CPUs at most, not one: a test suite may ask how many cores it has, and pylint 2.15's
    # --jobs tests skip on one (pylint-dev__pylint-7277's gold graded unresolved: a skip line
    # names no test, so swebench's parser misses a PASS_TO_PASS test). The official harness
    # limits nothing. A limit caps a container; it reserves nothing.
    cpus: float = 2.0
    memory_mb: int = 2048
    pids: int = 512
    network: bool = False

    def to_dict(self) -> dict[str, float | int | bool]:
        return {"cpus": self.cpus, "memory_mb": self.memory_mb, "pids": self.pids, "network": self.network}


DEFAULT_LIMITS = Limits()
