"""``relearn import chat`` builds each row's record as its pool line's JSON object, not as a
model: the pool it writes must be, byte for byte, the one the model path writes (each row
through ``chat.convert``, a validated Trajectory, written by pydantic), with the same ids,
content hashes, warnings, counts and located rejections. Compared here over every preset's
rows in JSON Lines, a JSON array and Parquet, the benchmark's rows, Parquet values that are not
JSON's own, and generated rows with awkward values in every place a row carries them."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.exporters.chat import export_chat
from harness.import_run import ImportSummary, import_files
from harness.importers import chat, rows
from harness.importers.base import ImportResult
from harness.scripted.codex_sessions import session, write_rollout
from records.pools import read_trajectories
from records.trajectory import Trajectory, record_content_id
from tests.test_import_bytes import FLOATS, TEXT, VALUES
from tests.test_import_chat import PRESET_ROWS, nebius_row, rebench_row, swe_gym_row, write


class ModelPath:
    """The reference reader: every row through ``chat.convert``, a validated Trajectory."""

    def __init__(self, options: chat.ChatOptions) -> None:
        self.options = options

    def discover(self, root: Path) -> list[Path]:
        return chat.discover(root)

    def read(self, path: Path, *, salvage: bool = False) -> Iterator[ImportResult]:
        return rows.read_rows(path, lambda row, diagnostics: chat.convert(row, str(path), self.options, diagnostics), empty="no rows")


def summary_view(summary: ImportSummary) -> dict[str, Any]:
    """What two import paths must agree on besides the pool bytes."""
    return {
        "imported": summary.imported,
        "skipped": summary.skipped_existing,
        "rejected": [str(error) for error in summary.rejected],
        "warnings": summary.warnings,
        "unknown": dict(summary.unknown),
        "messages": summary.messages,
    }


def assert_same_pool(path: Path, options: chat.ChatOptions) -> dict[str, Any]:
    """Import ``path`` both ways, twice over (the rerun skips what the pool holds): the same
    pool bytes and the same summary. Returns the first import's summary."""
    fast, model = path.with_name(path.name + ".fast.jsonl"), path.with_name(path.name + ".model.jsonl")
    for pool in (fast, model):
        pool.unlink(missing_ok=True)
    views = []
    for _ in range(2):
        got = summary_view(import_files("chat", [path], fast, importer=chat.ChatImporter(options)))
        want = summary_view(import_files("chat", [path], model, importer=ModelPath(options)))
        assert got == want
        assert fast.read_bytes() == model.read_bytes()
        views.append(got)
    assert views[1]["imported"] == 0 and views[1]["skipped"] == views[0]["imported"] + views[0]["skipped"]
    return views[0]


def _records(path: Path, options: chat.ChatOptions) -> list[ImportResult]:
    return list(chat.read(path, options=options))


@pytest.mark.parametrize("suffix", [".jsonl", ".json", ".parquet"])
@pytest.mark.parametrize("preset", list(PRESET_ROWS))
def test_every_preset_writes_the_model_paths_bytes(tmp_path: Path, preset: str, suffix: str) -> None:
    data = [rebench_row(n, parts=suffix != ".parquet") if preset == "swe-rebench-openhands" else PRESET_ROWS[preset](n) for n in range(3)]
    unnamed = copy.deepcopy(data[0])  # a row without an id of its own: its id is its content's
    for column in ("run_id", "traj_id", "trajectory_id"):
        unnamed.pop(column, None)
    unnamed["instance_id"] += "-unnamed"  # other content than the first row's, whatever the preset
    path = write(tmp_path / f"rows{suffix}", [*data, unnamed])
    options = chat.options_for(preset)
    summary = assert_same_pool(path, options)
    assert summary["imported"] == 4 and not summary["rejected"]
    # Every row took the record path (nothing here needs the model), ids as the model makes them.
    results = _records(path, options)
    assert all(r.record is not None and r.built is None for r in results)
    for result in results:
        assert result.record is not None
        trajectory = result.trajectory
        assert trajectory is not None
        assert result.record["id"] == trajectory.id
        if preset != "nebius-swe-agent":  # nebius rows have no id column: every id is the content's
            assert (result.content_hash is None) == trajectory.id.startswith("chat-")
        if result.content_hash is not None:
            assert result.content_hash == record_content_id(result.record) == trajectory.id


def test_the_benchmarks_rows_write_the_model_paths_bytes(tmp_path: Path) -> None:
    """The rows ``bench/bench_import.py`` times: Codex sessions exported with the SWE-Gym preset."""
    for n in range(3):
        write_rollout(
            tmp_path / f"rollout-{n}.jsonl", session(session_id=f"019e0000-0000-7000-8000-00000000000{n}", steps=3, filler=f'{n} \t"é" 🦀')
        )
    pool = tmp_path / "codex.jsonl"
    assert import_files("codex", sorted(tmp_path.glob("rollout-*.jsonl")), pool).imported == 3
    for suffix in (".jsonl", ".parquet"):
        export = tmp_path / f"chat{suffix}"
        export_chat(read_trajectories(pool), export, "swe-gym")
        summary = assert_same_pool(export, chat.options_for("swe-gym"))
        assert summary["imported"] == 3 and not summary["rejected"]
        assert all(r.record is not None for r in _records(export, chat.options_for("swe-gym")))


def test_parquet_values_that_are_not_json_go_through_the_model(tmp_path: Path) -> None:
    """Arrow gives bytes, datetimes, decimals and map entries, which pydantic writes its own way
    (msgspec would write bytes as base64): such a row is read by the model, counted once."""
    import datetime
    import decimal

    base = [rebench_row(n, parts=False) | {"note": "plain", "score": 1e20 + n} for n in range(4)]
    table = pa.Table.from_pylist(base)
    odd = {
        "blob": pa.array([b"\x00\xffbytes", None, b"", None]),
        "when": pa.array([datetime.datetime(2026, 1, 2, 3, 4, 5), None, None, datetime.datetime(2026, 1, 2)], pa.timestamp("us")),
        "price": pa.array([decimal.Decimal("1.50"), None, None, None], pa.decimal128(5, 2)),
        "pairs": pa.array([[("a", 1)], None, [], None], pa.map_(pa.string(), pa.int64())),
    }
    for name, column in odd.items():
        table = table.append_column(name, column)
    path = tmp_path / "odd.parquet"
    pq.write_table(table, path)
    options = chat.options_for("swe-rebench-openhands")
    summary = assert_same_pool(path, options)
    assert summary["unknown"] == {f"column {c!r}": 4 for c in ("note", "score", "blob", "when", "price", "pairs")}
    # Bytes that are not UTF-8 no pool line can hold: that row is rejected, by both alike.
    assert summary["imported"] == 3 and [e.split(": ", 1)[1] for e in summary["rejected"]] == [
        "could not be converted (PydanticSerializationError: Error serializing to JSON: invalid utf-8 sequence of 1 bytes from index 1)"
    ]
    # A row of JSON's own values (nulls, an empty map) takes the record path; the others the model.
    assert [r.record is not None for r in _records(path, options)] == [False, True, False, False]


def test_rows_the_model_path_warns_about_or_rejects_are_read_by_it(tmp_path: Path) -> None:
    good = rebench_row(1, parts=False)
    rows_: list[dict[str, Any]] = []
    for change in (
        lambda r: r["trajectory"][3].update(tool_call_id="call_nobody"),  # answers no call
        lambda r: r["trajectory"][3].pop("tool_call_id"),  # paired with the open call, a warning
        lambda r: r["trajectory"][2]["tool_calls"][0].pop("id"),  # a call without an id, named
        lambda r: r["trajectory"][2]["tool_calls"][0]["function"].update(arguments="ls -la"),  # kept verbatim
        lambda r: r["trajectory"][2]["tool_calls"][0]["function"].update(arguments="[1, 2]"),
        lambda r: r["trajectory"][2].update(role="robot"),
        lambda r: r["trajectory"][1].update(content=7),
        lambda r: r["trajectory"][1].update(mask=True),  # a user turn marked trainable: a warning
        lambda r: r["trajectory"][2].update(mask="maybe"),
        lambda r: r["trajectory"][0].update(tool_calls=[{"id": "x", "function": {"name": "f"}}]),
        lambda r: r.update(resolved="maybe"),
        lambda r: r.update(trajectory=[]),
        lambda r: r.update(tools="not tools"),
        lambda r: r.update(instance_id=[1]),
        lambda r: r["trajectory"][4].update(content="half a pair: \ud800"),  # no pool line can hold it
        lambda r: (r.pop("trajectory_id"), r["trajectory"][4].update(content="half a pair: \udfff")),
    ):
        row = copy.deepcopy(good)
        change(row)
        rows_.append(row)
    rows_.append(good)
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows_) + "not json\n")
    summary = assert_same_pool(path, chat.options_for("swe-rebench-openhands"))
    # Rows 2-5 and 8 are read with a warning; the rest, but for the last good rows, rejected.
    assert summary["imported"] + summary["skipped"] == 5 and len(summary["rejected"]) == 13
    assert [w.split(": ", 1)[0].rsplit(":", 1)[-1] for w in summary["warnings"] if w.startswith(str(path))] == ["2", "3", "4", "5", "8"]
    assert sum("surrogates not allowed" in e for e in summary["rejected"]) == 2


MASKS = st.sampled_from([True, False, 0, 1, "true", "False", "maybe", 2, None])
CONTENT = st.one_of(
    TEXT,
    st.none(),
    st.lists(st.one_of(TEXT, st.fixed_dictionaries({"type": st.just("text"), "text": TEXT}), VALUES), max_size=3),
    st.integers(0, 3),
)
NUMBERS = st.lists(st.one_of(FLOATS, st.integers(-(2**70), 2**70), st.booleans()), max_size=4)


@st.composite
def awkward_rows(draw: st.DrawFn) -> dict[str, Any]:
    """A rebench row changed where values can be anything: a message's content, role, extra
    keys, mask, token ids and log-probs; a call's arguments (JSON text or an object) and extra
    keys; the tools; columns kept under meta; the id and the grade."""
    row = rebench_row(draw(st.integers(0, 3)), parts=False)
    messages = row["trajectory"]
    for message in messages:
        if draw(st.integers(0, 3)) == 0:
            message["content"] = draw(CONTENT)
        if draw(st.booleans()):
            message[draw(st.sampled_from(["extra_key", "mask", "loss_mask", "weight", "text", "value", "from"]))] = draw(VALUES | MASKS)
        if message["role"] == "assistant" and draw(st.booleans()):
            message[draw(st.sampled_from(["token_ids", "generation_token_ids"]))] = draw(
                st.lists(st.integers(0, 2**70) | st.booleans(), max_size=4)
            )
            message[draw(st.sampled_from(["logprobs", "generation_log_probs"]))] = draw(NUMBERS)
    if draw(st.integers(0, 4)) == 0:
        messages[draw(st.integers(0, len(messages) - 1))]["role"] = draw(
            st.sampled_from(["ai", "human", "gpt", "function", "developer", "robot"])
        )
    call = messages[2]["tool_calls"][0]
    arguments = draw(VALUES)
    as_text = draw(st.booleans())
    call["function"]["arguments"] = json.dumps({"command": "ls", "options": arguments}) if as_text else {"options": arguments}
    if draw(st.booleans()):
        call[draw(TEXT)] = draw(VALUES)
    if draw(st.booleans()):
        row["tools"] = [{"type": "function", "function": {"name": "f", "parameters": draw(VALUES)}}]
    row[draw(st.sampled_from(["kept", "repo", "split"]))] = draw(VALUES)
    if draw(st.booleans()):
        del row["trajectory_id"]
    row["resolved"] = draw(st.sampled_from([0, 1, True, "1", "no", None]))
    if draw(st.booleans()):
        row["reward"] = draw(FLOATS | st.integers(-(2**70), 2**70) | st.sampled_from(["1", True]))
    return row


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.lists(awkward_rows(), min_size=1, max_size=3))
def test_awkward_rows_write_the_model_paths_bytes(tmp_path: Path, data: list[dict[str, Any]]) -> None:
    options = chat.options_for("swe-rebench-openhands")
    for suffix in (".jsonl", ".json"):
        path = tmp_path / f"rows{suffix}"
        path.write_text("".join(json.dumps(r) + "\n" for r in data) if suffix == ".jsonl" else json.dumps(data))
        assert_same_pool(path, options)


def test_a_record_read_back_is_the_models_trajectory(tmp_path: Path) -> None:
    """What the pool holds reads back as the model path's Trajectory, value for value."""
    path = write(
        tmp_path / "rows.parquet", [swe_gym_row(n) for n in range(2)] + [nebius_row(0) | {"messages": nebius_row(0)["trajectory"]}]
    )
    options = chat.options_for("swe-gym")
    assert_same_pool(path, options)
    fast = [r.trajectory for r in _records(path, options)]
    model = [r.trajectory for r in ModelPath(options).read(path)]
    assert all(isinstance(t, Trajectory) for t in fast) and fast == model
