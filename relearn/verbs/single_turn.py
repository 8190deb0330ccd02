"""What `relearn single-turn import | verify | review` accept (the pipeline's ``[pool.single_turn]``);
the work is ``relearn.ops.single_turn``."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, Literal

from relearn.options import nested, option, same_as
from relearn.verbs.review import JudgeOptions, ReviewOptions

# The row presets of harness.importers.single_turn, and chat records with one assistant turn.
SingleTurnFormat = Literal["rows", "verl", "openrlhf", "chat"]
# The token limit of the paper's single-turn relearning (its C.3), the single-turn pipeline's
# default [masks] and [train] ctx (the agentic default is relearn.masks.compile.CONTEXT_TOKENS).
SINGLE_TURN_CONTEXT = 32_768
PIPELINE_NAMES = "the pipeline names it: the work folder's pool, verified pool and reviews"
FORMAT_HELP = (
    "Column layout: rows (prompt, response, reward, step, task_id, checkpoint), verl ({step}.jsonl dumps: input, output, score, "
    "step), openrlhf (prompt, output, reward, global_step), or chat (records of chat messages with one assistant turn; no column "
    "flags)."
)
THINKING_HELP = (
    "Keep the response whole as visible text, for training in the template's no-thinking form (the default, as the paper's "
    "single-turn relearning: no-thinking responses, a 32,768-token limit in the pipeline), or --thinking: split a response's "
    "<think> block into reasoning (the template's thinking form, as sampled; then compile with `relearn masks` without "
    "--no-thinking)."
)


def _column(help: str) -> Any:
    return option(None, help, metavar="COLUMN", front="cli", why="the pipeline file names it in [pool.single_turn] columns")


@dataclass
class SingleTurnColumns:
    """The command line's column flags; the pipeline file writes the same as its ``columns`` table."""

    prompt: str | None = _column("The prompt column (dotted paths reach nested or JSON-text columns).")
    response: str | None = _column("The response column (reasoning and final answer).")
    reward: str | None = _column("The column of the reward the RL run logged.")
    step: str | None = _column("The column of the RL step that sampled the response.")
    task_id: str | None = _column("The column naming the task (default: a digest of the prompt).")
    id: str | None = _column("The column of the rollout's own id (default: a content hash).")
    checkpoint: str | None = _column("The column naming the checkpoint that sampled the response.")
    token_ids: str | None = _column("The column of the response's sampled token ids.")
    logprobs: str | None = _column("The column of the sampled tokens' log-probabilities.")


# The columns a row preset's layout can be overridden for (harness.importers.single_turn.SingleTurnOptions).
COLUMNS = tuple(f.name for f in fields(SingleTurnColumns))


@dataclass
class SingleTurnImportOptions:
    """Import single-turn rollouts into a pool: one user prompt and one generated response per row.

    A response's <think>...</think> block (or its text up to a lone </think>) becomes the reasoning and the rest the final answer. The logged reward is kept as the imported outcome until `relearn single-turn verify` grades the response. A damaged row is rejected with its file, line and field and the rows after it are read; a rerun adds nothing already in the pool.
    """

    paths: list[Path] = option(
        help="Rollout files (.jsonl, .json, .parquet), or folders walked recursively; in a pipeline file, relative to it (default there with tasks = \"mini\": the suite's rollouts).",
        argument=True, metavar="PATH", table_type=list[str] | None,  # kept as written: the stage resolves them
    )  # fmt: skip
    output: Path = option(
        help="Pool to append to (.jsonl or .jsonl.zst).", flags=("-o", "--output"), metavar="FILE", front="cli", why=PIPELINE_NAMES
    )
    format: SingleTurnFormat = option("rows", FORMAT_HELP, flags=("--preset",))
    columns: dict[str, str] = option(
        factory=dict, help="Columns over the row preset's, by name: " + ", ".join(COLUMNS) + ".", front="pipeline",
        why="the command line names each column by its own flag (SingleTurnColumns)",
    )  # fmt: skip
    thinking: bool = option(False, THINKING_HELP)  # False: the paper's single-turn relearning (its C.2)


@dataclass
class SingleTurnVerifyOptions:
    """Grade every response with its task's verifier: Math by math-verify against the reference answer, Code by the task's unit tests (visible and hidden) on the last ```python block, in a fresh container without network, IF by IFEval's checkers for the prompt's constraints.

    The verdict replaces the reward the RL run logged (kept as `verdict.logged_reward`). Graded rollouts are appended to OUTPUT.partial as they are graded, so a killed run resumes without grading them again; the file is renamed into place at the end. A rollout whose task is unknown is listed and left ungraded (exit 1). Code tasks need the Docker engine; the offline base image is built on first use.
    """

    pool: Path = option(help="Pool of single-turn rollouts.", argument=True, metavar="POOL", front="cli", why=PIPELINE_NAMES)
    output: Path = option(
        help="The pool with each response's verdict (written beside, then renamed into place).", flags=("-o", "--output"),
        metavar="FILE", front="cli", why=PIPELINE_NAMES,
    )  # fmt: skip
    tasks: str = option("mini", "Tasks .jsonl (id, kind, prompt, answer | tests | constraints), or `mini` for the shipped suite.")


KEEP_ROLES = "[review] names them: judge1 the keep judge, judge2 the auditor, judge2_base_url the auditor's endpoint"


@dataclass
class KeepJudges:
    """The command line's names for the judges' roles in the keep-interval review (``JudgeOptions``'
    judge1, judge2 and judge2_base_url)."""

    judge: str = option(help="Model of the keep judge, which selects the keep intervals.", metavar="MODEL", front="cli", why=KEEP_ROLES)
    auditor: str | None = option(
        None, "Model of the auditor, which checks the kept text alone (default: the judge's model).", metavar="MODEL", front="cli",
        why=KEEP_ROLES,
    )  # fmt: skip
    auditor_base_url: str | None = option(None, "The auditor's endpoint, when it differs.", metavar="URL", front="cli", why=KEEP_ROLES)

    def judge_options(self, judges: JudgeOptions) -> JudgeOptions:
        return replace(judges, judge1=self.judge, judge2=self.auditor, judge2_base_url=self.auditor_base_url)


@dataclass
class SingleTurnReviewOptions:
    """Review verifier-positive single-turn rollouts: keep intervals for Math and Code, full supervision for instruction following.

    The keep judge quotes the correct, self-contained reasoning and the complete final answer (leaving out wrong steps, abandoned approaches and repeated answer emission) or drops the response when no clean solution can be assembled from its own text; every quote is grounded to exact offsets, and one that does not ground drops the response. The auditor then reads the kept text alone and must find it self-contained and correct. Instruction-following positives are accepted whole without a call. Answers are cached beside the output, so a rerun costs nothing for what was reviewed; `relearn masks --mode ross` compiles A ∩ K from the reviews.
    """

    # The pipeline's single-turn review reads [review], as the agentic review does.
    pool: Path = option(help="Verified pool of single-turn rollouts.", argument=True, metavar="POOL", front="cli", why=PIPELINE_NAMES)
    output: Path = option(
        help="Reviews JSONL (appended; resumable by rollout id).", flags=("-o", "--output"), metavar="FILE", front="cli",
        why=PIPELINE_NAMES,
    )  # fmt: skip
    # judge1: the keep judge, which selects the keep intervals (required); judge2: the
    # auditor, which reads the kept text alone (default: the keep judge's model). Its
    # ``context`` is not used: a single-turn judge reads the whole response.
    judges: JudgeOptions = nested(JudgeOptions)
    workers: int = same_as(ReviewOptions, "workers")
    spend_cap: float | None = same_as(ReviewOptions, "spend_cap")
