"""`relearn run` from every format `relearn import` reads: the pool stage imports through
``relearn.ops.importing`` (the same options and operation as the verb), then verify, the heuristic
review and two mask variants run on what came in. Inputs are the real files of ../shared/samples
(copied into tmp_path: the samples folder is read-only) or, for the formats that have no sample
there, the inputs the importer's own tests build."""

from __future__ import annotations

import io
import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from harness.exporters.atif import to_atif
from harness.import_run import ImportFormat
from records.pools import read_trajectories, write_atomic
from relearn.ops.importing import count_pool, run_import
from relearn.ops.reporting import OpError
from relearn.ops.validate import run_validate
from relearn.pipeline.config import PipelineError, load_pipeline
from relearn.pipeline.plan import run_pipeline
from relearn.verbs.importing import ImportOptions
from relearn.verbs.validate import ValidateOptions
from tests.test_import_chat import swe_gym_row, write
from tests.test_import_openhands import _evaluation_record as openhands_evaluation_record
from tests.test_import_swe_agent import _document as swe_agent_document
from tests.test_import_verl import _rows as verl_rows
from tests.test_import_verl import _write as write_verl_step


def _copy(samples: Path, names: list[str], renamed: dict[str, str] | None = None) -> Callable[[Path], list[str]]:
    """The samples into the inputs folder; ``renamed``: sample -> the path its tool writes it
    under (an OpenHands run's ``output.jsonl``), which is what discovery looks for."""

    def make(inputs: Path) -> list[str]:
        for name in names:
            shutil.copy(samples / name, inputs / name)
        for name, target in (renamed or {}).items():
            (inputs / target).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(samples / name, inputs / target)
        return ["inputs"]

    return make


def _openhands_evaluation(samples: Path) -> Callable[[Path], list[str]]:
    """An evaluation run's output.jsonl, its record built around the real basic stream."""

    def make(inputs: Path) -> list[str]:
        (inputs / "run").mkdir()
        (inputs / "run" / "output.jsonl").write_text(json.dumps(openhands_evaluation_record(samples)) + "\n")
        return ["inputs/run"]

    return make


def _swe_agent(inputs: Path) -> list[str]:
    resolved = swe_agent_document()
    (inputs / "a" / "a.traj").parent.mkdir()
    (inputs / "a" / "a.traj").write_text(json.dumps(resolved))
    other = swe_agent_document()
    other["history"][2]["content"] = [{"type": "text", "text": "Fix the other colon."}]
    (inputs / "b.traj").write_text(json.dumps(other))
    return ["inputs"]


def _verl(inputs: Path) -> list[str]:
    write_verl_step(inputs / "dump", 1, verl_rows(1))
    write_verl_step(inputs / "dump", 2, verl_rows(2))
    return ["inputs/dump"]


def _chat(inputs: Path) -> list[str]:
    write(inputs / "swe-gym.parquet", [swe_gym_row(n) for n in range(4)])
    return ["inputs/swe-gym.parquet"]


def _chat_columns(inputs: Path) -> list[str]:
    rows = [
        {"turns": r["messages"], "key": f"k{n}", "ok": r["resolved"], "task": r["instance_id"]}
        for n, r in enumerate(swe_gym_row(n) for n in range(3))
    ]
    write(inputs / "rows.jsonl", rows)
    return ["inputs/rows.jsonl"]


def _atif(samples: Path) -> Callable[[Path], list[str]]:
    """ATIF documents as our exporter writes them, from the real OpenHands samples (imported
    first), the way a Harbor trial folder holds them."""

    def make(inputs: Path) -> list[str]:
        pool = inputs.parent / "openhands.jsonl"
        names = ["openhands_trajs_basic.json", "openhands_trajs_wrong_initial_state.json", "openhands_resolver_output_legacy.jsonl"]
        run_import(ImportOptions("openhands", [samples / n for n in names], pool))
        for n, trajectory in enumerate(read_trajectories(pool)):
            trial = inputs / f"trial-{n}" / "agent"
            trial.mkdir(parents=True)
            (trial / "trajectory.json").write_text(json.dumps(to_atif(trajectory)))
        return ["inputs"]

    return make


@dataclass
class Case:
    format: str
    inputs: Callable[[Path], Callable[[Path], list[str]]]  # (samples folder) -> (inputs folder) -> the file's paths
    fields: str  # more [pool.import] lines
    imported: int
    imported_grades: int  # trajectories whose grade is the source's; verify keeps it (no task of ours, no docker)
    positive: int  # verified positive after verify: what every variant compiles
    rejected: int = 0


CASES = {
    "codex": Case("codex", lambda s: _copy(s, ["codex_rollout_v0.135.0_exec.jsonl"]), "", 1, 0, 0),
    "mini-swe-agent": Case("mini-swe-agent", lambda s: _copy(s, ["mini_swe_agent_v1.13.4.traj.json"]), "", 1, 0, 0),
    "openhands-events": Case(
        "openhands",
        lambda s: _copy(
            s, ["openhands_trajs_basic.json", "openhands_trajs_basic_interactions.json", "openhands_trajs_wrong_initial_state.json"]
        ),
        "",
        3,
        0,
        0,
    ),
    "openhands-evaluation": Case("openhands", lambda s: _openhands_evaluation(s), "", 1, 1, 1),
    "openhands-resolver": Case(
        "openhands", lambda s: _copy(s, [], {"openhands_resolver_output_legacy.jsonl": "resolver/output.jsonl"}), "", 2, 2, 2
    ),
    "nemo-gym": Case(
        "nemo-gym",
        lambda s: _copy(s, ["nemo_gym_competitive_coding_rollouts_token_ids.jsonl", "nemo_gym_deepswe_rollouts.jsonl"]),
        "",
        10,
        10,
        3,
    ),
    "chat-preset": Case("chat", lambda _s: _chat, 'preset = "swe-gym"\n', 4, 4, 2),
    "chat-columns": Case("chat", lambda _s: _chat_columns, 'messages = "turns"\nid = "key"\nresolved = "ok"\ntask_id = "task"\n', 3, 3, 2),
    "swe-agent": Case("swe-agent", lambda _s: _swe_agent, "", 2, 0, 0),
    "atif": Case("atif", lambda s: _atif(s), "", 4, 0, 0),
    "verl": Case("verl", lambda _s: _verl, "", 6, 6, 4),
}


def _pipeline(tmp_path: Path, case: Case, paths: list[str]) -> Path:
    text = f"""workdir = "work"
[pool.import]
format = "{case.format}"
paths = {json.dumps(paths)}
{case.fields}
[review]
reviewer = "heuristic"
[masks]
variants = ["ross", "positive"]
"""
    (tmp_path / "p.toml").write_text(text)
    return tmp_path / "p.toml"


def _stamp(workdir: Path, stage: str) -> dict[str, Any]:
    return json.loads((workdir / ".pipeline" / f"{stage.replace(':', '-')}.json").read_text())["counts"]


# The verify stage opens the Docker engine (its orphan sweep) even with nothing to grade.
@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
def test_the_pipeline_runs_from_every_import_format(name: str, samples: Path, tmp_path: Path) -> None:
    case = CASES[name]
    (tmp_path / "inputs").mkdir()
    paths = case.inputs(samples)(tmp_path / "inputs")
    config = load_pipeline(_pipeline(tmp_path, case, paths))
    results, _ctx = run_pipeline(config, Console(file=io.StringIO()))
    assert [(r.name, r.status, r.error) for r in results] == [
        (n, "ran", None) for n in ("pool", "verify", "review", "masks:ross", "masks:positive", "contrasts", "report")
    ]
    work = config.workdir
    pool = _stamp(work, "pool")
    assert (pool["imported"], pool["rejected"], pool["trajectories"], pool["imported_grades"]) == (
        case.imported,
        case.rejected,
        case.imported,
        case.imported_grades,
    )
    # Verify grades nothing here (no task of the mini suite among them): the sources' grades stay.
    verified = count_pool(work / "verified.jsonl")
    assert (verified.trajectories, verified.imported_grades, verified.positive) == (case.imported, case.imported_grades, case.positive)
    reviews = [json.loads(line) for line in (work / "reviews.jsonl").read_text().splitlines()]
    assert len(reviews) == case.imported
    assert sum(r["decision"] != "reject" for r in reviews) == case.positive  # the heuristic reviewer accepts what passed
    for variant in ("ross", "positive"):
        stats = json.loads((work / "datasets" / variant / "stats.json").read_text())
        assert (stats["trajectories_in"], stats["trajectories_out"]) == (case.imported, case.positive), variant
        assert (stats["samples"] > 0) == (case.positive > 0), variant
    # A second run finds every stage current; a rerun of the pool stage would skip what it holds.
    again, _ = run_pipeline(config, Console(file=io.StringIO()))
    assert {r.status for r in again} == {"current"}


@pytest.mark.docker
def test_the_pool_stage_resumes_an_interrupted_import(samples: Path, tmp_path: Path) -> None:
    """The pool is appended to and resumed by stable ids: what an interrupted import wrote is
    skipped, the rest is added, nothing twice."""
    (tmp_path / "inputs").mkdir()
    case = CASES["nemo-gym"]
    config = load_pipeline(_pipeline(tmp_path, case, case.inputs(samples)(tmp_path / "inputs")))
    pool = config.workdir / "pool" / "trajectories.jsonl"
    run_import(ImportOptions("nemo-gym", [tmp_path / "inputs" / "nemo_gym_deepswe_rollouts.jsonl"], pool))  # half of it, no stamp
    results, _ = run_pipeline(config, Console(file=io.StringIO()))
    assert results[0].status == "ran"
    assert (results[0].counts["imported"], results[0].counts["skipped"], results[0].counts["trajectories"]) == (5, 5, 10)
    assert len({t.id for t in read_trajectories(pool)}) == 10


def test_missing_import_paths_stop_the_plan_and_a_dry_run_writes_nothing(tmp_path: Path) -> None:
    config = load_pipeline(_pipeline(tmp_path, CASES["chat-columns"], ["inputs/rows.jsonl", "no/such/dir"]))
    with pytest.raises(OpError, match=r"\[pool.import\] paths: no such file or folder: inputs/rows.jsonl \(.*\), no/such/dir \("):
        run_pipeline(config, Console(file=io.StringIO()), dry_run=True)
    (tmp_path / "inputs").mkdir()
    (tmp_path / "no/such/dir").mkdir(parents=True)
    _chat_columns(tmp_path / "inputs")
    results, _ = run_pipeline(config, Console(file=io.StringIO()), dry_run=True)
    assert {(r.status, r.error) for r in results} == {("would run", "not run before")}
    assert not config.workdir.exists()


@pytest.mark.docker
def test_a_grown_source_or_a_hand_edited_reviews_file_redoes_what_follows_and_says_why(tmp_path: Path) -> None:
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    case = CASES["chat-columns"]
    config = load_pipeline(_pipeline(tmp_path, case, case.inputs(Path())(inputs)))
    first, _ = run_pipeline(config, Console(file=io.StringIO()))
    assert {r.status for r in first} == {"ran"}
    # 2 new rows in the source: the import runs again, and so does everything after it.
    rows = [
        {"turns": r["messages"], "key": f"k{n}", "ok": r["resolved"], "task": r["instance_id"]}
        for n, r in ((n, swe_gym_row(n)) for n in range(5))
    ]
    write(inputs / "rows.jsonl", rows)
    log = io.StringIO()
    grown, _ = run_pipeline(config, Console(file=log, width=400))
    assert {r.status for r in grown} == {"ran"}
    assert _stamp(config.workdir, "pool")["trajectories"] == 5
    assert f"pool: import ({inputs / 'rows.jsonl'} changed since this stage ran (" in log.getvalue()
    # A reviews file edited by hand: review's output stands; the stages that read it run again.
    reviews = config.workdir / "reviews.jsonl"
    reviews.write_text(reviews.read_text().replace('"decision":"accept"', '"decision":"reject"', 1))
    log = io.StringIO()
    edited, _ = run_pipeline(config, Console(file=log, width=400))
    status = {r.name: r.status for r in edited}
    assert (status["pool"], status["verify"], status["review"], status["masks:ross"], status["masks:positive"]) == (
        "current",
        "current",
        "current",
        "ran",
        "ran",
    )
    assert f"compile ross masks ({reviews} was modified since this stage ran)" in log.getvalue()
    again, _ = run_pipeline(config, Console(file=io.StringIO()))
    assert {r.status for r in again} == {"current"}


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ('format = "codex"\npaths = ["x"]\nmessages = "turns"', "pool.import: Value error, messages only apply to the chat format"),
        ('format = "chat"\npaths = ["x"]\npreset = "swe-gyms"', "pool.import.preset: Input should be 'swe-gym', 'swe-smith'"),
        (
            'format = "cursor"\npaths = ["x"]',
            "pool.import.format: Input should be 'codex', 'mini-swe-agent', 'swe-agent', 'atif', 'openhands', 'chat', 'nemo-gym', 'verl' or 'harbor'",
        ),
        ('format = "codex"\npaths = []', "pool.import.paths: List should have at least 1 item"),
        ('format = "chat"\npaths = ["x"]\nmessages = ""', "pool.import.messages: String should have at least 1 character"),
        ('format = "codex"\npaths = ["x"]\noverwrite = true', "pool.import.overwrite: no such field"),
    ],
)
def test_a_pool_import_the_file_cannot_use_names_its_field(tmp_path: Path, fields: str, message: str) -> None:
    (tmp_path / "p.toml").write_text(f'workdir = "w"\n[pool.import]\n{fields}\n')
    with pytest.raises(PipelineError) as caught:
        load_pipeline(tmp_path / "p.toml")
    assert message in str(caught.value)


def test_one_format_list_for_both_front_ends() -> None:
    """The verb's FORMAT argument and the file's format field take exactly the importers' formats."""
    import typing

    from harness.importers import FORMATS
    from relearn.options import options_of
    from relearn.pipeline.config import ImportConfig

    assert [f.value for f in ImportFormat] == list(FORMATS)
    assert typing.get_type_hints(ImportOptions)["format"] is ImportFormat
    assert ImportConfig.model_fields["format"].annotation is ImportFormat
    # Every option of the verb (but where the pool goes: the work folder's) can be said in the file.
    verb = {o.name for o in options_of(ImportOptions)} - {"output", "overwrite"}
    assert verb == set(ImportConfig.model_fields)


def test_a_pipeline_stage_that_imports_nothing_fails_and_names_why(samples: Path, tmp_path: Path) -> None:
    (tmp_path / "inputs").mkdir()
    (tmp_path / "inputs" / "broken.jsonl").write_text('{"type": "session_meta"\n')
    config = load_pipeline(_pipeline(tmp_path, Case("codex", lambda s: _copy(s, []), "", 0, 0, 0), ["inputs"]))
    results, _ = run_pipeline(config, Console(file=io.StringIO()))
    assert [(r.name, r.status) for r in results] == [("pool", "failed")]
    assert (results[0].error or "").startswith("[pool.import]: no trajectory in")  # worded, without the class
    assert "broken.jsonl:1: invalid JSON" in (results[0].error or "")


# ---------------------------------------------------------------- the operations, called directly


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []

    def begin(self, label: str, total: float | None = None) -> None:
        self.events.append(("begin", (label, total)))

    def advance(self, amount: float = 1, **fields: Any) -> None:
        self.events.append(("advance", (amount, fields)))

    def end(self) -> None:
        self.events.append(("end", None))

    def note(self, message: str) -> None:
        self.events.append(("note", message))


def test_run_import_reports_bytes_and_records(samples: Path, tmp_path: Path) -> None:
    files = [samples / "nemo_gym_competitive_coding_rollouts_token_ids.jsonl", samples / "nemo_gym_deepswe_rollouts.jsonl"]
    reporter = Recorder()
    summary = run_import(ImportOptions("nemo-gym", files, tmp_path / "deep" / "pool.jsonl"), reporter)
    total = sum(f.stat().st_size for f in files)
    assert reporter.events[0] == ("note", f"created the folder {tmp_path / 'deep'}")  # a missing folder is said
    assert reporter.events[1] == ("begin", ("importing nemo-gym", total)) and reporter.events[-1] == ("end", None)
    steps = [payload for kind, payload in reporter.events if kind == "advance"]
    assert steps == [(files[0].stat().st_size, {"records": 5}), (files[1].stat().st_size, {"records": 10})]
    assert (summary.files, summary.imported, summary.input_bytes) == (2, 10, total)
    again = run_import(ImportOptions("nemo-gym", files, tmp_path / "deep" / "pool.jsonl"))
    assert (again.imported, again.skipped_existing) == (0, 10)
    rebuilt = run_import(ImportOptions("nemo-gym", files[:1], tmp_path / "deep" / "pool.jsonl", overwrite=True))
    assert rebuilt.imported == 5 and count_pool(tmp_path / "deep" / "pool.jsonl").trajectories == 5


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (dict(format="codex", messages="turns", task_id="t"), "--messages, --task-id only apply to the chat format"),
        (dict(format="chat", preset="swe-gyms"), "unknown preset 'swe-gyms'; known: swe-gym, swe-smith"),
        (dict(format="cursor"), "unknown import format 'cursor'; known: codex, mini-swe-agent, swe-agent"),
        (dict(format="codex", paths=["nope"]), "no such file or directory: "),
        (dict(format="verl", paths=["empty"]), "no verl files under "),
    ],
)
def test_run_import_refuses_unusable_options_before_writing(tmp_path: Path, options: dict[str, Any], message: str) -> None:
    (tmp_path / "empty").mkdir()
    paths = [tmp_path / p for p in options.pop("paths", ["empty"])]
    with pytest.raises(OpError) as caught:
        run_import(ImportOptions(paths=paths, output=tmp_path / "out" / "pool.jsonl", **options))
    assert message in str(caught.value)
    assert not (tmp_path / "out").exists()


def test_count_pool_counts_in_one_pass_what_the_models_say(samples: Path, tmp_path: Path) -> None:
    from records.trajectory import is_verified_positive

    pool = tmp_path / "pool.jsonl.zst"
    names = ["openhands_resolver_output_legacy.jsonl", "nemo_gym_deepswe_rollouts.jsonl"]
    run_import(ImportOptions("openhands", [samples / names[0]], pool))
    run_import(ImportOptions("nemo-gym", [samples / names[1]], pool))
    trajectories = list(read_trajectories(pool))
    counts = count_pool(pool)
    assert counts.trajectories == len(trajectories) == 7
    assert counts.positive == sum(is_verified_positive(t) for t in trajectories) == 5
    assert counts.exit_status == {"submitted": 2, "unknown": 5}
    with open(tmp_path / "torn.jsonl", "wb") as torn:  # a torn last line is counted, never raised
        torn.write(b"".join(json.dumps(json.loads(t.model_dump_json())).encode() + b"\n" for t in trajectories[:2]) + b'{"id": "x", "mess')
    assert (count_pool(tmp_path / "torn.jsonl").trajectories, count_pool(tmp_path / "torn.jsonl").unreadable) == (2, 1)


def test_run_validate_streams_and_finds_repeated_ids(samples: Path, tmp_path: Path) -> None:
    pool = tmp_path / "pool.jsonl"
    run_import(ImportOptions("openhands", [samples / "openhands_trajs_basic.json"], pool))
    (trajectory,) = read_trajectories(pool)
    write_atomic(tmp_path / "twice.jsonl", [trajectory, trajectory])
    summary = run_validate(ValidateOptions([pool, tmp_path / "twice.jsonl"]))
    assert (summary.trajectories, summary.clean) == (3, False)
    twice = tmp_path / "twice.jsonl"
    assert summary.problems == [f"{twice}:{n}: {trajectory.id}: repeated trajectory id, first at {pool}:1" for n in (1, 2)]
    assert summary.formats == {"openhands": 3}
    assert run_validate(ValidateOptions([pool])).clean
    with pytest.raises(OpError, match="nope.jsonl: no such pool file"):
        run_validate(ValidateOptions([tmp_path / "nope.jsonl"]))


# ---------------------------------------------------------------- the verbs: flags -> options -> table


def test_import_verb_maps_every_chat_flag_and_renders_the_summary(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from relearn.cli.main import app

    rows = [
        {"turns": r["messages"], "schemas": [], "key": f"k{n}", "ok": r["resolved"], "task": r["instance_id"], "diff": f"d{n}"}
        for n, r in enumerate(swe_gym_row(n) for n in range(2))
    ]
    data = write(tmp_path / "rows.jsonl", rows)
    with open(data, "a") as handle:
        handle.write('{"turns": 3}\n')  # a damaged row: rejected, located, the rest imported
    pool = tmp_path / "pool.jsonl"
    flags = ["--messages", "turns", "--tools", "schemas", "--id", "key", "--resolved", "ok", "--task-id", "task", "--patch", "diff"]
    result = CliRunner().invoke(app, ["import", "chat", str(data), *flags, "-o", str(pool)])
    assert result.exit_code == 1, result.output
    table = {line.split("│")[1].strip(): line.split("│")[2].strip() for line in result.stdout.splitlines() if line.count("│") == 3}
    assert (table["trajectories imported"], table["files or records rejected"]) == ("2", "1")
    assert f"{data}:3" in " ".join(result.output.split())
    trajectories = list(read_trajectories(pool))
    assert [(t.id, t.task_id, t.final_patch, t.outcome.resolved) for t in trajectories] == [
        ("chat-k0", "getmoto__moto-0", "d0", True),
        ("chat-k1", "getmoto__moto-1", "d1", False),
    ]
    validated = CliRunner().invoke(app, ["validate", str(pool)])
    assert validated.exit_code == 0 and "from chat" in validated.stdout
    missing = CliRunner().invoke(app, ["validate", str(tmp_path / "nope.jsonl")])
    assert missing.exit_code == 2 and "no such pool file" in missing.output
