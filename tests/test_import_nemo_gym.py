"""NeMo Gym rollouts: the real sample files, token ids through ``relearn masks``, damaged lines.

Expected counts are walked out of the raw lines here, independently of the importer."""

from __future__ import annotations

import copy
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from harness.importers import nemo_gym
from records.pools import read_trajectories, write_atomic
from records.trajectory import Outcome, Trajectory, tool_call_pairs
from relearn.masks.compile import CompileOptions, Rejected, compile_trajectory
from relearn.masks.template import render
from relearn.masks.tokenizers import load_tokenizer

SAMPLES = ["nemo_gym_competitive_coding_rollouts_token_ids.jsonl", "nemo_gym_deepswe_rollouts.jsonl"]
TOKEN_FIELDS = ("prompt_token_ids", "generation_token_ids", "generation_log_probs")


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _model_calls(output: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The output's model calls: runs of assistant items, cut at tool outputs and other
    roles' messages, and after an item that carries the call's token ids."""
    calls: list[list[dict[str, Any]]] = []
    run: list[dict[str, Any]] = []
    for item in output:
        if item["type"] == "function_call_output" or (item["type"] == "message" and item.get("role") != "assistant"):
            if run:
                calls.append(run)
            run = []
            continue
        run.append(item)
        if item.get("generation_token_ids"):
            calls.append(run)
            run = []
    if run:
        calls.append(run)
    return calls


@pytest.mark.parametrize("name", SAMPLES)
def test_real_rollouts(samples: Path, tmp_path: Path, name: str) -> None:
    path = samples / name
    lines = _lines(path)
    results = list(nemo_gym.read(path))
    assert [r.error for r in results] == [None] * len(lines)
    for raw, result in zip(lines, results, strict=True):
        t = result.trajectory
        output = raw["response"]["output"]
        prompt = raw["responses_create_params"]["input"]
        prompt_messages = 1 if isinstance(prompt, str) else len(prompt)
        calls = _model_calls(output)
        results_raw = [i for i in output if i["type"] == "function_call_output"]
        function_calls = [i for i in output if i["type"] == "function_call"]
        roles = [m.role for m in t.messages]
        assert len(t.messages) == prompt_messages + len(calls) + len(results_raw)
        assert roles.count("assistant") == len(calls) and roles.count("tool") == len(results_raw)
        assert all(m.generated == (m.role == "assistant") for m in t.messages)
        # Every function_call is a tool call, answered by its output, in order.
        made = [c for m in t.messages for c in m.tool_calls or []]
        assert [(c.id, c.function.name, c.function.arguments) for c in made] == [
            (i["call_id"], i["name"], json.loads(i["arguments"])) for i in function_calls
        ]
        pairs, answered = tool_call_pairs(t.messages)
        assert set(pairs) == set(answered) == {i["call_id"] for i in results_raw}
        assert [m.content for m in t.messages if m.role == "tool"] == [i["output"] for i in results_raw]
        # Reasoning and text are the model's own.
        assistants = [m for m in t.messages if m.role == "assistant"]
        for message, call in zip(assistants, calls, strict=True):
            summaries = [s["text"] for i in call if i["type"] == "reasoning" for s in i["summary"]]
            texts = ["".join(p["text"] for p in i["content"]) for i in call if i["type"] == "message"]
            assert (message.reasoning_content or None) == ("\n\n".join(summaries) or None)
            assert (message.content or None) == ("".join(texts) or None)
            # Token ids round-trip: on the message, exactly as recorded.
            carrier = next((i for i in call if i.get("generation_token_ids")), None)
            if carrier is None:
                assert message.token_ids is None
            else:
                assert message.token_ids == carrier["generation_token_ids"]
                assert message.logprobs == carrier["generation_log_probs"]
                assert message.extra["prompt_token_ids"] == carrier["prompt_token_ids"]
        usage = raw["response"]["usage"]
        assert (t.usage.input_tokens, t.usage.output_tokens, t.usage.total_tokens) == (
            usage["input_tokens"],
            usage["output_tokens"],
            usage["total_tokens"],
        )
        assert t.usage.cached_input_tokens == usage["input_tokens_details"]["cached_tokens"]
        # The grade is the source's, marked imported; the rollout index is the attempt.
        assert t.outcome.reward == raw["reward"] and t.outcome.verdict["imported_from"] == "nemo-gym"
        assert t.attempt == raw["_ng_rollout_index"]
        assert t.task_id == raw.get("task_id", f"ng-task-{raw['_ng_task_index']}")
        assert t.id == f"nemo-gym-{raw['response']['id']}"
        # Nothing dropped: every top-level field is under source.meta.
        for key, value in raw.items():
            if key not in ("responses_create_params", "response"):
                assert t.source.meta[key] == value, key
        assert t.source.meta["response"] == {k: v for k, v in raw["response"].items() if k != "output"}
    counted = results[0].diagnostics.unknown
    unknown = set(lines[0]) - nemo_gym.KNOWN_FIELDS - set(nemo_gym.ID_FIELDS) - nemo_gym.MAPPED_FIELDS
    assert {k for k in counted} == {f"server field {k!r}" for k in unknown}
    assert all(n == len(lines) for n in counted.values())
    pool = tmp_path / "pool.jsonl"
    write_atomic(pool, [r.trajectory for r in results])
    again = list(read_trajectories(pool))
    assert [m.token_ids for t in again for m in t.messages] == [m.token_ids for r in results for m in r.trajectory.messages]


def test_cli_imports_and_validates_the_samples(relearn_bin: str, samples: Path, tmp_path: Path) -> None:
    pool = tmp_path / "pool.jsonl"
    files = [str(samples / name) for name in SAMPLES]
    result = subprocess.run([relearn_bin, "import", "nemo-gym", *files, "-o", str(pool)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert len(list(read_trajectories(pool))) == sum(len(_lines(samples / name)) for name in SAMPLES)
    check = subprocess.run([relearn_bin, "validate", str(pool)], capture_output=True, text=True, timeout=120)
    assert check.returncode == 0, check.stdout


def test_swe_rollout_keeps_the_verifier_fields(samples: Path) -> None:
    raw = _lines(samples / "nemo_gym_deepswe_rollouts.jsonl")[0]
    (result, *_rest) = list(nemo_gym.read(samples / "nemo_gym_deepswe_rollouts.jsonl"))
    fields = result.trajectory.outcome.verdict["source_fields"]
    for key in ("verifier_exit_code", "f2p_total", "f2p_passed", "p2p_total", "p2p_passed", "model_patch_sha256"):
        assert fields[key] == raw[key]
    assert result.trajectory.messages[0].role == "system" and result.trajectory.messages[1].role == "user"


# What the policy was given for _rollout's one call, as a Qwen3.6 engine tokenised it.
PROMPT = "<|im_start|>user\nPrint 3.<|im_end|>\n<|im_start|>assistant\n<think>\n"


def _rollout(
    reasoning: str, text: str, generation: list[int] | None, reward: float = 1.0, prompt: list[int] | None = None
) -> dict[str, Any]:
    """A single-call rollout in NeMo Gym's layout (``prompt``: its recorded prompt ids)."""
    message: dict[str, Any] = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }
    if generation is not None:
        message |= {
            "prompt_token_ids": prompt or [1, 2, 3],
            "generation_token_ids": generation,
            "generation_log_probs": [-0.5] * len(generation),
        }
    return {
        "responses_create_params": {"input": [{"role": "user", "content": "Print 3.", "type": "message"}], "tools": []},
        "response": {
            "id": f"resp_{len(generation or [])}_{reward}",
            "model": "policy",
            "status": "completed",
            "output": [{"id": "rs_1", "type": "reasoning", "summary": [{"type": "summary_text", "text": reasoning}]}, message],
        },
        "reward": reward,
        "_ng_task_index": 0,
        "_ng_rollout_index": 0,
    }


def _import(tmp_path: Path, rows: list[dict[str, Any]]) -> list[Trajectory]:
    path = tmp_path / "rollouts.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    results = list(nemo_gym.read(path))
    assert all(r.error is None for r in results), [str(r.error) for r in results]
    return [r.trajectory for r in results]


def _true_ids(tok, t: Trajectory) -> list[int]:  # noqa: ANN001
    """The ids our tokenizer gives the generated turn as the template renders it: what a
    policy sampling with this tokenizer would have recorded (derived here, not a sample's)."""
    rendered = render(t, tok, template_kwargs={"preserve_thinking": True})
    turn = rendered.turns[-1]
    encoding = tok(rendered.text, add_special_tokens=False, return_offsets_mapping=True)
    return [
        i
        for i, (s, e) in zip(encoding["input_ids"], encoding["offset_mapping"], strict=True)
        if s >= turn.start and e <= turn.end and e > s
    ]


def _prompt(tok) -> list[int]:  # noqa: ANN001
    return tok(PROMPT, add_special_tokens=False)["input_ids"]


def test_recorded_ids_are_trained_and_a_disagreement_is_reported(tok, tmp_path: Path) -> None:  # noqa: ANN001
    (plain,) = _import(tmp_path, [_rollout("Three is three.", "print(3)", None)])
    ids = _true_ids(tok, plain)
    (t,) = _import(tmp_path, [_rollout("Three is three.", "print(3)", ids, prompt=_prompt(tok))])
    assert t.messages[-1].token_ids == ids
    (sample,) = compile_trajectory(t, None, tok, CompileOptions(mode="positive"))
    assert sample.supervised == len(ids) and sample.targets == "recorded" and sample.context_rule == "prompt_ids"
    # The context as sent and the turn as generated (then the template's newline after the turn).
    assert sample.input_ids.tolist() == _prompt(tok) + ids + tok("\n", add_special_tokens=False)["input_ids"]
    flipped = list(ids)
    flipped[4] += 1
    (bad,) = _import(tmp_path, [_rollout("Three is three.", "print(3)", flipped, prompt=_prompt(tok))])
    (fallback,) = compile_trajectory(bad, None, tok, CompileOptions(mode="positive"))
    # Not fatal: the text is trained, and why the ids were not is named.
    assert fallback.targets == "ids_disagree" and fallback.input_ids.tolist() == sample.input_ids.tolist()
    assert fallback.targets_detail.startswith(f"message 1: its {len(ids)} recorded ids decode to other text than the turn")


def test_the_samples_foreign_ids_are_rejected(tok, samples: Path) -> None:  # noqa: ANN001
    """The sample was sampled with a Qwen3 tokenizer (151,669 ids; <think> is 151667), not
    Qwen3.6's: its prompt ids disagree with the render from the first token, cannot stand for
    the context as sent, and the compiler refuses the trajectory, naming the turn."""
    (result, *_rest) = list(nemo_gym.read(samples / "nemo_gym_competitive_coding_rollouts_token_ids.jsonl"))
    t = result.trajectory.model_copy(update={"outcome": Outcome(resolved=True)})  # the sample's reward is 0
    with pytest.raises(Rejected, match=r"recorded prompt ids do not end with the generation prompt: message 1: "):
        compile_trajectory(t, None, tok, CompileOptions(mode="positive"))


def test_the_samples_ids_are_trained_exactly_with_the_policys_tokenizer(samples: Path, tokenizer_cache: Path) -> None:
    """With the tokenizer that sampled them (built-in ``qwen3``), every recorded call's prompt
    ids are the render's and each turn trains on its recorded ids."""
    qwen3 = load_tokenizer("qwen3", cache_dir=tokenizer_cache)
    for result in nemo_gym.read(samples / "nemo_gym_competitive_coding_rollouts_token_ids.jsonl"):
        t = result.trajectory.model_copy(update={"outcome": Outcome(resolved=True)})
        (sample,) = compile_trajectory(t, None, qwen3, CompileOptions(mode="positive"))
        turn = t.messages[1]
        assert (sample.context_rule, sample.as_sent, sample.targets) == ("prompt_ids", False, "recorded")
        assert sample.input_ids.tolist()[:-1] == turn.extra["prompt_token_ids"] + turn.token_ids
        assert qwen3.decode(sample.input_ids[-1:]) == "\n"  # the template's newline after the turn
        assert sample.eligible == len(turn.token_ids)


def test_cli_masks_checks_recorded_ids(relearn_bin: str, tok, tokenizer_cache: Path, tmp_path: Path) -> None:  # noqa: ANN001
    (plain,) = _import(tmp_path, [_rollout("Three is three.", "print(3)", None)])
    ids = _true_ids(tok, plain)
    flipped = [*ids[:-1], ids[-1] + 1]
    prompt = _prompt(tok)
    rows = [
        _rollout("Three is three.", "print(3)", ids, prompt=prompt),
        _rollout("Three is three.", "print(3)", flipped, reward=0.5, prompt=prompt),
    ]
    path = tmp_path / "rollouts.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    pool = tmp_path / "pool.jsonl"
    env = {**os.environ, "RELEARN_CACHE": str(tokenizer_cache)}
    imported = subprocess.run([relearn_bin, "import", "nemo-gym", str(path), "-o", str(pool)], capture_output=True, text=True, timeout=120)
    assert imported.returncode == 0, imported.stdout + imported.stderr
    assert subprocess.run([relearn_bin, "validate", str(pool)], capture_output=True, text=True, timeout=120).returncode == 0
    out = tmp_path / "dataset"
    masks = subprocess.run(
        [relearn_bin, "masks", str(pool), "-o", str(out), "--mode", "positive"], capture_output=True, text=True, env=env, timeout=600
    )
    assert masks.returncode in (0, 1), masks.stdout + masks.stderr
    stats = json.loads((out / "stats.json").read_text())
    assert stats["trajectories_in"] == 2 and stats["trajectories_out"] == 2 and stats["rejected"] == {}
    assert stats["targets"]["samples"] == {"recorded": 1, "ids_disagree": 1}
    assert stats["context"]["by_rule"] == {"prompt_ids": 2} and stats["context"]["as_sent"] == {}
    (note,) = stats["targets"]["notes"]
    assert note["detail"].startswith(f"message 1: its {len(ids)} recorded ids decode to other text than the turn")
    # Listed with the turn, and counted in the summary.
    words = " ".join((masks.stdout + masks.stderr).split())
    assert "recorded ids decode to other text than the turn" in words and "generated tokens: ids disagree" in words


def test_damaged_lines_are_located_and_the_batch_goes_on(samples: Path, tmp_path: Path) -> None:
    good = _lines(samples / "nemo_gym_deepswe_rollouts.jsonl")[0]
    unanswered = copy.deepcopy(good)
    unanswered["response"]["output"][2]["call_id"] = "nobody"
    bad_reward = copy.deepcopy(good) | {"reward": "high"}
    bad_ids = copy.deepcopy(_rollout("r", "t", [1, 2, 3]))
    bad_ids["response"]["output"][1]["generation_log_probs"] = [-1.0]
    no_response = {k: v for k, v in good.items() if k != "response"}
    lines = [
        json.dumps(good),
        json.dumps(unanswered),
        "{not json",
        json.dumps(bad_reward),
        json.dumps(bad_ids),
        json.dumps(no_response),
        json.dumps(_rollout("r", "t", [5])),
    ]
    path = tmp_path / "rollouts.jsonl"
    path.write_text("\n".join(lines) + "\n")
    results = list(nemo_gym.read(path))
    assert [r.trajectory is not None for r in results] == [True, False, False, False, False, False, True]
    errors = [str(r.error) for r in results if r.error is not None]
    assert errors[0] == f"{path}:2: response.output[2].call_id: output for 'nobody': no earlier function_call has this call_id"
    assert errors[1].startswith(f"{path}:3: invalid JSON")
    assert errors[2] == f"{path}:4: reward: expected a number, got str"
    assert errors[3] == f"{path}:5: response.output[1].generation_log_probs: 1 log-probs for 3 generated tokens"
    assert errors[4] == f"{path}:6: response: missing"
