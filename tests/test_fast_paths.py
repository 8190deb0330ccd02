"""The fast paths of import and masks give what the plain ones give: msgspec's JSON against
``json``, the tokenizer's Rust backend against the ``transformers`` wrapper, one batch against
one trajectory at a time, the run-wise JSON map against the character-wise one, the resume
index against a full parse. (``test_outputs_unchanged`` checks whole outputs byte for byte.)"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.import_run import pool_index
from harness.importers import codex
from harness.scripted.codex_sessions import envelope, legacy_session, session, write_rollout
from records.pools import RecordError, dump_line, loads, parse_json_line
from records.review import Defect, Review
from records.trajectory import Trajectory, content_id, dump_record, record_content_id
from relearn.masks.compile import CompileOptions, Rejected, compile_batch, compile_trajectory
from relearn.masks.template import map_json_value
from relearn.masks.tokens import encode_texts


@pytest.mark.parametrize(
    "text",
    [
        '{"a": 1, "a": 2}',
        "[NaN, Infinity, -Infinity]",
        '"\\ud800 lone surrogate"',
        '"\\ud83e\\udd80"',
        "123456789012345678901234567890",
        "-18446744073709551617",
        "1e400",
        '{"a": -0.0, "b": 1.5e-7, "c": "caf\\u00e9"}',
    ],
)
def test_loads_gives_what_json_gives(text: str) -> None:
    expected, got = json.loads(text), loads(text)
    assert repr(got) == repr(expected)  # repr: NaN != NaN, and 0.0 == -0.0
    assert type(got) is type(expected)


@pytest.mark.parametrize("text", ['{"a": 1', '{"a": tru}', "[1, 2,]", '{"a": "b"} extra', ""])
def test_bad_json_is_located_as_json_locates_it(text: str) -> None:
    with pytest.raises(json.JSONDecodeError) as plain:
        json.loads(text)
    with pytest.raises(RecordError) as ours:
        parse_json_line("pool.jsonl", 7, text)
    assert ours.value.line == 7
    if plain.value.pos >= len(text.rstrip()):
        # Ends mid-value: where it was cut, in words, whichever error json met first.
        assert ours.value.message == f"invalid JSON: cut short at column {len(text) + 1} (the record is truncated)"
    else:
        assert ours.value.message == f"invalid JSON at column {plain.value.colno}: {plain.value.msg}"


def test_the_resume_index_reads_every_shape_a_full_parse_reads(tmp_path: Path) -> None:
    lines = [
        {"id": "a", "source": {"format": "codex", "content_hash": "t-1"}},
        {"id": "b", "messages": []},
        {"id": "c", "source": "not an object"},
        {"id": "d", "source": {"content_hash": 5}},
        {"id": 7},
        ["not", "a", "record"],
    ]
    text = "".join(json.dumps(line) + "\n" for line in lines) + '{"id": "e", "x": NaN}\n{"id": "torn", "sou'
    pool = tmp_path / "pool.jsonl"
    pool.write_text(text)
    assert pool_index(pool) == {"a": "t-1", "b": None, "c": None, "d": 5, "e": None}


TEXTS = [
    "",
    "plain ascii text",
    "<|im_start|>user\ncafé 🦀 中文\t\x01<|im_end|>\n<|im_start|>assistant\n<think>\nx\n</think>\n\nok<|im_end|>",
    "e\u0301 decomposed, \u00a0 no-break space, \u200b zero width, \r\n windows line",
    "    leading spaces and trailing   \n\n\n",
]


def test_the_backend_encodes_as_the_wrapper_does(tok) -> None:  # noqa: ANN001
    rng = random.Random(5)
    alphabet = "ab é🦀中\n\t\x00<|>im_end{}\"'\\"
    texts = [*TEXTS, *("".join(rng.choice(alphabet) for _ in range(rng.randint(1, 400))) for _ in range(40))]
    for text, encoded in zip(texts, encode_texts(tok, texts), strict=True):
        wrapper = tok(text, add_special_tokens=False, return_offsets_mapping=True)
        assert encoded.ids.tolist() == wrapper["input_ids"]
        assert [tuple(pair) for pair in encoded.offsets.tolist()] == [tuple(pair) for pair in wrapper["offset_mapping"]]
        assert encoded.decoded == tok.decode(wrapper["input_ids"], skip_special_tokens=False, clean_up_tokenization_spaces=False)


def _char_by_char(value: object, json_pos: int, shown_at: int) -> tuple[dict[int, int], int]:
    """The character-at-a-time mapping the run-wise one replaced."""
    json_map: dict[int, int] = {}
    if not isinstance(value, str):
        shown = json.dumps(value, ensure_ascii=False)
        for i in range(len(shown)):
            json_map[json_pos + i] = shown_at + i
        return json_map, json_pos + len(shown)
    json_pos += 1
    for i, char in enumerate(value):
        width = len(json.dumps(char, ensure_ascii=False)) - 2
        for j in range(width):
            json_map[json_pos + j] = shown_at + i
        json_pos += width
    return json_map, json_pos + 1


@settings(max_examples=300, deadline=None)
@given(
    value=st.one_of(
        st.text(alphabet=st.characters(codec="utf-8") | st.sampled_from('"\\\n\t\x00\x1f\x7f')),
        st.integers(),
        st.lists(st.text(max_size=5), max_size=3),
    ),
    at=st.integers(0, 50),
)
def test_the_json_map_is_the_character_wise_one(value: object, at: int) -> None:
    mine: dict[int, int] = {}
    end = map_json_value(value, 3, at, mine)
    expected, expected_end = _char_by_char(value, 3, at)
    assert (mine, end) == (expected, expected_end)


def _trajectory(seed: int, **extra: object) -> Trajectory:
    messages = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": f"Task {seed}: fix it."},
        {
            "role": "assistant",
            "generated": True,
            "reasoning_content": f"Look first {seed}.",
            "content": "Reading.",
            "tool_calls": [{"id": "c1", "function": {"name": "shell", "arguments": {"command": ["cat", "a.py"]}}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "x = 1"},
        {"role": "user", "content": "Summary so far: read a.py."},
        {"role": "assistant", "generated": True, "content": f"Done {seed}."},
    ]
    return Trajectory.model_validate({"id": f"t{seed}", "messages": messages, "outcome": {"resolved": True}, **extra})


def test_a_batch_compiles_as_trajectories_one_at_a_time(tok) -> None:  # noqa: ANN001
    items: list[tuple[Trajectory, Review | None]] = []
    for seed in range(6):
        t = _trajectory(seed)
        quote = f"Look first {seed}."
        defects = [Defect(message_index=2, field="reasoning_content", start=0, end=len(quote), quote=quote)]
        if seed == 2:  # a quote not at its offsets rejects this one, and only this one
            defects = [Defect(message_index=2, field="reasoning_content", start=1, end=len(quote), quote=quote[:-1])]
        items.append((t, Review(trajectory_id=t.id, decision="accept", defects=defects)))
    items.append((_trajectory(9, outcome={"resolved": False}), None))  # not positive: rejected before rendering
    items.append((_trajectory(10, context_resets=[{"message_index": 4}]), Review(trajectory_id="t10", decision="accept")))  # two samples
    options = CompileOptions(ctx=10**6)
    batch = compile_batch(items, tok, options)
    assert len(batch) == len(items)
    for (trajectory, review), got in zip(items, batch, strict=True):
        try:
            alone = compile_trajectory(trajectory, review, tok, options)
        except Rejected as exc:
            assert isinstance(got, Rejected) and (got.reason, got.detail) == (exc.reason, exc.detail)
            continue
        assert not isinstance(got, Rejected)
        assert [s.sample_id for s in got] == [s.sample_id for s in alone]
        for a, b in zip(got, alone, strict=True):
            assert a.input_ids.tolist() == b.input_ids.tolist() and a.loss_mask.tolist() == b.loss_mask.tolist()
            assert (a.eligible, a.excluded, a.supervised) == (b.eligible, b.excluded, b.supervised)
    assert isinstance(batch[2], Rejected) and batch[2].reason == "quote not at its offsets"
    assert isinstance(batch[6], Rejected) and batch[6].reason == "not verified positive"
    assert [s.sample_id for s in batch[7]] == ["t10#r0", "t10#r1"]  # type: ignore[union-attr]
    assert batch[0][0].excluded > 0  # type: ignore[index]


SAMPLES = Path(__file__).resolve().parents[2] / "shared" / "samples"


def _awkward_session() -> list[dict]:
    """Values the two serialisers could write differently: exponent floats, integers past 64
    bits, nulls inside kept objects, separators and controls in strings, a local shell call,
    no session id (the id comes from the content), and compaction."""
    lines = session(steps=2, filler="\u2028 \x7f \x1f caf\u00e9 \U0001f980")
    del lines[0]["payload"]["id"]
    lines[1]["payload"].update({"big": 2**70, "tiny": 1.5e-7, "huge": 1e22, "neg": -0.0, "none": None})
    lines.insert(
        9,
        envelope(
            "response_item",
            {
                "type": "local_shell_call",
                "call_id": "sh1",
                "status": None,
                "action": {"type": "exec", "command": ["ls"], "timeout_ms": 1.0e3},
            },
        ),
    )
    lines.insert(
        10,
        envelope(
            "response_item",
            {
                "type": "function_call_output",
                "call_id": "sh1",
                "output": '{"output": "a\\n", "metadata": {"exit_code": 0, "duration_seconds": 0.1}}',
            },
        ),
    )
    lines.insert(
        11,
        envelope(
            "compacted",
            {
                "message": "",
                "replacement_history": [
                    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "summary"}], "extra": None}
                ],
            },
        ),
    )
    return lines


def test_a_codex_record_is_the_line_and_id_the_model_gives(tmp_path: Path) -> None:
    # The Codex reader builds plain dicts and import writes them unvalidated: each must be
    # exactly what validating it as a Trajectory and writing that would give.
    inputs = {"awkward": _awkward_session(), "plain": session(steps=3), "legacy": legacy_session()}
    for name, lines in inputs.items():
        write_rollout(tmp_path / f"{name}.jsonl", lines)
    paths = [*sorted(tmp_path.glob("*.jsonl")), SAMPLES / "codex_rollout_v0.135.0_exec.jsonl"]
    for path in paths:
        (result,) = codex.read(path)
        assert result.error is None, result.error
        record = result.record
        assert record is not None
        trajectory = Trajectory.model_validate(record)
        assert dump_record(record) + b"\n" == dump_line(trajectory), path.name
        assert record_content_id(record) == content_id(trajectory), path.name
        assert record["id"] == trajectory.id
    (awkward,) = codex.read(tmp_path / "awkward.jsonl")
    assert awkward.record["id"].startswith("t-")  # no session id: the content names it
    assert b'"huge":1e+22' in dump_record(awkward.record)


def test_a_codex_line_with_a_timestamp_of_the_wrong_type_is_rejected_where_it_is(tmp_path: Path) -> None:
    lines = session(steps=1)
    lines[3]["timestamp"] = 1717563480
    write_rollout(tmp_path / "bad.jsonl", lines)
    (result,) = codex.read(tmp_path / "bad.jsonl")
    assert result.record is None and result.trajectory is None
    assert (result.error.line, result.error.field) == (4, "timestamp")
    assert "expected string, got int" in result.error.message
