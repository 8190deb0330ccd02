"""What `relearn analyze nll` and `relearn analyze passk` accept (the pipeline's ``[analyze]``); the work is ``relearn.ops.analyze``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from relearn.analyze.nll import BATCH
from relearn.analyze.pools import NamedPool
from relearn.analyze.split import BOOTSTRAP_SAMPLES
from relearn.masks.compile import Context, DefectScope
from relearn.options import option, same_as
from relearn.train.options import TrainOptions
from relearn.verbs.containers import ContainerOptions
from relearn.verbs.masks import CHAT_TEMPLATE_HELP, MasksOptions

BUILTIN_TOKENIZER = MasksOptions.tokenizer
POOL_HELP = (
    "A pool as NAME=PATH (.jsonl or .jsonl.zst); repeat for several, e.g. --pool historical=a.jsonl --pool current=b.jsonl. "
    "The first is the baseline."
)
PIPELINE_MODELS = "the pipeline scores its own pools (training, held-out) under its own models (the start model, each variant)"
AS_MASKS = "the pipeline scores as its [masks] compiled"


@dataclass
class NllOptions:
    """Compatibility: token-level NLL of each pool's eligible tokens under one model.

    Each trajectory is rendered over the chat template and scored on its eligible tokens A (generated assistant turns, as `relearn masks` finds them; defects are not removed), everything else staying as context. Per pool: NLL per token (token-weighted, 95% bootstrap CI), perplexity, the distribution of per-trajectory means (mean with CI, median, p10-p90) and the difference from the first pool. Lower means more compatible: historical rollouts of the same policy line, current-policy rollouts and an external teacher's can be compared side by side. Scores are cached in --out; a rerun is free.

    With --reviews, each trajectory's eligible tokens are also split by the ROSS mask its latest review gives: kept (A \\ E, what ROSS trains on) and excluded (E), with the NLL of each, of each defect category's excluded tokens and of the excluded - kept gap (95% bootstrap over trajectories). A trajectory the review rejects, or that the mask compiler refuses, is scored but not split, and counted by reason; one whose latest review line is unreadable is listed too (never split by an earlier review). A changed review is split again; everything else comes from the cache.

    With --workers N (CPU) or --ray ADDRESS, batches of trajectories are scored by worker processes or on a Ray cluster's nodes (--device cuda: each unit asks Ray for a GPU, and this machine needs none); each worker process loads the model once. Only this process writes the score cache and the results, which equal a run here.
    """

    out: Path = option(
        help="Folder for nll.json, nll.md, nll.png and the score cache nll-scores.jsonl.", flags=("--out", "-o"), metavar="DIR",
        front="cli", why="the pipeline writes each model's scores under analyze/MODEL/",
    )  # fmt: skip
    pools: list[NamedPool] = option(  # the first is the baseline of the differences
        help=POOL_HELP, factory=list, flags=("--pool", "-p"), metavar="NAME=PATH", front="cli", why=PIPELINE_MODELS
    )
    reviews: Path | None = option(
        None, "reviews.jsonl (relearn review): also split each pool's eligible tokens into kept (A \\ E) and excluded (E, by category) "
        "as `relearn masks --mode ross` does; the latest review line of a trajectory is used.",
        flags=("--reviews", "-r"), front="cli", why="the pipeline splits by its own review stage's reviews.jsonl",
    )  # fmt: skip
    defect_scope: DefectScope = option(
        MasksOptions.defect_scope, "With --reviews: action (a defect in a tool call excludes the whole call, as `relearn masks` does "
        "by default) | minimal (only the quoted text).", front="cli", why=AS_MASKS,
    )  # fmt: skip
    context: Context = option(
        MasksOptions.context, "as-sent: a trajectory whose render departs from what the model saw (its recorded prompt ids disagree, "
        "or the harness never sent reasoning back) is scored one turn at a time under the context it was sent, as `relearn masks` "
        "compiles it | render: every turn under the template's render of the history.", front="cli", why=AS_MASKS,
    )  # fmt: skip
    model: str | None = option(
        None, "Model folder: any Hugging Face causal LM (the current policy, say).", metavar="DIR", front="cli", why=PIPELINE_MODELS
    )
    tiny: Literal["qwen3", "qwen3-moe", "qwen3.5-moe"] | None = option(
        None, "Tiny random model instead of --model (tests).", front="cli", why=PIPELINE_MODELS
    )
    seed: int = option(0, "Seed of a --tiny model's init.", front="cli", why=PIPELINE_MODELS)
    tokenizer: str | None = option(
        None, "`qwen3.6` (built in, offline) or a tokenizer folder (default: the --model folder's; qwen3.6 with --tiny).",
        metavar="NAME|DIR", front="cli", why=AS_MASKS,
    )  # fmt: skip
    chat_template: str | None = option(
        None, CHAT_TEMPLATE_HELP + " Use the one `relearn masks --chat-template` compiled with.", metavar="NAME|FILE",
        front="cli", why=AS_MASKS,
    )  # fmt: skip
    ctx: int = option(
        MasksOptions.ctx, "Longest trajectory in tokens; longer ones are skipped and counted, never cut.", ge=2, metavar="TOKENS",
        front="cli", why=AS_MASKS,
    )  # fmt: skip
    limit: int | None = option(None, "Read at most the first N records of each pool.", ge=1)
    positive_only: bool = option(
        False, "Score only verified-positive trajectories (what SFT would train on).", flag_only=True,
        front="cli", why="the pipeline scores what its variants trained on: verified-positive trajectories only",
    )  # fmt: skip
    device: str = option("cpu", "cpu | cuda | cuda:N.", metavar="DEVICE")
    bf16: bool = option(False, "Run the model in bf16 (the softmax stays fp32).", flag_only=True)
    attn: Literal["sdpa", "flash_attention_2", "eager"] = option(TrainOptions.attn, "Attention implementation.")
    chunk: int = option(TrainOptions.chunk, "Eligible positions per LM-head chunk (memory ~ chunk x vocab x 4 bytes).", ge=1)
    preserve_thinking: bool = option(
        MasksOptions.preserve_thinking, "Keep reasoning on every turn (Qwen3.6's preserve_thinking), as `relearn masks` does.",
        front="cli", why=AS_MASKS,
    )  # fmt: skip
    bootstrap: int = option(BOOTSTRAP_SAMPLES, "Bootstrap resamples for the 95% intervals.", ge=100)
    progress: bool = option(True, "Show the progress bar.", front="cli", why="the pipeline draws its own progress")
    workers: int = option(
        1, "Worker processes scoring on CPU at once (each loads the model once; batches of trajectories are their work units). "
        "1: score here.", ge=1,
    )  # fmt: skip
    ray: str | None = same_as(ContainerOptions, "ray")
    batch: int = option(
        BATCH, "With --workers or --ray: trajectories per work unit (larger: less overhead per unit; smaller: spread over more "
        "workers).", ge=1,
    )  # fmt: skip
    chart: bool = True  # also draw nll.png

    @property
    def tokenizer_name(self) -> str:
        return self.tokenizer or self.model or BUILTIN_TOKENIZER


@dataclass
class PasskOptions:
    """Complementarity: per-problem success rates, unbiased pass@k curves, problems solved by one pool only.

    Success is the verifier's (resolved, or a positive reward); trajectories without a verifier result or a task_id are rejected and listed, never counted as failures. Over the problems all pools attempted: problems solved only by each pool, and by any; for each pair of pools, problems solved by both, only one, or neither.
    """

    out: Path = option(help="Folder for passk.json, passk.md and passk.png.", flags=("--out", "-o"), metavar="DIR")
    pools: list[NamedPool] = option(help=POOL_HELP, factory=list, flags=("--pool", "-p"), metavar="NAME=PATH")
    max_k: int | None = option(
        None, "Largest k of the curves (default: the fewest attempts any problem of the pool has, so every point averages the same "
        "problems).", ge=1,
    )  # fmt: skip
    limit: int | None = option(None, "Read at most the first N records of each pool.", ge=1)
