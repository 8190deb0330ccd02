"""`relearn review --estimate`: what a review would send, counted and priced before paying."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from harness.policies.base import PolicySpec
from records.pools import write_atomic
from review.estimate import PricesError, UnknownModel, estimate, load_prices, synthetic
from review.judges import CallCache, Judge, Judge1Output, prompt
from review.reading import count_tokens
from tests.test_review_batch import AGENT_SYSTEM, JUDGE2_CALLS, answer, reading_of, rollout

# 16 rollouts of two tasks; a low cache minimum so that their shared prefixes are cached.
OVERRIDE = """
[models."claude-sonnet-4-5"]
provider = "anthropic"
input = 3.0
output = 15.0
cache_read = 0.3
cache_write = 3.75
min_cache_tokens = 100

[assumptions]
judge1_output_tokens = 500
"""


def judges(model: str = "claude-sonnet-4-5") -> tuple[Judge, Judge]:
    spec = PolicySpec(kind="anthropic", model=model, base_url="http://127.0.0.1:9")  # nothing may be sent
    return Judge(spec, "judge1"), Judge(spec, "judge2")


def test_the_estimate_counts_what_the_review_would_send_and_prices_caching_best_case(tmp_path: Path) -> None:
    prices = tmp_path / "prices.toml"
    prices.write_text(OVERRIDE)
    table = load_prices(prices)
    assert table.assumptions.judge1_output_tokens == 500 and table.assumptions.judge2_output_tokens == 300  # laid over the shipped ones
    pool = [rollout(n) for n in range(16)]
    cache = CallCache(tmp_path / "calls.jsonl")
    first, second = estimate(pool, judges(), cache, table)
    system = count_tokens(prompt("judge1"))
    assert first.totals.requests == 16 and first.totals.exact
    assert first.totals.input_tokens == sum(system + count_tokens(reading_of(t)) for t in pool)
    assert first.totals.output_tokens == 16 * 500
    # Best-case caching: the first rollout writes instructions + agent prompt + task; the other
    # seven of its task read all of it; the first of task 1 reads the shared part and writes its task.
    shared = system + count_tokens(f"### system\n{AGENT_SYSTEM}\n\n")
    task = [system + count_tokens(f"### system\n{AGENT_SYSTEM}\n\n### user\n{t.messages[1].content}\n\n") for t in (pool[0], pool[8])]
    assert first.totals.cache_read_tokens == 7 * task[0] + shared + 7 * task[1]
    assert first.totals.cache_write_tokens == task[0] + (task[1] - shared)
    t, p = first.totals, first.price
    plain = (t.input_tokens * 3.0 + t.output_tokens * 15.0) / 1e6
    cached = (
        (t.input_tokens - t.cache_read_tokens - t.cache_write_tokens) * 3.0
        + t.cache_read_tokens * 0.3
        + t.cache_write_tokens * 3.75
        + t.output_tokens * 15.0
    ) / 1e6
    assert t.dollars(p, batch=False, cached=False) == pytest.approx(plain)
    assert t.dollars(p, batch=True, cached=False) == pytest.approx(plain / 2)
    assert t.dollars(p, batch=True, cached=True) == pytest.approx(cached / 2) and cached < plain
    # Judge 2 waits on judge 1's answers: assumed, one request a judged trajectory.
    assert second.totals.requests == 16 and not second.totals.exact

    # Once judge 1's answers are cached, judge 1 costs nothing and judge 2 is counted exactly.
    for trajectory in pool:
        request = judges()[0].request(prompt("judge1"), reading_of(trajectory), Judge1Output)
        cache.put(request.key, {"text": answer({"user": request.user}).content})
    first, second = estimate(pool, judges(), cache, table)
    assert first.totals.requests == 0 and second.totals.exact
    assert second.totals.requests == sum(JUDGE2_CALLS[n % 5] for n in range(16))
    cache.close()


def test_cli_estimate_prints_the_table_and_sends_nothing(relearn_bin: str, tmp_path: Path) -> None:
    pool = tmp_path / "pool.jsonl"
    write_atomic(pool, [rollout(n) for n in range(8)] + [rollout(8).model_copy(update={"outcome": None})])
    command = [relearn_bin, "review", str(pool), "-o", str(tmp_path / "reviews.jsonl"), "--base-url", "http://127.0.0.1:9", "--estimate"]
    result = subprocess.run(
        [*command, "--judge1", "claude-sonnet-4-5-20250929", "--judge2", "claude-haiku-4-5"], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert figures["trajectories"] == 8  # the unverified one goes to no judge
    judge1, judge2 = figures["judges"]
    assert (judge1["model"], judge1["requests"], judge2["requests"]) == ("claude-sonnet-4-5-20250929", 8, 8)
    assert judge1["usd_batch"] == pytest.approx(judge1["usd"] / 2, abs=0.01) and "$ batch+cached" in result.stdout
    assert not (tmp_path / "reviews.jsonl").exists()

    bad = tmp_path / "bad.toml"
    bad.write_text('[models."claude-sonnet-4-5"]\nprovider = "anthropic"\ninput = "cheap"\noutput = 1\ncache_read = 0\ncache_write = 0\n')
    wrong = subprocess.run([*command, "--judge1", "claude-sonnet-4-5", "--prices", str(bad)], capture_output=True, text=True, timeout=300)
    assert wrong.returncode == 2 and str(bad) in wrong.stderr and "models.claude-sonnet-4-5.input" in wrong.stderr


def test_a_prices_file_that_is_not_toml_is_named_with_its_line_and_unknown_models_say_so(tmp_path: Path) -> None:
    bad = tmp_path / "prices.toml"
    bad.write_text("[models.x]\ninput = \n")
    with pytest.raises(PricesError, match=r"prices.toml: not TOML: .*line 2"):
        load_prices(bad)
    with pytest.raises(UnknownModel, match="no price for model 'mystery-model'"):
        load_prices().price("mystery-model")
    assert load_prices().price("gpt-5.1-2025-11-13").input == load_prices().price("gpt-5.1").input  # a dated snapshot is its model


def test_the_readme_pool_4048_tasks_by_8_rollouts_of_60k_tokens() -> None:
    """The README's figures come from this call; the arithmetic is checked by hand here."""
    table = load_prices()
    pool, task = 465 + 2_000, 465 + 2_000 + 1_500  # judge-1 prompt + agent system prompt (+ task statement)
    assert count_tokens(prompt("judge1")) == 465 and count_tokens(prompt("judge2")) == 445  # as the README says
    first, second = synthetic(
        4048,
        8,
        60_000,
        shared_pool=pool,
        shared_task=task,
        judge2_tokens=445 + 1_500,
        models=("claude-sonnet-4-5", "claude-sonnet-4-5"),
        table=table,
    )
    n = 4048 * 8
    assert first.totals.requests == n and first.totals.input_tokens == n * 60_000
    # Each task's first rollout reads the pool prefix (but the very first) and writes the rest of the task prefix.
    assert first.totals.cache_read_tokens == (4048 - 1) * pool + 4048 * 7 * task
    assert first.totals.cache_write_tokens == pool + 4048 * (task - pool)
    assert first.row()["usd"] == pytest.approx((n * 60_000 * 3 + n * 800 * 15) / 1e6, abs=0.01)
    assert second.totals.cache_read_tokens == 0  # judge 2's prompt is shorter than the cache minimum
    totals = [round(first.row()[k] + second.row()[k]) for k in ("usd", "usd_cached", "usd_batch", "usd_batch_cached")]
    assert totals == [6552, 6227, 3276, 3113]  # the README's claude-sonnet-4-5 row


def test_the_review_op_hands_over_the_estimate_before_anything_is_paid(tmp_path: Path) -> None:
    """What the pipeline's review stage prints before its judges are paid (relearn.ops.review)."""
    from rich.console import Console

    from relearn.ops.reporting import OpError
    from relearn.ops.review import run_review
    from relearn.verbs.review import JudgeOptions, ReviewOptions

    pool = tmp_path / "verified.jsonl"
    write_atomic(pool, [rollout(n) for n in range(4)])
    console = Console(record=True, width=250)

    def options(model: str) -> ReviewOptions:
        judges = JudgeOptions(judge1=model, base_url="http://127.0.0.1:9")  # nothing may be sent
        return ReviewOptions(pool, tmp_path / "reviews.jsonl", judges, estimate=True)

    summary = run_review(options("claude-sonnet-4-5"), on_estimate=lambda e: console.print(e.render()))
    assert summary.run is None and summary.estimate is not None and summary.estimate.trajectories == 4
    shown = console.export_text()
    assert "estimate for 4 trajectories" in shown and "claude-sonnet-4-5" in shown and "$ batch+cached" in shown
    with pytest.raises(OpError, match="no price for model 'mystery-model'"):
        run_review(options("mystery-model"), on_estimate=lambda e: console.print(e.render()))
    assert not (tmp_path / "reviews.jsonl").exists()
