"""An evaluation run: one policy endpoint × instances × a fixed budget × sampling × seed.

A run folder holds ``manifest.json`` (everything needed to reproduce and to compare
runs), the harness's collection layout (``trajectories.jsonl``, ``episodes/``,
``verify-logs/``, ``infra_errors.jsonl``), ``predictions.jsonl`` in SWE-bench format and
``reports/<instance>.json``. Rerunning into the same folder resumes it; a different
run (other model, budget, instances...) is refused there.

The agent is part of the scaffold: our own loop (``scaffold.version`` = the loop's
version), or the real Codex CLI (``scaffold.agent`` = ``codex-cli``, ``version`` = the
binary's, the digests of its config, model catalog entry, instructions and the exact
tool schemas it offers, learned by a probe run before any episode and written in full
under ``codex``). Runs of different scaffolds are never resumed into each other or
compared.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import docker

from envs.docker_backend import DEFAULT_LIMITS, Limits
from envs.executor import Backend
from envs.image_choice import ImageChoice
from envs.images import Prepared, prepare_images
from envs.tasks import Task
from eval.dataset import Selection, dataset_digest, load_dataset_tasks
from harness.agent import SCAFFOLD_VERSION, AgentConfig
from harness.budget import Budget
from harness.codex_cli import config as codex_setup
from harness.collect import CollectSummary, collect
from harness.policies.base import PolicySpec
from harness.policies.make import make_policy
from harness.tools.apply_patch import Semantics
from harness.tools.toolbox import SCHEMAS
from records.pools import RecordError, read_trajectories_lenient, write_atomic, write_text_atomic
from records.trajectory import Trajectory

# Fields of the manifest that make two runs the same run (resume) or comparable.
IDENTITY = ("scaffold", "budget", "dataset", "policy", "sampling", "seed")
# Where the policy is served is not what it is: a run resumed after its server moved to
# another port (a local server's port changes on every start) is the same run.
TRANSPORT = {"policy.base_url"}


class ManifestMismatch(ValueError):
    pass


@dataclass
class RunConfig:
    dataset: str
    spec: PolicySpec
    budget: Budget = field(default_factory=Budget)
    selection: Selection = field(default_factory=Selection)
    seed: int | None = None
    workers: int = 1
    spend_cap_usd: float | None = None
    infra_retries: int = 1
    # The real Codex CLI as the agent instead of our own loop.
    codex: codex_setup.CodexCliConfig | None = None
    apply_patch: Semantics = "codex"  # the builtin tool set's apply_patch semantics
    images: ImageChoice = field(default_factory=ImageChoice)  # --image-map / --image-template
    pull: bool = False
    limits: Limits = DEFAULT_LIMITS
    # --registry HOST[/NS]: whoever runs an instance pulls its image from there when it lacks it.
    registry: str | None = None


def tools_digest() -> str:
    return hashlib.sha256(json.dumps(SCHEMAS, sort_keys=True).encode()).hexdigest()[:16]


def make_manifest(config: RunConfig, tasks: list[Task], probed: dict[str, Any] | None = None) -> dict[str, Any]:
    """``probed``: what ``codex_setup.probe`` learned, for a codex-cli run."""
    spec = config.spec
    if config.codex is not None:
        if probed is None:
            raise ValueError("a codex-cli run's manifest needs the probe of its tool schemas")
        scaffold = codex_setup.scaffold(config.codex, spec.model, probed)
    else:
        scaffold = {
            "version": SCAFFOLD_VERSION, "tools_digest": tools_digest(), "tools": [t["function"]["name"] for t in SCHEMAS],
            "apply_patch": config.apply_patch,
        }  # fmt: skip
    manifest = {
        "scaffold": scaffold,
        "budget": config.budget.to_dict(),
        "dataset": {
            "source": config.dataset,
            "digest": dataset_digest(tasks),
            "instances": len(tasks),
            "selection": {
                "ids": list(config.selection.ids),
                "repos": list(config.selection.repos),
                "difficulties": list(config.selection.difficulties),
                "slice": config.selection.slice,
            },
        },
        "policy": {"kind": spec.kind, "model": spec.model, "base_url": spec.base_url, "checkpoint": spec.checkpoint, "step": spec.step},
        "sampling": spec.sampling,
        "seed": config.seed,
        "spend_cap_usd": config.spend_cap_usd,
        "instances": {t.instance_id: {"repo": t.repo, "difficulty": t.difficulty} for t in tasks},
        # Where each instance ran: the image names (their digests are added as the run
        # goes, under image_digests), how they were chosen, the containers' limits.
        "environment": {
            **config.images.to_manifest(),
            "pull": config.pull,
            "limits": config.limits.to_dict(),
            "images": {t.instance_id: t.image for t in tasks},
        },
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    if config.codex is not None:
        assert probed is not None
        codex = config.codex
        manifest["codex"] = {
            "version": codex.install.version_string,
            "package_integrity": codex.install.integrity,
            "binary_sha256": codex.install.sha256.get("codex"),
            "tool_schemas": probed["tools"],
            "config_toml": codex_setup.toml(
                codex_setup.codex_config(codex, spec.model, "http://<relay>/v1", codex_setup.CODEX_HOME, spec.timeout_s)
            ),
            "catalog_entry_digest": scaffold["catalog_digest"],
        }
    return manifest


def differences(a: dict[str, Any], b: dict[str, Any], keys: tuple[str, ...] = IDENTITY) -> list[str]:
    """Dotted names of the fields where two manifests differ, with both values."""
    out: list[str] = []

    def walk(x: Any, y: Any, name: str) -> None:
        if name in TRANSPORT:
            return
        if isinstance(x, dict) and isinstance(y, dict):
            for key in sorted(set(x) | set(y)):
                walk(x.get(key), y.get(key), f"{name}.{key}")
        elif x != y:
            out.append(f"{name}: {x!r} vs {y!r}")

    for key in keys:
        walk(a.get(key), b.get(key), key)
    return out


def load_manifest(run_dir: Path) -> dict[str, Any]:
    path = run_dir / "manifest.json"
    if not path.is_file():
        raise FileNotFoundError(f"{run_dir} is not a run folder (no manifest.json)")
    return json.loads(path.read_text())


def latest_trajectories(run_dir: Path, errors: list[RecordError]) -> dict[str, Trajectory]:
    """Each instance's trajectory (attempt 0 of this run's policy)."""
    by_task: dict[str, Trajectory] = {}
    pool = run_dir / "trajectories.jsonl"
    if pool.exists():
        for trajectory in read_trajectories_lenient(pool, errors):
            by_task[trajectory.task_id or trajectory.id] = trajectory
    return by_task


def run_eval(
    client: docker.DockerClient,
    config: RunConfig,
    out: Path,
    *,
    base_image: str | None = None,
    on_done: Callable[[Trajectory | None], None] | None = None,
    prepare: Callable[[list[Task]], Prepared] | None = None,
    backend: Backend | None = None,
) -> tuple[CollectSummary, int]:
    """Run (or resume) the evaluation; returns the collection summary and the number of
    selected instances. ``prepare`` routes the selected tasks to their images and gets
    them (default: ``envs.images.prepare_images`` with the run's image options); the base
    image is built only when a task or the codex-cli relay needs it. ``backend``: where the
    instances run (default: ``config.workers`` threads here; envs.executor for a cluster)."""
    all_tasks, load_errors = load_dataset_tasks(config.dataset)
    if load_errors and not all_tasks:
        raise ValueError(f"no readable instances in {config.dataset}: {load_errors[0]}")
    tasks = config.selection.apply(all_tasks)
    if prepare is None:
        prepared = prepare_images(
            client,
            tasks,
            config.images,
            pull=config.pull,
            need_base=config.codex is not None,
            base=base_image,
            log=lambda _m: None,
            registry=config.registry,
        )
    else:
        prepared = prepare(tasks)
    tasks = prepared.tasks
    base_image = base_image or prepared.base
    spec = config.spec
    if config.seed is not None:
        spec.sampling = {**spec.sampling, "seed": config.seed}
    probed = codex_setup.probe(config.codex, spec.model) if config.codex is not None else None
    manifest = make_manifest(config, tasks, probed)
    out.mkdir(parents=True, exist_ok=True)
    if (out / "manifest.json").exists():
        existing = load_manifest(out)
        changed = differences(existing, manifest)
        if existing.get("environment", {}).get("images") is not None:  # runs from before it was recorded resume as they were
            changed += differences(existing["environment"], manifest["environment"], ("images",))
        if changed:
            raise ManifestMismatch(f"{out} holds another run; it differs in: " + "; ".join(changed))
        manifest["created"] = existing["created"]
    write_text_atomic(out / "manifest.json", json.dumps(manifest, indent=1, sort_keys=True))
    summary = collect(
        client,
        tasks,
        make_policy(spec),
        spec,
        out,
        attempts=1,
        workers=config.workers,
        config=AgentConfig(budget=config.budget, apply_patch=config.apply_patch),
        base_image=base_image,
        spend_cap_usd=config.spend_cap_usd,
        infra_retries=config.infra_retries,
        on_done=on_done,
        codex=config.codex,
        limits=config.limits,
        backend=backend,
        registry=config.registry,
    )
    finalize(out, manifest)
    return summary, len(tasks)


def finalize(out: Path, manifest: dict[str, Any]) -> None:
    """predictions.jsonl, per-instance reports and image digests from what the run holds."""
    errors: list[RecordError] = []
    trajectories = latest_trajectories(out, errors)
    model = manifest["policy"]["model"]
    write_atomic(
        out / "predictions.jsonl",
        ({"instance_id": iid, "model_name_or_path": model, "model_patch": t.final_patch or ""} for iid, t in sorted(trajectories.items())),
    )
    digests: dict[str, str] = {}
    for iid, trajectory in trajectories.items():
        verdict = (trajectory.outcome.verdict if trajectory.outcome else None) or {}
        if verdict.get("image_digest"):
            digests[iid] = verdict["image_digest"]
        report = {
            "instance_id": iid,
            "resolved": bool(trajectory.outcome and trajectory.outcome.resolved),
            "exit_status": trajectory.exit_status.value,
            "tests": verdict.get("tests"),
            "patch_applied": verdict.get("patch_applied"),
            "error": verdict.get("error"),
            "log": trajectory.outcome.verdict_ref if trajectory.outcome else None,
        }
        write_text_atomic(out / "reports" / f"{iid}.json", json.dumps(report, indent=1, sort_keys=True))
    manifest["image_digests"] = dict(sorted(digests.items()))
    write_text_atomic(out / "manifest.json", json.dumps(manifest, indent=1, sort_keys=True))
