"""Training on what the policy saw and did (issue 36): the recorded generation ids of each turn,
and, where the render departs from what the model was sent, one sample per turn under the
context as sent (its recorded prompt ids, or the history without reasoning its harness never
sent back)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from records.review import Review
from relearn.masks.compile import CompileOptions, Rejected, compile_trajectory
from relearn.masks.template import render
from relearn.masks.tokens import decode_spans
from relearn.ops.masks import run_masks
from relearn.verbs.masks import MasksOptions
from tests.test_masks import call, defect, supervised_text, trajectory

KWARGS = {"preserve_thinking": True}


AGENT = [
    {"role": "system", "content": "You are a coding agent."},
    {"role": "user", "content": "Fix add() in calc.py."},
    {
        "role": "assistant",
        "generated": True,
        "reasoning_content": "The bug is probably in parse().",
        "content": "Let me look at the file.",
        "tool_calls": [call("c1", "shell", command=["bash", "-lc", "cat calc.py"])],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "def add(a, b):\n    return a - b\n"},
    {
        "role": "assistant",
        "generated": True,
        "reasoning_content": "It subtracts.",
        "tool_calls": [call("c2", "apply_patch", input="*** Begin Patch\n-    return a - b\n+    return a + b\n*** End Patch\n")],
    },
    {"role": "tool", "tool_call_id": "c2", "content": "Success."},
    # No reasoning: the template renders an empty think block, half of it in the generation prompt.
    {"role": "assistant", "generated": True, "content": "Fixed: add() returns a + b."},
]
GENERATED = (2, 4, 6)


def ids(tok, text: str) -> list[int]:  # noqa: ANN001
    return tok(text, add_special_tokens=False)["input_ids"]


def with_generation_ids(tok, messages: list[dict]) -> list[dict]:  # noqa: ANN001
    """Each generated turn's ids as an engine samples them: the turn's text tokenised on its
    own, after the prompt (never merged with the prompt's last characters)."""
    rendered = render(trajectory(messages), tok, template_kwargs=KWARGS)
    out = [dict(m) for m in messages]
    for turn in rendered.turns:
        out[turn.message_index]["token_ids"] = ids(tok, rendered.text[turn.start : turn.end])
    return out


def test_decode_spans_gives_each_token_its_characters(tok) -> None:  # noqa: ANN001
    text = "naïve 日本語 café 🙂 done\n</think>\n\n"
    token_ids = ids(tok, text)
    decoded, offsets = decode_spans(tok, token_ids)
    assert decoded == text
    # Every token covers characters, in order; a character split over tokens is covered by each.
    assert np.all(offsets[:, 1] > offsets[:, 0]) and np.all(np.diff(offsets[:, 0]) >= 0)
    assert offsets[0, 0] == 0 and offsets[-1, 1] == len(text)
    for token, (lo, hi) in zip(token_ids, offsets.tolist(), strict=True):
        piece = tok.decode([token])
        assert piece == text[lo:hi] or "\ufffd" in piece


def test_recorded_ids_are_trained_where_the_text_would_tokenise_otherwise(tok) -> None:  # noqa: ANN001
    messages = with_generation_ids(tok, AGENT)
    t = trajectory(messages)
    (exact,) = compile_trajectory(t, None, tok, CompileOptions(mode="positive"))
    (text,) = compile_trajectory(t, None, tok, CompileOptions(mode="positive", recorded_ids=False))
    recorded = [messages[i]["token_ids"] for i in GENERATED]
    assert exact.targets == "recorded" and text.targets == "text"
    # Every recorded id is a target; re-tokenised, the empty think block's "\n" merges with the
    # prompt's into one "\n\n" token that straddles the turn's edge and is trained by nobody.
    assert exact.eligible == sum(len(r) for r in recorded)
    assert text.eligible < exact.eligible and len(text.input_ids) < len(exact.input_ids)
    assert tok.decode(exact.input_ids.tolist()) == tok.decode(text.input_ids.tolist())
    sequence = exact.input_ids.tolist()
    for turn_ids in recorded:
        at = next(k for k in range(len(sequence)) if sequence[k : k + len(turn_ids)] == turn_ids)
        assert exact.loss_mask[at : at + len(turn_ids)].all()
    # Ids that stop before the end-of-turn token (as some engines record them) give the same sample.
    for i in GENERATED:
        messages[i]["token_ids"] = messages[i]["token_ids"][:-1]
    (stopless,) = compile_trajectory(trajectory(messages), None, tok, CompileOptions(mode="positive"))
    assert stopless.targets == "recorded" and stopless.input_ids.tolist() == sequence


def test_defects_map_onto_recorded_tokens_as_onto_text_tokens(tok) -> None:  # noqa: ANN001
    t = trajectory(with_generation_ids(tok, AGENT))
    review = Review(trajectory_id=t.id, decision="accept", defects=[defect(t, 4, "reasoning_content", "subtracts")])
    for scope in ("minimal", "action"):
        (exact,) = compile_trajectory(t, review, tok, CompileOptions(defect_scope=scope))
        (text,) = compile_trajectory(t, review, tok, CompileOptions(defect_scope=scope, recorded_ids=False))
        assert exact.targets == "recorded" and exact.excluded == text.excluded > 0
        assert "subtracts" not in supervised_text(tok, exact) and "The bug is probably in parse()." in supervised_text(tok, exact)


def test_ids_that_decode_to_other_text_are_reported_and_the_text_trained(tok) -> None:  # noqa: ANN001
    messages = with_generation_ids(tok, AGENT)
    messages[4]["token_ids"] = [messages[4]["token_ids"][0] + 1, *messages[4]["token_ids"][1:]]
    (sample,) = compile_trajectory(trajectory(messages), None, tok, CompileOptions(mode="positive"))
    (text,) = compile_trajectory(trajectory(messages), None, tok, CompileOptions(mode="positive", recorded_ids=False))
    assert sample.targets == "ids_disagree" and sample.targets_detail.startswith("message 4: its ")
    assert "at character 0" in sample.targets_detail
    assert sample.input_ids.tolist() == text.input_ids.tolist() and sample.loss_mask.tolist() == text.loss_mask.tolist()


def _prompt_ids(tok, messages: list[dict], system: str) -> dict[int, list[int]]:  # noqa: ANN001
    """What a harness sent each call: the history without earlier reasoning, under another
    system prompt than the pool records (a server-side prompt the trajectory lost)."""
    sent = [dict(m, content=system) if m["role"] == "system" else m for m in messages]
    sent = [{k: v for k, v in m.items() if k != "reasoning_content"} for m in sent]
    out = {}
    for index in GENERATED:
        chat = [
            {
                "role": m["role"],
                "content": m.get("content") or "",
                **(
                    {"tool_calls": [{"type": "function", "function": c["function"]} for c in m["tool_calls"]]}
                    if m.get("tool_calls")
                    else {}
                ),
                **({"tool_call_id": m["tool_call_id"]} if m.get("tool_call_id") else {}),
            }
            for m in sent[:index]
        ]
        out[index] = tok.apply_chat_template(chat, tokenize=True, add_generation_prompt=True, return_dict=False, **KWARGS)
    return out


def test_turns_whose_recorded_prompt_differs_compile_under_the_context_as_sent(tok) -> None:  # noqa: ANN001
    messages = with_generation_ids(tok, AGENT)
    prompts = _prompt_ids(tok, AGENT, "You are a coding agent. Be brief.")
    for index, prompt in prompts.items():
        messages[index]["extra"] = {"prompt_token_ids": list(prompt)}
    t = trajectory(messages)
    samples = compile_trajectory(t, None, tok, CompileOptions(mode="positive"))
    assert [s.sample_id.removeprefix(t.id) for s in samples] == [f"#m{i}" for i in GENERATED]
    for sample, index in zip(samples, GENERATED, strict=True):
        prompt, generated = list(prompts[index]), messages[index]["token_ids"]
        assert (sample.context_rule, sample.as_sent, sample.targets) == ("prompt_ids", True, "recorded")
        # Exactly what the call was sent, then exactly what it generated.
        assert sample.input_ids.tolist() == prompt + generated
        assert sample.eligible == len(generated) and not sample.loss_mask[: len(prompt)].any()
    assert "Be brief." in tok.decode(samples[2].input_ids.tolist())
    assert "The bug is probably" not in tok.decode(samples[1].input_ids.tolist())
    # Trusting the template instead: one sample, the recorded system prompt, earlier reasoning kept.
    (rendered,) = compile_trajectory(t, None, tok, CompileOptions(mode="positive", context="render"))
    assert (rendered.as_sent, rendered.context_rule) == (False, "prompt_ids")
    assert "Be brief." not in tok.decode(rendered.input_ids.tolist())
    # A defect of a turn compiled as sent is excluded in that turn's sample only.
    review = Review(trajectory_id=t.id, decision="accept", defects=[defect(t, 4, "reasoning_content", "subtracts")])
    masked = compile_trajectory(t, review, tok, CompileOptions(defect_scope="minimal"))
    assert [s.excluded > 0 for s in masked] == [False, True, False]
    assert "subtracts" not in supervised_text(tok, masked[1]) and "It" in supervised_text(tok, masked[1])


def test_prompt_ids_of_another_tokenizer_reject_the_trajectory(tok) -> None:  # noqa: ANN001
    messages = with_generation_ids(tok, AGENT)
    messages[2]["extra"] = {"prompt_token_ids": [1, 2, 3]}
    try:
        compile_trajectory(trajectory(messages), None, tok, CompileOptions(mode="positive"))
    except Rejected as exc:
        assert exc.reason == "recorded prompt ids do not end with the generation prompt" and "message 2" in exc.detail
    else:
        raise AssertionError("prompt ids that cannot stand for the context were accepted")


USER_OBSERVATIONS = [
    {"role": "system", "content": "Answer with one shell command in a bash block."},
    {"role": "user", "content": "Fix add() in calc.py."},
    {"role": "assistant", "generated": True, "reasoning_content": "Look first.", "content": "```bash\ncat calc.py\n```"},
    {"role": "user", "content": "def add(a, b):\n    return a - b\n"},
    {"role": "assistant", "generated": True, "reasoning_content": "It subtracts.", "content": "```bash\nsed -i s/-/+/ calc.py\n```"},
]


def test_user_observations_compile_per_turn_without_the_reasoning_never_sent(tok) -> None:  # noqa: ANN001
    t = trajectory(USER_OBSERVATIONS)
    first, second = compile_trajectory(t, None, tok, CompileOptions(mode="positive"))
    assert (second.context_rule, second.as_sent, second.targets) == ("user_observations", True, "text")
    assert "Look first." in supervised_text(tok, first)
    context = tok.decode([i for i, m in zip(second.input_ids.tolist(), second.loss_mask.tolist(), strict=True) if not m])
    assert "cat calc.py" in context and "Look first." not in context  # the earlier turn, as sent: no reasoning
    assert "It subtracts." in supervised_text(tok, second)
    (whole,) = compile_trajectory(t, None, tok, CompileOptions(mode="positive", context="render"))
    assert "Look first." in tok.decode(whole.input_ids.tolist()) and not whole.as_sent
    # Without preserve_thinking the template drops that reasoning itself, which rewrites the
    # earlier turn: one render cannot train it, the turns as sent can.
    samples = compile_trajectory(t, None, tok, CompileOptions(mode="positive", template_kwargs={"preserve_thinking": False}))
    assert [s.as_sent for s in samples] == [True, True] and "Look first." not in tok.decode(samples[1].input_ids.tolist())
    assert "It subtracts." in supervised_text(tok, samples[1])


def test_masks_stats_count_trajectories_by_rule_and_samples_by_targets(tok, tmp_path: Path) -> None:  # noqa: ANN001
    exact = with_generation_ids(tok, AGENT)
    sent = [dict(m) for m in exact]
    for index, prompt in _prompt_ids(tok, AGENT, "Another system prompt.").items():
        sent[index]["extra"] = {"prompt_token_ids": list(prompt)}
    pool = tmp_path / "pool.jsonl"
    pool.write_text(
        "".join(
            json.dumps(trajectory(m, id=name, task_id=name).to_dict()) + "\n"
            for name, m in (("tools", AGENT), ("exact", exact), ("sent", sent), ("user", USER_OBSERVATIONS))
        )
    )
    summary = run_masks(MasksOptions(pool=pool, output=tmp_path / "out", mode="positive"), tokenizer=tok)
    stats = json.loads((tmp_path / "out" / "stats.json").read_text())
    assert stats == summary.stats or stats["context"] == summary.stats["context"]
    assert stats["context"] == {
        "mode": "as-sent",
        "by_rule": {"prompt_ids": 1, "user_observations": 1, "tool_observations": 2},
        "as_sent": {"prompt_ids": 1, "user_observations": 1},
    }
    # tools: 1 text sample; exact: 1 recorded; sent: 3 recorded; user: 2 text.
    assert stats["targets"]["samples"] == {"recorded": 4, "text": 3} and stats["targets"]["notes"] == []
    assert {s["targets"] for s in stats["per_sample"] if s["trajectory_id"] == "sent"} == {"recorded"}


def test_the_viewer_says_how_a_trajectory_was_compiled(tok, tmp_path: Path) -> None:  # noqa: ANN001
    from typer.testing import CliRunner

    from relearn.cli.main import app

    exact = with_generation_ids(tok, AGENT)
    pool = tmp_path / "pool.jsonl"
    pool.write_text(
        "".join(
            json.dumps(trajectory(m, id=name, task_id=name).to_dict()) + "\n" for name, m in (("exact", exact), ("user", USER_OBSERVATIONS))
        )
    )
    run_masks(MasksOptions(pool=pool, output=tmp_path / "out", mode="positive"), tokenizer=tok)
    shown = CliRunner().invoke(app, ["view", str(pool), "-d", str(tmp_path / "out"), "--print", "--limit", "5", "--width", "400"])
    assert shown.exit_code == 0, shown.output
    words = " ".join(shown.output.split())
    assert "trained on the recorded token ids" in words
    assert "2 samples, one a turn under the context as sent (user_observations)" in words
