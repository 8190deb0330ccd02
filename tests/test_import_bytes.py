"""Import writes pool lines with msgspec and reads rollouts as bytes: each fast path must give
exactly the bytes, ids and errors of the plain one (pydantic's serialiser, the text reader).
``test_outputs_unchanged`` compares whole pools with the golden digests; these tests go after
the values and inputs where the two could part."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

import pydantic_core
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.import_run import import_files
from harness.importers import codex
from harness.importers.codex_fields import RolloutJson
from harness.scripted.codex_sessions import envelope, session, write_rollout
from records.pools import dump_line, read_trajectories
from records.trajectory import Trajectory, WideFloat, content_id, dump_record, mark_wide_floats, record_content_id

# Floats on both sides of where msgspec starts to write exponents its own way (1e16), the
# smallest and largest there are, negative zero, and what JSON text can hold beyond: NaN and
# the infinities (pydantic writes null for them).
FLOATS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([1e16, -1e16, 9999999999999998.0, 1e22, 1.5e-7, 5e-324, 1.7976931348623157e308, -0.0, 0.1, 1e15]),
    st.integers(-(10**20), 10**20).map(lambda n: n * 1e10),
)
TEXT = st.text(alphabet=st.characters(codec="utf-8") | st.sampled_from('"\\\n\t\x00\x1f\x7f\u2028\u2029\U0001f980'), max_size=12)
LEAVES = st.one_of(st.none(), st.booleans(), st.integers(-(2**80), 2**80), FLOATS, TEXT)
VALUES = st.recursive(LEAVES, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4), max_leaves=12)


def _pydantic(value: Any) -> bytes:
    return pydantic_core.to_json(value, inf_nan_mode="null")


@settings(max_examples=400, deadline=None)
@given(value=VALUES)
def test_a_marked_value_is_written_as_pydantic_writes_it(value: Any) -> None:
    marked = mark_wide_floats(copy.deepcopy(value))
    assert dump_record({"value": marked}) == _pydantic({"value": value})


@settings(max_examples=300, deadline=None)
@given(value=VALUES)
def test_the_rollout_decoder_notes_every_float_that_needs_marking(value: Any) -> None:
    # Whatever the decoder gives, once marked where it said so, is written as pydantic writes
    # the plain json decoding of the same text; where it said nothing, unmarked already.
    text = json.dumps({"value": value})
    rollout = RolloutJson("r.jsonl")
    decoded = rollout.loads(1, text)
    plain = json.loads(text)
    if rollout.wide_floats:
        mark_wide_floats(decoded)
    assert dump_record(decoded) == _pydantic(plain)


def test_wide_floats_are_the_ones_msgspec_writes_otherwise() -> None:
    rollout = RolloutJson("r.jsonl")
    rollout.loads(1, '{"a": [1e15, 9999999999999998.0, -0.0, 1.5e-7, 5e-324]}')
    assert not rollout.wide_floats
    for text in ('{"a": 1e16}', '{"a": -2.5e300}', '{"a": 1e400}', '{"a": NaN, "b": 3e20}'):
        rollout = RolloutJson("r.jsonl")
        rollout.loads(1, text)
        assert rollout.wide_floats, text
    marked = mark_wide_floats({"a": [1e22, {"b": float("inf")}, 2.5], "c": 1.0})
    assert type(marked["a"][0]) is WideFloat and type(marked["a"][1]["b"]) is WideFloat
    assert type(marked["a"][2]) is float and type(marked["c"]) is float
    assert dump_record(marked) == b'{"a":[1e+22,{"b":null},2.5],"c":1.0}'


@settings(max_examples=60, deadline=None)
@given(extra=VALUES, arguments=VALUES, kept=VALUES, output=VALUES, session_id=st.booleans())
def test_a_codex_record_with_awkward_values_is_what_the_model_writes(
    tmp_path_factory: Any, extra: Any, arguments: Any, kept: Any, output: Any, session_id: bool
) -> None:
    """Values in every place a rollout carries them: an item's unknown fields (message extra),
    call arguments (JSON in a string), a line kept whole, a legacy JSON-encoded output."""
    lines = session(steps=1)
    if not session_id:
        del lines[0]["payload"]["id"]  # the id then comes from the content
    lines[5]["payload"]["extra_field"] = extra
    lines[8]["payload"]["arguments"] = json.dumps({"command": ["ls"], "options": arguments})
    lines[9]["payload"]["info"]["model_context_window"] = kept
    lines[11]["payload"]["output"] = json.dumps({"output": "done", "metadata": {"exit_code": 0, "duration_seconds": output}})
    path = tmp_path_factory.mktemp("rollout") / "r.jsonl"
    write_rollout(path, lines)
    (result,) = codex.read(path)
    assert result.error is None, result.error
    record = result.record
    assert record is not None
    trajectory = Trajectory.model_validate(record)
    assert dump_record(record) + b"\n" == dump_line(trajectory)
    assert record_content_id(record) == content_id(trajectory) and record["id"] == trajectory.id


def test_the_content_id_basis_keeps_what_the_model_keeps() -> None:
    # Fields other importers set (task, attempt), a message without content, no messages at all.
    for fields in (
        {"task_id": "t1", "attempt": 3, "policy": {"name": "p", "step": 7}},
        {"policy": {}},
    ):
        messages = [
            {"role": "user", "content": "x"},
            {"role": "assistant", "generated": True, "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": {"n": 1e30}}}]},
        ]
        for listed in (messages, []):
            trajectory = Trajectory.model_validate({**fields, "messages": listed})
            record = json.loads(trajectory.model_dump_json(exclude_none=True))
            assert record_content_id(mark_wide_floats(record)) == content_id(trajectory)


def _error(path: Path) -> str:
    (result,) = codex.read(path)
    assert result.record is None and result.error is not None
    return str(result.error)


def test_a_file_read_as_bytes_is_rejected_as_the_text_reader_rejects_it(tmp_path: Path) -> None:
    """The text reader decodes ahead of the line it yields: bytes that are not UTF-8 further
    down are what it reports, before a broken line that comes first."""
    lines = [json.dumps(line).encode() for line in session(steps=2)]
    lines[2] = b'{"timestamp": 5, "type": "event_msg", "payload": {}}'  # a broken line early on
    lines[-1] = lines[-1].replace(b"Fixed", b"Fi\xffxed")  # and bytes that are not UTF-8 later
    path = tmp_path / "r.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    assert "not UTF-8 text" in _error(path)
    lines[-1] = lines[-1].replace(b"\xff", b"")
    path.write_bytes(b"\n".join(lines) + b"\n")
    assert _error(path).endswith(":3: timestamp: expected string, got int")


def test_lines_msgspec_refuses_are_read_as_json_reads_them(tmp_path: Path) -> None:
    lines = session(steps=1)
    text = "".join(json.dumps(line) + "\n" for line in lines)
    # NaN in a kept line; an escaped non-BMP character split in two (a surrogate pair); a blank
    # line of Unicode whitespace, which text reading skips.
    text = text.replace('"model_context_window": 258400', '"model_context_window": NaN', 1)
    text = text.replace("Fix add()", "Fix \\ud83e\\udd80 add()", 1)
    text = text.replace("\n", "\n\u2028\n", 1)
    for name, data in (("r.jsonl", text.encode()), ("r.jsonl.zst", zstandard.ZstdCompressor().compress(text.encode()))):
        path = tmp_path / name
        path.write_bytes(data)
        (result,) = codex.read(path)
        assert result.error is None, result.error
        record = result.record
        assert record is not None
        assert any(m.get("content", "").startswith("Fix \U0001f980 add()") for m in record["messages"])
        kept = [
            r["record"]["payload"] for r in record["source"]["records"] if r["record"]["payload"].get("model_context_window") is not None
        ]
        assert math.isnan(kept[0]["model_context_window"])
        assert dump_record(record) + b"\n" == dump_line(Trajectory.model_validate(record))


def test_a_zstd_stream_is_read_as_the_text_reader_reads_it(tmp_path: Path) -> None:
    """A frame per line, as ``JsonlWriter`` appends them: a last frame cut short is dropped with
    what it held; bytes after the frames that are no frame reject the file."""
    lines = [json.dumps(line) + "\n" for line in session(steps=3)]
    frames = [zstandard.ZstdCompressor().compress(line.encode()) for line in lines]
    path = tmp_path / "r.jsonl.zst"
    path.write_bytes(b"".join(frames)[:-10])
    (result,) = codex.read(path)
    assert result.record is not None and [r["line"] for r in result.record["source"]["records"]][-1] == len(lines) - 1
    path.write_bytes(b"".join(frames) + b"not a frame")
    assert "not a readable zstd stream" in _error(path)


def test_a_record_no_pool_line_can_hold_is_rejected_and_the_batch_goes_on(tmp_path: Path) -> None:
    """JSON text can spell a lone surrogate (``\\ud800``); no UTF-8 pool line can hold one. The
    file is rejected, located, and the other files are imported."""
    bad = session(session_id="bad-session", steps=1)
    bad[5]["payload"]["content"][0]["text"] = "half a pair: \ud800"
    write_rollout(tmp_path / "a.jsonl", bad)
    write_rollout(tmp_path / "b.jsonl", session(session_id="good-session", steps=1))
    write_rollout(tmp_path / "c.jsonl", bad)  # the same id again: rejected again, not "already in the pool"
    pool = tmp_path / "pool.jsonl"
    summary = import_files("codex", [tmp_path / "a.jsonl", tmp_path / "b.jsonl", tmp_path / "c.jsonl"], pool)
    assert summary.imported == 1 and summary.skipped_existing == 0
    assert [error.path for error in summary.rejected] == [str(tmp_path / "a.jsonl"), str(tmp_path / "c.jsonl")]
    assert all("surrogates not allowed" in error.message for error in summary.rejected)
    assert [t.id for t in read_trajectories(pool)] == ["codex-good-session"]


def test_a_late_exit_code_keeps_the_tool_message_in_field_order(tmp_path: Path) -> None:
    """Tool messages are built in field order and written as they stand: an exit code that
    arrives after the output (exec_command_end, item_completed) must not change that."""
    lines = session(steps=2)
    ends = [line for line in lines if line["payload"].get("type") == "exec_command_end"]
    lines = [line for line in lines if line not in ends]
    lines += [*ends, envelope("event_msg", {"type": "exec_command_end", "call_id": "call_patch"})]
    lines.append(
        envelope(
            "event_msg",
            {"type": "item_completed", "item": {"type": "CommandExecution", "id": "call_0", "duration": {"secs": 2, "nanos": 5}}},
        )
    )
    path = tmp_path / "r.jsonl"
    write_rollout(path, lines)
    (result,) = codex.read(path)
    record = result.record
    assert record is not None
    tools = [m for m in record["messages"] if m["role"] == "tool"]
    assert tools[0]["metadata"] == {
        "exit_code": 0,
        "duration": {"secs": 0, "nanos": 5000000},
        "status": "completed",
        "duration_seconds": 2.000000005,
    }
    assert tools[-1]["metadata"] == {}  # an end event with nothing in it, as the model keeps it
    assert dump_record(record) + b"\n" == dump_line(Trajectory.model_validate(record))
