"""What `relearn masks` accepts (the pipeline's ``[masks]``); the work is ``relearn.ops.masks``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from relearn.masks.compile import CompileOptions, Context, DefectScope, Mode
from relearn.masks.shards import SHARD_SIZE
from relearn.masks.template import PrefixCheck
from relearn.options import option, same_as
from relearn.verbs.containers import ContainerOptions

PIPELINE_PATHS = "the pipeline names it: the work folder's training pool, reviews.jsonl, datasets/VARIANT"
# --chat-template's help, the same wherever a verb renders a template (stats, analyze, export).
CHAT_TEMPLATE_HELP = (
    "The chat template to render with, in place of the tokenizer's: a Jinja file, or the name of a template trl ships "
    "(qwen3, qwen3_6, glm4moe, deepseekv3, gptoss, nemotron_3_nano, lfm2_v2..., or its NAME_training variant)."
)


@dataclass
class MasksOptions:
    """Compile token masks A \\ E over the real chat template, VALIDATE them, write Parquet shards.

    Each trajectory is rendered once; each rejected trajectory is counted with its reason. Resumable (finished shards with the same options are kept) and deterministic.

    ross and ross-nomask validate the same defects and so hold the same trajectories: the masking contrast is the same subset with and without the mask.
    """

    pool: Path = option(
        help="Pool of trajectories (.jsonl or .jsonl.zst).", argument=True, metavar="POOL", exists="file", front="cli", why=PIPELINE_PATHS
    )
    output: Path = option(
        help="Dataset folder: shard-*.parquet and stats.json.", flags=("-o", "--output"), metavar="DIR", front="cli", why=PIPELINE_PATHS
    )
    reviews: Path | None = option(
        None, "Review JSONL (needed for ross and ross-nomask).", flags=("--reviews", "-r"), exists="file", front="cli", why=PIPELINE_PATHS
    )
    tokenizer: str = option("qwen3.6", "`qwen3.6` or `qwen3` (built in, offline) or a Hugging Face tokenizer folder.")
    chat_template: str | None = option(
        None, CHAT_TEMPLATE_HELP + " Part of the dataset's identity: another template compiles again.", metavar="NAME|FILE"
    )
    mode: Mode = option(
        CompileOptions.mode, "ross (A \\ E, accepted) | positive (A, all verified-positive) | ross-nomask (A, accepted).",
        front="cli", why="[masks].variants names the modes, one dataset each",
    )  # fmt: skip
    ctx: int = option(
        CompileOptions.ctx, "Longest sample in tokens; longer trajectories are dropped and counted, never cut.", ge=1, metavar="TOKENS"
    )
    prefix_check: PrefixCheck = option(
        CompileOptions.prefix_check, "header (each turn opens with the generation prompt) | every (re-render each prefix) | off."
    )
    per_turn: bool = option(CompileOptions.per_turn, "One sample per generated turn, for templates that rewrite earlier turns.")
    preserve_thinking: bool = option(True, "Keep reasoning on every turn (Qwen3.6's preserve_thinking).")
    no_thinking: bool = option(
        False, "Render in the template's no-thinking form (enable_thinking=False: its empty think block is part of the generation "
        "prompt), for single-turn rollouts imported with `relearn single-turn import --no-thinking`.",
        flag_only=True, front="cli", why="the pipeline reads it from [pool.single_turn].thinking",
    )  # fmt: skip
    shard_size: int = option(SHARD_SIZE, "Trajectories of the pool per shard.", ge=1)
    include_suspicious: bool = option(
        CompileOptions.include_suspicious, "Also take successes the verifier found suspicious (edited tests or pytest config, code "
        "reaching into pytest); by default they are rejected and counted.",
    )  # fmt: skip
    defect_scope: DefectScope = option(
        CompileOptions.defect_scope, "action: a defect in a tool call excludes the whole call as the template renders it (tags, "
        "function name, every argument, and the end of turn after a turn's last call), since the error is the decision to call; "
        "minimal: only the quoted characters (the ablation).",
    )  # fmt: skip
    workers: int = option(
        1, "Worker processes compiling shards at once (each shard is one work unit; the files are written by this process, in the "
        "same bytes). 1: compile here, one shard after another, in the least memory.", ge=1,
    )  # fmt: skip
    ray: str | None = same_as(ContainerOptions, "ray")
    audit: Path | None = option(
        None, "Image audit records (`relearn envs audit -o FILE`): the trajectories of tasks whose images it flags (.git exposes the "
        "fix) are left out of every mode and counted, as the paper's training set left them out. Without it no audit is applied, "
        "and the summary says so.", exists="file",
    )  # fmt: skip
    keep_flagged: bool = option(False, "Keep the trajectories of the tasks --audit flags (still counted in the summary).")
    context: Context = option(
        CompileOptions.context, "as-sent: a trajectory whose render departs from what the model saw is compiled one sample per turn "
        "under the context as sent: its calls' recorded prompt ids where the pool has them and they disagree with the render, or "
        "the history without reasoning where the harness never sent reasoning back (observations as user turns, text-only "
        "agents); stats.json counts trajectories by the rule that decided | render: trust the template's render of the history.",
    )  # fmt: skip
    recorded_ids: bool = option(
        CompileOptions.recorded_ids, "Train each generated turn on the token ids the policy recorded for it (where every generated "
        "turn of a sample has them), not on its text tokenised again; ids that decode to other text than the turn are reported "
        "in stats.json and the text is trained.",
    )  # fmt: skip

    def template_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"preserve_thinking": self.preserve_thinking}
        if self.no_thinking:
            kwargs["enable_thinking"] = False
        return kwargs

    def compile_options(self, flagged_tasks: dict[str, str] | None = None) -> CompileOptions:
        """``flagged_tasks``: those the audit file flags (task id -> why), left out unless kept."""
        return CompileOptions(
            mode=self.mode, ctx=self.ctx, template_kwargs=self.template_kwargs(), prefix_check=self.prefix_check,
            per_turn=self.per_turn, include_suspicious=self.include_suspicious, defect_scope=self.defect_scope,
            flagged_tasks={} if self.keep_flagged or flagged_tasks is None else dict(flagged_tasks),
            context=self.context, recorded_ids=self.recorded_ids,
        )  # fmt: skip
