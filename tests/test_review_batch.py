"""Batch mode and prompt caching, through the real SDKs against local batch servers."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from harness.policies.base import PolicySpec
from harness.scripted.servers import ModelServer, ScriptedTurn
from records.pools import write_atomic
from records.review import Review, numbered_steps
from records.trajectory import Trajectory
from review.batch import BatchOptions
from review.judges import Judge, Judge1Output, prompt, structured_output
from review.prefilters import prefilter
from review.reading import render_for_reading
from review.run import batch_state_path, review_pool
from tests.batch_servers import BatchServer

REASONING = "The bug must be in the parser.  I will read it first."
AGENT_SYSTEM = "You are a coding agent. " * 40


def rollout(number: int, *, task: int | None = None) -> Trajectory:
    """One of a pool's rollouts: the same fixture steps, its own id; eight rollouts a task."""
    task = number // 8 if task is None else task
    return Trajectory.model_validate(
        {
            "id": f"traj-{number:03d}",
            "task_id": f"task-{task}",
            "messages": [
                {"role": "system", "content": AGENT_SYSTEM},
                {"role": "user", "content": f"Fix add() in calc.py (task {task})."},
                {
                    "role": "assistant",
                    "generated": True,
                    "reasoning_content": REASONING,
                    "content": "Reading the file.",
                    "tool_calls": [{"id": "c1", "function": {"name": "shell", "arguments": {"command": "cat parser.py"}}}],
                },
                {"role": "tool", "tool_call_id": "c1", "content": "Exit code: 1\nOutput:\ncat: parser.py: No such file"},
                {
                    "role": "assistant",
                    "generated": True,
                    "content": "Fixed add().",
                    "tool_calls": [
                        {"id": "c2", "function": {"name": "apply_patch", "arguments": {"input": "*** Begin Patch\n*** End Patch\n"}}}
                    ],
                },
                {"role": "tool", "tool_call_id": "c2", "content": "Success."},
                {
                    "role": "assistant",
                    "generated": True,
                    "content": f"Done. TRAJ-{number:03d}.",
                },  # the judges' script reads the number here
            ],
            "outcome": {"resolved": True, "reward": 1.0},
            "final_patch": "diff --git a/calc.py b/calc.py\n",
        }
    )


def reading_of(trajectory: Trajectory) -> str:
    """Judge 1's user text for ``trajectory``, hints included, as review_trajectory renders it."""
    hints = [
        f"step {step}: {s.kind}: {s.detail}"
        for s in prefilter(trajectory)
        for step, index in numbered_steps(trajectory).items()
        if index == s.message_index
    ]
    return render_for_reading(trajectory, hints, system=prompt("judge1")).text


def _error(step: int, number: int, what: str) -> dict[str, Any]:
    return {
        "step": step,
        "category": "wrong_hypothesis",
        "description": f"{what} (traj-{number:03d})",
        "evidence": "parser.py does not exist",
    }


def answer(body: dict[str, Any]) -> ScriptedTurn:
    """Both judges, from what the request says: judge 1 by the trajectory's number (five
    kinds of outcome), judge 2 by the error description judge 1 gave."""
    text = json.dumps(body)
    if "localize confirmed errors" in text:
        if "misreads the output" in text:
            quote = {"field": "content", "quote": "Fixed add()."}
        elif "(hallucinated" in text:
            quote = {"field": "reasoning_content", "quote": "The tests are all wrong."}
        else:
            quote = {"field": "reasoning_content", "quote": "The bug must be in the parser."}
        return ScriptedTurn(content=json.dumps({"spans": [{"error": 0, **quote}]}), input_tokens=500, output_tokens=50)
    number = int(text.split("TRAJ-", 1)[1][:3])
    kind = number % 5
    if kind == 0:
        verdict = {"decision": "accept", "reason": "solved", "errors": [_error(1, number, "blames the parser")]}
    elif kind == 1:
        verdict = {"decision": "accept", "reason": "fine", "errors": []}
    elif kind == 2:
        verdict = {
            "decision": "reject",
            "reason": "edits the tests",
            "errors": [{"step": 2, "category": "reward_hacking", "description": "x", "evidence": "y"}],
        }
    elif kind == 3:
        verdict = {"decision": "accept", "reason": "solved", "errors": [_error(1, number, "blames the parser (hallucinated")]}
    else:
        verdict = {
            "decision": "accept",
            "reason": "solved",
            "errors": [_error(1, number, "blames the parser"), _error(2, number, "misreads the output")],
        }
    return ScriptedTurn(content=json.dumps(verdict), input_tokens=2000, output_tokens=100)


JUDGE2_CALLS = {0: 1, 1: 0, 2: 0, 3: 1, 4: 2}  # judge-2 requests per trajectory, by number % 5
PRICE = {"price_in_per_mtok": 3.0, "price_out_per_mtok": 15.0}
COST1 = (2000 * 3.0 + 100 * 15.0) / 1e6  # one judge-1 call at full price
COST2 = (500 * 3.0 + 50 * 15.0) / 1e6


def judges(base_url: str, kind: str) -> tuple[Judge, Judge]:
    spec = PolicySpec(kind=kind, model="judge-model", base_url=base_url, backoff_base_s=0.001, request_token_ids=False, **PRICE)  # type: ignore[arg-type]
    return Judge(spec, "judge1"), Judge(spec, "judge2")


def outcomes(path: Path) -> dict[str, dict[str, Any]]:
    """Each trajectory's review as a dict, less what it cost."""
    return {
        r.trajectory_id: r.model_dump(mode="json", exclude={"cost_usd"})
        for r in map(Review.model_validate_json, path.read_text().splitlines())
    }


def fate(custom_id: str, body: dict[str, Any]) -> str:
    text = json.dumps(body)
    if "TRAJ-007." in text or "TRAJ-104." in text:
        return "errored"
    if "TRAJ-013." in text:
        return "expired"
    if "localize confirmed errors" in text and "(traj-020)" in text:
        return "errored"
    return "succeeded"


@pytest.mark.parametrize(("kind", "provider"), [("anthropic", "anthropic"), ("chat", "openai")])
def test_a_batch_review_of_200_trajectories_equals_the_live_one(tmp_path: Path, kind: str, provider: str) -> None:
    count = 200
    pool = tmp_path / "pool.jsonl"
    write_atomic(pool, [rollout(n) for n in range(count)])
    live = tmp_path / "live.jsonl"
    with ModelServer(kind, answer) as server:  # type: ignore[arg-type]
        live_summary, live_ledger = review_pool(pool, live, judges=judges(server.base_url, kind), workers=4)
    assert live_summary.reviewed == count and not live_summary.errors
    judge2_total = sum(JUDGE2_CALLS[n % 5] for n in range(count))
    assert live_ledger.calls == count + judge2_total

    batched = tmp_path / "batched.jsonl"
    again = tmp_path / "again.jsonl"
    with BatchServer(provider, answer, fate=fate) as server:  # type: ignore[arg-type]
        summary, ledger = review_pool(pool, batched, judges=judges(server.base_url, kind), workers=4, batch=BatchOptions(poll_s=0.01))
        creates = [len(c["requests"]) for c in server.creates]
        online = [json.dumps(body) for body in server.online]
        # The batches filled the ordinary call cache (keyed by endpoint too): a run without
        # batch mode on it costs nothing.
        shutil.copy(batched.with_name(batched.name + ".calls.jsonl"), again.with_name(again.name + ".calls.jsonl"))
        _summary, again_ledger = review_pool(pool, again, judges=judges(server.base_url, kind), workers=4)
        assert len(server.online) == len(online) and len(server.creates) == 2
    assert again_ledger.calls == 0 and again_ledger.spent_usd == 0.0 and outcomes(again) == outcomes(live)
    assert outcomes(batched) == outcomes(live)
    assert not summary.errors and summary.batch is not None
    # One batch per judge: all 200 judge-1 requests, then judge 2 for what judge 1 answered in
    # the batch (not for the three whose judge-1 request failed there: theirs go online).
    failed_judge1 = {7, 13, 104}
    assert creates == [count, judge2_total - sum(JUDGE2_CALLS[n % 5] for n in failed_judge1)]
    # Retried one by one: the three failed judge-1 requests, their judge-2 requests, and the
    # judge-2 request that failed in its batch.
    assert len(online) == len(failed_judge1) + sum(JUDGE2_CALLS[n % 5] for n in failed_judge1) + JUDGE2_CALLS[20 % 5]
    assert sum("TRAJ-" in body for body in online) == len(failed_judge1)
    expected_failures = {"errored": 3, "expired": 1} if provider == "anthropic" else {"400": 3, "batch_expired": 1}
    assert dict(summary.batch.failed) == expected_failures
    # Batch answers at half price, the retried ones at full price; every Review carries its share.
    online_judge2 = len(online) - len(failed_judge1)
    batched_cost = (count - 3) * COST1 + (creates[1] - 1) * COST2
    assert ledger.spent_usd == pytest.approx(0.5 * batched_cost + 3 * COST1 + online_judge2 * COST2)
    assert ledger.spent_usd == pytest.approx(live_ledger.spent_usd - 0.5 * batched_cost)
    assert summary.cost_usd == pytest.approx(ledger.spent_usd)
    state = json.loads(batch_state_path(batched).read_text())
    assert [(b["stage"], b["state"]) for b in state["batches"]] == [("judge1", "collected"), ("judge2", "collected")]


def test_an_expired_openai_batch_keeps_what_ran_and_retries_the_rest(tmp_path: Path) -> None:
    pool = tmp_path / "pool.jsonl"
    write_atomic(pool, [rollout(n) for n in range(10)])
    live = tmp_path / "live.jsonl"
    with ModelServer("responses", answer) as server:
        review_pool(pool, live, judges=judges(server.base_url, "responses"), workers=2)
    output = tmp_path / "reviews.jsonl"
    with BatchServer("openai", answer) as server:
        server.expire = True  # every second request of each batch expires
        summary, ledger = review_pool(pool, output, judges=judges(server.base_url, "responses"), workers=2, batch=BatchOptions(poll_s=0.01))
        judge1_online = sum("TRAJ-" in json.dumps(b) for b in server.online)
    assert outcomes(output) == outcomes(live) and not summary.errors
    assert summary.batch is not None and summary.batch.failed["batch_expired"] >= 5
    assert judge1_online == 5 and ledger.batched == 5 + summary.batch.answered["judge2"]


def test_a_run_killed_while_polling_resumes_its_batches(relearn_bin: str, tmp_path: Path) -> None:
    pool = tmp_path / "pool.jsonl"
    write_atomic(pool, [rollout(n) for n in range(20)])
    output = tmp_path / "reviews.jsonl"
    env = {**os.environ, "ANTHROPIC_API_KEY": "local"}
    with BatchServer("anthropic", answer) as server:
        command = [
            relearn_bin,
            "review",
            str(pool),
            "-o",
            str(output),
            "--judge1",
            "judge-model",
            "--base-url",
            server.base_url,
            "--batch",
            "--poll-interval",
            "0.05",
        ]
        server.hold.set()
        first = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 120
        while (not server.creates or server.retrieves < 2) and time.monotonic() < deadline and first.poll() is None:
            time.sleep(0.05)
        assert server.creates and server.retrieves >= 2, first.communicate(timeout=5)
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=10)
        state = json.loads(batch_state_path(output).read_text())
        assert [(b["stage"], b["state"], len(b["keys"])) for b in state["batches"]] == [("judge1", "submitted", 20)]
        server.hold.clear()
        second = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
        assert second.returncode == 0, second.stderr
        stages = ["judge2" if "localize confirmed errors" in json.dumps(c["requests"][0]) else "judge1" for c in server.creates]
    assert stages == ["judge1", "judge2"] and server.online == []
    assert "batches (submitted / resumed)" in second.stdout and "1 / 1" in second.stdout
    assert len(outcomes(output)) == 20


def test_requests_are_laid_out_for_prompt_caching_and_cached_tokens_are_priced(tmp_path: Path) -> None:
    pool = tmp_path / "pool.jsonl"
    write_atomic(pool, [rollout(0), rollout(5), rollout(8)])  # two rollouts of task 0, one of task 1
    with ModelServer(
        "anthropic", lambda body: ScriptedTurn(content=answer(body).content, input_tokens=2000, output_tokens=100, cached_input_tokens=1500)
    ) as server:
        spec = PolicySpec(kind="anthropic", model="judge-model", base_url=server.base_url, price_cached_in_per_mtok=0.3, **PRICE)
        _summary, ledger = review_pool(pool, tmp_path / "a.jsonl", judges=(Judge(spec, "judge1"), Judge(spec, "judge2")), workers=1)
        first = server.requests[0]
    assert first["system"] == [{"type": "text", "text": prompt("judge1"), "cache_control": {"type": "ephemeral"}}]
    blocks = first["messages"][0]["content"]
    reading = reading_of(rollout(0))
    assert "".join(b["text"] for b in blocks) == reading  # what the judge reads is unchanged
    assert [b["text"].split("\n", 1)[0] for b in blocks] == ["### system", "### user", "### Step 1 (assistant)"]
    assert [("cache_control" in b) for b in blocks] == [True, True, False]  # the unique rest is not written to the cache
    calls = 3 + 3  # judge 1 thrice; judge 2 once each (rollouts 0 and 5 are of kind 0, 8 of kind 3)
    assert ledger.calls == calls and ledger.input_tokens == calls * 2000 and ledger.cached_input_tokens == calls * 1500
    assert ledger.spent_usd == pytest.approx(calls * (500 * 3.0 + 1500 * 0.3 + 100 * 15.0) / 1e6)

    with ModelServer("chat", answer) as server:
        review_pool(pool, tmp_path / "b.jsonl", judges=judges(server.base_url, "chat"), workers=1)
        keys = [r["prompt_cache_key"] for r in server.requests if "TRAJ-" in json.dumps(r)]
        texts = [r["messages"][1]["content"] for r in server.requests if "TRAJ-" in json.dumps(r)]
    assert keys[0] == keys[1] != keys[2]  # a task's rollouts share their cache key
    assert texts[0] == reading  # one plain string for OpenAI: it caches identical prefixes itself


def test_answers_cached_before_the_layout_are_still_used(tmp_path: Path) -> None:
    """The call cache's key is the request as the judge reads it, computed as before the
    prompt-cache layout existed: an old calls file still answers."""
    pool = tmp_path / "pool.jsonl"
    write_atomic(pool, [rollout(1)])  # kind 1: accepted clean, so judge 1 only
    output = tmp_path / "reviews.jsonl"
    with ModelServer("chat", answer) as server:
        judge1, judge2 = judges(server.base_url, "chat")
        spec = judge1.spec
        sampling = {**spec.sampling, **structured_output("chat", "judge1", Judge1Output.model_json_schema())}
        user = reading_of(rollout(1))
        identity = json.dumps(
            ["judge1", spec.kind, spec.model, spec.base_url, sampling, prompt("judge1"), user], sort_keys=True, default=str
        )
        key = hashlib.sha256(identity.encode()).hexdigest()
        old = {
            "key": key,
            "text": json.dumps({"decision": "accept", "reason": "from the old cache", "errors": []}),
            "cost_usd": 0.01,
            "model": "judge-model",
        }
        output.with_name(output.name + ".calls.jsonl").write_text(json.dumps(old) + "\n")
        summary, ledger = review_pool(pool, output, judges=(judge1, judge2), workers=1)
        assert server.requests == []
    assert (
        ledger.calls == 0
        and ledger.cached == 1
        and summary.reviewed == 1
        and Review.model_validate_json(output.read_text().splitlines()[0]).reason == "from the old cache"
    )


def test_a_batch_over_the_spend_cap_is_not_submitted(tmp_path: Path) -> None:
    pool = tmp_path / "pool.jsonl"
    write_atomic(pool, [rollout(n) for n in range(10)])
    with BatchServer("anthropic", answer) as server:
        summary, ledger = review_pool(
            pool,
            tmp_path / "reviews.jsonl",
            judges=judges(server.base_url, "anthropic"),
            batch=BatchOptions(poll_s=0.01),
            spend_cap_usd=0.001,
        )
        assert server.creates == [] and server.online == []
    assert summary.not_reviewed == 10 and "over what is left of the spend cap" in summary.errors[0] and ledger.spent_usd == 0.0
