"""``relearn analyze``: NLL of eligible tokens (compatibility) and pass@k (complementarity).

NLL runs the real Qwen3.6 tokenizer and chat template and a tiny random Qwen3 with the real
248,320-token vocabulary; the chunked, eligible-positions-only path is checked against full
logits, and a pool copied from the model's own greedy output must score lower than random
text. With reviews, the kept/excluded split is checked against the mask compiler's own
masks and counts. pass@k is checked against hand-computed values of the unbiased estimator.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from typer.testing import CliRunner

from records.pools import write_atomic
from records.review import Defect, Review, field_text
from records.trajectory import Trajectory
from relearn.analyze.nll import Scorer, eligible_tokens, folder_fingerprint
from relearn.analyze.passk import analyze, read_outcomes
from relearn.analyze.pools import NamedPool
from relearn.cli.main import app
from relearn.masks.template import render

KW = {"preserve_thinking": True}
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def lm() -> torch.nn.Module:
    from relearn.train.model import build_model

    return build_model(tiny="qwen3", seed=0).eval()  # the weights `--tiny qwen3 --seed 0` builds


def call(call_id: str, name: str, **arguments: object) -> dict:
    return {"id": call_id, "function": {"name": name, "arguments": arguments}}


def context(task: str) -> list[dict]:
    return [{"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": f"Fix {task}() in calc.py."}]


AGENT = [
    *context("add"),
    # Copied from another run: context, never scored.
    {"role": "assistant", "generated": False, "content": "A copied answer from elsewhere."},
    {"role": "user", "content": "Go on."},
    {
        "role": "assistant",
        "generated": True,
        "reasoning_content": "The bug is probably in add().",
        "content": "Let me look at the file.",
        "tool_calls": [call("c1", "shell", command=["bash", "-lc", "cat calc.py"], workdir="/repo")],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "def add(a, b):\n    return a - b\n"},
    {"role": "assistant", "generated": True, "content": "Fixed: add() returns a + b."},
]


def trajectory(messages: list[dict], **extra: object) -> Trajectory:
    return Trajectory.model_validate({"messages": messages, **extra})


def run(*args: str) -> object:
    result = CliRunner().invoke(app, list(args))
    result.words = " ".join((result.stdout + result.stderr).split())  # rich wraps long lines; compare words
    return result


# ---------------------------------------------------------------- nll


def test_nll_is_the_full_logits_masked_mean_over_eligible_tokens_only(tok, lm: torch.nn.Module) -> None:  # noqa: ANN001
    t = trajectory(AGENT)
    (sample,) = eligible_tokens(t, tok, KW)
    ours = Scorer(lm, chunk=7).token_nll(sample.input_ids, sample.loss_mask)  # 7 does not divide the count

    ids = torch.tensor(sample.input_ids, dtype=torch.long)[None]
    with torch.no_grad():
        logits = lm(input_ids=ids).logits.float()[0]  # [S, V]: what the chunked path avoids
    logp = F.log_softmax(logits[:-1], dim=-1).gather(-1, ids[0, 1:, None])[:, 0]
    targets = torch.tensor(sample.loss_mask[1:], dtype=torch.bool)
    reference = (-logp[targets]).double().numpy()
    assert len(ours) == sample.eligible == int(targets.sum()) > 0
    np.testing.assert_allclose(ours, reference, rtol=1e-5, atol=1e-5)
    assert abs(ours.mean() - reference.mean()) < 1e-5

    # The scored tokens are the generated turns (after the generation prompt, through the
    # end-of-turn token; a whitespace token straddling the turn's start is not the turn's):
    # not the copied assistant message, not tool output, not headers.
    rendered = render(t, tok, template_kwargs=KW)
    offsets = tok(rendered.text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    eligible = sample.loss_mask.astype(bool)
    inside = 0
    for turn in rendered.turns:
        picked = [i for i, (a, b) in enumerate(offsets) if eligible[i] and a >= turn.start and b <= turn.end]
        inside += len(picked)
        covered = rendered.text[offsets[picked[0]][0] : offsets[picked[-1]][1]]
        whole = rendered.text[turn.start : turn.end]
        assert whole.endswith(covered) and whole[: len(whole) - len(covered)].strip() == ""
    assert inside == sample.eligible and len(rendered.turns) == 2
    scored = tok.decode(sample.input_ids[eligible].tolist())
    assert "copied answer" not in scored and "return a - b" not in scored and "Go on" not in scored
    # Generated too, the copied turn is answered by a user turn: the harness sends observations as
    # user turns, so each turn is scored under the context it was sent (as masks compiles it).
    copied_too = eligible_tokens(trajectory([{**m, "generated": True} if m.get("role") == "assistant" else m for m in AGENT]), tok, KW)
    assert len(copied_too) == 3 and sum(s.eligible for s in copied_too) > sample.eligible
    assert "copied answer" in tok.decode(copied_too[0].input_ids[copied_too[0].loss_mask.astype(bool)].tolist())


def greedy_reasoning(tok, lm: torch.nn.Module, messages: list[dict], n: int) -> str:  # noqa: ANN001
    prompt = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **KW)
    ids = tok(prompt, add_special_tokens=False)["input_ids"]
    with torch.inference_mode():
        out = lm.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False, pad_token_id=0)
    return tok.decode(out[0, len(ids) :].tolist())


def test_nll_scores_each_turn_under_the_context_it_was_sent_as_masks_compiles_it(tok, lm: torch.nn.Module) -> None:  # noqa: ANN001
    """Observations as user turns: the harness never sent the first turn's reasoning back, so the
    second turn was generated without it in view. NLL scores that turn under the context it was
    sent, on the very sequences `relearn masks` compiles (and, with `render`, the whole render)."""
    from relearn.masks.compile import CompileOptions, compile_trajectory
    from tests.test_masks_as_sent import USER_OBSERVATIONS

    t = trajectory(USER_OBSERVATIONS, id="obs", outcome={"resolved": True})
    scored = eligible_tokens(t, tok, KW)
    compiled = compile_trajectory(t, None, tok, CompileOptions(mode="positive", template_kwargs=KW))
    assert len(scored) == len(compiled) == 2
    for mine, theirs in zip(scored, compiled, strict=True):
        assert mine.sample_id == theirs.sample_id and np.array_equal(mine.input_ids, theirs.input_ids)
        assert np.array_equal(mine.loss_mask, theirs.loss_mask)
    assert "Look first." not in tok.decode(scored[1].input_ids.tolist())
    (whole,) = eligible_tokens(t, tok, KW, context="render")
    assert "Look first." in tok.decode(whole.input_ids.tolist()) and whole.eligible == sum(s.eligible for s in scored)
    # The scores differ with the context, so each keys its own cache entries.
    scorer = Scorer(lm)
    as_sent = sum(float(scorer.token_nll(s.input_ids, s.loss_mask).sum()) for s in scored)
    rendered = float(scorer.token_nll(whole.input_ids, whole.loss_mask).sum())
    assert as_sent != pytest.approx(rendered)
    from relearn.analyze.nll import Settings

    settings = Settings(model="m", tokenizer="t", dtype="float32", template_kwargs=KW)
    assert settings.digest() != Settings(model="m", tokenizer="t", dtype="float32", template_kwargs=KW, context="render").digest()


def test_cli_nll_compares_pools_writes_table_json_png_and_reruns_for_free(
    tmp_path: Path, tok, lm: torch.nn.Module, monkeypatch: pytest.MonkeyPatch
) -> None:  # noqa: ANN001
    rng = np.random.default_rng(0)

    def turn(task: str, reasoning: str) -> Trajectory:
        messages = [*context(task), {"role": "assistant", "generated": True, "reasoning_content": reasoning, "content": "Done."}]
        return trajectory(messages, task_id=task)

    # What the model itself would write (its greedy reasoning) against random text of the same length.
    policy = [turn(task, greedy_reasoning(tok, lm, context(task), 24)) for task in ("add", "sub")]
    noise = [turn(task, tok.decode(rng.integers(0, 240_000, 24).tolist())) for task in ("add", "sub")]
    pools = tmp_path / "pools"
    write_atomic(pools / "policy.jsonl", policy)
    write_atomic(pools / "random.jsonl", noise)
    good = trajectory(AGENT, task_id="add")
    bad_ids = trajectory([*AGENT[:-1], {**AGENT[-1], "token_ids": [1, 2, 3]}], task_id="add-ids")
    too_long = trajectory([*AGENT[:5], {**AGENT[5], "content": "line of output\n" * 200}, AGENT[6]], task_id="long")
    nothing_generated = trajectory(context("mul"), task_id="mul")
    lines = [json.dumps(t.to_dict()) for t in (good, bad_ids, too_long, nothing_generated, good)]
    lines.insert(1, '{"messages": [')  # line 2: torn JSON
    broken = pools / "broken.jsonl"
    broken.write_text("\n".join(lines) + "\n")

    out = tmp_path / "out"
    monkeypatch.setattr("relearn.masks.tokenizers.load_tokenizer", lambda _name: tok)  # the same one; loading a folder's is tested below

    def nll(ctx: int) -> object:
        pools_args = ["--pool", f"policy={pools / 'policy.jsonl'}", "--pool", f"random={pools / 'random.jsonl'}", "--pool", str(broken)]
        return run(
            "analyze", "nll", *pools_args, "--tiny", "qwen3", "--ctx", str(ctx), "--bootstrap", "1000", "-o", str(out), "--no-progress"
        )

    first = nll(400)
    assert first.exit_code == 1, first.words  # done, but broken.jsonl had bad records
    for located in (
        f"{broken}:2: invalid JSON",
        f"{broken}:3: messages: {bad_ids.id}: recorded token ids disagree",
        f"{broken}:6: id: '{good.id}' repeats line 1",
    ):
        assert located in first.words
    assert "written:" in first.words and "policy" in first.stdout and "random" in first.stdout

    result = json.loads((out / "nll.json").read_text())
    rows = {r["name"]: r for r in result["pools"]}
    assert [r["name"] for r in result["pools"]] == ["policy", "random", "broken"]
    assert rows["policy"]["scored"] == rows["random"]["scored"] == 2
    assert rows["broken"]["records"] == 5 and rows["broken"]["scored"] == 1 and rows["broken"]["rejected"] == 3
    assert rows["broken"]["skipped"] == {"longer than ctx": 1, "no generated assistant turn": 1}
    # Compatibility: the model's own output is far likelier than random text, and the
    # interval of the difference says so.
    assert rows["policy"]["nll_per_token"] + 0.2 < rows["random"]["nll_per_token"]
    assert rows["random"]["diff_vs_first_ci95"][0] > 0
    assert rows["policy"]["p10"] <= rows["policy"]["median"] <= rows["policy"]["p90"]
    lo, hi = rows["random"]["nll_per_token_ci95"]
    assert lo <= rows["random"]["nll_per_token"] <= hi
    # Each trajectory's figure is the scorer's over its eligible tokens.
    (scored_good,) = result["trajectories"]["broken"]
    (sample,) = eligible_tokens(good, tok, KW)
    assert scored_good["eligible"] == sample.eligible and scored_good["line"] == 1
    assert scored_good["resolved"] is bool(good.outcome and good.outcome.resolved)
    assert abs(scored_good["nll_mean"] - Scorer(lm).token_nll(sample.input_ids, sample.loss_mask).mean()) < 1e-5
    assert (out / "nll.png").read_bytes().startswith(PNG)
    assert "| policy | 2 |" in (out / "nll.md").read_text()

    # A rerun finds everything in the score cache: the same figures, and no model is loaded.
    def no_model(**_kwargs: object) -> None:
        raise AssertionError("the rerun loaded a model")

    monkeypatch.setattr("relearn.train.model.build_model", no_model)
    with open(out / "nll-scores.jsonl", "a") as scores:
        scores.write('{"trajectory_id": "t-killed-mid-wr')  # a torn last line costs nothing
    second = nll(400)
    assert second.exit_code == 1, second.words
    again = json.loads((out / "nll.json").read_text())
    assert [r["nll_per_token"] for r in again["pools"][:2]] == [r["nll_per_token"] for r in result["pools"][:2]]
    assert again["pools"][0]["reused"] == 2 and again["pools"][2]["rejected"] == 3

    # A larger ctx makes the long trajectory fit: it alone needs the model (--debug lets the
    # test's AssertionError through, where `relearn` would call it a bug in one line).
    monkeypatch.setenv("RELEARN_DEBUG", "1")
    wider = nll(4096)
    assert isinstance(wider.exception, AssertionError) and "the rerun loaded a model" in str(wider.exception)


def test_cli_nll_model_folder_and_usage_errors(tmp_path: Path, tok, lm: torch.nn.Module, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    from transformers import AutoModelForCausalLM

    from relearn.train.model import tiny_config

    pool = tmp_path / "pool.jsonl"
    write_atomic(pool, [trajectory(AGENT, task_id="add")])
    folder = tmp_path / "model"
    lm.save_pretrained(folder)
    tok.save_pretrained(folder)
    loaded = run(
        "analyze", "nll", "--pool", f"p={pool}", "--model", str(folder), "-o", str(tmp_path / "a"), "--bootstrap", "100", "--no-progress"
    )
    assert loaded.exit_code == 0, loaded.words
    (sample,) = eligible_tokens(trajectory(AGENT), tok, KW)
    row = json.loads((tmp_path / "a" / "nll.json").read_text())["pools"][0]
    assert row["eligible_tokens"] == sample.eligible
    assert abs(row["nll_per_token"] - Scorer(lm).token_nll(sample.input_ids, sample.loss_mask).mean()) < 1e-5
    # Overwritten weights are another model: their scores are not the cached ones.
    before = folder_fingerprint(str(folder))
    (folder / "config.json").write_text((folder / "config.json").read_text() + "\n")
    assert folder_fingerprint(str(folder)) != before and folder_fingerprint("qwen3.6") == folder_fingerprint()

    small = tmp_path / "small"
    AutoModelForCausalLM.from_config(tiny_config("qwen3", vocab_size=1000)).save_pretrained(small)
    monkeypatch.setattr("relearn.masks.tokenizers.load_tokenizer", lambda _name: tok)  # loading it is tested above; the pairing here
    mismatch = run(
        "analyze", "nll", "--pool", str(pool), "--model", str(small), "--tokenizer", "qwen3.6", "-o", str(tmp_path / "b"), "--no-progress"
    )
    assert mismatch.exit_code == 2 and "248,077 tokens but the model's vocabulary is 1,000" in mismatch.words

    for args, message in (
        (["--tiny", "qwen3", "--model", str(folder)], "exactly one of --model FOLDER or --tiny"),
        (["--tiny", "qwen3", "--device", "tpu"], "--device must be cpu or cuda"),
        (["--tiny", "qwen3", "--pool", f"p={tmp_path / 'missing.jsonl'}"], "no such file"),
        (["--tiny", "qwen3", "--pool", f"p={pool}"], "two pools are named 'p'"),
        (["--model", str(tmp_path / "nowhere")], "no such folder"),
    ):
        result = run("analyze", "nll", "--pool", f"p={pool}", "-o", str(tmp_path / "c"), *args)
        assert result.exit_code == 2 and message in result.words, (args, result.words)


# ---------------------------------------------------------------- passk


def attempt(task: str | None, number: int, resolved: bool | None = None, reward: float | None = None, pool: str = "h") -> dict:
    outcome = None if resolved is None and reward is None else {"resolved": resolved, "reward": reward}
    return {"id": f"{pool}-{task}-{number}", "task_id": task, "messages": context(str(task)), "outcome": outcome}


def pools_for_passk(tmp_path: Path) -> tuple[Path, Path]:
    historical = [attempt("A", i, i < 3) for i in range(4)]  # 3/4
    historical += [attempt("B", i, False) for i in range(4)]  # 0/4
    historical += [attempt("C", i, i in (1, 3)) for i in range(4)]  # 2/4
    historical += [attempt("D", i, reward=1.0 if i == 0 else 0.0) for i in range(4)]  # 1/4, reward-only verdicts
    current = [attempt("A", i, True, pool="c") for i in range(4)]  # 4/4
    current += [attempt("B", i, i == 2, pool="c") for i in range(4)]  # 1/4
    current += [attempt("C", i, False, pool="c") for i in range(4)]  # 0/4
    current += [attempt("D", i, False, pool="c") for i in range(4)]  # 0/4
    current += [attempt("E", 0, True, pool="c")]  # only here, 1 attempt
    h, c = tmp_path / "historical.jsonl", tmp_path / "current.jsonl"
    h.write_text("".join(json.dumps(r) + "\n" for r in historical))
    bad = [json.dumps(attempt(None, 9, True, pool="c")), json.dumps(attempt("A", 9, pool="c")), json.dumps(current[0]), "not json"]
    c.write_text("".join(json.dumps(r) + "\n" for r in current) + "\n".join(bad) + "\n")
    return h, c


def test_passk_unbiased_values_and_problems_solved_by_one_pool_only(tmp_path: Path) -> None:
    h, c = pools_for_passk(tmp_path)
    historical, current = read_outcomes(NamedPool("historical", h)), read_outcomes(NamedPool("current", c))
    assert [str(e) for e in current.rejected] == [
        f"{c}:18: task_id: missing: attempts are grouped by problem",
        f"{c}:19: outcome: no verifier result (resolved or reward); run `relearn verify` first",
        f"{c}:20: id: 'c-A-0' repeats line 1",
        f"{c}:21: invalid JSON at column 1: Expecting value",
    ]
    assert historical.table["D"]["resolved"] == 1  # a positive reward is a success without `resolved`
    result = analyze([historical, current], max_k=4)
    hist, cur = result["pools"]
    # 1 - C(n-c, k) / C(n, k) by hand. historical, k = 1..4: A (c=3): 3/4, 1, 1, 1; B: 0;
    # C (c=2): 1/2, 5/6, 1, 1; D (c=1): 1/4, 1/2, 3/4, 1.
    expected = [(3 / 4 + 0 + 1 / 2 + 1 / 4) / 4, (1 + 0 + 5 / 6 + 1 / 2) / 4, (1 + 0 + 1 + 3 / 4) / 4, 3 / 4]
    assert [p["pass"] for p in hist["curve"]] == pytest.approx(expected, abs=1e-12)
    # current: A 1, B (c=1) 1/4, 1/2, 3/4, 1; C, D 0; E (1 attempt) only at k = 1.
    assert [p["pass"] for p in cur["curve"]] == pytest.approx([(1 + 1 / 4 + 1) / 5, (1 + 1 / 2) / 4, (1 + 3 / 4) / 4, 2 / 4], abs=1e-12)
    assert [p["problems"] for p in cur["curve"]] == [5, 4, 4, 4]
    assert [len(analyze([current])["pools"][0]["curve"])] == [1]  # by default K = the fewest attempts
    assert result["common_problems"] == 4 and result["solved_by_any_common"] == 4
    (pair,) = result["pairs"]
    assert (pair["problems"], pair["both"], pair["only_a"], pair["only_b"], pair["neither"]) == (4, 1, 2, 1, 0)
    assert pair["only_a_tasks"] == ["C", "D"] and pair["only_b_tasks"] == ["B"]
    assert (hist["solved_only_here"], cur["solved_only_here"], cur["solved"]) == (2, 1, 3)
    assert result["problems"]["E"] == {"current": {"attempts": 1, "resolved": 1, "rate": 1.0}}


def test_cli_passk_writes_table_json_png(tmp_path: Path) -> None:
    h, c = pools_for_passk(tmp_path)
    out = tmp_path / "out"
    result = run("analyze", "passk", "--pool", f"historical={h}", "--pool", f"current={c}", "--max-k", "4", "-o", str(out))
    assert result.exit_code == 1, result.words  # done, four records rejected
    assert "rejected (4)" in result.words and f"{c}:19: outcome: no verifier result" in result.words
    assert "historical" in result.stdout and "only A" in result.stdout
    data = json.loads((out / "passk.json").read_text())
    assert data["pairs"][0]["only_a"] == 2 and data["pools"][0]["curve"][1]["pass"] == pytest.approx(7 / 12)
    assert "| historical | current | 4 | 1 | 2 | 1 | 0 |" in (out / "passk.md").read_text()
    assert (out / "passk.png").read_bytes().startswith(PNG)
    alone = run("analyze", "passk", "--pool", str(h), "-o", str(tmp_path / "alone"))  # one pool, named after its file
    assert alone.exit_code == 0 and (tmp_path / "alone" / "passk.png").read_bytes().startswith(PNG)

    unverified = tmp_path / "unverified.jsonl"
    unverified.write_text(json.dumps(attempt("A", 0)) + "\n")
    for args, message in (
        ([], "give at least one --pool"),
        (["--pool", f"x={tmp_path / 'missing.jsonl'}"], "no such file"),
        (["--pool", f"x={unverified}"], "no verified trajectory with a task_id"),
    ):
        failed = run("analyze", "passk", "-o", str(tmp_path / "x"), *args)
        assert failed.exit_code == 2 and message in failed.words, (args, failed.words)


# ---------------------------------------------------------------- nll: kept (A \ E) vs excluded (E)


def defect(t: Trajectory, index: int, field: str, quote: str, category: str) -> Defect:
    text = field_text(t.messages[index], field)
    assert text is not None and quote in text
    start = text.index(quote)
    return Defect(message_index=index, field=field, start=start, end=start + len(quote), quote=quote, category=category)


def resolved(messages: list[dict], name: str) -> Trajectory:
    return trajectory(messages, id=name, task_id=name, outcome={"resolved": True, "reward": 1.0})


def squeeze(text: str) -> str:
    return "".join(text.split())


def review_line(t: Trajectory, decision: str = "accept", defects: list[Defect] | None = None) -> str:
    return json.dumps(
        Review(
            trajectory_id=t.id, decision=decision, reason=None if decision == "accept" else "reward hacking", defects=defects or []
        ).model_dump(mode="json")
    )


def test_cli_nll_splits_eligible_tokens_into_kept_and_excluded_as_masks_compile_them(
    tmp_path: Path, tok, lm: torch.nn.Module, monkeypatch: pytest.MonkeyPatch
) -> None:  # noqa: ANN001
    from relearn.masks.compile import CompileOptions, compile_trajectory

    longer = [*AGENT[:6], {**AGENT[6], "content": "Fixed: add() returns a + b. I also checked sub()."}]
    split_me = resolved(AGENT, "split-me")
    two = [
        defect(split_me, 4, "reasoning_content", "probably in add()", "wrong_hypothesis"),
        defect(split_me, 4, "tool_calls[0].arguments", "cat calc.py", "redundant_exploration"),
    ]
    clean = resolved(longer, "clean")  # accepted without defects: every eligible token is kept
    rejected = resolved([*AGENT[:6], {**AGENT[6], "content": "Tests deleted."}], "rejected")
    unreviewed = resolved([*AGENT[:6], {**AGENT[6], "content": "No review for me."}], "unreviewed")
    garbled = resolved([*AGENT[:6], {**AGENT[6], "content": "My latest review is torn."}], "garbled")
    misplaced = resolved([*AGENT[:6], {**AGENT[6], "content": "A quote off its offsets."}], "misplaced")
    off = defect(misplaced, 6, "content", "quote", "other").model_copy(update={"start": 0, "end": 5})  # the field has "A quo" there
    pool = tmp_path / "pool.jsonl"
    write_atomic(pool, [split_me, clean, rejected, unreviewed, garbled, misplaced])
    reviews = tmp_path / "reviews.jsonl"
    lines = [
        review_line(split_me, defects=two[:1]),  # superseded by the next line
        review_line(split_me, defects=two),
        review_line(clean),
        review_line(rejected, "reject"),
        review_line(garbled, defects=[defect(garbled, 6, "content", "torn", "other")]),  # an older, readable review: never used
        '{"trajectory_id": "garbled", "decision": "acc',  # line 6: the latest review of "garbled", unreadable
        review_line(misplaced, defects=[off]),
    ]
    reviews.write_text("\n".join(lines) + "\n")
    monkeypatch.setattr("relearn.masks.tokenizers.load_tokenizer", lambda _name: tok)
    out = tmp_path / "out"

    def nll(*extra: str) -> object:
        return run(
            "analyze", "nll", "--pool", f"p={pool}", "--tiny", "qwen3", "--bootstrap", "500", "-o", str(out), "--no-progress", *extra
        )

    plain = nll()
    assert plain.exit_code == 0, plain.words
    plain_rows = {s["trajectory_id"]: s for s in json.loads((out / "nll.json").read_text())["trajectories"]["p"]}
    assert "split" not in json.loads((out / "nll.json").read_text())["pools"][0]

    first = nll("--reviews", str(reviews))
    assert first.exit_code == 1, first.words  # done, but a latest review was unreadable
    squeezed = "".join((first.stdout + first.stderr).split())  # rich folds long paths, even mid-word
    assert squeeze(f"{pool}:5: garbled: not split, its latest review is unreadable: {reviews}:6: invalid JSON") in squeezed
    assert squeeze("kept (A \\ E) vs excluded (E)") in squeezed
    result = json.loads((out / "nll.json").read_text())
    (row,) = result["pools"]
    split = row["split"]
    assert split["trajectories"] == 2
    assert split["not_split"] == {"review rejected": 1, "no review": 1, "unreadable review": 1, "quote not at its offsets": 1}
    scores = {s["trajectory_id"]: s for s in result["trajectories"]["p"]}
    assert set(scores) == set(plain_rows)  # every trajectory is still scored ...
    for name, score in scores.items():  # ... to the same plain figures as without reviews
        assert score["eligible"] == plain_rows[name]["eligible"] and abs(score["nll_sum"] - plain_rows[name]["nll_sum"]) < 1e-6
        assert score["resolved"] == plain_rows[name]["resolved"]
        assert ("split" in score) == (name in ("split-me", "clean"))

    scorer = Scorer(lm)
    kept_tokens = excluded_tokens = 0
    for t, defects in ((split_me, two), (clean, [])):
        (sample,) = compile_trajectory(t, Review(trajectory_id=t.id, decision="accept", defects=defects), tok, CompileOptions(mode="ross"))
        s = scores[t.id]["split"]
        (kept_sum, kept), (excluded_sum, excluded) = s["kept"], s["excluded"]
        assert kept + excluded == scores[t.id]["eligible"] == sample.eligible
        assert (kept, excluded) == (sample.supervised, sample.excluded)
        assert {c: n for c, (_sum, n) in s["categories"].items()} == dict(sample.excluded_by_category)
        # The figures are the model's NLL at exactly those positions.
        excluded_mask = sample.eligible_mask & (1 - sample.loss_mask)
        assert abs(kept_sum - scorer.token_nll(sample.input_ids, sample.loss_mask).sum()) < 1e-3
        assert abs(excluded_sum - (scorer.token_nll(sample.input_ids, excluded_mask).sum() if excluded else 0.0)) < 1e-3
        kept_tokens, excluded_tokens = kept_tokens + kept, excluded_tokens + excluded
    assert scores["split-me"]["split"]["excluded"][1] > 0 and scores["clean"]["split"]["excluded"][1] == 0
    assert set(scores["split-me"]["split"]["categories"]) == {"wrong_hypothesis", "redundant_exploration"}
    assert (split["kept"]["tokens"], split["excluded"]["tokens"]) == (kept_tokens, excluded_tokens)
    assert sum(c["tokens"] for c in split["categories"].values()) == excluded_tokens
    for part in ("kept", "excluded"):
        lo, hi = split[part]["ci95"]
        assert lo <= split[part]["nll"] <= hi
    assert abs(split["gap"]["nll"] - (split["excluded"]["nll"] - split["kept"]["nll"])) < 1e-12
    markdown_text = (out / "nll.md").read_text()
    assert (
        "## Kept (A \\ E) vs excluded (E) eligible tokens" in markdown_text
        and "| p | 2 | " in markdown_text
        and "| p | wrong_hypothesis |" in markdown_text
    )

    # The same reviews again: everything from the cache, no model loaded.
    real_build = __import__("relearn.train.model", fromlist=["build_model"]).build_model
    loads: list[object] = []

    def counted(**kwargs: object) -> torch.nn.Module:
        loads.append(kwargs)
        return real_build(**kwargs)

    monkeypatch.setattr("relearn.train.model.build_model", counted)
    again = nll("--reviews", str(reviews))
    assert again.exit_code == 1 and loads == []
    assert json.loads((out / "nll.json").read_text())["pools"][0]["split"] == split

    # A changed review (the first defect withdrawn, appended as the latest line) is split again;
    # the other trajectories come from the cache.
    with open(reviews, "a") as f:
        f.write(review_line(split_me, defects=two[1:]) + "\n")
    changed = nll("--reviews", str(reviews))
    assert changed.exit_code == 1 and len(loads) == 1
    after = json.loads((out / "nll.json").read_text())
    assert after["pools"][0]["reused"] == 5
    (fewer,) = compile_trajectory(
        split_me, Review(trajectory_id=split_me.id, decision="accept", defects=two[1:]), tok, CompileOptions(mode="ross")
    )
    redone = next(s for s in after["trajectories"]["p"] if s["trajectory_id"] == "split-me")["split"]
    assert redone["excluded"][1] == fewer.excluded < scores["split-me"]["split"]["excluded"][1]
    assert set(redone["categories"]) == {"redundant_exploration"}


def test_split_statistics_are_paired_over_trajectories() -> None:
    """The gap and the change between two models resample the same trajectories for both
    figures: a constant per-token shift has no spread at all."""
    from collections import Counter

    from relearn.analyze.split import paired_delta, summarize_split

    rng = np.random.default_rng(1)
    before, after = [], []
    for i in range(12):
        excluded = int(rng.integers(10, 80))
        kept = 5 * excluded  # the same share everywhere, so that the token-weighted gap is exactly the per-token one
        level = float(rng.uniform(8, 12))  # trajectories differ a lot from each other
        split = {
            "kept": [level * kept, kept],
            "excluded": [(level + 0.75) * excluded, excluded],
            "categories": {"other": [(level + 0.75) * excluded, excluded]},
        }
        before.append({"trajectory_id": f"t{i}", "split": split})
        shifted = {
            "kept": [(level - 0.5) * kept, kept],
            "excluded": [(level - 0.2) * excluded, excluded],
            "categories": {"other": [(level - 0.2) * excluded, excluded]},
        }
        after.append({"trajectory_id": f"t{i}", "split": shifted})
    before.append({"trajectory_id": "unsplit"})
    summary = summarize_split(before, Counter({"review rejected": 1}), samples=2000)
    assert summary["trajectories"] == 12 and summary["not_split"] == {"review rejected": 1}
    assert summary["kept"]["ci95"][1] - summary["kept"]["ci95"][0] > 0.3  # unpaired figures spread with the trajectories ...
    assert summary["gap"]["nll"] == pytest.approx(0.75) and summary["gap"]["ci95"] == pytest.approx(
        [0.75, 0.75]
    )  # ... the paired gap does not
    assert summary["categories"]["other"]["tokens"] == summary["excluded"]["tokens"]
    delta = paired_delta(before, after[::-1], samples=2000)  # matched by id, not by order
    assert delta["trajectories"] == 12
    assert delta["kept"]["delta"] == pytest.approx(-0.5) and delta["kept"]["ci95"] == pytest.approx([-0.5, -0.5])
    assert delta["excluded"]["delta"] == pytest.approx(-0.95) and delta["excluded"]["ci95"] == pytest.approx([-0.95, -0.95])
    other = [{**r, "split": {**r["split"], "kept": [r["split"]["kept"][0], r["split"]["kept"][1] + 1]}} for r in after]
    with pytest.raises(ValueError, match="split the trajectories differently"):
        paired_delta(before, other)


def test_nll_on_a_backend_reads_the_pools_as_its_units_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With worker processes or Ray, the driver holds the units in flight, not the pools: a unit
    starts while most of the pool is unread, and every record is still tallied in file order."""
    from envs.executor import LocalBackend
    from relearn.analyze import nll

    pools = []
    for name in ("a", "b"):
        path = tmp_path / f"{name}.jsonl"
        write_atomic(path, [trajectory(AGENT, id=f"{name}-{n}", task_id=f"t{n}") for n in range(20)])
        pools.append(NamedPool(name, path))
    lines_read = [0]
    real_iter_pool = nll.iter_pool

    def counted(*args: object, **kwargs: object) -> object:
        for item in real_iter_pool(*args, **kwargs):  # type: ignore[arg-type]
            lines_read[0] += 1
            yield item

    monkeypatch.setattr(nll, "iter_pool", counted)
    read_when_started: list[int] = []

    def job(unit: list[nll.Due]) -> list[dict[str, object]]:
        read_when_started.append(lines_read[0])
        return [{"trajectory_id": t.id, "task_id": t.task_id, "rejected": "not scored here"} for t, _review, _key in unit]

    digest = "settings"
    cache = nll.ScoreCache(tmp_path / "scores.jsonl", digest)
    kept: list[str] = []

    def keep(record: dict[str, object], key: str | None) -> None:
        record["settings"] = digest
        kept.append(str(record["trajectory_id"]))
        cache.put(record)

    backend = LocalBackend(1)
    try:
        results = nll._score_on(backend, job, pools, cache, keep, 64, None, False, None, lambda: None, 4)  # type: ignore[arg-type]
    finally:
        backend.close()
    assert read_when_started[0] <= 8  # the first unit of 4, and at most the next one read ahead
    assert len(read_when_started) == 10 and lines_read[0] == 40
    assert kept == [f"{name}-{n}" for name in ("a", "b") for n in range(20)]
    assert [(r.name, r.records) for r in results] == [("a", 20), ("b", 20)]
