"""Each judge's reasoning and sampling settings (``review.reasoning``) through the real SDKs:
the fields arrive in the request body as each vendor's API documents them, answers with
reasoning still parse, the review records the settings, the call cache's key follows them,
combinations an API refuses are refused before anything is sent, the estimate and the batch
path count and send them, and the pipeline's ``[review]`` table sets them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from harness.scripted.servers import ModelServer, ScriptedTurn
from records.pools import write_atomic
from records.review import Review
from relearn.cli.main import app
from relearn.ops.reporting import OpError
from relearn.ops.review import make_judges, run_review
from relearn.pipeline.config import load_pipeline
from relearn.verbs.review import JudgeOptions, ReviewOptions
from tests.batch_servers import BatchServer
from tests.test_review_batch import answer, rollout

THOUGHT = "Let me weigh the steps first. The parser claim looks wrong."


def thinking_answer(body: dict[str, Any]) -> ScriptedTurn:
    """The batch tests' judges, each answer with reasoning beside it (a thinking block, a
    reasoning item, reasoning_content): only the answer's text is the judge's answer."""
    turn = answer(body)
    turn.reasoning = THOUGHT
    return turn


def review(tmp_path: Path, judges: JudgeOptions, *, pool: int = 1, output: str = "reviews.jsonl", **options: Any) -> Any:
    path = tmp_path / "pool.jsonl"
    if not path.exists():
        write_atomic(path, [rollout(n) for n in range(pool)])  # rollout 0: judge 1 accepts with one error, judge 2 quotes it
    return run_review(ReviewOptions(pool=path, output=tmp_path / output, judges=judges, workers=1, **options))


# What each backend sends for the settings given, per judge: (options, judge-1 sampling, judge-2 sampling).
SETTINGS: dict[str, tuple[dict[str, Any], dict[str, Any], dict[str, Any]]] = {
    "anthropic": (
        {
            "reasoning_effort": "high", "thinking_budget": 2048, "extra_body": '{"metadata": {"user_id": "relearn-review"}}',
            "judge2_thinking_budget": 0, "judge2_temperature": 0.5,
        },
        {
            "output_config": {"effort": "high"}, "thinking": {"type": "enabled", "budget_tokens": 2048}, "max_tokens": 2048 + 4096,
            "extra_body": {"metadata": {"user_id": "relearn-review"}},
        },
        {"output_config": {"effort": "high"}, "temperature": 0.5, "extra_body": {"metadata": {"user_id": "relearn-review"}}},
    ),
    "chat": (
        {
            "reasoning_effort": "high", "temperature": 0.2, "extra_body": '{"chat_template_kwargs": {"enable_thinking": true}}',
            "judge2_reasoning_effort": "low", "judge2_extra_body": "{}",
        },
        {"reasoning_effort": "high", "temperature": 0.2, "extra_body": {"chat_template_kwargs": {"enable_thinking": True}}},
        {"reasoning_effort": "low", "temperature": 0.2},
    ),
    "responses": (
        {"reasoning_effort": "xhigh", "extra_body": '{"service_tier": "flex"}', "judge2_reasoning_effort": "minimal", "judge2_temperature": 1.0},
        {"reasoning": {"effort": "xhigh"}, "extra_body": {"service_tier": "flex"}},
        {"reasoning": {"effort": "minimal"}, "temperature": 1.0, "extra_body": {"service_tier": "flex"}},
    ),
}  # fmt: skip


def wire(sampling: dict[str, Any]) -> dict[str, Any]:
    """The request-body fields of a sampling: extra_body merged in at the top."""
    fields = {k: v for k, v in sampling.items() if k != "extra_body"}
    return {**fields, **sampling.get("extra_body", {})}


@pytest.mark.parametrize("kind", sorted(SETTINGS))
def test_each_backend_sends_the_settings_as_its_api_documents_and_the_review_records_them(tmp_path: Path, kind: str) -> None:
    given, first, second = SETTINGS[kind]
    with ModelServer(kind, thinking_answer) as server:  # type: ignore[arg-type]
        summary = review(tmp_path, JudgeOptions(judge1="judge-model", backend=kind, base_url=server.base_url, **given))  # type: ignore[arg-type]
        bodies = list(server.requests)
    assert summary.run is not None and summary.run.reviewed == 1 and not summary.run.errors
    assert len(bodies) == 2  # judge 1, then judge 2 for the error it confirmed
    structured = {"anthropic": "output_config", "chat": "response_format", "responses": "text"}[kind]
    for body, sampling in zip(bodies, (first, second), strict=True):
        for key, value in wire(sampling).items():
            if key == "output_config":  # Anthropic's effort sits beside the answer format
                assert body[key]["effort"] == value["effort"] and body[key]["format"]["type"] == "json_schema"
            else:
                assert body[key] == value, (key, body.get(key))
        assert structured in body  # the answer format is still asked for
        assert "extra_body" not in body
    assert "temperature" not in bodies[0] or kind != "anthropic"  # thinking takes no temperature
    if kind == "anthropic":
        assert "thinking" not in bodies[1] and bodies[1]["max_tokens"] == 4096  # judge 2: budget 0, no thinking
    if kind == "chat":
        assert "chat_template_kwargs" not in bodies[1]  # judge 2's '{}' replaces judge 1's extra fields
    # The answers came with reasoning; the judges read only their text: accepted, the quote grounded.
    written = Review.model_validate_json((tmp_path / "reviews.jsonl").read_text().splitlines()[0])
    assert written.decision == "accept" and len(written.defects) == 1
    assert written.model_extra["sampling"] == {"judge1": first, "judge2": second}
    assert written.model_extra["judges"] == {"judge1": "judge-model", "judge2": "judge-model"}


def test_without_settings_nothing_is_added_and_the_review_says_so(tmp_path: Path) -> None:
    with ModelServer("chat", thinking_answer) as server:
        review(tmp_path, JudgeOptions(judge1="judge-model", backend="chat", base_url=server.base_url))
        body = server.requests[0]
    assert not {"reasoning_effort", "temperature", "chat_template_kwargs", "reasoning"} & set(body)
    written = Review.model_validate_json((tmp_path / "reviews.jsonl").read_text().splitlines()[0])
    assert written.model_extra["sampling"] == {"judge1": {}, "judge2": {}}


def test_the_call_cache_key_follows_the_settings(tmp_path: Path) -> None:
    """An unchanged configuration is answered from the call cache; another effort, budget,
    temperature or extra field is another request. (Keys without settings are the keys of
    before: tests/test_review_batch.py's old-cache test computes them by the old formula.)"""
    calls = "reviews.jsonl.calls.jsonl"
    base = {"judge1": "judge-model", "backend": "chat"}
    with ModelServer("chat", thinking_answer) as server:
        first = JudgeOptions(**base, base_url=server.base_url, reasoning_effort="high", temperature=0.2)  # type: ignore[arg-type]
        (tmp_path / "a").mkdir()
        review(tmp_path / "a", first)
        sent = len(server.requests)
        assert sent == 2
        for name, change in [
            ("same", {}),
            ("effort", {"reasoning_effort": "medium"}),
            ("temperature", {"temperature": 0.3}),
            ("extra", {"extra_body": '{"chat_template_kwargs": {"enable_thinking": true}}'}),
            ("judge2", {"judge2_temperature": 0.0}),
        ]:
            (tmp_path / name).mkdir()
            shutil.copy(tmp_path / "a" / calls, tmp_path / name / calls)
            before = len(server.requests)
            summary = review(tmp_path / name, JudgeOptions(**{**vars(first), **change}))
            assert summary.ledger is not None
            asked = len(server.requests) - before
            if name == "same":
                assert asked == 0 and summary.ledger.cached == 2, name
            elif name == "judge2":
                assert asked == 1 and summary.ledger.cached == 1, name  # judge 1's answer still holds
            else:
                assert asked == 2, name
    judges, _table = make_judges(JudgeOptions(**base))  # type: ignore[arg-type]
    assert judges is not None and judges[0].spec.sampling == {} and judges[1].spec.sampling == {}


def test_an_anthropic_thinking_budget_for_the_anthropic_batch_and_effort_for_the_openai_one(tmp_path: Path) -> None:
    """The batch path sends the same fields in each batched request, and a batched answer with
    thinking blocks still parses."""
    for provider, kind, given in [
        ("anthropic", "anthropic", {"thinking_budget": 3000}),
        ("openai", "responses", {"reasoning_effort": "high", "extra_body": '{"service_tier": "flex"}'}),
    ]:
        where = tmp_path / provider
        where.mkdir()
        with BatchServer(provider, thinking_answer) as server:  # type: ignore[arg-type]
            options = JudgeOptions(judge1="judge-model", backend=kind, base_url=server.base_url, **given)  # type: ignore[arg-type]
            summary = review(where, options, pool=3, batch=True, poll_interval=0.01)
            bodies = [item["params"] if provider == "anthropic" else item["body"] for c in server.creates for item in c["requests"]]
            assert server.online == []
        assert summary.run is not None and summary.run.reviewed == 3 and not summary.run.errors
        assert len(server.creates) == 2 and len(bodies) == 3 + 1  # judge 1 for all three, judge 2 for rollout 0's error
        for body in bodies:
            if provider == "anthropic":
                assert body["thinking"] == {"type": "enabled", "budget_tokens": 3000} and body["max_tokens"] == 7096
                assert "temperature" not in body
            else:
                assert body["reasoning"] == {"effort": "high"} and body["service_tier"] == "flex" and "extra_body" not in body
        decisions = [Review.model_validate_json(line).decision for line in (where / "reviews.jsonl").read_text().splitlines()]
        assert decisions.count("accept") == 2  # rollouts 0 and 1 accepted, 2 rejected, as the live run has them


REFUSED = [
    ("chat", {"thinking_budget": 2048}, "--thinking-budget is Anthropic's extended thinking (--backend anthropic)"),
    ("responses", {"judge2_thinking_budget": 2048}, "--judge2-thinking-budget is Anthropic's extended thinking"),
    ("anthropic", {"thinking_budget": 1000}, "--thinking-budget 1000: Anthropic's thinking budget is at least 1024 tokens"),
    ("anthropic", {"thinking_budget": 2048, "temperature": 0.5}, "--temperature with --thinking-budget: Anthropic's extended thinking takes no temperature"),
    ("anthropic", {"thinking_budget": 2048, "judge2_thinking_budget": 0, "judge2_temperature": 0.5}, None),  # judge 2 does not think: fine
    ("anthropic", {"judge2_temperature": 0.5, "thinking_budget": 2048}, "--judge2-temperature with --judge2-thinking-budget"),
    ("anthropic", {"extra_body": '{"thinking": {"type": "adaptive"}}', "temperature": 0.3}, "--temperature with thinking in --extra-body"),
    ("anthropic", {"thinking_budget": 4096, "extra_body": '{"max_tokens": 4000}'}, "must be below max_tokens"),
    ("anthropic", {"thinking_budget": 2048, "extra_body": '{"top_k": 5}'}, "takes no top_k"),
    ("anthropic", {"thinking_budget": 2048, "extra_body": '{"top_p": 0.5}'}, "top_p is from 0.95 to 1"),
    ("anthropic", {"reasoning_effort": "minimal"}, "--reasoning-effort minimal: Anthropic's effort is one of low, medium, high, xhigh, max"),
    ("anthropic", {"temperature": 1.5}, "--temperature 1.5: Anthropic's temperature is from 0 to 1"),
    ("chat", {"extra_body": "[1, 2]"}, "--extra-body must be a JSON object"),
    ("chat", {"judge2_extra_body": "{oops"}, "--judge2-extra-body is not JSON"),
    ("chat", {"extra_body": '{"response_format": {"type": "text"}}'}, "--extra-body may not set response_format"),
    ("chat", {"extra_body": '{"messages": []}'}, "--extra-body may not set messages"),
    ("chat", {"reasoning_effort": "low", "extra_body": '{"reasoning_effort": "high"}'}, "sets reasoning_effort, which --reasoning-effort sets too"),
    ("responses", {"temperature": 0.0, "extra_body": '{"temperature": 1}'}, "sets temperature, which --temperature sets too"),
]  # fmt: skip


@pytest.mark.parametrize(("kind", "given", "refusal"), REFUSED)
def test_incompatible_settings_are_refused_before_anything_is_sent(
    tmp_path: Path, kind: str, given: dict[str, Any], refusal: str | None
) -> None:
    options = JudgeOptions(judge1="judge-model", backend=kind, base_url="http://127.0.0.1:9", **given)  # type: ignore[arg-type]
    if refusal is None:
        make_judges(options)
        return
    with pytest.raises(OpError) as raised:
        review(tmp_path, options)
    assert refusal in str(raised.value) and "\n" not in str(raised.value)
    assert not (tmp_path / "reviews.jsonl").exists()


def test_the_command_line_refuses_with_one_line(tmp_path: Path) -> None:
    pool = tmp_path / "pool.jsonl"
    write_atomic(pool, [rollout(0)])
    args = ["review", "pool", str(pool), "-o", str(tmp_path / "r.jsonl"), "--judge1", "m", "--backend", "anthropic"]
    result = CliRunner().invoke(app, [*args, "--thinking-budget", "2048", "--temperature", "0.7"])
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: --temperature with --thinking-budget"), result.stderr
    assert not (tmp_path / "r.jsonl").exists()


@pytest.mark.parametrize(
    ("kind", "model", "given", "per_request"),
    [
        ("anthropic", "claude-sonnet-4-5", {"thinking_budget": 10_000}, (5_000, 5_000)),  # half the budget, judge 2 inheriting it
        ("responses", "gpt-5.1", {"reasoning_effort": "high", "judge2_reasoning_effort": "low"}, (8_000, 1_000)),
    ],
)
def test_the_estimate_counts_assumed_reasoning_tokens(
    tmp_path: Path, kind: str, model: str, given: dict[str, Any], per_request: tuple[int, int]
) -> None:
    plain = JudgeOptions(judge1=model, backend=kind, base_url="http://127.0.0.1:9")  # type: ignore[arg-type]
    baseline = review(tmp_path, plain, pool=5, estimate=True).estimate
    thinking = review(tmp_path, JudgeOptions(**{**vars(plain), **given}), estimate=True).estimate
    assert baseline is not None and thinking is not None
    for before, after, reasoning in zip(baseline.estimates, thinking.estimates, per_request, strict=True):
        rows = before.row(), after.row()
        assert rows[0]["reasoning_tokens"] == 0 and rows[0]["reasoning_assumed"] == ""
        assert rows[1]["reasoning_tokens"] == round(reasoning * after.totals.requests)
        assert rows[1]["output_tokens"] == rows[0]["output_tokens"] + rows[1]["reasoning_tokens"]  # billed as output
        assert rows[1]["usd"] > rows[0]["usd"] and rows[1]["input_tokens"] == rows[0]["input_tokens"]
    caption = str(thinking.render().caption)
    assert "output tok include reasoning tokens, assumed" in caption and f"judge1 {per_request[0]:,} a request" in caption
    assert "output tok include reasoning" not in str(baseline.render().caption)
    # The share and the levels are [assumptions] of the pricing table, overridable like the rest.
    prices = tmp_path / "prices.toml"
    prices.write_text("[assumptions]\nthinking_budget_share = 0.25\neffort_reasoning_tokens = { high = 2000 }\n")
    cheaper = review(tmp_path, JudgeOptions(**{**vars(plain), **given, "prices": prices}), estimate=True).estimate
    assert cheaper is not None
    assert cheaper.estimates[0].row()["reasoning_tokens"] == round(
        (2_500 if kind == "anthropic" else 2_000) * cheaper.estimates[0].totals.requests
    )


def test_the_pipeline_review_table_sets_them(tmp_path: Path) -> None:
    with ModelServer("chat", thinking_answer) as server:
        path = tmp_path / "PIPELINE.toml"
        path.write_text(
            'workdir = "w"\n[pool]\nimport = { format = "codex", paths = ["x"] }\n'
            f'[review]\njudge1 = "judge-model"\nbackend = "chat"\nbase_url = "{server.base_url}"\n'
            'reasoning_effort = "high"\ntemperature = 0.0\njudge2_reasoning_effort = "medium"\n'
            "extra_body = { chat_template_kwargs = { enable_thinking = true } }\n"
            "judge2_extra_body = '{\"top_k\": 20}'\n"
        )
        config = load_pipeline(path)
        write_atomic(tmp_path / "pool.jsonl", [rollout(0)])
        options = config.review.options(tmp_path / "pool.jsonl", tmp_path / "reviews.jsonl", None, ray=None)
        summary = run_review(options)
        bodies = list(server.requests)
    assert summary.run is not None and summary.run.reviewed == 1
    assert bodies[0]["reasoning_effort"] == "high" and bodies[0]["temperature"] == 0.0
    assert bodies[0]["chat_template_kwargs"] == {"enable_thinking": True} and "top_k" not in bodies[0]
    assert bodies[1]["reasoning_effort"] == "medium" and bodies[1]["temperature"] == 0.0 and bodies[1]["top_k"] == 20
    assert "chat_template_kwargs" not in bodies[1]
    written = json.loads((tmp_path / "reviews.jsonl").read_text().splitlines()[0])
    assert written["sampling"]["judge1"]["extra_body"] == {"chat_template_kwargs": {"enable_thinking": True}}
