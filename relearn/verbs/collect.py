"""What `relearn collect` and `relearn replay` accept (the pipeline's ``[pool.collect]``), with the
agent, endpoint and budget options `relearn eval run` shares; the work is ``relearn.ops.collect``."""

from __future__ import annotations

import typing
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from harness.tools.apply_patch import Semantics
from relearn.options import nested, option
from relearn.verbs.containers import ContainerOptions, tasks_option

if TYPE_CHECKING:
    pass


Agent = Literal["builtin", "codex-cli"]
AGENTS = typing.get_args(Agent)


@dataclass
class AgentOptions:
    """Who acts in the container, with which tools, and what it asks the endpoint for
    (``relearn collect`` and ``relearn eval run``)."""

    agent: Agent = option(
        "builtin",
        "builtin: our Codex-style loop | codex-cli: the real Codex CLI in the container, talking to the endpoint through the relearn gateway (needs a Responses endpoint).",
    )
    policy: Literal["chat", "responses", "anthropic"] | None = option(
        None,
        "Endpoint protocol: chat (OpenAI-compatible, vLLM/SGLang; the builtin default), responses (codex-cli's only one) or anthropic.",
    )
    apply_patch: Semantics = option(
        "codex",
        "The builtin tool set's apply_patch semantics: codex (Codex's own: an added file or a move overwrites what is there, and a failing operation keeps the ones before it) or strict (refuse those overwrites, and change nothing when any operation fails). Recorded with every episode; runs that differ are not compared.",
    )
    reasoning_effort: str | None = option("medium", "codex-cli: model_reasoning_effort (low | medium | high | xhigh).", metavar="LEVEL")
    token_ids: bool | None = option(
        None,
        "Ask the server for the sampled token ids (vLLM: return_token_ids for chat, enable_response_messages for responses), which relearn masks trains on. Default: asked by the builtin agent, not by codex-cli. --no-token-ids for servers that refuse fields they do not know, such as api.openai.com.",
    )

    def request_token_ids(self) -> bool:
        return self.token_ids if self.token_ids is not None else self.agent == "builtin"


@dataclass
class EndpointOptions:
    """The policy's endpoint, what each call asks of it and what it costs (``relearn collect``
    and ``relearn eval run``; the pipeline's eval serves its model itself and takes only
    ``temperature`` of these)."""

    base_url: str | None = option(None, "Endpoint URL, e.g. http://localhost:8000/v1.", metavar="URL")
    api_key_env: str | None = option(
        None, "Environment variable holding the API key (default: OPENAI_API_KEY, or ANTHROPIC_API_KEY for anthropic).", metavar="NAME"
    )
    temperature: float | None = option(None, "Sampling temperature.")
    max_output_tokens: int | None = option(None, "Per-call output token limit.", ge=1)
    price_in: float = option(0.0, "USD per million input tokens.", ge=0)
    price_out: float = option(0.0, "USD per million output tokens.", ge=0)
    checkpoint: str | None = option(None, "Checkpoint the endpoint serves (stamped on every trajectory).", metavar="NAME")


@dataclass
class BudgetOptions:
    """What one episode may spend (``harness.budget.Budget``); an eval instance is one episode."""

    max_turns: int | None = option(50, "Budget: model calls per episode.")
    max_tokens: int | None = option(None, "Budget: input+output tokens per episode.")
    max_seconds: float | None = option(None, "Budget: wall-clock seconds per episode.")
    max_cost: float | None = option(None, "Budget: USD per episode.", gt=0)


@dataclass
class CollectOptions:
    """Run a policy on tasks × attempts in containers, verify each episode, and write a pool.

    Resumable by (task, policy, attempt): rerun the same command after a crash and only the unfinished episodes run.

    With --ray, each episode is a Ray task on a node offering the docker resource (its image is built or loaded there, once per node, or pulled from --registry); a node lost mid-episode is retried on another, and only this process writes the pool.
    """

    out: Path = option(
        help="Output folder: trajectories.jsonl, episodes/, verify-logs/.", flags=("--out",), metavar="DIR",
        front="cli", why="the pipeline names its pool folder",
    )  # fmt: skip
    model: str = option(help="Model name the endpoint serves.", metavar="NAME")
    tasks: str = tasks_option()
    ids: list[str] | None = option(None, "Only these tasks (repeatable).", flags=("--id",), metavar="ID")
    agent: AgentOptions = nested(AgentOptions)
    endpoint: EndpointOptions = nested(EndpointOptions)
    step: int | None = option(None, "Training step of that checkpoint.")
    attempts: int = option(1, "Attempts per task.", ge=1)
    workers: int = option(1, "Episodes at once.", ge=1)
    budget: BudgetOptions = nested(BudgetOptions)
    containers: ContainerOptions = nested(ContainerOptions)


@dataclass
class ReplayOptions:
    """Re-execute recorded tool calls in fresh containers; report the first divergence and verify the final patch.

    Exits 1 when any trajectory does not reproduce.
    """

    pool: Path = option(help="Pool of trajectories.", argument=True, metavar="POOL", exists="file")
    tasks: str = tasks_option()
    ids: list[str] | None = option(None, "Only these trajectory ids (repeatable).", flags=("--id",), metavar="ID")
    verify: bool = option(True, "Verify the replayed final patch.")
    containers: ContainerOptions = nested(ContainerOptions)
