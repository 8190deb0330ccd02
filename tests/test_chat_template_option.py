"""``--chat-template`` wherever relearn renders a template: `relearn stats --context`, `relearn
analyze nll`, the exports' tokenizer check, and the pipeline (``[masks] chat_template`` through
``Context.tokenizer()`` and ``[analyze]``).

The pool's calls recorded the prompt ids a server rendering GLM-4.5's template (trl's
``glm4moe``) over the real Qwen3.6 tokenizer sent, so a render with that template agrees with
them token for token and one with Qwen3.6's own template does not: which template a verb
rendered with shows in what it reports."""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from typer.testing import CliRunner

from harness.exporters.hf_chat import chat_messages_with_sources
from records.pools import write_atomic
from records.trajectory import FunctionCall, Message, Outcome, ToolCall, Trajectory
from relearn.analyze.nll import eligible_tokens
from relearn.analyze.pools import NamedPool
from relearn.cli.main import app
from relearn.masks.tokenizers import resolve_chat_template, with_chat_template
from relearn.ops.analyze import run_nll
from relearn.ops.export import run_export_dataset, run_export_masks
from relearn.ops.masks import run_masks
from relearn.ops.reporting import OpError
from relearn.verbs.analyze import NllOptions
from relearn.verbs.export import DatasetExportOptions, MasksExportOptions
from relearn.verbs.masks import MasksOptions

GLM = "glm4moe_training"  # the plain template ends the last turn with nothing: relearn refuses it (no end of turn)
KW = {"preserve_thinking": True}
TOOLS = [
    {"type": "function", "function": {"name": "bash", "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}}
]


@pytest.fixture(autouse=True)
def _session_tokenizer(tok: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The verbs load the session's qwen3.6 (2 s a load on a quiet machine, a dozen loads here);
    every path under test renders another template through a copy, never the object itself."""

    def load(name: str, cache_dir: Path | None = None, chat_template: str | None = None) -> Any:
        assert name == "qwen3.6", name
        return with_chat_template(tok, resolve_chat_template(chat_template) if chat_template is not None else None)

    monkeypatch.setattr("relearn.masks.tokenizers.load_tokenizer", load)


@pytest.fixture(scope="module")
def glm(tok: Any) -> Any:
    return with_chat_template(tok, resolve_chat_template(GLM))


def _agent(n: int) -> list[Message]:
    call = ToolCall(id="c1", function=FunctionCall(name="bash", arguments={"command": f"ls dir{n}"}))
    return [
        Message(role="system", content="You fix bugs."),
        Message(role="user", content=f"Fix the failing test {n}."),
        Message(role="assistant", generated=True, reasoning_content="Look around first.", content="Listing.", tool_calls=[call]),
        Message(role="tool", tool_call_id="c1", content="setup.py src tests"),
        Message(role="assistant", generated=True, reasoning_content="Now the tests.", content="Done."),
    ]


def _recorded(tok: Any, messages: list[Message]) -> list[Message]:
    """Each generated turn records the prompt ids a server rendering ``tok``'s template sent."""
    out = []
    for i, message in enumerate(messages):
        if message.generated:
            chat, _ = chat_messages_with_sources(messages[:i])
            ids = tok.apply_chat_template(chat, tools=TOOLS, add_generation_prompt=True, tokenize=True)["input_ids"]
            message = message.model_copy(update={"extra": {"prompt_token_ids": list(ids)}})
        out.append(message)
    return out


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory, glm: Any) -> Path:
    path = tmp_path_factory.mktemp("pool") / "pool.jsonl"
    trajectories = [
        Trajectory(id=f"glm-{n}", task_id=f"task-{n}", messages=_recorded(glm, _agent(n)), tools=TOOLS, outcome=Outcome(resolved=True))
        for n in range(2)
    ]
    write_atomic(path, trajectories)
    return path


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory, pool: Path, tok: Any) -> Path:
    out = tmp_path_factory.mktemp("dataset") / "glm"
    stats = run_masks(MasksOptions(pool=pool, output=out, mode="positive", chat_template=GLM), tokenizer=tok).stats
    assert stats["trajectories_out"] == 2, stats["rejections"]
    return out


def _stats(*args: str) -> Any:
    return CliRunner().invoke(app, ["stats", *args])


def test_stats_context_renders_with_the_named_template(pool: Path) -> None:
    named = _stats(str(pool), "--context", "--chat-template", GLM, "--json", "-")
    assert named.exit_code == 0, named.output
    context = json.loads(named.stdout)["context"]
    assert context["turns_checked"] == 4 and context["turns_differ"] == 0
    own = _stats(str(pool), "--context", "--json", "-")  # Qwen3.6's own template: not what the server sent
    assert own.exit_code == 0, own.output
    assert json.loads(own.stdout)["context"]["turns_differ"] == 4
    nowhere = _stats(str(pool), "--chat-template", GLM)
    assert nowhere.exit_code == 2 and "only with --context" in nowhere.output
    unknown = _stats(str(pool), "--context", "--chat-template", "no-such-family")
    assert unknown.exit_code == 2 and "--chat-template no-such-family" in unknown.output and "glm4moe" in unknown.output


def test_stats_warns_when_the_dataset_was_compiled_with_another_template(pool: Path, dataset: Path) -> None:
    other = _stats(str(pool), "--dataset", str(dataset), "--context")
    assert other.exit_code == 1, other.output
    words = " ".join(other.output.split())
    assert "compiled with another" in words and "add --chat-template glm4moe_training" in words
    same = _stats(str(pool), "--dataset", str(dataset), "--context", "--chat-template", GLM)
    assert same.exit_code == 0, same.output


def test_exports_check_the_tokenizer_with_the_named_template(tmp_path: Path, dataset: Path) -> None:
    # The dataset's own tokenizer with its own template is not what it was compiled with: the
    # refusal names the template trl ships that it was.
    with pytest.raises(OpError, match="add --chat-template glm4moe_training"):
        run_export_masks(MasksExportOptions(dataset, tmp_path / "refused.jsonl"))
    assert not (tmp_path / "refused.jsonl").exists()
    spans = run_export_masks(MasksExportOptions(dataset, tmp_path / "spans.jsonl", chat_template=GLM))
    rows = [json.loads(line) for line in (tmp_path / "spans.jsonl").read_text().splitlines()]
    assert spans.samples == len(rows) == 2 and all("<|assistant|>" in row["text"] for row in rows)  # GLM's turns
    with pytest.raises(OpError, match="chat template"):
        run_export_dataset(DatasetExportOptions(dataset, "trl", tmp_path / "refused", tokenizer="qwen3.6"))
    assert not (tmp_path / "refused").exists()
    # Without --tokenizer, --chat-template alone checks the dataset's tokenizer with it.
    with pytest.raises(OpError, match="chat template"):
        run_export_dataset(DatasetExportOptions(dataset, "trl", tmp_path / "refused", chat_template="qwen3"))
    written = run_export_dataset(DatasetExportOptions(dataset, "trl", tmp_path / "trl", tokenizer="qwen3.6", chat_template=GLM))
    assert written.rows == 2
    result = CliRunner().invoke(
        app, ["export", "masks", str(dataset), "-o", str(tmp_path / "cli.jsonl"), "--chat-template", str(tmp_path / "missing.jinja")]
    )
    assert result.exit_code == 2 and "--chat-template" in result.output and not (tmp_path / "cli.jsonl").exists()


def test_analyze_nll_scores_the_eligible_tokens_of_the_named_template(tmp_path: Path, pool: Path, glm: Any) -> None:
    def nll(out: Path, chat_template: str | None) -> dict[str, Any]:
        options = NllOptions(
            out=out, pools=[NamedPool("glm", pool)], tiny="qwen3", chat_template=chat_template, bootstrap=100, progress=False, chart=False
        )
        run_nll(options)
        return json.loads((out / "nll.json").read_text())

    trajectories = [Trajectory.model_validate_json(line) for line in pool.read_text().splitlines()]
    eligible = {t.id: sum(s.eligible for s in eligible_tokens(t, glm, KW)) for t in trajectories}
    named = nll(tmp_path / "glm", GLM)
    assert {r["trajectory_id"]: r["eligible"] for r in named["trajectories"]["glm"]} == eligible
    assert named["settings"]["chat_template"] == hashlib.sha256(resolve_chat_template(GLM).encode()).hexdigest()
    # Under Qwen3.6's own template the recorded prompts are another template's: nothing scores.
    with pytest.raises(OpError, match="no trajectory could be scored"):
        nll(tmp_path / "own", None)
    scores = [json.loads(line) for line in (tmp_path / "own" / "nll-scores.jsonl").read_text().splitlines()]
    assert scores and all(s["rejected"].startswith("recorded prompt ids do not end with the generation prompt") for s in scores)
    with pytest.raises(OpError, match="--chat-template nope"):
        run_nll(NllOptions(out=tmp_path / "x", pools=[NamedPool("glm", pool)], tiny="qwen3", chat_template="nope", progress=False))


def test_the_pipeline_renders_with_masks_chat_template_relative_to_its_file(
    tmp_path: Path, tokenizer_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from relearn.pipeline.config import AnalyzeConfig, load_pipeline
    from relearn.pipeline.context import Context
    from relearn.pipeline.stages import analyze as analyze_stage
    from relearn.pipeline.stages import masks as masks_stage

    template = "{# ours #}" + resolve_chat_template(GLM)
    (tmp_path / "templates").mkdir()
    (tmp_path / "templates" / "ours.jinja").write_text(template)
    path = tmp_path / "p.toml"
    path.write_text(
        'workdir = "w"\n[pool.import]\nformat = "codex"\npaths = ["x"]\n[masks]\nchat_template = "templates/ours.jinja"\n'
        '[train]\ntiny = "qwen3"\n[analyze]\n'
    )
    monkeypatch.undo()  # the real load_tokenizer: its chat_template argument is what the pipeline passes
    monkeypatch.setenv("RELEARN_CACHE", str(tokenizer_cache))
    config = load_pipeline(path)
    assert config.masks.chat_template == str(tmp_path / "templates" / "ours.jinja")
    ctx = Context(config, Console(file=io.StringIO()))
    assert ctx.tokenizer().chat_template == template  # what the masks compile with and the start model is saved with
    assert config.analyze is not None
    options = config.analyze.nll_options([], tmp_path, "model", tmp_path / "r.jsonl", config.masks, ray=None)
    assert options.chat_template == config.masks.chat_template and "chat_template" not in AnalyzeConfig.model_fields
    sha = hashlib.sha256(template.encode()).hexdigest()
    (stage,) = analyze_stage.stages(ctx)
    assert masks_stage.settings(ctx)["chat_template"] == stage.settings["chat_template"] == sha
    # A trl name stays a name.
    path.write_text(path.read_text().replace("templates/ours.jinja", GLM))
    assert load_pipeline(path).masks.chat_template == GLM
