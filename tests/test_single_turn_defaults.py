"""The single-turn defaults are the paper's (its C.2, C.3): no-thinking responses and a
32,768-token limit, said in `--help`; the thinking form and another limit stay one option away."""

from __future__ import annotations

import io
import json
from pathlib import Path

from rich.console import Console
from typer.testing import CliRunner

from records.pools import read_trajectories_lenient
from relearn.cli.main import app
from relearn.masks.compile import CONTEXT_TOKENS
from relearn.ops.single_turn import run_single_turn_import
from relearn.pipeline.config import load_pipeline
from relearn.pipeline.context import Context
from relearn.pipeline.stages.pool_single_turn import import_options
from relearn.verbs.single_turn import SINGLE_TURN_CONTEXT, SingleTurnImportOptions

ROLLOUT = {
    "prompt": "Compute 3/4 + 1/8. Put the final answer in \\boxed{}.",
    "response": "<think>\n3/4 = 6/8, so 6/8 + 1/8 = 7/8.\n</think>\n\nThe answer is $\\boxed{\\frac{7}{8}}$.",
    "reward": 1.0,
    "step": 3,
    "task_id": "math-m01",
}
PIPELINE = """\
workdir = "work"
[pool.single_turn]
tasks = "mini"
{pool}
[review]
judge1 = "keep-judge"
[masks]
{masks}
[train]
tiny = "qwen3"
{train}
"""


def _pipeline(tmp_path: Path, pool: str = "", masks: str = "", train: str = "") -> Context:
    (tmp_path / "p.toml").write_text(PIPELINE.format(pool=pool, masks=masks, train=train))
    return Context(load_pipeline(tmp_path / "p.toml"), Console(file=io.StringIO()))


def test_the_import_keeps_the_response_whole_unless_thinking_is_asked(tmp_path: Path) -> None:
    source = tmp_path / "rollouts.jsonl"
    source.write_text(json.dumps(ROLLOUT) + "\n")
    assert SingleTurnImportOptions([source], tmp_path / "x").thinking is False
    run_single_turn_import(SingleTurnImportOptions([source], tmp_path / "plain.jsonl"))
    (plain,) = read_trajectories_lenient(tmp_path / "plain.jsonl", [])
    assert plain.messages[-1].reasoning_content is None
    assert plain.messages[-1].content == "3/4 = 6/8, so 6/8 + 1/8 = 7/8.\n\nThe answer is $\\boxed{\\frac{7}{8}}$."
    # The thinking form through the CLI flag: the <think> block becomes the reasoning.
    result = CliRunner().invoke(app, ["single-turn", "import", str(source), "-o", str(tmp_path / "think.jsonl"), "--thinking"])
    assert result.exit_code == 0, result.output
    (think,) = read_trajectories_lenient(tmp_path / "think.jsonl", [])
    assert think.messages[-1].reasoning_content == "3/4 = 6/8, so 6/8 + 1/8 = 7/8."
    assert think.messages[-1].content == "The answer is $\\boxed{\\frac{7}{8}}$."


def test_help_states_the_defaults() -> None:
    result = CliRunner().invoke(app, ["single-turn", "import", "--help"], env={"COLUMNS": "400", "NO_COLOR": "1"})
    text = " ".join(result.output.split())
    assert result.exit_code == 0
    assert "no-thinking form (the default, as the paper's single-turn relearning" in text and "32,768" in text


def test_the_single_turn_pipeline_defaults_to_no_thinking_and_32768_tokens(tmp_path: Path) -> None:
    ctx = _pipeline(tmp_path)
    config = ctx.config
    assert SINGLE_TURN_CONTEXT == 32_768 < CONTEXT_TOKENS
    assert config.masks.ctx == SINGLE_TURN_CONTEXT and config.train is not None and config.train.ctx == SINGLE_TURN_CONTEXT
    assert import_options(ctx, tmp_path / "pool.jsonl").thinking is False
    masks = config.masks.options(Path("p"), Path("o"), Path("r"), "ross", no_thinking=not config.pool.single_turn.thinking, ray=None)  # type: ignore[union-attr]
    assert masks.ctx == SINGLE_TURN_CONTEXT and masks.no_thinking
    assert config.train.options(Path("d"), Path("o"), "upstream", "qwen3.6").ctx == SINGLE_TURN_CONTEXT


def test_the_thinking_form_and_another_limit_are_one_field_away(tmp_path: Path) -> None:
    ctx = _pipeline(tmp_path, pool="thinking = true", masks="ctx = 40000", train="ctx = 65536")
    assert import_options(ctx, tmp_path / "pool.jsonl").thinking is True
    assert ctx.config.masks.ctx == 40_000 and ctx.config.train is not None and ctx.config.train.ctx == 65_536


def test_an_agentic_pipeline_keeps_the_agentic_limit(tmp_path: Path) -> None:
    (tmp_path / "a.toml").write_text('workdir = "w"\n[pool]\nimport = { format = "codex", paths = ["x"] }\n[train]\ntiny = "qwen3"\n')
    config = load_pipeline(tmp_path / "a.toml")
    assert config.masks.ctx == CONTEXT_TOKENS and config.train is not None and config.train.ctx == CONTEXT_TOKENS
