"""``relearn import openhands`` and ``relearn import nemo-gym`` build each JSON Lines row's record
without the models: OpenHands with plain objects (``harness.importers.base.PLAIN``), NeMo Gym
straight to dicts (``nemo_gym._record``). The pool they write must be, byte for byte, the one the
model path writes (each row through ``convert`` with the models, a validated Trajectory written by
pydantic), with the same ids, content hashes, warnings, counts and located rejections. Compared
here on the real samples (resolver output, evaluation records made from saved event streams,
NeMo Gym rollouts with and without token ids) and on those rows changed at random places: values
of every JSON kind, huge integers, wide floats, NaN, text with escapes, lone surrogates, missing
fields and nulls."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.import_run import import_files
from harness.importers import base, nemo_gym, openhands, rows
from harness.importers.base import ImportResult
from records.trajectory import Trajectory
from tests.test_import_bytes import VALUES
from tests.test_import_chat_bytes import summary_view

SAMPLES = Path(__file__).resolve().parents[2] / "shared" / "samples"
pytestmark = pytest.mark.skipif(not SAMPLES.is_dir(), reason="the shared samples are not checked out")


class ModelPath:
    """The reference reader: every row converted with the models."""

    def __init__(self, convert: Callable[[rows.Row, str, base.Diagnostics], Trajectory]) -> None:
        self.convert = convert

    def discover(self, root: Path) -> list[Path]:
        return []

    def read(self, path: Path, *, salvage: bool = False) -> Iterator[ImportResult]:
        return rows.read_rows(path, lambda row, diagnostics: self.convert(row, str(path), diagnostics), empty="no rows")


MODEL_PATHS = {
    "openhands": ModelPath(lambda row, path, diag: openhands.convert_record(row, path, diag)),
    "nemo-gym": ModelPath(lambda row, path, diag: nemo_gym.convert(row, path, diag)),
}


def assert_same_pool(fmt: str, path: Path) -> dict[str, Any]:
    """Import ``path`` both ways, twice over (the rerun skips what the pool holds): the same pool
    bytes and the same summary. Returns the first import's summary."""
    fast, model = path.with_name(path.name + ".fast.pool"), path.with_name(path.name + ".model.pool")
    for pool in (fast, model):
        pool.unlink(missing_ok=True)
    views = []
    for _ in range(2):
        got = summary_view(import_files(fmt, [path], fast))
        want = summary_view(import_files(fmt, [path], model, importer=MODEL_PATHS[fmt]))
        assert got == want
        assert fast.read_bytes() == model.read_bytes()
        views.append(got)
    assert views[1]["imported"] == 0 and views[1]["skipped"] == views[0]["imported"] + views[0]["skipped"]
    return views[0]


def _lines(name: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (SAMPLES / name).read_text().splitlines() if line.strip()]


def _evaluation_records() -> list[dict[str, Any]]:
    """The saved event streams as evaluation ``output.jsonl`` records (the events layout)."""
    names = ("openhands_trajs_basic.json", "openhands_trajs_basic_interactions.json", "openhands_trajs_wrong_initial_state.json")
    return [
        {"instance_id": f"sample__{n}", "history": json.loads((SAMPLES / name).read_text()), "metrics": {"accumulated_cost": 0.25}}
        for n, name in enumerate(names)
    ]


ROWS: dict[str, Callable[[], list[dict[str, Any]]]] = {
    "openhands": lambda: _lines("openhands_resolver_output_legacy.jsonl") + _evaluation_records(),
    "nemo-gym": lambda: _lines("nemo_gym_deepswe_rollouts.jsonl") + _lines("nemo_gym_competitive_coding_rollouts_token_ids.jsonl"),
}


def _write(path: Path, data: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in data))
    return path


@pytest.mark.parametrize("fmt", list(ROWS))
def test_the_samples_write_the_model_paths_bytes(tmp_path: Path, fmt: str) -> None:
    view = assert_same_pool(fmt, _write(tmp_path / "output.jsonl", ROWS[fmt]()))
    assert view["imported"] == len(ROWS[fmt]()) and not view["rejected"]


@pytest.mark.parametrize("fmt", list(ROWS))
def test_the_samples_take_the_plain_path(tmp_path: Path, fmt: str) -> None:
    """The rows are built plain, not handed to the models (which would pass the byte test too),
    and each record, asked for as a Trajectory, is the model path's, id included."""
    path = _write(tmp_path / "output.jsonl", ROWS[fmt]())
    read = openhands.read if fmt == "openhands" else nemo_gym.read
    results = list(read(path))
    assert results and all(result.record is not None and result.built is None for result in results)
    models = list(MODEL_PATHS[fmt].read(path))
    for result, model in zip(results, models, strict=True):
        assert model.trajectory is not None and result.trajectory is not None
        assert result.trajectory.model_dump() == model.trajectory.model_dump()


def test_values_the_model_would_change_go_through_it(tmp_path: Path) -> None:
    """Token ids the model coerces (3.0 -> 3) or rejects, a tool list holding a non-object, an
    empty call id the tool message's validator refuses: the model path's bytes or errors."""
    rollout = _lines("nemo_gym_competitive_coding_rollouts_token_ids.jsonl")[0]
    item = next(i for i in rollout["response"]["output"] if "generation_token_ids" in i)
    coerced = json.loads(
        json.dumps(rollout).replace(json.dumps(item["generation_token_ids"]), json.dumps([float(t) for t in item["generation_token_ids"]]))
    )
    tools = json.loads(json.dumps(rollout))
    tools["responses_create_params"]["tools"] = [*tools["responses_create_params"].get("tools", []), "not a tool"]
    assert_same_pool("nemo-gym", _write(tmp_path / "nemo.jsonl", [rollout, coerced, tools]))
    resolver = _lines("openhands_resolver_output_legacy.jsonl")[0]
    events = _evaluation_records()[0]
    events["metadata"] = {"llm_config": {"model": "m"}}
    events["history"][1].setdefault("tool_call_metadata", {})
    empty_id = json.loads(json.dumps(events))
    for event in empty_id["history"]:
        if isinstance(event.get("tool_call_metadata"), dict):
            event["tool_call_metadata"]["tool_call_id"] = ""
    view = assert_same_pool("openhands", _write(tmp_path / "openhands.jsonl", [resolver, events, empty_id]))
    assert view["imported"] + len(view["rejected"]) == 3


def test_wide_floats_in_call_arguments_are_written_as_the_model_writes_them(tmp_path: Path) -> None:
    """A function call's arguments arrive as JSON text, decoded apart from the row: its floats of
    1e16 and up must be marked too, or msgspec writes ``1e16`` where pydantic writes ``1e+16``
    (the plain objects NeMo Gym rows were built with before wrote the former)."""
    rollout = _lines("nemo_gym_deepswe_rollouts.jsonl")[0]
    calls = [item for item in rollout["response"]["output"] if item.get("type") == "function_call"]
    assert calls
    for item in calls:
        item["arguments"] = json.dumps({"offset": 1e16, "limit": 2.5, "lines": [-3e20, 7]})
    path = _write(tmp_path / "wide.jsonl", [rollout])
    view = assert_same_pool("nemo-gym", path)
    assert view["imported"] == 1
    pool = path.with_name(path.name + ".fast.pool").read_text()
    assert '"offset":1e+16' in pool and '"lines":[-3e+20,7]' in pool
    assert next(iter(nemo_gym.read(path))).record is not None  # built without the models


def test_lone_surrogates_and_nan_are_the_model_paths(tmp_path: Path) -> None:
    """A lone surrogate (JSON text can spell one; no pool line can hold it) and NaN (not JSON,
    read by the text reader): rejected or written as the model path does."""
    for fmt, name in (("openhands", "openhands_resolver_output_legacy.jsonl"), ("nemo-gym", "nemo_gym_deepswe_rollouts.jsonl")):
        text = json.dumps(_lines(name)[0])
        # In a message's text (which the content id covers), and in a value kept under meta.
        surrogate = text.replace('"content": "', '"content": "\\ud800', 1)
        assert surrogate != text
        lines = [text, surrogate, text.replace("}", ', "kept": NaN}', 1)]
        path = tmp_path / f"{fmt}.jsonl"
        path.write_text("\n".join(lines) + "\n")
        view = assert_same_pool(fmt, path)
        assert view["imported"] + view["skipped"] + len(view["rejected"]) == 3
        assert len(view["rejected"]) == 1 and view["rejected"][0].startswith(str(path))  # the surrogate's line


def _slots(value: Any) -> list[tuple[Any, Any]]:
    """Every (container, key) of a JSON value, for a change at a random place."""
    found: list[tuple[Any, Any]] = []
    pending = [value]
    while pending:
        container = pending.pop()
        for key, item in container.items() if isinstance(container, dict) else enumerate(container):
            found.append((container, key))
            if isinstance(item, (dict, list)):
                pending.append(item)
    return found


CHANGES = st.sampled_from(["set", "delete", "null", "add"])
SPECIAL = st.sampled_from(["", "\u00e9\u0301", "\\", "\x00", 2**70, -(2**64), 1e16, 1e300, -0.0, 3.0, True, [], {}, [1.5, 2], ["x"]])


@st.composite
def changed_rows(draw: st.DrawFn, fmt: str) -> dict[str, Any]:
    """A sample row changed at a few random places: a value replaced (by any JSON value, or
    one of the awkward ones), a key deleted or nulled, a key added to an object."""
    samples = ROWS[fmt]()
    row = json.loads(json.dumps(samples[draw(st.integers(0, len(samples) - 1))]))
    for _ in range(draw(st.integers(1, 4))):
        slots = _slots(row)
        container, key = slots[draw(st.integers(0, len(slots) - 1))]
        change = draw(CHANGES)
        if change == "set":
            container[key] = draw(VALUES | SPECIAL)
        elif change == "null":
            container[key] = None
        elif change == "delete" and isinstance(container, dict):
            del container[key]
        elif change == "add" and isinstance(container, dict):
            container[draw(st.sampled_from(["kept", "extra_key", "token_ids", "logprobs", "thought", "timestamp"]))] = draw(
                VALUES | SPECIAL
            )
    return row


@pytest.mark.parametrize("fmt", list(ROWS))
def test_changed_rows_write_the_model_paths_bytes(tmp_path: Path, fmt: str) -> None:
    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    @given(data=st.lists(changed_rows(fmt), min_size=1, max_size=3))
    def check(data: list[dict[str, Any]]) -> None:
        assert_same_pool(fmt, _write(tmp_path / "output.jsonl", data))

    check()
