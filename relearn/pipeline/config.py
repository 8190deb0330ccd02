"""PIPELINE.toml: one file says what every stage does.

    workdir = "runs/exp1"            # relative to this file's folder; every stage writes under it
    tasks = "mini"                   # mini | a SWE-bench .jsonl/.json/.parquet | a Harbor folder

    [pool]                           # where the trajectories come from: collect OR import
    collect = { model = "ckpt-29", base_url = "http://gpu:8000/v1", policy = "chat", checkpoint = "iter-29", step = 29, attempts = 4 }
    # import = { format = "codex", paths = ["~/.codex/sessions"] }   # any `relearn import` format, its flags as fields
    # import = { format = "chat", paths = ["swe-gym.parquet"], preset = "swe-gym", salvage = true }
    # single_turn = { tasks = "mini" }   # Math/Code/IF rollouts: single-turn verifiers, keep-interval review

    [verify]                         # grading what the pool has not graded (workers, timeout, images, limits)
    workers = 4
    image_template = "registry.example.com/swe/sweb.eval.{arch}.{instance_key}:{tag}"

    [review]                         # no judge1: the offline heuristic reviewer (`relearn review` fields)
    judge1 = "claude-sonnet-4-5"
    backend = "anthropic"
    batch = true                     # also: workers, spend_cap_usd, judge_context, prices, estimate, ...

    [masks]                          # `relearn masks` fields, once for every variant
    tokenizer = "qwen3.6"
    variants = ["ross", "ross-nomask", "positive"]
    heldout_tasks = ["astropy__astropy-12907"]   # no variant trains on these tasks' trajectories
    defect_scope = "action"          # also: ctx, per_turn, preserve_thinking, prefix_check, workers, ...

    [train]                          # one run per mask variant, all from the same start (`relearn train` fields)
    init = "/models/Qwen3-1.7B"      # or tiny = "qwen3"
    epochs = 3

    [analyze]                        # NLL of kept (A \\ E) and excluded (E) tokens, training pool and held-out
    bootstrap = 10000                # also: device, bf16, attn, chunk, workers, batch

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

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from harness.import_run import ChatPreset, ImportFormat
from relearn.analyze.pools import NamedPool
from relearn.ops.analyze import NllOptions
from relearn.ops.collect import AgentOptions, CollectOptions
from relearn.ops.containers import ContainerOptions, memory_mb
from relearn.ops.evaluate import EvalOptions
from relearn.ops.importing import ImportOptions, chat_only_fields
from relearn.ops.masks import MasksOptions
from relearn.ops.review import JudgeOptions, ReviewOptions
from relearn.ops.single_turn import COLUMNS as SINGLE_TURN_COLUMNS
from relearn.ops.single_turn import SINGLE_TURN_CONTEXT, SingleTurnFormat, SingleTurnImportOptions, SingleTurnVerifyOptions
from relearn.ops.train import TrainOptions
from relearn.ops.verify import VerifyOptions

VARIANTS = ("ross", "ross-nomask", "positive")
# The paper's names for the variants, in the order its tables put them.
VARIANT_NAMES = {"upstream": "Upstream", "positive": "Positive-Rollout SFT", "ross-nomask": "ROSS w/o mask", "ross": "ROSS"}


class PipelineError(ValueError):
    """The pipeline file cannot be used (names the file and the field)."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ContainersConfig(_Strict):
    """The fields of every table whose stage runs tasks in containers ([pool.collect], [verify],
    [eval]): which image each task runs in (``image_map``, a file relative to this one, wins
    over ``image_template``, which wins over the task's own), ``pull`` what the engine lacks,
    and each container's ``cpus`` and ``memory`` (``relearn.ops.containers.ContainerOptions``;
    the Ray address and the registry are [cluster]'s)."""

    image_map: str | None = ContainerOptions.image_map
    image_template: str | None = Field(ContainerOptions.image_template, min_length=1)
    pull: bool = ContainerOptions.pull
    cpus: float = Field(ContainerOptions.cpus, gt=0)
    memory: str = ContainerOptions.memory

    @field_validator("memory")
    @classmethod
    def a_size(cls, value: str) -> str:
        memory_mb(value)
        return value


class CollectConfig(ContainersConfig):
    """[pool.collect]: the fields of `relearn collect` (``relearn.ops.collect.CollectOptions``)."""

    model: str
    ids: list[str] | None = CollectOptions.ids  # only these tasks (default: all of `tasks`)
    base_url: str | None = CollectOptions.base_url
    agent: Literal["builtin", "codex-cli"] = AgentOptions.agent  # type: ignore[assignment]
    policy: Literal["chat", "responses", "anthropic"] | None = AgentOptions.policy  # None: chat for builtin, responses for codex-cli
    apply_patch: Literal["codex", "strict"] = AgentOptions.apply_patch  # type: ignore[assignment]
    reasoning_effort: str | None = AgentOptions.reasoning_effort  # codex-cli
    token_ids: bool | None = AgentOptions.token_ids  # ask for the sampled token ids (None: the builtin agent does, codex-cli not)
    api_key_env: str | None = CollectOptions.api_key_env
    checkpoint: str | None = CollectOptions.checkpoint
    step: int | None = CollectOptions.step
    attempts: int = Field(CollectOptions.attempts, ge=1)
    workers: int = Field(CollectOptions.workers, ge=1)
    max_turns: int | None = CollectOptions.max_turns
    max_tokens: int | None = CollectOptions.max_tokens
    max_seconds: float | None = CollectOptions.max_seconds
    max_cost: float | None = Field(CollectOptions.max_cost, gt=0)
    temperature: float | None = CollectOptions.temperature
    max_output_tokens: int | None = Field(CollectOptions.max_output_tokens, ge=1)
    price_in: float = Field(CollectOptions.price_in, ge=0)
    price_out: float = Field(CollectOptions.price_out, ge=0)


class VerifyConfig(ContainersConfig):
    """[verify]: grading the pool as `relearn verify` grades predictions (``relearn.ops.verify``)."""

    workers: int = Field(VerifyOptions.workers, ge=1)  # containers at once, without [cluster]
    timeout: float = Field(VerifyOptions.timeout, gt=0)  # seconds for one test run


class ImportConfig(_Strict):
    """[pool.import]: the fields of `relearn import` (``relearn.ops.importing.ImportOptions``),
    every format with the chat presets and columns; the pool is the work folder's, appended to
    and resumed by stable ids when the stage reruns."""

    format: ImportFormat
    paths: list[str] = Field(min_length=1)  # files, or folders walked recursively
    salvage: bool = ImportOptions.salvage  # keep what parses from a damaged file (each skipped line a warning)
    preset: ChatPreset | None = ImportOptions.preset  # chat: the columns of a published set
    messages: str | None = Field(ImportOptions.messages, min_length=1)  # chat: the column of messages (dotted paths reach nested ones)
    tools: str | None = Field(ImportOptions.tools, min_length=1)  # chat: the column of tool schemas
    id: str | None = Field(ImportOptions.id, min_length=1)  # chat: the column(s) of the trajectory's id, comma-separated
    task_id: str | None = Field(ImportOptions.task_id, min_length=1)  # chat: the column of the task id
    resolved: str | None = Field(ImportOptions.resolved, min_length=1)  # chat: the column of the resolved flag
    patch: str | None = Field(ImportOptions.patch, min_length=1)  # chat: the column of the final patch

    def options(self, paths: list[Path], output: Path) -> ImportOptions:
        """The import's options, with ``paths`` resolved against the pipeline file's folder."""
        fields = self.model_dump(exclude={"format", "paths", "preset"})
        return ImportOptions(
            format=self.format.value, paths=paths, output=output, preset=self.preset.value if self.preset else None, **fields
        )

    @model_validator(mode="after")
    def chat_fields_for_chat(self) -> ImportConfig:
        misplaced = chat_only_fields(self.options([], Path()))
        if misplaced:
            raise ValueError(f"{', '.join(misplaced)} only apply to the chat format")
        return self


class SingleTurnConfig(_Strict):
    """A pool of single-turn RL rollouts (Math, Code, instruction following): the fields of
    `relearn single-turn import` and `verify` (``relearn.ops.single_turn``, which owns the
    defaults); imported from row dumps, graded by the single-turn verifiers, reviewed with keep
    intervals ([review]: judge1 the keep judge, judge2 the auditor)."""

    tasks: str = SingleTurnVerifyOptions.tasks  # the shipped mini suite, or a tasks .jsonl (envs.single_turn.tasks)
    paths: list[str] | None = None  # rollout files or folders (default with tasks = "mini": the suite's rollouts)
    format: SingleTurnFormat = SingleTurnImportOptions.format  # a row preset, or chat-message records with one assistant turn
    columns: dict[str, str] = Field(default_factory=dict)  # prompt, response, reward, step, task_id, id, checkpoint, token_ids, logprobs
    # Train in the template's no-thinking form (reasoning and answer as visible text after the
    # template's empty block; the paper's single-turn default) or its thinking form (reasoning
    # inside <think>, as sampled).
    thinking: bool = SingleTurnImportOptions.thinking  # true: the thinking form (`--thinking`)

    @model_validator(mode="after")
    def known_columns(self) -> SingleTurnConfig:
        unknown = sorted(set(self.columns) - set(SINGLE_TURN_COLUMNS))
        if unknown:
            raise ValueError(f"columns: unknown {', '.join(unknown)} (known: {', '.join(sorted(SINGLE_TURN_COLUMNS))})")
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


# The [review] fields of the agentic review that the keep-interval review has no use for:
# one written in a [pool.single_turn] file is refused, not silently ignored.
SINGLE_TURN_UNREAD_REVIEW_FIELDS = {"judge_context", "estimate", "batch", "poll_interval", "include_suspicious"}


class ReviewConfig(_Strict):
    """[review]: the fields of `relearn review POOL` (``relearn.ops.review.ReviewOptions`` and
    ``JudgeOptions``, which own the defaults); [cluster] sends the reviews to Ray. No judge1:
    the offline heuristic reviewer. With judges, the cost estimate is printed before anything
    is paid; ``estimate = true`` prints it and stops the run there."""

    judge1: str | None = JudgeOptions.judge1
    judge2: str | None = JudgeOptions.judge2
    backend: Literal["anthropic", "chat", "responses"] = JudgeOptions.backend  # type: ignore[assignment]
    base_url: str | None = JudgeOptions.base_url
    judge2_base_url: str | None = JudgeOptions.judge2_base_url
    api_key_env: str | None = JudgeOptions.api_key_env
    price_in: float | None = Field(JudgeOptions.price_in, ge=0)
    price_out: float | None = Field(JudgeOptions.price_out, ge=0)
    price_cached_in: float | None = Field(JudgeOptions.price_cached_in, ge=0)
    prices: str | None = None  # a TOML pricing table laid over the shipped one (relative to this file)
    judge_context: int = Field(JudgeOptions.context, ge=1000)  # tokens of prompt a judge reads at most
    workers: int = Field(ReviewOptions.workers, ge=1)
    spend_cap_usd: float | None = Field(ReviewOptions.spend_cap, ge=0)
    estimate: bool = ReviewOptions.estimate
    batch: bool = ReviewOptions.batch
    poll_interval: float = Field(ReviewOptions.poll_interval, gt=0)
    include_suspicious: bool = ReviewOptions.include_suspicious

    def options(self, pool: Path, output: Path, prices: Path | None, *, ray: str | None) -> ReviewOptions:
        judges = JudgeOptions(
            judge1=self.judge1, judge2=self.judge2, backend=self.backend, base_url=self.base_url, judge2_base_url=self.judge2_base_url,
            api_key_env=self.api_key_env, price_in=self.price_in, price_out=self.price_out, price_cached_in=self.price_cached_in,
            prices=prices, context=self.judge_context,
        )  # fmt: skip
        return ReviewOptions(
            pool=pool, output=output, judges=judges, workers=self.workers, spend_cap=self.spend_cap_usd, estimate=self.estimate,
            batch=self.batch, poll_interval=self.poll_interval, include_suspicious=self.include_suspicious, ray=ray,
        )  # fmt: skip


class MasksConfig(_Strict):
    """[masks]: the fields of `relearn masks` (``relearn.ops.masks.MasksOptions``, which owns
    the defaults), once for every variant; the mode of each is its variant."""

    tokenizer: str = MasksOptions.tokenizer
    ctx: int = Field(MasksOptions.ctx, ge=1)
    variants: list[Literal["ross", "ross-nomask", "positive"]] = Field(default_factory=lambda: list(VARIANTS))
    # Task ids whose trajectories every variant leaves out (the same for all), so that the
    # analyze stage has verified, reviewed trajectories no model was trained on. None: none.
    heldout_tasks: list[str] | None = None
    # action: a defect in a tool call excludes the whole call; minimal: only its quote (the ablation).
    defect_scope: Literal["action", "minimal"] = MasksOptions.defect_scope  # type: ignore[assignment]
    prefix_check: Literal["header", "every", "off"] = MasksOptions.prefix_check  # type: ignore[assignment]
    per_turn: bool = MasksOptions.per_turn
    preserve_thinking: bool = MasksOptions.preserve_thinking
    include_suspicious: bool = MasksOptions.include_suspicious
    # `relearn envs audit -o` records (relative to this file): every variant leaves out the
    # trajectories of the tasks it flags, unless keep_flagged. None: no audit applied.
    audit: Path | None = MasksOptions.audit
    keep_flagged: bool = MasksOptions.keep_flagged
    # as-sent: trajectories whose render departs from what the model saw compile per turn under
    # the context as sent; render: the template's history is trusted.
    context: Literal["as-sent", "render"] = MasksOptions.context  # type: ignore[assignment]
    recorded_ids: bool = MasksOptions.recorded_ids  # train generated turns on their recorded ids
    shard_size: int = Field(MasksOptions.shard_size, ge=1)
    # Where it runs, not what it makes (not part of the stage's identity); [cluster] sends the
    # shards to Ray instead.
    workers: int = Field(MasksOptions.workers, ge=1)

    def options(
        self, pool: Path, output: Path, reviews: Path, mode: str, *, no_thinking: bool, ray: str | None, audit: Path | None = None
    ) -> MasksOptions:
        """``audit``: ``self.audit`` resolved against the pipeline file's folder."""
        return MasksOptions(
            pool=pool, output=output, reviews=reviews, tokenizer=self.tokenizer, mode=mode, ctx=self.ctx,
            prefix_check=self.prefix_check, per_turn=self.per_turn, preserve_thinking=self.preserve_thinking, no_thinking=no_thinking,
            shard_size=self.shard_size, include_suspicious=self.include_suspicious, defect_scope=self.defect_scope, workers=self.workers,
            ray=ray, audit=audit, keep_flagged=self.keep_flagged, context=self.context, recorded_ids=self.recorded_ids,
        )  # fmt: skip

    @model_validator(mode="after")
    def distinct(self) -> MasksConfig:
        if self.heldout_tasks is not None and len(set(self.heldout_tasks)) != len(self.heldout_tasks):
            raise ValueError("heldout_tasks: a task id is named twice")
        if len(set(self.variants)) != len(self.variants):
            raise ValueError("variants: a variant is named twice")
        return self


class TrainConfig(_Strict):
    """[train]: the fields of `relearn train` (``relearn.train.options.TrainOptions``, which owns
    the defaults) that one process can run; ZeRO stages, offloading and sequence parallelism need
    a launcher (torchrun, deepspeed) and stay with the verb. The dataset, run folder and
    tokenizer are the pipeline's."""

    init: str | None = TrainOptions.init
    tiny: Literal["qwen3", "qwen3-moe", "qwen3.5-moe"] | None = TrainOptions.tiny  # type: ignore[assignment]
    ctx: int = Field(TrainOptions.ctx, ge=1)
    epochs: int = Field(TrainOptions.epochs, ge=1)
    lr: float = Field(TrainOptions.lr, gt=0)
    warmup: float = Field(TrainOptions.warmup, ge=0)
    weight_decay: float = Field(TrainOptions.weight_decay, ge=0)
    clip: float = Field(TrainOptions.clip, ge=0)
    batch_trajectories: int = Field(TrainOptions.batch_trajectories, ge=1)
    grad_accum: int = Field(TrainOptions.grad_accum, ge=1)
    loss_norm: Literal["trajectory", "token"] = TrainOptions.loss_norm  # type: ignore[assignment]
    chunk: int = Field(TrainOptions.chunk, ge=1)
    bf16: bool = TrainOptions.bf16
    pack: bool = TrainOptions.pack
    offload_activations: bool = TrainOptions.offload_activations
    gradient_checkpointing: bool = TrainOptions.gradient_checkpointing
    attn: Literal["sdpa", "flash_attention_2", "flash_attention_3", "eager"] = TrainOptions.attn  # type: ignore[assignment]
    seed: int = TrainOptions.seed
    save_every: int = Field(TrainOptions.save_every, ge=0)
    keep_checkpoints: int = Field(TrainOptions.keep_checkpoints, ge=1)
    max_steps: int | None = Field(TrainOptions.max_steps, ge=1)

    def options(self, dataset: Path, out: Path, init: str, tokenizer: str) -> TrainOptions:
        """The run's options: trained from ``init`` (the upstream stage's weights)."""
        return TrainOptions(dataset=dataset, out=out, tokenizer=tokenizer, **{**self.model_dump(exclude={"tiny"}), "init": init})

    @model_validator(mode="after")
    def one_start(self) -> TrainConfig:
        if (self.init is None) == (self.tiny is None):
            raise ValueError("give exactly one of init (a model folder) or tiny")
        return self


class AnalyzeConfig(_Strict):
    """NLL of the training pool's and the held-out trajectories' kept and excluded tokens under
    the start model and each trained variant (``relearn analyze nll --reviews``)."""

    bootstrap: int = Field(NllOptions.bootstrap, ge=100)
    bf16: bool = NllOptions.bf16
    attn: Literal["sdpa", "flash_attention_2", "eager"] = NllOptions.attn  # type: ignore[assignment]
    chunk: int = Field(NllOptions.chunk, ge=1)
    # Where it runs, not what it finds: not part of the stage's identity. [cluster] sends the
    # batches of trajectories to Ray (with a GPU each when device is cuda).
    device: str = NllOptions.device
    workers: int = Field(NllOptions.workers, ge=1)
    batch: int = Field(NllOptions.batch, ge=1)

    def nll_options(
        self, pools: list[NamedPool], out: Path, model: str, reviews: Path, masks: MasksConfig, *, ray: str | None
    ) -> NllOptions:
        """`relearn analyze nll --reviews` of one model, as the masks stages compiled: the same
        tokenizer, context, defect scope and thinking form; verified-positive trajectories only."""
        return NllOptions(
            pools=pools, out=out, model=model, tokenizer=masks.tokenizer, reviews=reviews, defect_scope=masks.defect_scope,
            context=masks.context, ctx=masks.ctx,
            positive_only=True, device=self.device, bf16=self.bf16, attn=self.attn, chunk=self.chunk,
            preserve_thinking=masks.preserve_thinking, bootstrap=self.bootstrap, workers=self.workers, ray=ray, batch=self.batch,
            chart=False,
        )  # fmt: skip


class EvalConfig(ContainersConfig):
    """[eval]: the fields of `relearn eval run` (``relearn.ops.evaluate.EvalOptions``) that
    apply to a model this pipeline serves itself (no endpoint, key, agent or prices)."""

    dataset: str = EvalOptions.dataset
    ids: list[str] | None = EvalOptions.ids
    repos: list[str] | None = EvalOptions.repos
    difficulties: list[str] | None = EvalOptions.difficulties
    slice: str | None = EvalOptions.slice
    # Fewer turns than the verb's default: the pipeline evaluates its own (often tiny) models.
    max_turns: int | None = 20
    max_tokens: int | None = EvalOptions.max_tokens
    max_seconds: float | None = EvalOptions.max_seconds
    max_new_tokens: int = Field(256, ge=1)  # per model call, for the local server
    max_context: int = Field(32768, ge=1)
    temperature: float | None = EvalOptions.temperature
    apply_patch: Literal["codex", "strict"] = AgentOptions.apply_patch  # type: ignore[assignment]
    spend_cap: float | None = Field(EvalOptions.spend_cap, gt=0)
    workers: int = Field(EvalOptions.workers, ge=1)
    seed: int = 0


class ClusterConfig(_Strict):
    """[cluster]: run collect, verify, review and masks as units on a Ray cluster (envs.executor;
    eval runs here, where its model is served);
    ``auto`` joins the cluster `ray start` runs on this machine, HOST:PORT a remote head.
    ``registry`` (HOST[/NS]): a node lacking a task's image pulls it from there as
    HOST/NS/NAME:TAG instead of building it (as `relearn collect --registry`)."""

    address: str = "auto"
    registry: str | None = Field(None, min_length=1)


class PipelineConfig(_Strict):
    workdir: Path
    tasks: str = "mini"
    pool: PoolConfig
    verify: VerifyConfig = Field(default_factory=VerifyConfig)
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
        unread = sorted(SINGLE_TURN_UNREAD_REVIEW_FIELDS & self.review.model_fields_set)
        if self.pool.single_turn is not None and unread:
            raise ValueError(f"[review] {', '.join(unread)}: not used by the single-turn (keep-interval) review")
        if self.pool.single_turn is not None and self.verify.model_fields_set:
            written = ", ".join(sorted(self.verify.model_fields_set))
            raise ValueError(f"[verify] {written}: a single-turn pool is graded by its tasks' verifiers, not [verify]")
        if self.pool.single_turn is not None and "tasks" in self.model_fields_set:
            raise ValueError("tasks: a single-turn pool names its tasks in [pool.single_turn]")
        if self.pool.single_turn is not None:
            # The paper's single-turn token limit, unless the file writes its own ctx.
            if "ctx" not in self.masks.model_fields_set:
                self.masks.ctx = SINGLE_TURN_CONTEXT
            if self.train is not None and "ctx" not in self.train.model_fields_set:
                self.train.ctx = SINGLE_TURN_CONTEXT
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
