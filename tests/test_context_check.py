"""The context a turn is trained under, checked against the prompt ids its call recorded, and
the protocol rule where none are recorded (relearn.masks.context_check, `relearn stats --context`).

The recorded ids are what a vLLM-style server sends: the real Qwen3.6 template rendered over
the history with the generation prompt and its default arguments (no preserve_thinking), the
way `relearn serve` builds its prompt."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from harness.exporters.hf_chat import chat_messages_with_sources
from harness.importers import nemo_gym
from records.pools import JsonlWriter
from records.trajectory import FunctionCall, Message, Source, ToolCall, Trajectory
from relearn.cli.main import app as cli_app
from relearn.masks.context_check import check_context, check_trajectory, protocol_rule
from relearn.masks.tokenizers import load_tokenizer

TOOLS = [
    {"type": "function", "function": {"name": "bash", "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}}
]


def _sent_ids(tok: Any, messages: list[Message], **template_kwargs: Any) -> list[int]:
    """The prompt a server renders for a call given ``messages``."""
    chat, _sources = chat_messages_with_sources(messages)
    return list(tok.apply_chat_template(chat, tools=TOOLS, add_generation_prompt=True, tokenize=True, **template_kwargs)["input_ids"])


def _with_ids(tok: Any, messages: list[Message], **template_kwargs: Any) -> list[Message]:
    """Each generated turn records the prompt ids of the call that produced it."""
    out = []
    for i, message in enumerate(messages):
        if message.generated:
            message = message.model_copy(update={"extra": {"prompt_token_ids": _sent_ids(tok, messages[:i], **template_kwargs)}})
        out.append(message)
    return out


def _call(index: int) -> ToolCall:
    return ToolCall(id=f"c{index}", function=FunctionCall(name="bash", arguments={"command": f"ls dir{index}"}))


def _tool_agent() -> list[Message]:
    return [
        Message(role="system", content="You fix bugs."),
        Message(role="user", content="Fix the failing test."),
        Message(role="assistant", generated=True, reasoning_content="Look around first.", tool_calls=[_call(1)]),
        Message(role="tool", tool_call_id="c1", content="setup.py src tests"),
        Message(role="assistant", generated=True, reasoning_content="Now the tests.", content="Done."),
    ]


def _user_observation_agent() -> list[Message]:
    return [
        Message(role="system", content="You fix bugs. Answer with one command."),
        Message(role="user", content="Fix the failing test."),
        Message(role="assistant", generated=True, reasoning_content="Look around first.", content="ls"),
        Message(role="user", content="setup.py src tests"),
        Message(role="assistant", generated=True, reasoning_content="Now the tests.", content="pytest"),
    ]


def _trajectory(messages: list[Message], name: str = "t", source: str | None = None) -> Trajectory:
    return Trajectory(id=name, task_id="task", messages=messages, tools=TOOLS, source=Source(format=source) if source else None)


def test_tool_observations_render_exactly_the_context_the_server_sent(tok: Any) -> None:
    check = check_trajectory(_trajectory(_with_ids(tok, _tool_agent())), tok, {"preserve_thinking": True})
    assert (check.rule, check.turns_checked, check.turns_differ, check.differs, check.error) == ("prompt_ids", 2, 0, False, None)


def test_user_observations_differ_where_the_template_dropped_earlier_reasoning(tok: Any) -> None:
    trajectory = _trajectory(_with_ids(tok, _user_observation_agent()))
    check = check_trajectory(trajectory, tok, {"preserve_thinking": True})
    # The first call had nothing to drop; the second was sent without "Look around first.".
    assert (check.turns_checked, check.turns_differ, check.differs) == (2, 1, True)
    assert check.first is not None and check.first.message_index == 4
    recorded = trajectory.messages[4].extra["prompt_token_ids"]  # type: ignore[index]
    assert check.first.recorded_tokens == len(recorded) < check.first.rendered_tokens
    assert tok.decode(recorded[: check.first.position]) == tok.decode(recorded)[: len(tok.decode(recorded[: check.first.position]))]
    assert "Look" in check.first.rendered and "Look" not in check.first.recorded
    # Without preserve_thinking the one render drops the first turn's reasoning: that field is
    # left out of A (relearn.masks.template), and the check says the second call's context is not
    # the one the server sent; compiled per turn, each context is the one the server sent.
    dropped = check_trajectory(trajectory, tok, {"preserve_thinking": False})
    assert dropped.error is None and (dropped.turns_checked, dropped.turns_differ, dropped.differs) == (2, 1, True)
    same = check_trajectory(trajectory, tok, {"preserve_thinking": False}, per_turn=True)
    assert (same.turns_checked, same.turns_differ, same.differs, same.error) == (2, 0, False, None)


def test_ids_of_another_tokenizer_differ_from_the_first_token(tok: Any) -> None:
    messages = _with_ids(tok, _tool_agent())
    for message in messages:
        if message.extra:
            message.extra["prompt_token_ids"] = [i + 1 for i in message.extra["prompt_token_ids"]]
    report = check_context([_trajectory(messages)], tok, {"preserve_thinking": True})
    assert (report.turns_checked, report.turns_differ) == (2, 2)
    assert report.examples[0]["position"] == 0 and "another tokenizer" in report.examples[0]["hint"]


def test_without_ids_the_protocol_decides_and_the_rule_is_named(tok: Any) -> None:
    plain = [m.model_copy(update={"reasoning_content": None}) for m in _tool_agent()]
    cases = {
        "tool": (_trajectory(_tool_agent()), "tool_observations", False),
        "user": (_trajectory(_user_observation_agent()), "user_observations", True),
        "text": (_trajectory(_tool_agent(), source="mini-swe-agent"), "reasoning_not_sent", True),
        "plain": (_trajectory(plain), "no_reasoning", False),
    }
    for name, (trajectory, rule, differs) in cases.items():
        assert protocol_rule(trajectory) == rule, name
        check = check_trajectory(trajectory, tok, {"preserve_thinking": True})
        assert (check.rule, check.differs, check.turns_checked) == (rule, differs, 0), name
    # Rendered without preserve_thinking, the reasoning is dropped as the model saw it dropped.
    assert not check_trajectory(cases["user"][0], tok, {"preserve_thinking": False}).differs


def test_a_context_reset_checks_each_turn_in_its_own_segment(tok: Any) -> None:
    from records.trajectory import ContextReset

    agent = _tool_agent()
    # A summary replaces the history at index 3: the second call saw the instructions, the
    # summary and the tool's answer, not the first turn.
    messages = [*agent[:3], Message(role="user", content="Summary: listed the files."), *agent[3:]]
    messages[2] = messages[2].model_copy(update={"extra": {"prompt_token_ids": _sent_ids(tok, messages[:2])}})
    segment = [messages[0], *messages[3:5]]
    messages[5] = messages[5].model_copy(update={"extra": {"prompt_token_ids": _sent_ids(tok, segment)}})
    trajectory = _trajectory(messages).model_copy(update={"context_resets": [ContextReset(message_index=3)]})
    check = check_trajectory(trajectory, tok, {"preserve_thinking": True})
    assert (check.turns_checked, check.turns_differ) == (2, 0)
    # Checked against the whole history instead, the second turn would differ.
    whole = _trajectory(messages)
    assert check_trajectory(whole, tok, {"preserve_thinking": True}).turns_differ == 1


def test_stats_counts_rules_and_differing_turns(tok: Any, tokenizer_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RELEARN_CACHE", str(tokenizer_cache))  # the session's build of qwen3.6
    pool = tmp_path / "pool.jsonl"
    with JsonlWriter(pool) as writer:
        writer.write(_trajectory(_with_ids(tok, _tool_agent()), "ids-same"))
        writer.write(_trajectory(_with_ids(tok, _user_observation_agent()), "ids-differ"))
        writer.write(_trajectory(_user_observation_agent(), "no-ids"))
    result = CliRunner().invoke(cli_app, ["stats", str(pool), "--context", "--json", "-"])
    assert result.exit_code == 0, result.output
    context = json.loads(result.stdout)["context"]
    assert context["by_rule"] == {"prompt_ids": 2, "user_observations": 1}
    assert context["differs_by_rule"] == {"prompt_ids": 1, "user_observations": 1}
    assert (context["turns_checked"], context["turns_differ"]) == (4, 1)
    assert context["as_sent"] == 2  # ids-differ by its prompt ids, no-ids by its protocol
    assert context["examples"][0]["trajectory"] == "ids-differ"
    table = CliRunner().invoke(cli_app, ["stats", str(pool), "--context", "--no-preserve-thinking"])
    assert table.exit_code == 0, table.output
    assert "turns whose context differs" in table.output and "preserve_thinking=False" in table.output
    # Without preserve_thinking the ids agree, but the user-observation history is still sent without reasoning.
    assert "compiled per turn as sent by `relearn masks`" in " ".join(table.output.split())
    missing = CliRunner().invoke(cli_app, ["stats", str(pool), "--context", "--tokenizer", str(tmp_path / "nothing")])
    assert missing.exit_code == 2 and "--tokenizer" in missing.output


def test_the_nemo_gym_samples_prompt_ids_match_the_render_of_their_own_tokenizer(tok: Any, samples: Path) -> None:
    trajectories = [r.trajectory for r in nemo_gym.read(samples / "nemo_gym_competitive_coding_rollouts_token_ids.jsonl")]
    assert len(trajectories) == 5
    qwen3 = check_context(trajectories, load_tokenizer("qwen3"), {"preserve_thinking": True})
    assert (dict(qwen3.by_rule), qwen3.turns_checked, qwen3.turns_differ, qwen3.render_errors) == ({"prompt_ids": 5}, 5, 0, 0)
    # Under Qwen3.6 (another vocabulary) every context differs from the first token on.
    other = check_context(trajectories, tok, {"preserve_thinking": True})
    assert (other.turns_checked, other.turns_differ) == (5, 5)
    assert all(e["position"] == 0 and e["recorded_tokens"] == 109 for e in other.examples)


def test_each_context_is_tokenised_as_the_prompt_alone(tok: Any) -> None:
    """The whole render is tokenised once and split at each turn's role header (an added token,
    where the tokenizer splits first): every turn's context ids are those of its prefix alone."""
    from relearn.masks.context_check import _contexts
    from relearn.masks.template import probe, render

    messages = _with_ids(tok, _tool_agent())
    trajectory = _trajectory(messages)
    kwargs = {"preserve_thinking": True}
    rendered = render(trajectory, tok, template_kwargs=kwargs)
    got = list(_contexts(tok, rendered, probe(tok, kwargs), trajectory))
    assert len(got) == len(rendered.turns) >= 2
    for turn, ids in got:
        assert ids == tok(rendered.text[: turn.start], add_special_tokens=False)["input_ids"]
