"""Harbor trials (``harbor run`` job folders): one trajectory per trial, with the trial's grade.

A trial folder holds ``config.json`` (the trial's ``TrialConfig``) and, once it finished,
``result.json`` (``TrialResult``); a job folder holds its trials beside its own ``config.json``
and ``result.json`` (job statistics, which are not a trial and are skipped). ``discover`` finds
each trial's ``result.json``, or its ``config.json`` where the trial never wrote a result (a
crashed trial, counted and not imported).

The agent's trajectory comes from the richest source the trial holds (``TRAJECTORY_SOURCES``):
Codex's raw rollout (``agent/sessions/**/rollout-*.jsonl``, read by the ``codex`` importer,
lossless) where present, else Harbor's ATIF file ``agent/trajectory.json`` (read by the
``atif`` importer, sub-agents as links). ``source.meta.trajectory`` says which was read.

Read off ``result.json``: the task (``task_name``; Harbor's ``task_id`` object kept), the
trial's name and id (the pool id is ``harbor-<result id>``: a re-import adds nothing), the
policy (``agent_info.model_info``, the agent itself kept), usage and cost (``agent_result``),
timings, the exit status (``exception_info``, mapped by ``EXIT_STATUSES``; the exception kept),
the grade (``verifier_result.rewards``: the imported outcome, resolved by ``min_reward`` on
``reward_key``, every key kept, with the tail of ``verifier/test-stdout.txt`` as the verifier's
evidence), the RL run's token ids (``agent_result.rollout_details``, first element the main
agent: one turn per model call, put on the generated assistant messages as the chat policy
records them), and a final patch the trial kept among its ``artifacts/``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import msgspec

from harness.importers import atif, codex
from harness.importers.base import (
    Diagnostics,
    Fields,
    ImportResult,
    conversion_error,
    fail,
    imported_outcome,
    number,
    read_json_document,
)
from records.trajectory import ExitStatus, Policy, Source, Trajectory, TrajectoryLink, Usage

FORMAT = "harbor"
TRAJECTORY_SOURCES = ("auto", "rollout", "atif")
# How much of the verifier's output the outcome keeps for the judges (the whole file stays in
# the trial folder, named by ``verdict_ref``): what relearn's own verdicts keep of a test log.
TEST_OUTPUT_TAIL = 4000
PATCH_SUFFIXES = (".diff", ".patch")

# Harbor's exception types (``harbor.models.trial.error_policy``, the agents' and litellm's
# errors) as relearn's exit statuses. A verifier failure is no exit of the agent's: the episode
# ended as it would have, and the grade is missing instead.
EXIT_STATUSES: dict[str, ExitStatus] = {
    "AgentTimeoutError": ExitStatus.time_exhausted,
    "ContextWindowExceededError": ExitStatus.context_overflow,
    "ContextLengthExceededError": ExitStatus.context_overflow,
    "OutputTokenExceededError": ExitStatus.tokens_exhausted,
    "OutputLengthExceededError": ExitStatus.tokens_exhausted,
    "BudgetExceededError": ExitStatus.cost_exhausted,
    "ApiUsageLimitError": ExitStatus.cost_exhausted,
    "NonZeroAgentExitCodeError": ExitStatus.aborted,
    "CancelledError": ExitStatus.aborted,
    **dict.fromkeys(
        (
            "EnvironmentStartTimeoutError", "SandboxBuildFailedError", "AgentSetupTimeoutError", "HealthcheckError",
            "SandboxLikelyOutOfMemoryError", "MemoryLimitExceededError", "SSHAccessError", "GKEExecStreamClosedError",
            "GKEPodNotFoundError", "RuntimeRequestError", "AddTestsDirError", "DownloadVerifierDirError",
            "ServiceOperationsUnsupportedError",
        ),
        ExitStatus.env_error,
    ),
    **dict.fromkeys(
        (
            "ApiError", "ApiRateLimitError", "ApiInternalServerError", "ApiOverloadedError", "ApiConnectionClosedError",
            "ApiResponseStalledError", "UnknownApiError", "NetworkConnectionError", "ApiConnectionError", "RateLimitError",
            "InternalServerError", "ServiceUnavailableError", "APIConnectionError", "APIError", "Timeout",
            "UnsupportedModelParametersError", "BadRequestError", "UnprocessableEntityError", "UnsupportedParamsError",
            "APIResponseValidationError", "AgentAuthenticationError", "ModelNotFoundError", "ApiProviderResourceNotFoundError",
            "AuthenticationError", "PermissionDeniedError", "NotFoundError", "AgentSafetyRefusalError", "ContentPolicyViolationError",
        ),
        ExitStatus.policy_error,
    ),
}  # fmt: skip
VERIFIER_ERRORS = frozenset(
    {"VerifierTimeoutError", "RewardFileNotFoundError", "RewardFileEmptyError", "VerifierOutputParseError", "RegradeError"}
)
# Exceptions after which Harbor holds the reward invalid (``ErrorPolicy.has_valid_reward``):
# read from result.json's ``reward_valid`` where it has one (Harbor >= 0.26), else from this.
INVALID_REWARD = (
    frozenset(name for name, status in EXIT_STATUSES.items() if status in (ExitStatus.env_error, ExitStatus.policy_error))
    - {"AgentSafetyRefusalError", "ContentPolicyViolationError"}
    | {"BudgetExceededError", "ApiUsageLimitError", "CancelledError"}
    | VERIFIER_ERRORS
)

# Why a trial gave no trajectory, as the import summary counts them.
NO_RESULT = "no result.json (the trial did not finish)"
NO_TRAJECTORY = "no agent trajectory"


@dataclass(frozen=True)
class HarborOptions:
    """``trajectory``: which of the trial's sources to read (``TRAJECTORY_SOURCES``);
    ``min_reward``: the least reward that counts as resolved; ``reward_key``: the key of
    ``verifier_result.rewards`` that decides (a single key decides whatever its name)."""

    trajectory: str = "auto"
    min_reward: float = 1.0
    reward_key: str = "reward"


class HarborImporter:
    """The ``harbor`` importer configured for one run; offers ``discover``/``read`` as an
    importer module does."""

    def __init__(self, options: HarborOptions) -> None:
        if options.trajectory not in TRAJECTORY_SOURCES:
            raise ValueError(f"trajectory source {options.trajectory!r}: one of {', '.join(TRAJECTORY_SOURCES)}")
        self.options = options

    def discover(self, root: Path) -> list[Path]:
        return discover(root)

    def read(self, path: Path, *, salvage: bool = False) -> Iterator[ImportResult]:
        return read(path, salvage=salvage, options=self.options)


# ---------------------------------------------------------------- finding trials


class _ModelInfo(msgspec.Struct):
    name: str | None = None


class _AgentInfo(msgspec.Struct):
    name: str | None = None
    model_info: _ModelInfo | None = None


class _Shape(msgspec.Struct):
    """The keys that tell a trial's documents from a job's (and number its attempts)."""

    trial_name: str | None = None
    task_name: str | None = None
    task: dict[str, Any] | None = None
    started_at: str | None = None
    agent_info: _AgentInfo | None = None


_SHAPE = msgspec.json.Decoder(_Shape)


def _shape(path: Path) -> _Shape | None:
    try:
        return _SHAPE.decode(path.read_bytes())
    except (OSError, msgspec.DecodeError):
        return None


def is_trial_result(path: Path) -> bool:
    shape = _shape(path)
    return shape is not None and shape.trial_name is not None and shape.task_name is not None


def is_trial_config(path: Path) -> bool:
    shape = _shape(path)
    return shape is not None and shape.trial_name is not None and shape.task is not None


def discover(root: Path) -> list[Path]:
    """Each trial under ``root`` (a trial, a job, or a folder of jobs): its ``result.json``,
    or its ``config.json`` where it wrote none. A job's own result.json (statistics) and
    config.json (no ``trial_name``) are not trials."""
    found: list[Path] = []
    for config in sorted(root.rglob("config.json")):
        if not config.is_file() or not is_trial_config(config):
            continue
        result = config.with_name("result.json")
        found.append(result if result.is_file() else config)
    # A trial folder copied without its config.json still has its result.
    listed = {p.parent for p in found}
    found += [p for p in sorted(root.rglob("result.json")) if p.parent not in listed and p.is_file() and is_trial_result(p)]
    return sorted(found)


# ---------------------------------------------------------------- reading one trial


def read(path: Path, *, salvage: bool = False, options: HarborOptions | None = None) -> Iterator[ImportResult]:
    """The trial's trajectory (and its sub-agents'), or why it has none (``skipped``), or the
    located error that rejects it."""
    chosen = options or HarborOptions()
    diagnostics = Diagnostics(str(path))
    if path.name == "config.json":
        yield ImportResult(str(path), None, None, diagnostics, skipped=NO_RESULT)
        return
    try:
        trial = _Trial(path, chosen, diagnostics, salvage)
        results = trial.convert()
    except Exception as exc:
        yield ImportResult(str(path), None, conversion_error(path, exc), diagnostics)
        return
    if not results:
        yield ImportResult(str(path), None, None, diagnostics, skipped=trial.skip_reason)
        return
    for trajectory in results:
        yield ImportResult(str(path), trajectory, None, diagnostics)


class _Trial:
    def __init__(self, path: Path, options: HarborOptions, diag: Diagnostics, salvage: bool) -> None:
        self.path = path
        self.dir = path.parent
        self.options = options
        self.diag = diag
        self.salvage = salvage
        self.skip_reason = NO_TRAJECTORY

    def convert(self) -> list[Trajectory]:
        name = str(self.path)
        top = Fields(read_json_document(self.path), name, None, "")
        trial_name = top.str("trial_name", required=True)
        task_name = top.str("task_name", required=True)
        agent_info = top.obj("agent_info")
        agent_name = agent_info.str("name") if agent_info is not None else None
        exception = top.obj("exception_info")
        exception_type = exception.str("exception_type") if exception is not None else None

        found = self.agent_trajectory()
        if found is None:
            why = f"agent {agent_name}" if agent_name else "no agent named"
            if exception_type:
                why += f", {exception_type}"
            self.skip_reason = f"{NO_TRAJECTORY} ({why})"
            return []
        kind, trajectories, inner = found
        main = trajectories[0]

        main.task_id = task_name
        main.attempt = _attempts(self.dir.parent).get(trial_name or "")
        main.policy = _policy(agent_info, main.policy)
        agent_result = top.obj("agent_result")
        if agent_result is not None:
            main.usage = Usage(
                input_tokens=agent_result.get("n_input_tokens", int),
                cached_input_tokens=agent_result.get("n_cache_tokens", int),
                output_tokens=agent_result.get("n_output_tokens", int),
                cost_usd=number(agent_result.get("cost_usd", (int, float))),
            )
        main.started_at = top.str("started_at") or main.started_at
        main.finished_at = top.str("finished_at") or main.finished_at
        main.exit_status = self.exit_status(exception_type, main.exit_status)
        main.final_patch = self.final_patch()
        main.outcome = self.outcome(top, exception_type)
        rollout_rest = self.place_token_ids(agent_result, main)

        given_id = top.str("id")
        read_id, main.id = main.id, f"harbor-{given_id}" if given_id else f"harbor-{trial_name}"
        meta: dict[str, Any] = {
            "trial_name": trial_name,
            "trial_uri": top.str("trial_uri"),
            "task_name": task_name,
            "task_id": top.data.get("task_id"),
            "task_checksum": top.str("task_checksum"),
            "dataset": top.data.get("source"),
            "agent": agent_info.data if agent_info is not None else None,
            "trajectory": {
                "source": kind,
                "format": inner.format,
                "format_version": inner.format_version,
                "path": inner.path,
                "meta": inner.meta,
            },
            "exception": exception.data if exception is not None else None,
            "timings": {key: top.data.get(key) for key in ("environment_setup", "agent_setup", "agent_execution", "verifier")},
            "agent_metadata": agent_result.data.get("metadata") if agent_result is not None else None,
            "model_usage": agent_result.data.get("model_usage") if agent_result is not None else None,
            "rollout_details": rollout_rest,
            "step_results": top.data.get("step_results"),
            "verifier_environment_mode": top.data.get("verifier_environment_mode"),
        }
        # ``config`` (the TrialConfig) is not copied: it can carry the agent's environment, API
        # keys included, and stays in the trial's result.json and config.json (``source.path``).
        known = {
            "schema_version", "id", "task_name", "trial_name", "trial_uri", "task_id", "source", "task_checksum", "config",
            "agent_info", "agent_result", "verifier_result", "verifier_environment_mode", "exception_info", "started_at",
            "finished_at", "environment_setup", "agent_setup", "agent_execution", "verifier", "step_results", "reward_valid",
        }  # fmt: skip
        for key in top.data:
            if key not in known:
                self.diag.unknown_kind(None, f"result.json field {key!r}")
                meta[key] = top.data[key]
        main.source = Source(
            format=FORMAT,
            format_version=f"TrialResult v{top.data.get('schema_version', 1)}",
            path=name,
            meta={k: v for k, v in meta.items() if v is not None},
            records=inner.records,
            warnings=self.diag.warnings or None,
        )
        for child in trajectories[1:]:
            child.task_id = task_name
            child.policy = child.policy if child.policy.name else Policy(name=main.policy.name, provider=main.policy.provider)
            for link in child.links or []:
                if link.relation == "parent" and link.trajectory_id in (None, read_id):
                    link.trajectory_id = main.id  # the reader linked the id it gave; the pool's is Harbor's
            if child.source is not None:
                child.source.meta = {**(child.source.meta or {}), "harbor_trial": trial_name, "harbor_source": kind}
        return trajectories

    # ---- the agent's trajectory

    def agent_trajectory(self) -> tuple[str, list[Trajectory], Source] | None:
        """(which source, the main trajectory then its sub-agents', the reader's own source)."""
        choice = self.options.trajectory
        rollouts = sorted(p for p in (self.dir / "agent" / "sessions").rglob("rollout-*") if p.name.endswith(codex.SUFFIXES))
        atif_file = self.dir / "agent" / "trajectory.json"
        if rollouts and choice in ("auto", "rollout"):
            return "codex-rollout", *self.read_rollouts(rollouts)
        if atif_file.is_file() and choice in ("auto", "atif"):
            return "atif", *self.read_inner(atif.read(atif_file, salvage=self.salvage))
        if choice != "auto" and (rollouts or atif_file.is_file()):
            other = "rollout" if choice == "atif" else "atif"
            self.diag.warn(None, f"no {choice} trajectory in the trial (it has a {other} one; --trajectory auto reads it)")
        return None

    def read_inner(self, results: Iterator[ImportResult]) -> tuple[list[Trajectory], Source]:
        """What another importer read (the first its main trajectory), with the first's source."""
        trajectories: list[Trajectory] = []
        for result in results:
            if result.error is not None:
                raise result.error
            trajectory = result.trajectory
            assert trajectory is not None
            trajectories.append(trajectory)
            for warning in result.diagnostics.warnings:
                if warning not in self.diag.warnings:
                    self.diag.warnings.append(warning)
            self.diag.unknown.update(result.diagnostics.unknown)
        return trajectories, trajectories[0].source or Source(format="unknown")

    def read_rollouts(self, files: list[Path]) -> tuple[list[Trajectory], Source]:
        """The first rollout (by name: Codex names them by their start time) is the agent's;
        others (sub-agents Codex spawned) are imported as its sub-agents, linked."""
        main, inner = self.read_inner(codex.read(files[0], salvage=self.salvage))
        children = [t for path in files[1:] for t in self.read_inner(codex.read(path, salvage=self.salvage))[0]]
        for child in children:
            child.links = [*(child.links or []), TrajectoryLink(relation="parent", trajectory_id=None, resolved=True)]
            main[0].links = [*(main[0].links or []), TrajectoryLink(relation="subagent", trajectory_id=child.id, resolved=True)]
        return main + children, inner

    # ---- what result.json says of it

    def exit_status(self, exception_type: str | None, read: ExitStatus) -> ExitStatus:
        if exception_type is None or exception_type in VERIFIER_ERRORS:
            return read if read != ExitStatus.unknown else ExitStatus.submitted
        status = EXIT_STATUSES.get(exception_type)
        if status is None:
            self.diag.warn(None, f"exception_info.exception_type {exception_type!r} is not one relearn maps: exit status aborted")
            return ExitStatus.aborted
        return status

    def outcome(self, top: Fields, exception_type: str | None) -> Any:
        verifier = top.obj("verifier_result")
        rewards = verifier.get("rewards", dict) if verifier is not None else None
        if not rewards:
            return None
        for key, value in rewards.items():
            if number(value) is None:
                raise fail(top.path, None, f"verifier_result.rewards.{key}", f"expected a number, got {type(value).__name__}")
        key = self.options.reward_key
        if key not in rewards and len(rewards) == 1:
            key = next(iter(rewards))
        reward = number(rewards.get(key))
        valid = top.data.get("reward_valid")
        if not isinstance(valid, bool):
            valid = exception_type not in INVALID_REWARD
        details: dict[str, Any] = {"rewards": rewards, "reward_key": key, "min_reward": self.options.min_reward, "reward_valid": valid}
        if reward is None:
            self.diag.warn(None, f"verifier_result.rewards has no {self.options.reward_key!r} (keys: {', '.join(rewards)}): not graded")
            resolved = None
        else:
            resolved = valid and reward >= self.options.min_reward
        if exception_type is not None:
            details["exception_type"] = exception_type
        outcome = imported_outcome(FORMAT, reward=reward, resolved=resolved, details=details)
        if outcome is None:
            return None
        stdout = self.dir / "verifier" / "test-stdout.txt"
        if stdout.is_file():
            text = stdout.read_text(encoding="utf-8", errors="replace")
            outcome.verdict_ref = str(stdout)
            assert outcome.verdict is not None
            outcome.verdict["test_output"] = text[-TEST_OUTPUT_TAIL:]
            if len(text) > TEST_OUTPUT_TAIL:
                outcome.verdict["test_output_omitted_chars"] = len(text) - TEST_OUTPUT_TAIL
        return outcome

    def final_patch(self) -> str | None:
        """A diff the trial kept among its artifacts (a task's ``artifacts`` entry, or what the
        agent left in /logs/artifacts); with several, the largest, the others named."""
        folder = self.dir / "artifacts"
        if not folder.is_dir():
            return None
        patches = sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix in PATCH_SUFFIXES)
        texts = [(p, p.read_text(encoding="utf-8", errors="replace")) for p in patches]
        texts = [(p, t) for p, t in texts if t.strip()]
        if not texts:
            return None
        chosen, text = max(texts, key=lambda pt: len(pt[1]))
        if len(texts) > 1:
            others = ", ".join(str(p.relative_to(folder)) for p, _ in texts if p != chosen)
            self.diag.warn(None, f"artifacts/{chosen.relative_to(folder)} taken as the final patch (also: {others})")
        if "diff --git" not in text and not text.startswith(("--- ", "diff ")):
            self.diag.warn(None, f"artifacts/{chosen.relative_to(folder)} does not look like a diff; kept as the final patch anyway")
        return text

    def place_token_ids(self, agent_result: Fields | None, main: Trajectory) -> list[Any] | None:
        """``rollout_details[0]`` (the main agent) onto the generated assistant messages, one turn
        per model call: completion ids as ``token_ids``, logprobs, prompt ids as
        ``extra.prompt_token_ids`` (where the chat policy records them). What is not placed (the
        other segments, per-turn extras, all of it where the counts disagree) is returned to be
        kept under ``source.meta``."""
        details = agent_result.list("rollout_details") if agent_result is not None else []
        if not details:
            return None
        first = Fields(details[0], self.diag.path, None, "agent_result.rollout_details[0]")
        completions = first.list("completion_token_ids")
        prompts = first.list("prompt_token_ids")
        logprobs = first.list("logprobs")
        calls = [m for m in main.messages if m.role == "assistant" and m.generated]
        problem = None
        unplaced: dict[str, Any] = {}  # the turns past the messages, where the ids prove the pairing
        if (prompts and len(prompts) != len(completions)) or (logprobs and len(logprobs) != len(completions)):
            problem = f"{len(prompts)} prompts and {len(logprobs)} logprob lists for {len(completions)} turns"
        elif len(completions) != len(calls):
            problem = f"{len(completions)} turns, the trajectory {len(calls)} generated assistant messages"
            if len(completions) > len(calls) and calls and all(m.token_ids == completions[i] for i, m in enumerate(calls)):
                # The trajectory's own ids (ATIF metrics) prove which turns its messages are: the
                # first ones; the later calls made no step (a timeout while their command ran).
                self.diag.warn(
                    None,
                    f"agent_result.rollout_details[0]: {problem}; the messages' own ids match the first {len(calls)} turns: "
                    f"placed on them, the last {len(completions) - len(calls)} kept under source.meta.rollout_details",
                )
                unplaced = {
                    "prompt_token_ids": prompts[len(calls) :],
                    "completion_token_ids": completions[len(calls) :],
                    "logprobs": logprobs[len(calls) :],
                    "first_turn": len(calls),
                }
                completions, prompts, logprobs = completions[: len(calls)], prompts[: len(calls)], logprobs[: len(calls)]
                problem = None
        if problem is not None:
            self.diag.warn(
                None, f"agent_result.rollout_details[0]: {problem}: token ids not placed (kept under source.meta.rollout_details)"
            )
            return details
        for index, message in enumerate(calls):
            ids = completions[index]
            if not isinstance(ids, list) or not all(type(i) is int for i in ids):
                raise fail(
                    self.diag.path, None, f"agent_result.rollout_details[0].completion_token_ids[{index}]", "expected a list of integers"
                )
            if message.token_ids is not None and message.token_ids != ids:
                self.diag.warn(None, f"turn {index}: the trajectory's completion ids differ from rollout_details'; rollout_details' kept")
            message.token_ids = ids
            if logprobs:
                values = logprobs[index]
                message.logprobs = [float(v) for v in values] if isinstance(values, list) and len(values) == len(ids) else None
                if message.logprobs is None:
                    self.diag.warn(
                        None, f"turn {index}: {len(values) if isinstance(values, list) else 'no'} logprobs for {len(ids)} ids: not placed"
                    )
            if prompts:
                message.extra = {**(message.extra or {}), "prompt_token_ids": prompts[index]}
        rest = {k: v for k, v in first.data.items() if k not in ("completion_token_ids", "prompt_token_ids", "logprobs")}
        rest |= unplaced
        kept = ([rest] if rest else [{}]) + details[1:]
        return kept if any(kept) else None


def _policy(agent_info: Fields | None, read: Policy) -> Policy:
    model = agent_info.obj("model_info") if agent_info is not None else None
    name = (model.str("name") if model is not None else None) or read.name
    provider = (model.str("provider") if model is not None else None) or read.provider
    if name is None and agent_info is not None:
        name = agent_info.str("name")
    return Policy(name=name, provider=provider, checkpoint=read.checkpoint, step=read.step)


@lru_cache(maxsize=64)
def _attempts_cached(job: str, listing: tuple[str, ...]) -> dict[str, int]:
    """Trial name -> attempt (0, 1, ...) among the job's trials of the same task by the same
    agent and model, in the order they started (then by name): Harbor numbers no attempt, and a
    trial's id is its own."""
    by_task: dict[tuple[str, str | None, str | None], list[tuple[str, str]]] = {}
    for trial in listing:
        shape = _shape(Path(job) / trial / "result.json")
        if shape is None or shape.task_name is None or shape.trial_name is None:
            continue
        agent = shape.agent_info or _AgentInfo()
        key = (shape.task_name, agent.name, agent.model_info.name if agent.model_info else None)
        by_task.setdefault(key, []).append((shape.started_at or "", shape.trial_name))
    return {name: index for trials in by_task.values() for index, (_, name) in enumerate(sorted(trials))}


def _attempts(job: Path) -> dict[str, int]:
    try:
        listing = tuple(sorted(p.name for p in job.iterdir() if (p / "result.json").is_file()))
    except OSError:
        return {}
    return _attempts_cached(str(job), listing)
