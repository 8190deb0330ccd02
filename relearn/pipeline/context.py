"""What every stage shares (``Context``) and where each writes in the work folder (``WORKDIR``):

    pool/trajectories.jsonl    collected (with episodes/, verify-logs/) or imported
    verified.jsonl             the pool with an outcome on every trajectory that can be graded
    verify/verdicts.jsonl      every verdict the verify stage got
    reviews.jsonl              one Review per trajectory
    heldout/train.jsonl        the verified pool without the held-out tasks: what masks compile
    heldout/heldout.jsonl      the held-out tasks' trajectories: no variant trains on them
    audit/audit.jsonl          the image audit of the pool's tasks (`relearn envs audit -o`), which masks apply
    datasets/V/                Parquet shards and stats.json
    datasets/contrasts.json    each variant's trajectory ids and how the sets relate
    upstream/                  the starting weights (for a tiny random model; else --init is used as is)
    train/V/                   the training run; train/V/model/ the final weights
    analyze/                   nll.md, nll.json: kept vs excluded NLL per model; analyze/MODEL/ its scores
    eval/NAME/                 one evaluation run per model (manifest, trajectories, report)
    report/                    report.md, report.json, PNGs

A stage reads what an earlier one wrote through these functions, never a path of its own, so
the layout is said once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from relearn.pipeline.config import PipelineConfig

if TYPE_CHECKING:
    from relearn.ops.reporting import RichReporter
    from relearn.pipeline.config import ContainersConfig
    from relearn.verbs.containers import ContainerOptions


@dataclass
class Context:
    """What stages share: the config, the console, the masks tokenizer loaded once, the notes."""

    config: PipelineConfig
    console: Console
    _tokenizer: Any = None
    pool_url: str | None = None  # overrides [pool.collect].base_url (the demo's local policy)
    notes: list[str] = field(default_factory=list)

    @property
    def workdir(self) -> Path:
        return self.config.workdir

    def tokenizer(self) -> Any:
        """The masks tokenizer, rendering with [masks] chat_template where one is named, loaded
        once for every variant (and saved with the start model: it renders as the masks did)."""
        if self._tokenizer is None:
            from relearn.masks.tokenizers import load_tokenizer

            self._tokenizer = load_tokenizer(self.config.masks.tokenizer, chat_template=self.config.chat_template())
        return self._tokenizer

    @property
    def ray_address(self) -> str | None:
        """[cluster] address for the ops' ``ray`` option: None runs the stage here."""
        return self.config.cluster.address if self.config.cluster is not None else None

    @property
    def registry(self) -> str | None:
        """[cluster] registry: where a node lacking a task's image pulls it from."""
        return self.config.cluster.registry if self.config.cluster is not None else None

    def containers(self, table: ContainersConfig) -> ContainerOptions:
        """A container stage's options: its table's images and limits, [cluster]'s address and registry."""
        from relearn.verbs.containers import ContainerOptions

        image_map = self.config.resolve(table.image_map) if table.image_map is not None else None
        return ContainerOptions(image_map, table.image_template, table.pull, table.cpus, table.memory, self.ray_address, self.registry)

    def reporter(self) -> RichReporter:
        """Progress of an operation, under the stage's line."""
        from relearn.ops.reporting import RichReporter

        return RichReporter(self.console, indent="  ")


def pool_path(ctx: Context) -> Path:
    return ctx.workdir / "pool" / "trajectories.jsonl"


def verified_path(ctx: Context) -> Path:
    return ctx.workdir / "verified.jsonl"


def verdicts_path(ctx: Context) -> Path:
    """Every verdict the verify stage got (``relearn envs audit --verdicts`` reads it)."""
    return ctx.workdir / "verify" / "verdicts.jsonl"


def reviews_path(ctx: Context) -> Path:
    return ctx.workdir / "reviews.jsonl"


def heldout_dir(ctx: Context) -> Path:
    return ctx.workdir / "heldout"


def training_pool_path(ctx: Context) -> Path:
    """What every masks variant compiles: the verified pool, less the held-out tasks."""
    return heldout_dir(ctx) / "train.jsonl" if ctx.config.masks.heldout_tasks else verified_path(ctx)


def training_pool_stage(ctx: Context) -> str:
    """The stage that writes ``training_pool_path``: what the masks and analyze stages need."""
    return "holdout" if ctx.config.masks.heldout_tasks else "verify"


def heldout_pool_path(ctx: Context) -> Path:
    return heldout_dir(ctx) / "heldout.jsonl"


def audit_path(ctx: Context) -> Path:
    """The audit stage's records (``relearn envs audit -o``): what every masks variant applies."""
    return ctx.workdir / "audit" / "audit.jsonl"


def contrasts_path(ctx: Context) -> Path:
    return ctx.workdir / "datasets" / "contrasts.json"


def analyze_dir(ctx: Context) -> Path:
    return ctx.workdir / "analyze"


def dataset_dir(ctx: Context, variant: str) -> Path:
    return ctx.workdir / "datasets" / variant


def upstream_dir(ctx: Context) -> Path:
    train = ctx.config.train
    assert train is not None
    return ctx.workdir / "upstream" if train.tiny else ctx.config.resolve(train.init or "")


def train_dir(ctx: Context, variant: str) -> Path:
    return ctx.workdir / "train" / variant


def eval_dir(ctx: Context, name: str) -> Path:
    return ctx.workdir / "eval" / name


def report_dir(ctx: Context) -> Path:
    return ctx.workdir / "report"


def dataset_source(ctx: Context, source: str) -> str:
    """``mini``, a file or folder (relative to the pipeline file), or a Hugging Face dataset name."""
    if source == "mini":
        return source
    local = ctx.config.resolve(source)
    return str(local) if local.exists() else source
