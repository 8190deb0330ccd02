"""What `relearn verify` accepts, and the pipeline's ``[verify]`` of its pool; the work is ``relearn.ops.verify``."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from relearn.options import nested, option
from relearn.verbs.containers import ContainerOptions, tasks_option

POOL_GRADED = "the pipeline grades its pool and writes the graded pool and the verdicts in its work folder"


@dataclass
class VerifyOptions:
    """``relearn verify``: the predictions (SWE-bench rows: instance_id, model_patch), the
    tasks, and where the verdicts are appended (finished pairs are skipped)."""

    patches: Path = option(
        help="Predictions: JSONL/JSON rows of instance_id, model_patch (SWE-bench format).", flags=("--patches", "-p"), exists="file",
        front="cli", why=POOL_GRADED,
    )  # fmt: skip
    tasks: str = tasks_option()
    output: Path = option(
        Path("verdicts.jsonl"), "Verdicts JSONL (appended; finished pairs are skipped).", flags=("-o", "--output"), metavar="FILE",
        front="cli", why=POOL_GRADED,
    )  # fmt: skip
    workers: int = option(1, "Containers at once.", ge=1)
    timeout: float = option(1800.0, "Seconds for one test run.", gt=0, metavar="SECONDS")
    log_dir: Path | None = option(
        None, "Keep each full test log here.", metavar="DIR", front="cli", why="the pipeline keeps them in its work folder's verify-logs/"
    )
    again: bool = option(
        False,
        "Grade again what was graded before. In the pipeline: trajectories whose grade was imported from the tool that ran them (a Harbor trial's verifier, NeMo Gym's, a dataset's resolved column) are graded here where their task and a final patch exist; without it the imported grade is kept, and the summary says it was imported, not re-verified. With --patches: the predictions the verdicts file already holds are graded again, their new verdicts appended after the old (the last verdict of a pair is the one that counts).",
    )
    network: bool = option(
        False,
        "Grade with the network on, as the official SWE-bench harness grades (its containers have the network). Without it the grading container has no network at all, and a listed test that reaches the internet fails (psf__requests-2317's tests call httpbin.org, sphinx-doc__sphinx-8269's linkcheck tests www.google.com): its verdict stays unresolved and names those tests in network_needed. "
        "The risk: the patch under test runs during its tests, so with the network on its code can reach anything the engine's bridge network reaches (this machine's services, your network, the internet), to fetch or to send. Turn it on only for patches you would let run with that reach. Recorded in every verdict's limits (network: true) and in the summary.",
        flag_only=True,
    )  # fmt: skip
    containers: ContainerOptions = nested(ContainerOptions)


@dataclass
class PoolVerifyOptions:
    """The pipeline's verify stage: grade what ``pool`` has not graded and write the pool, in
    its order, to ``output`` (through ``output``.partial: resumed by trajectory id). Every
    verdict is appended to ``verdicts``. ``chunk``: trajectories held at once while their
    patches are graded (0: 8 per slot, at least 64), so memory does not grow with the pool.
    ``again``: imported grades are graded here where they can be (else kept). ``network``:
    the grading containers have the network (``VerifyOptions.network``)."""

    pool: Path
    output: Path
    verdicts: Path
    tasks: str = "mini"
    workers: int = VerifyOptions.workers
    timeout: float = VerifyOptions.timeout
    log_dir: Path | None = None
    containers: ContainerOptions = field(default_factory=ContainerOptions)
    chunk: int = 0
    again: bool = False
    network: bool = False
