from __future__ import annotations

import json
from pathlib import Path

import pytest
import trl
from transformers.utils.chat_template_utils import render_jinja_template

from harness.exporters.atif import to_atif
from harness.exporters.hf_chat import to_chat_messages
from harness.importers import atif, codex, mini_swe_agent
from harness.scripted.codex_sessions import session, write_rollout

QWEN36_TEMPLATE = Path(trl.__file__).parent / "chat_templates" / "qwen3_6.jinja"


def _atif_document() -> dict:
    """An ATIF v1.7 trajectory shaped as Harbor's models define it."""
    return {
        "schema_version": "ATIF-v1.7",
        "session_id": "trial-42",
        "agent": {
            "name": "codex",
            "version": "0.135.0",
            "model_name": "qwen3.6",
            "tool_definitions": [{"type": "function", "function": {"name": "shell", "parameters": {"type": "object"}}}],
        },
        "steps": [
            {"step_id": 1, "source": "system", "message": "You are Codex."},
            {"step_id": 2, "source": "user", "message": "Fix add()."},
            {
                "step_id": 3,
                "timestamp": "2026-06-05T04:58:20Z",
                "source": "agent",
                "model_name": "qwen3.6",
                "message": "Reading the file.",
                "reasoning_content": "Look first.",
                "tool_calls": [{"tool_call_id": "c1", "function_name": "shell", "arguments": {"command": ["cat", "calc.py"]}}],
                "observation": {"results": [{"source_call_id": "c1", "content": "def add(a, b): return a - b"}]},
                "metrics": {
                    "prompt_tokens": 120,
                    "completion_tokens": 3,
                    "completion_token_ids": [11, 12, 13],
                    "logprobs": [-0.1, -0.2, -0.3],
                },
            },
            {"step_id": 4, "source": "agent", "message": "Copied from a previous episode.", "is_copied_context": True},
            {"step_id": 5, "source": "agent", "message": "Done.", "metrics": {"prompt_tokens": 200, "completion_tokens": 2}},
        ],
        "final_metrics": {"total_prompt_tokens": 320, "total_completion_tokens": 5, "total_steps": 5},
    }


def test_atif_import(tmp_path: Path) -> None:
    path = tmp_path / "trajectory.json"
    path.write_text(json.dumps(_atif_document()))
    (result,) = list(atif.read(path))
    assert result.error is None, result.error
    t = result.trajectory
    assert [m.role for m in t.messages] == ["system", "user", "assistant", "tool", "assistant", "assistant"]
    assert [m.generated for m in t.messages] == [False, False, True, False, False, True]
    assert t.messages[2].token_ids == [11, 12, 13] and t.messages[2].logprobs == [-0.1, -0.2, -0.3]
    assert t.messages[2].usage.input_tokens == 120
    assert t.messages[3].tool_call_id == "c1"
    assert t.tools[0]["function"]["name"] == "shell"
    assert t.id.startswith("t-") and t.policy.name == "qwen3.6"  # session_id is run-scoped, not an id
    document = _atif_document() | {"trajectory_id": "doc-7"}
    path.write_text(json.dumps(document))
    (result,) = list(atif.read(path))
    assert result.trajectory.id == "atif-doc-7"
    assert t.usage.output_tokens == 5


def test_discovery_skips_harbor_result_files(tmp_path: Path) -> None:
    trial = tmp_path / "jobs" / "job-1" / "hello__abc"
    (trial / "agent").mkdir(parents=True)
    (trial / "agent" / "trajectory.json").write_text(json.dumps(_atif_document()))
    (trial / "agent" / "trajectory.summarization-1-summary.json").write_text(json.dumps(_atif_document()))
    (trial / "result.json").write_text("{}")
    (trial / "config.json").write_text("{}")
    assert sorted(p.name for p in atif.discover(tmp_path)) == ["trajectory.json", "trajectory.summarization-1-summary.json"]


def test_atif_round_trip_is_lossless(tmp_path: Path) -> None:
    path = tmp_path / "trajectory.json"
    original = _atif_document()
    path.write_text(json.dumps(original))
    (result,) = list(atif.read(path))
    exported = to_atif(result.trajectory, agent_name="codex", agent_version="0.135.0")
    assert exported["steps"] == original["steps"]
    assert exported["agent"] == original["agent"]
    assert exported["session_id"] == "trial-42"


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda d: d.update(schema_version="ATIF-v2.0"), "schema_version: 'ATIF-v2.0' is not ATIF v1.x"),
        (lambda d: d.update(steps=[]), "steps: empty"),
        (
            lambda d: d["steps"][2]["observation"]["results"][0].update(source_call_id="zz"),
            "steps[2].observation.results[0].source_call_id",
        ),
        (lambda d: d["steps"][1].update(tool_calls=[]), "steps[1].tool_calls: only agent steps"),
        (lambda d: d["steps"][2].update(message={"role": "assistant"}), "steps[2].message: expected string or array, got object"),
    ],
)
def test_atif_violations_are_located(tmp_path: Path, mutate, expected: str) -> None:  # noqa: ANN001
    document = _atif_document()
    mutate(document)
    path = tmp_path / "trajectory.json"
    path.write_text(json.dumps(document))
    (result,) = list(atif.read(path))
    assert result.trajectory is None and expected in str(result.error), str(result.error)


def test_codex_to_atif_is_valid_and_reimports(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    write_rollout(path, session(steps=2))
    (result,) = list(codex.read(path))
    document = to_atif(result.trajectory)
    assert document["schema_version"] == "ATIF-v1.7"
    assert [s["step_id"] for s in document["steps"]] == list(range(1, len(document["steps"]) + 1))
    for step in document["steps"]:
        for res in (step.get("observation") or {}).get("results", []):
            assert res["source_call_id"] in {c["tool_call_id"] for c in step["tool_calls"]}
    out = tmp_path / "trajectory.json"
    out.write_text(json.dumps(document))
    (again,) = list(atif.read(out))
    assert again.error is None
    assert [m.role for m in again.trajectory.messages] == [
        "system" if m.role == "developer" else m.role for m in result.trajectory.messages
    ]


def test_chat_messages_render_with_the_real_qwen36_template(tmp_path: Path, samples: Path) -> None:
    template = QWEN36_TEMPLATE.read_text()
    path = tmp_path / "r.jsonl"
    write_rollout(path, session(steps=1))
    (result,) = list(codex.read(path))
    chat = to_chat_messages(result.trajectory)
    tools = [
        {
            "type": "function",
            "function": {
                "name": "shell",
                "description": "run",
                "parameters": {"type": "object", "properties": {"command": {"type": "array"}}},
            },
        }
    ]
    rendered = render_jinja_template(conversations=[chat], tools=tools, chat_template=template)[0][0]
    assert rendered.startswith("<|im_start|>system\n")
    assert rendered.count("<|im_start|>system") == 1  # developer text did not become a second system turn
    assert "<tool_call>\n<function=shell>" in rendered and "<parameter=command>" in rendered
    assert "<tool_response>\nProcess exited with code 0" in rendered
    assert "Fixed: add() now returns a + b." in rendered
    # The mini-swe-agent sample renders too (text protocol, list content flattened).
    (mini,) = list(mini_swe_agent.read(samples / "mini_swe_agent_v1.13.4.traj.json"))
    text = render_jinja_template(conversations=[to_chat_messages(mini.trajectory)], chat_template=template)[0][0]
    assert text.count("<|im_start|>assistant") == 3


def _compacted_document(summary: str | None) -> dict:
    """A terminus-2-shaped ATIF v1.7 episode: work, a compaction step (a system step whose
    extra.context_management says how the context was rebuilt, with sub-agent references),
    and the work after it."""
    results: list[dict] = [
        {"subagent_trajectory_ref": [{"trajectory_path": "trajectory.summarization-1-summary.json", "session_id": "s-sum"}]}
    ]
    if summary is not None:
        results.insert(0, {"content": summary})
    return {
        "schema_version": "ATIF-v1.7",
        "trajectory_id": "main-1",
        "agent": {"name": "terminus-2", "version": "2.0", "model_name": "qwen3.6"},
        "steps": [
            {"step_id": 1, "source": "user", "message": "PRE-TASK: fix add() in calc.py."},
            {"step_id": 2, "source": "agent", "message": "PRE-THOUGHT: read it.", "tool_calls": [{"tool_call_id": "c1", "function_name": "shell", "arguments": {"command": "cat calc.py"}}],
             "observation": {"results": [{"source_call_id": "c1", "content": "PRE-OUTPUT: return a - b"}]}},
            {"step_id": 3, "source": "system", "message": "Performed context summarization and handoff to continue task.",
             "observation": {"results": results}, "extra": {"context_management": {"type": "compaction", "boundary": "replace"}}},
            {"step_id": 4, "source": "agent", "message": "POST: patching now.", "tool_calls": [{"tool_call_id": "c2", "function_name": "shell", "arguments": {"command": "sed -i s/-/+/ calc.py"}}],
             "observation": {"results": [{"source_call_id": "c2", "content": ""}]}},
            {"step_id": 5, "source": "agent", "message": "POST: done."},
        ],
    }  # fmt: skip


def _summary_subagent() -> dict:
    return {
        "schema_version": "ATIF-v1.7",
        "trajectory_id": "summary-1",
        "agent": {"name": "terminus-2-summarization-summary", "version": "2.0", "model_name": "qwen3.6"},
        "steps": [
            {"step_id": 1, "source": "user", "message": "PRE-TASK copied.", "is_copied_context": True},
            {"step_id": 2, "source": "user", "message": "Summarize the work so far."},
            {"step_id": 3, "source": "agent", "message": "Summary: add() subtracts."},
        ],
    }


def test_atif_compaction_is_a_context_reset_and_sub_agents_are_linked(tmp_path: Path) -> None:
    from records.trajectory import Outcome
    from relearn.masks.compile import CompileOptions, compile_trajectory
    from relearn.masks.tokenizers import load_tokenizer

    folder = tmp_path / "agent"
    folder.mkdir()
    (folder / "trajectory.json").write_text(json.dumps(_compacted_document("Summary: add() subtracts; make it add.")))
    (folder / "trajectory.summarization-1-summary.json").write_text(json.dumps(_summary_subagent()))
    assert atif.discover(tmp_path) == [folder / "trajectory.json"]  # the sub-agent file is read through its parent
    parent_result, child_result = list(atif.read(folder / "trajectory.json"))
    parent, child = parent_result.trajectory, child_result.trajectory
    contents = [m.content for m in parent.messages]
    assert "Performed context summarization and handoff to continue task." not in contents  # an annotation, never seen by the model
    assert "" not in [
        c for c, m in zip(contents, parent.messages, strict=True) if m.role == "user"
    ]  # no message made up for the references
    reset = parent.messages.index(next(m for m in parent.messages if m.content == "Summary: add() subtracts; make it add."))
    assert parent.context_resets[0].message_index == reset and parent.context_resets[0].replacement_known
    assert not parent.messages[reset].generated and parent.messages[reset].role == "user"
    (link,) = parent.links
    assert (link.relation, link.trajectory_id, link.resolved, link.ref["trajectory_path"]) == (
        "subagent",
        child.id,
        True,
        "trajectory.summarization-1-summary.json",
    )
    assert child.id == "atif-summary-1" and child.links[0].relation == "parent" and child.links[0].trajectory_id == parent.id
    assert [m.generated for m in child.messages] == [False, False, True]
    # The compaction step survives an export: the same steps, its observation the new context.
    exported = to_atif(parent)
    assert [s["source"] for s in exported["steps"]] == ["user", "agent", "system", "agent", "agent"]
    assert exported["steps"][2]["extra"]["context_management"] == {"type": "compaction", "boundary": "replace"}
    # Masks: the turns after the compaction are trained after what the model saw then.
    tok = load_tokenizer("qwen3.6")
    positive = parent.model_copy(update={"outcome": Outcome(resolved=True)})
    before, after = compile_trajectory(positive, None, tok, CompileOptions(mode="positive"))
    after_text = tok.decode(after.input_ids.tolist())
    assert "PRE-" not in after_text and "Summary: add() subtracts" in after_text and "POST: done." in after_text
    assert "PRE-THOUGHT" in tok.decode(before.input_ids.tolist())


def test_atif_compaction_without_its_new_context_is_never_trained_on(tmp_path: Path) -> None:
    from records.trajectory import Outcome
    from relearn.masks.compile import CompileOptions, Rejected, compile_trajectory
    from relearn.masks.tokenizers import load_tokenizer

    path = tmp_path / "trajectory.json"
    path.write_text(json.dumps(_compacted_document(None)))
    (result,) = list(atif.read(path))  # the sub-agent file is not there: the link stays unresolved
    t = result.trajectory
    assert not t.context_resets[0].replacement_known and not t.links[0].resolved
    assert any("no replacement content" in w for w in result.diagnostics.warnings)
    with pytest.raises(Rejected, match="context reset without a known replacement"):
        compile_trajectory(
            t.model_copy(update={"outcome": Outcome(resolved=True)}), None, load_tokenizer("qwen3.6"), CompileOptions(mode="positive")
        )


def test_embedded_sub_agents_resolve_by_trajectory_id(tmp_path: Path) -> None:
    document = _compacted_document("Summary.")
    document["steps"][2]["observation"]["results"][1]["subagent_trajectory_ref"] = [{"trajectory_id": "summary-1"}]
    document["subagent_trajectories"] = [_summary_subagent()]
    path = tmp_path / "trajectory.json"
    path.write_text(json.dumps(document))
    parent, child = (r.trajectory for r in atif.read(path))
    assert parent.links[0].trajectory_id == child.id == "atif-summary-1" and child.source.path.endswith("#subagent_trajectories[summary-1]")
