"""PIPELINE.toml: one file says what every stage does.

    workdir = "runs/exp1"            # relative to this file's folder; every stage writes under it
    tasks = "mini"                   # mini | a SWE-bench .jsonl/.json/.parquet | a Harbor folder

    [pool]                           # where the trajectories come from: collect OR import
    collect = { model = "ckpt-29", base_url = "http://gpu:8000/v1", policy = "chat", checkpoint = "iter-29", step = 29, attempts = 4 }
    # import = { format = "codex", paths = ["~/.codex/sessions"] }
    # single_turn = { tasks = "mini" }   # Math/Code/IF rollouts: single-turn verifiers, keep-interval review

    [review]                         # no judge1: the offline heuristic reviewer
    judge1 = "claude-sonnet-4-5"
    backend = "anthropic"

    [masks]
    tokenizer = "qwen3.6"
    variants = ["ross", "ross-nomask", "positive"]
    heldout_tasks = ["astropy__astropy-12907"]   # no variant trains on these tasks' trajectories

    [train]                          # one run per mask variant, all from the same start
    init = "/models/Qwen3-1.7B"      # or tiny = "qwen3"
    epochs = 3

    [analyze]                        # NLL of kept (A \\ E) and excluded (E) tokens, training pool and held-out
    bootstrap = 10000

    [eval]                           # the start ("upstream") and every trained variant, same budget
    dataset = "mini"
    max_turns = 20

Paths are relative to the file's folder. A field nobody reads is an error, not a silent
no-op: a typo would otherwise run a different experiment than the one written down.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from review.reading import DEFAULT_JUDGE_CONTEXT

VARIANTS = ("ross", "ross-nomask", "positive")
# The paper's names for the variants, in the order its tables put them.
VARIANT_NAMES = {"upstream": "Upstream", "positive": "Positive-Rollout SFT", "ross-nomask": "ROSS w/o mask", "ross": "ROSS"}


class PipelineError(ValueError):
    """The pipeline file cannot be used (names the file and the field)."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CollectConfig(_Strict):
    model: str
    ids: list[str] | None = None  # only these tasks (default: all of `tasks`)
    base_url: str | None = None
    policy: Literal["chat", "responses", "anthropic"] = "chat"
    api_key_env: str | None = None
    checkpoint: str | None = None
    step: int | None = None
    attempts: int = Field(1, ge=1)
    workers: int = Field(1, ge=1)
    max_turns: int | None = 50
    max_tokens: int | None = None
    max_seconds: float | None = None
    temperature: float | None = None


class ImportConfig(_Strict):
    format: Literal["codex", "mini-swe-agent", "swe-agent", "atif"]
    paths: list[str]


class SingleTurnConfig(_Strict):
    """A pool of single-turn RL rollouts (Math, Code, instruction following): imported from
    row dumps, graded by the single-turn verifiers, reviewed with keep intervals."""

    tasks: str = "mini"  # the shipped mini suite, or a tasks .jsonl (envs.single_turn.tasks)
    paths: list[str] | None = None  # rollout files or folders (default with tasks = "mini": the suite's rollouts)
    format: Literal["rows", "verl", "openrlhf", "chat"] = "rows"  # a row preset, or chat-message records with one assistant turn
    columns: dict[str, str] = Field(default_factory=dict)  # column overrides: prompt, response, reward, step, task_id, id, checkpoint
    # Train in the template's thinking form (reasoning inside <think>, as sampled) or its
    # no-thinking form (reasoning and answer as visible text after the template's empty block).
    thinking: bool = True

    @model_validator(mode="after")
    def known_columns(self) -> SingleTurnConfig:
        allowed = {"prompt", "response", "reward", "step", "task_id", "id", "checkpoint", "token_ids", "logprobs"}
        unknown = sorted(set(self.columns) - allowed)
        if unknown:
            raise ValueError(f"columns: unknown {', '.join(unknown)} (known: {', '.join(sorted(allowed))})")
        if self.format == "chat" and self.columns:
            raise ValueError("columns apply to the row formats, not chat")
        if self.tasks != "mini" and not self.paths:
            raise ValueError("paths: name the rollout files of your own tasks")
        return self


class PoolConfig(_Strict):
    collect: CollectConfig | None = None
    import_: ImportConfig | None = Field(None, alias="import")
    single_turn: SingleTurnConfig | None = None

    @model_validator(mode="after")
    def one_source(self) -> PoolConfig:
        if sum(x is not None for x in (self.collect, self.import_, self.single_turn)) != 1:
            raise ValueError("give exactly one of [pool.collect] or [pool.import] (or [pool.single_turn] for single-turn rollouts)")
        return self


class ReviewConfig(_Strict):
    judge1: str | None = None
    judge2: str | None = None
    backend: Literal["anthropic", "chat", "responses"] = "anthropic"
    base_url: str | None = None
    api_key_env: str | None = None
    workers: int = Field(4, ge=1)
    spend_cap_usd: float | None = None
    judge_context: int = Field(DEFAULT_JUDGE_CONTEXT, ge=1000)  # tokens of prompt a judge reads at most


class MasksConfig(_Strict):
    tokenizer: str = "qwen3.6"
    ctx: int = Field(65536, ge=1)
    variants: list[Literal["ross", "ross-nomask", "positive"]] = Field(default_factory=lambda: list(VARIANTS))
    # Task ids whose trajectories every variant leaves out (the same for all), so that the
    # analyze stage has verified, reviewed trajectories no model was trained on. None: none.
    heldout_tasks: list[str] | None = None
    # action: a defect in a tool call excludes the whole call; minimal: only its quote (the ablation).
    defect_scope: Literal["action", "minimal"] = "action"

    @model_validator(mode="after")
    def distinct(self) -> MasksConfig:
        if self.heldout_tasks is not None and len(set(self.heldout_tasks)) != len(self.heldout_tasks):
            raise ValueError("heldout_tasks: a task id is named twice")
        if len(set(self.variants)) != len(self.variants):
            raise ValueError("variants: a variant is named twice")
        return self


class TrainConfig(_Strict):
    init: str | None = None
    tiny: Literal["qwen3", "qwen3-moe", "qwen3.5-moe"] | None = None
    ctx: int = Field(65536, ge=1)
    epochs: int = Field(3, ge=1)
    lr: float = 1e-5
    warmup: float = 0.03
    grad_accum: int = Field(1, ge=1)
    loss_norm: Literal["trajectory", "token"] = "trajectory"
    bf16: bool = False
    seed: int = 0
    max_steps: int | None = None

    @model_validator(mode="after")
    def one_start(self) -> TrainConfig:
        if (self.init is None) == (self.tiny is None):
            raise ValueError("give exactly one of init (a model folder) or tiny")
        return self


class AnalyzeConfig(_Strict):
    """NLL of the training pool's and the held-out trajectories' kept and excluded tokens under
    the start model and each trained variant (``relearn analyze nll --reviews``)."""

    bootstrap: int = Field(10_000, ge=100)
    device: str = "cpu"  # where it runs, not what it finds: not part of the stage's identity
    bf16: bool = False
    chunk: int = Field(1024, ge=1)


class EvalConfig(_Strict):
    dataset: str = "mini"
    ids: list[str] | None = None
    max_turns: int | None = 20
    max_tokens: int | None = None
    max_seconds: float | None = None
    max_new_tokens: int = Field(256, ge=1)  # per model call, for the local server
    max_context: int = Field(32768, ge=1)
    workers: int = Field(1, ge=1)
    seed: int = 0


class ClusterConfig(_Strict):
    """[cluster]: run collect, review and masks as units on a Ray cluster (envs.executor);
    ``auto`` joins the cluster `ray start` runs on this machine, HOST:PORT a remote head.
    ``registry`` (HOST[/NS]): a node lacking a task's image pulls it from there as
    HOST/NS/NAME:TAG instead of building it (as `relearn collect --registry`)."""

    address: str = "auto"
    registry: str | None = Field(None, min_length=1)


class PipelineConfig(_Strict):
    workdir: Path
    tasks: str = "mini"
    pool: PoolConfig
    review: ReviewConfig = Field(default_factory=ReviewConfig)
    masks: MasksConfig = Field(default_factory=MasksConfig)
    train: TrainConfig | None = None
    analyze: AnalyzeConfig | None = None
    eval: EvalConfig | None = None
    cluster: ClusterConfig | None = None
    source: Path | None = Field(None, exclude=True)  # the file it was read from

    @property
    def variants(self) -> list[str]:
        return list(self.masks.variants)

    @model_validator(mode="after")
    def analyze_needs_train(self) -> PipelineConfig:
        if self.analyze is not None and self.train is None:
            raise ValueError("[analyze] scores the start model and the trained ones: it needs [train]")
        if self.pool.single_turn is not None and self.eval is not None:
            raise ValueError("[eval] runs agentic tasks: a [pool.single_turn] pipeline has no evaluation stage")
        if self.pool.single_turn is not None and not (self.review.judge1 or self.review.judge2):
            raise ValueError("[review]: single-turn review needs judge1 (the keep judge; judge2, the auditor, defaults to it)")
        return self

    @property
    def single_turn(self) -> bool:
        return self.pool.single_turn is not None

    def resolve(self, path: str | Path) -> Path:
        """A path written in the file, relative to the file's folder."""
        p = Path(path).expanduser()
        if p.is_absolute() or self.source is None:
            return p
        return (self.source.parent / p).resolve()


def load_pipeline(path: Path) -> PipelineConfig:
    try:
        data: dict[str, Any] = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise PipelineError(f"{path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise PipelineError(f"{path}: not valid TOML: {exc}") from None
    try:
        config = PipelineConfig.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or '(top)'}: {e['msg']}" for e in exc.errors())
        raise PipelineError(f"{path}: {problems}") from None
    config.source = path.resolve()
    config.workdir = config.resolve(config.workdir)
    return config
