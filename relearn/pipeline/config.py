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

import difflib
import json
import tomllib
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

from relearn.analyze.pools import NamedPool
from relearn.masks.compile import Mode
from relearn.pipeline.tables import Strict, options_of_table, table
from relearn.train.options import TrainOptions
from relearn.verbs.analyze import NllOptions
from relearn.verbs.collect import CollectOptions
from relearn.verbs.containers import ContainerOptions, memory_mb
from relearn.verbs.evaluate import SERVED, EvalOptions
from relearn.verbs.importing import ImportOptions, misplaced_fields
from relearn.verbs.masks import MasksOptions
from relearn.verbs.review import ReviewOptions
from relearn.verbs.single_turn import COLUMNS as SINGLE_TURN_COLUMNS
from relearn.verbs.single_turn import SINGLE_TURN_CONTEXT, SingleTurnImportOptions, SingleTurnVerifyOptions
from relearn.verbs.verify import PoolVerifyOptions, VerifyOptions

VARIANTS = ("ross", "ross-nomask", "positive")
# The paper's names for the variants, in the order its tables put them.
VARIANT_NAMES = {"upstream": "Upstream", "positive": "Positive-Rollout SFT", "ross-nomask": "ROSS w/o mask", "ross": "ROSS"}


class PipelineError(ValueError):
    """The pipeline file cannot be used (names the file and the field)."""


class ContainersConfig(table("ContainersTable", ContainerOptions)):
    """The fields of every table whose stage runs tasks in containers ([pool.collect], [verify],
    [eval]): which image each task runs in (``image_map``, a file relative to this one, wins
    over ``image_template``, which wins over the task's own), ``pull`` what the engine lacks,
    and each container's ``cpus`` and ``memory`` (``relearn.verbs.containers.ContainerOptions``;
    the Ray address and the registry are [cluster]'s)."""

    @field_validator("memory")
    @classmethod
    def a_size(cls, value: str) -> str:
        memory_mb(value)
        return value


class CollectConfig(table("CollectTable", CollectOptions, base=ContainersConfig)):
    """[pool.collect]: the fields of `relearn collect` (``relearn.verbs.collect.CollectOptions``)."""

    def options(self, out: Path, tasks: str, containers: ContainerOptions, base_url: str | None = None) -> CollectOptions:
        """The stage's options: its pool folder, the file's tasks, the containers as the stage
        resolves them (``image_map`` against the file, [cluster]'s address and registry), and
        ``base_url`` over the table's when given (the demo's local policy)."""
        given = {"base_url": base_url} if base_url else {}
        return options_of_table(self, CollectOptions, out=out, tasks=tasks, **vars(containers), **given)


class VerifyConfig(table("VerifyTable", VerifyOptions, base=ContainersConfig)):
    """[verify]: grading the pool as `relearn verify` grades predictions (``relearn.verbs.verify``)."""

    def options(
        self, pool: Path, output: Path, verdicts: Path, tasks: str, log_dir: Path, containers: ContainerOptions
    ) -> PoolVerifyOptions:
        """The pool's grading: the stage names its files; workers and timeout are the table's."""
        return PoolVerifyOptions(
            pool, output, verdicts, tasks, self.workers, self.timeout, log_dir, containers, again=self.again, network=self.network
        )


class ImportConfig(table("ImportTable", ImportOptions)):
    """[pool.import]: the fields of `relearn import` (``relearn.verbs.importing.ImportOptions``,
    which declares them), every format with the chat presets and columns; the pool is the work
    folder's, appended to and resumed by stable ids when the stage reruns."""

    def options(self, paths: list[Path], output: Path) -> ImportOptions:
        """The import's options, with ``paths`` resolved against the pipeline file's folder."""
        return options_of_table(self, ImportOptions, paths=paths, output=output)

    @model_validator(mode="after")
    def chat_fields_for_chat(self) -> ImportConfig:
        for fmt, names in misplaced_fields(self.options([], Path())).items():
            raise ValueError(f"{', '.join(names)} only apply to the {fmt} format")
        return self


class SingleTurnConfig(table("SingleTurnTable", SingleTurnVerifyOptions, SingleTurnImportOptions, paths=None)):
    """A pool of single-turn RL rollouts (Math, Code, instruction following): the fields of
    `relearn single-turn import` and `verify` (``relearn.verbs.single_turn``, which declares
    them); imported from row dumps, graded by the single-turn verifiers, reviewed with keep
    intervals ([review]: judge1 the keep judge, judge2 the auditor)."""

    def import_options(self, paths: list[Path], output: Path) -> SingleTurnImportOptions:
        """The import's options, with ``paths`` resolved against the pipeline file's folder."""
        return options_of_table(self, SingleTurnImportOptions, paths=paths, output=output)

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


class PoolConfig(Strict):
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
SINGLE_TURN_UNREAD_REVIEW_FIELDS = {"judge_context", "estimate", "batch", "poll_interval", "include_suspicious", "reviewer"}


class ReviewConfig(table("ReviewTable", ReviewOptions)):
    """[review]: the fields of `relearn review POOL` (``relearn.verbs.review.ReviewOptions`` and
    ``JudgeOptions``, which declare them); [cluster] sends the reviews to Ray. No judge:
    the run stops before its first stage, unless ``reviewer = "heuristic"`` asks for the
    offline heuristic reviewer by name. With judges, the cost estimate is printed before anything
    is paid; ``estimate = true`` prints it and stops the run there. ``prices`` is a path
    relative to this file. ``extra_body`` (and judge 2's) is a table or JSON text; the verb
    takes JSON text."""

    @field_validator("extra_body", "judge2_extra_body", mode="after")
    @classmethod
    def extra_body_as_json(cls, value: Any) -> Any:
        return json.dumps(value) if isinstance(value, dict) else value

    def options(self, pool: Path, output: Path, prices: Path | None, *, ray: str | None) -> ReviewOptions:
        return options_of_table(self, ReviewOptions, pool=pool, output=output, prices=prices, ray=ray)


class MasksConfig(table("MasksTable", MasksOptions)):
    """[masks]: the fields of `relearn masks` (``relearn.verbs.masks.MasksOptions``, which declares
    them), once for every variant; the mode of each is its variant. ``audit`` is on (true), off
    (false) or a path relative to this file. ``workers`` is where it runs, not what it makes (not
    part of the stage's identity); [cluster] sends the shards to Ray instead."""

    # The verb's --audit FILE, and the pipeline's own audit: on unless turned off.
    audit: bool | Path = Field(
        True,
        description="true: the pipeline audits the images of the pool's tasks itself (the audit stage: `relearn envs audit` into "
        "WORKDIR/audit/audit.jsonl) wherever it has them (a collected pool, or an imported one graded against the tasks the file "
        "names; not with [cluster]), and every variant leaves out the trajectories of the tasks it flags (.git exposes the fix) and "
        "counts them, as the paper's training set left them out; false: no audit; a path (relative to this file): the records of "
        "`relearn envs audit -o FILE`, applied as they are, and no audit stage. The masks summary says which audit was applied, or "
        "why none was.",
    )
    variants: list[Mode] = Field(default_factory=lambda: list(VARIANTS))
    # Task ids whose trajectories every variant leaves out (the same for all), so that the
    # analyze stage has verified, reviewed trajectories no model was trained on. None: none.
    heldout_tasks: list[str] | None = None

    def options(
        self, pool: Path, output: Path, reviews: Path, mode: str, *, no_thinking: bool, ray: str | None, audit: Path | None = None
    ) -> MasksOptions:
        """``audit``: the audit file every variant applies (resolved against the pipeline file's folder; None: none)."""
        return options_of_table(
            self, MasksOptions, pool=pool, output=output, reviews=reviews, mode=mode, no_thinking=no_thinking, ray=ray, audit=audit
        )

    @field_validator("audit", mode="before")
    @classmethod
    def audit_path(cls, value: Any) -> Any:
        return Path(value) if isinstance(value, str) else value  # "true" or "no" is a file's name, not a switch

    @model_validator(mode="after")
    def distinct(self) -> MasksConfig:
        if self.heldout_tasks is not None and len(set(self.heldout_tasks)) != len(self.heldout_tasks):
            raise ValueError("heldout_tasks: a task id is named twice")
        if len(set(self.variants)) != len(self.variants):
            raise ValueError("variants: a variant is named twice")
        return self


class TrainConfig(table("TrainTable", TrainOptions)):
    """[train]: the fields of `relearn train` (``relearn.train.options.TrainOptions``, which
    declares them) that one process can run; ZeRO stages, offloading and sequence parallelism
    need a launcher (torchrun, deepspeed) and stay with the verb. The dataset, run folder and
    tokenizer are the pipeline's."""

    def options(self, dataset: Path, out: Path, init: str, tokenizer: str, chat_template: str | None = None) -> TrainOptions:
        """The run's options: trained from ``init`` (the upstream stage's weights)."""
        return options_of_table(
            self, TrainOptions, dataset=dataset, out=out, tokenizer=tokenizer, chat_template=chat_template, init=init, tiny=None
        )

    @model_validator(mode="after")
    def one_start(self) -> TrainConfig:
        if (self.init is None) == (self.tiny is None):
            raise ValueError("give exactly one of init (a model folder) or tiny")
        return self


class AnalyzeConfig(table("AnalyzeTable", NllOptions)):
    """NLL of the training pool's and the held-out trajectories' kept and excluded tokens under
    the start model and each trained variant (``relearn analyze nll --reviews``; the fields are
    ``relearn.verbs.analyze.NllOptions``'). device, workers and batch say where it runs, not what
    it finds: they are not part of the stage's identity. [cluster] sends the batches of
    trajectories to Ray (with a GPU each when device is cuda)."""

    def nll_options(
        self, pools: list[NamedPool], out: Path, model: str, reviews: Path, masks: MasksConfig, *, ray: str | None
    ) -> NllOptions:
        """`relearn analyze nll --reviews` of one model, as the masks stages compiled: the same
        tokenizer and chat template, context, defect scope and thinking form; verified-positive trajectories only."""
        return options_of_table(
            self, NllOptions, pools=pools, out=out, model=model, reviews=reviews, tokenizer=masks.tokenizer,
            chat_template=masks.chat_template, defect_scope=masks.defect_scope, context=masks.context, ctx=masks.ctx, preserve_thinking=masks.preserve_thinking,
            positive_only=True, ray=ray, chart=False,
        )  # fmt: skip


SPEAKS_CHAT = "the model the pipeline serves speaks chat to the builtin agent"
# The endpoint's and the budget's options that [eval] leaves out, each for that reason.
SERVED_ENDPOINT = dict.fromkeys(("base_url", "api_key_env", "checkpoint", "max_output_tokens", "price_in", "price_out", "max_cost"), SERVED)
SERVED_AGENT = {
    "agent": SPEAKS_CHAT, "policy": SPEAKS_CHAT, "reasoning_effort": "codex-cli's, which the pipeline does not run",
    "token_ids": "the pipeline's own server answers the token ids the builtin agent asks for",
}  # fmt: skip


# Fewer turns than the verb's default: the pipeline evaluates its own (often tiny) models.
class EvalConfig(table("EvalTable", EvalOptions, base=ContainersConfig, exclude=SERVED_AGENT | SERVED_ENDPOINT, max_turns=20, seed=0)):
    """[eval]: the fields of `relearn eval run` (``relearn.verbs.evaluate.EvalOptions``) that
    apply to a model this pipeline serves itself (no endpoint, key, agent or prices)."""

    max_new_tokens: int = Field(256, ge=1)  # per model call, for the local server
    max_context: int = Field(32768, ge=1)  # tokens the local server holds: prompt and output

    def options(self, out: Path, model: str, dataset: str, base_url: str, containers: ContainerOptions) -> EvalOptions:
        """A served model's run: the builtin agent speaking chat to ``base_url``, each call's
        output as long as the server's (``max_new_tokens``), and its episodes here, where the
        model is served (``containers``' registry still applies, its cluster not)."""
        return options_of_table(
            self, EvalOptions, out=out, model=model, dataset=dataset, base_url=base_url, policy="chat",
            max_output_tokens=self.max_new_tokens, **{**vars(containers), "ray": None},
        )  # fmt: skip


class ClusterConfig(Strict):
    """[cluster]: run collect, verify, review and masks as units on a Ray cluster (envs.executor;
    eval runs here, where its model is served);
    ``auto`` joins the cluster `ray start` runs on this machine, HOST:PORT a remote head.
    ``registry`` (HOST[/NS]): a node lacking a task's image pulls it from there as
    HOST/NS/NAME:TAG instead of building it (as `relearn collect --registry`)."""

    address: str = "auto"
    registry: str | None = Field(None, min_length=1)


class PipelineConfig(Strict):
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
        if self.train is not None and "ctx" not in self.train.model_fields_set:
            self.train.ctx = self.masks.ctx  # what the masks stage keeps is what the trainer takes
        if self.train is not None and self.train.ctx < self.masks.ctx:
            raise ValueError(
                f"train.ctx {self.train.ctx} is shorter than masks.ctx {self.masks.ctx}: "
                "the trainer would refuse the samples the masks stage kept between the two"
            )
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

    def chat_template(self) -> str | None:
        """[masks] chat_template as the loaders take it: a file relative to this file's folder
        where one is there, else as written (the name of a template trl ships)."""
        name = self.masks.chat_template
        if name is None:
            return None
        path = self.resolve(name)
        return str(path) if path.is_file() else name


def load_pipeline(path: Path) -> PipelineConfig:
    try:
        data: dict[str, Any] = tomllib.loads(path.read_text(encoding="utf-8"))
    except IsADirectoryError:
        raise PipelineError(f"{path}: is a folder; give the pipeline's .toml file") from None
    except FileNotFoundError:
        raise PipelineError(f"{path}: no such pipeline file; check the path") from None
    except UnicodeDecodeError as exc:
        raise PipelineError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start:,}); a pipeline file is TOML") from None
    except OSError as exc:
        raise PipelineError(f"{path}: {(exc.strerror or str(exc)).lower()}") from None
    except tomllib.TOMLDecodeError as exc:
        raise PipelineError(f"{path}: not valid TOML: {exc}") from None
    try:
        config = PipelineConfig.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(_problem(e) for e in exc.errors())
        raise PipelineError(f"{path}: {problems}") from None
    config.source = path.resolve()
    config.workdir = config.resolve(config.workdir)
    config.masks.chat_template = config.chat_template()  # every stage that renders reads the same file
    return config


def _problem(error: Any) -> str:
    """One validation error as ``table.field: what is wrong``; a field no table has gets the
    nearest names it does have (a typo would otherwise read as a missing feature)."""
    loc = [str(part) for part in error["loc"]]
    where = ".".join(loc) or "(top)"
    if error["type"] != "extra_forbidden":
        return f"{where}: {error['msg']}"
    known = _known_fields(PipelineConfig, loc[:-1])
    close = difflib.get_close_matches(loc[-1], known, n=2, cutoff=0.6)
    hint = f"did you mean {' or '.join(f'`{name}`' for name in close)}?" if close else f"known: {', '.join(sorted(known))}"
    return f"{where}: no such field; {hint}"


def _known_fields(model: type[BaseModel], path: list[str]) -> list[str]:
    """The field names (as the file writes them) of the table at ``path`` under ``model``."""
    for part in path:
        field = next((f for name, f in model.model_fields.items() if (f.alias or name) == part), None)
        inner = [a for a in typing.get_args(field.annotation)] if field is not None else []
        tables = [a for a in (field.annotation if field is not None else None, *inner) if isinstance(a, type) and issubclass(a, BaseModel)]
        if not tables:
            return []
        model = tables[0]
    return [f.alias or name for name, f in model.model_fields.items() if not f.exclude]
