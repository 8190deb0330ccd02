"""The container operations called directly (``relearn.ops.containers``, ``verify``, ``collect``,
``evaluate``): options refused before any engine is touched, `relearn verify`'s work and the
pipeline's pool grading through the same batch code, and every option of these verbs sayable
in the pipeline file."""

from __future__ import annotations

import dataclasses
import io
import json
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from envs.tasks import load_tasks
from records.pools import read_trajectories
from records.trajectory import Message, Trajectory
from relearn.ops.collect import policy_spec, resolve_agent, run_collect
from relearn.ops.containers import MINI_SUITE, check_containers, load_task_list
from relearn.ops.reporting import OpError
from relearn.ops.verify import run_verify, verify_pool
from relearn.options import options_of
from relearn.verbs.collect import AgentOptions, BudgetOptions, CollectOptions, EndpointOptions
from relearn.verbs.containers import ContainerOptions
from relearn.verbs.evaluate import EvalOptions
from relearn.verbs.verify import PoolVerifyOptions, VerifyOptions

TASKS = {t.instance_id: t for t in load_tasks(MINI_SUITE)[0]}


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (ContainerOptions(memory="lots"), r"--memory 'lots': expected a size"),
        (ContainerOptions(memory="10m"), r"at least 64 MiB"),
        (ContainerOptions(image_template="Not An Image {nope}"), r"nope"),
        (ContainerOptions(image_map=Path("/no/such/map.json")), r"/no/such/map.json"),
    ],
)
def test_unusable_container_options_are_refused_naming_the_option(options: ContainerOptions, message: str, tmp_path: Path) -> None:
    with pytest.raises(OpError, match=message):
        check_containers(options)
    # The verbs refuse them before touching the engine or the tasks.
    with pytest.raises(OpError, match=message):
        run_collect(CollectOptions(out=tmp_path, model="m", tasks="no-such-tasks", containers=options))


def test_tasks_and_agent_options_are_checked() -> None:
    with pytest.raises(OpError, match="no such task in mini: mini__nope"):
        load_task_list("mini", ["mini__calc-1", "mini__nope"])
    chosen, problems = load_task_list("mini", ["mini__calc-1"])
    assert [t.instance_id for t in chosen] == ["mini__calc-1"] and problems == []
    with pytest.raises(OpError, match="--apply-patch must be one of"):
        resolve_agent(AgentOptions(apply_patch="loose"))
    with pytest.raises(OpError, match="--agent must be one of"):
        resolve_agent(AgentOptions(agent="other"))
    assert resolve_agent(AgentOptions()) == ("chat", None) and resolve_agent(AgentOptions(policy="anthropic")) == ("anthropic", None)
    with pytest.raises(OpError, match="codex-cli speaks the Responses API: use --policy responses"):
        resolve_agent(AgentOptions("codex-cli", "chat"))  # refused before looking for an install


def test_run_verify_grades_and_resumes(base_image: str, tmp_path: Path) -> None:
    task = TASKS["mini__calc-1"]
    patches = tmp_path / "preds.jsonl"
    rows = [{"instance_id": task.instance_id, "model_patch": task.patch}, {"instance_id": task.instance_id, "model_patch": ""}]
    patches.write_text("".join(json.dumps(r) + "\n" for r in rows) + "{broken\n")
    options = VerifyOptions(patches, output=tmp_path / "verdicts.jsonl", workers=2)
    first = run_verify(options)
    assert len(first.verdicts) == 2 and first.skipped == 0 and not first.errors
    assert [p for p in first.unreadable if "preds.jsonl:3" in p] and first.partial  # the broken line is counted
    assert {v.patch_exists: v.patch_applied for v in first.verdicts} == {True: True, False: False}
    again = run_verify(options)
    assert again.verdicts == [] and again.skipped == 2
    assert len((tmp_path / "verdicts.jsonl").read_text().splitlines()) == 2
    with pytest.raises(OpError, match="no predictions in"):
        (tmp_path / "empty.jsonl").write_text("")
        run_verify(dataclasses.replace(options, patches=tmp_path / "empty.jsonl"))


def _pool(path: Path) -> list[Trajectory]:
    messages = [Message(role="user", content="fix it")]
    calc, pager = TASKS["mini__calc-1"], TASKS["mini__pager-1"]
    pool = [
        Trajectory(id="gold-calc", task_id=calc.instance_id, messages=messages, final_patch=calc.patch),
        Trajectory(
            id="collected", task_id=calc.instance_id, messages=messages, final_patch=calc.patch, outcome={"resolved": False, "reward": 0.0}
        ),
        Trajectory(id="gold-pager", task_id=pager.instance_id, messages=messages, final_patch=pager.patch),
        Trajectory(id="again-calc", task_id=calc.instance_id, messages=messages, final_patch=calc.patch),
        Trajectory(id="no-task", task_id="nowhere", messages=messages, final_patch=calc.patch),
        Trajectory(id="no-patch", task_id=calc.instance_id, messages=messages),
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(t.model_dump_json() + "\n" for t in pool) + '{"messages": [\n')  # and a torn record
    return pool


def test_verify_pool_streams_in_chunks_keeps_the_order_and_resumes(base_image: str, tmp_path: Path) -> None:
    pool = _pool(tmp_path / "pool.jsonl")

    def run(name: str, chunk: int) -> tuple[object, list[Trajectory]]:
        options = PoolVerifyOptions(
            tmp_path / "pool.jsonl", tmp_path / name / "verified.jsonl", tmp_path / name / "verdicts.jsonl", workers=2, chunk=chunk
        )
        summary = verify_pool(options)
        return summary, list(read_trajectories(options.output))

    whole, graded = run("whole", 0)
    assert [t.id for t in graded] == [t.id for t in pool]  # the pool's order, the torn line left out
    assert dict(whole.counts) == {
        "graded now": 3,
        "graded when collected": 1,
        "ungradable (no task or no final patch)": 2,
    }
    assert len(whole.unreadable) == 1 and not whole.errors
    outcomes = {t.id: t.outcome.model_dump(exclude={"verdict_ref"}) if t.outcome else None for t in graded}
    assert outcomes["gold-calc"] == outcomes["again-calc"] and outcomes["no-task"] is None and outcomes["no-patch"] is None
    # Graded when collected: kept as it was, though another trajectory with its patch is graded now.
    assert outcomes["collected"]["resolved"] is False and outcomes["collected"]["verdict"] is None
    # Two distinct (task, patch) pairs: one container each, every verdict kept, no scratch left.
    assert len((tmp_path / "whole" / "verdicts.jsonl").read_text().splitlines()) == 2
    assert not (tmp_path / "whole" / "verdicts.jsonl.chunk").exists()

    # One trajectory at a time gives the same pool.
    small, one_by_one = run("small", 1)
    assert {t.id: t.outcome.model_dump(exclude={"verdict_ref"}) if t.outcome else None for t in one_by_one} == outcomes
    assert small.resolved == whole.resolved

    # An interrupted run resumes from its partial file by trajectory id.
    resumed = tmp_path / "resumed"
    resumed.mkdir()
    (resumed / "verified.jsonl.partial").write_text("".join(t.model_dump_json() + "\n" for t in graded[:3]))
    later, after = run("resumed", 0)
    assert [t.id for t in after] == [t.id for t in graded] and later.counts["graded now"] == 1  # again-calc only
    assert later.resolved == whole.resolved


def test_every_option_of_the_container_verbs_can_be_said_in_the_pipeline_file() -> None:
    from relearn.pipeline.config import CollectConfig, ContainersConfig, EvalConfig, VerifyConfig

    def names(options: type) -> set[str]:  # nested options spread in, as the tables have them
        return {o.name for o in options_of(options)}

    containers = names(ContainerOptions) - {"ray", "registry"}  # [cluster]'s
    assert containers == set(ContainersConfig.model_fields)
    collect = names(CollectOptions) - {"out", "tasks", "ray", "registry"}  # the work folder, the file's tasks, [cluster]'s
    assert collect == set(CollectConfig.model_fields)
    assert {"workers", "timeout"} | containers <= set(VerifyConfig.model_fields)
    # The served model is the pipeline's own: no endpoint, key, agent, checkpoint or prices.
    served = {"out", "model", "agent", "policy", "reasoning_effort", "token_ids", "base_url", "api_key_env", "checkpoint", "price_in",
              "price_out", "max_cost", "max_output_tokens", "ray", "registry"}  # fmt: skip
    assert names(EvalOptions) - served == set(EvalConfig.model_fields) - {"max_new_tokens", "max_context"}
    # Their defaults are the operations'.
    assert CollectConfig(model="m").attempts == CollectOptions.attempts and VerifyConfig().timeout == VerifyOptions.timeout
    assert VerifyConfig().memory == ContainerOptions.memory and CollectConfig(model="m").apply_patch == AgentOptions.apply_patch


def test_the_tables_give_back_the_stages_options() -> None:
    """A table's ``options()`` is its verb's options with what the stage names itself: its
    files, the file's tasks, the containers resolved; eval's served model speaks chat, here."""
    from relearn.pipeline.config import CollectConfig, EvalConfig, VerifyConfig

    boxes = ContainerOptions(Path("/maps/m.json"), None, True, 1.5, "8g", "auto", "reg.example/team")
    collect = CollectConfig(model="m", attempts=3, agent="codex-cli", memory="1g").options(Path("w"), "mini", boxes, "http://x/v1")
    assert (collect.out, collect.tasks, collect.model, collect.attempts) == (Path("w"), "mini", "m", 3)
    assert collect.agent.agent == "codex-cli" and collect.endpoint.base_url == "http://x/v1"
    assert collect.containers == boxes  # the stage's containers win over the table's own
    assert CollectConfig(model="m", base_url="http://y/v1").options(Path("w"), "mini", boxes).endpoint.base_url == "http://y/v1"
    graded = VerifyConfig(workers=4).options(Path("p"), Path("o"), Path("v"), "mini", Path("logs"), boxes)
    assert (graded.workers, graded.timeout, graded.log_dir, graded.containers) == (4, VerifyOptions.timeout, Path("logs"), boxes)
    served = EvalConfig(max_new_tokens=64, apply_patch="strict").options(Path("e"), "upstream", "mini", "http://127.0.0.1:1/v1", boxes)
    assert (served.agent.agent, served.agent.policy, served.agent.apply_patch) == ("builtin", "chat", "strict")
    assert (served.endpoint.max_output_tokens, served.budget.max_turns, served.seed) == (64, 20, 0)
    assert served.containers.ray is None and served.containers.registry == "reg.example/team"


def test_the_builtin_agent_asks_for_token_ids_unless_told_not_to() -> None:
    """``--no-token-ids`` (``token_ids = false`` in the file) reaches the policy client, for servers
    that refuse vLLM's fields; codex-cli asks only when told to."""
    from relearn.pipeline.config import CollectConfig

    def spec(**agent: Any) -> Any:
        return policy_spec(EndpointOptions(), "m", "responses", AgentOptions(**agent))

    assert spec().request_token_ids is True and spec(token_ids=False).request_token_ids is False
    assert not AgentOptions(agent="codex-cli").request_token_ids() and AgentOptions(agent="codex-cli", token_ids=True).request_token_ids()
    assert CollectConfig(model="m", token_ids=False).token_ids is False and CollectConfig(model="m").token_ids is None


def test_a_pipeline_file_without_the_new_fields_keeps_its_stamps(tmp_path: Path) -> None:
    """Fields the container tables gained stay out of the stage settings at their default."""
    from relearn.pipeline.config import load_pipeline
    from relearn.pipeline.context import Context
    from relearn.pipeline.plan import plan

    (tmp_path / "p.toml").write_text(
        'workdir = "w"\n[pool.collect]\nmodel = "m"\nbase_url = "http://x/v1"\n[verify]\nworkers = 8\npull = true\n[review]\nreviewer = "heuristic"\n'
    )
    stages = {s.name: s for s in plan(Context(load_pipeline(tmp_path / "p.toml"), Console(file=io.StringIO())), dict)}
    assert stages["verify"].settings == {"tasks": "mini"}  # workers and pull are transport
    collect = stages["pool"].settings["collect"]
    assert collect["policy"] == "chat" and not {"agent", "apply_patch", "token_ids", "cpus", "memory", "pull", "base_url"} & set(collect)
    (tmp_path / "p.toml").write_text(
        'workdir = "w"\n[pool.collect]\nmodel = "m"\nmemory = "8g"\n[verify]\nimage_template = "r/{instance_key}:v"\n[review]\nreviewer = "heuristic"\n'
    )
    stages = {s.name: s for s in plan(Context(load_pipeline(tmp_path / "p.toml"), Console(file=io.StringIO())), dict)}
    assert stages["verify"].settings["image_template"] == "r/{instance_key}:v" and stages["pool"].settings["collect"]["memory"] == "8g"


def test_run_collect_then_run_replay(base_image: str, tmp_path: Path) -> None:
    """`relearn collect`'s work called directly: episodes verified as they finish, counts from
    one pass over the pool, resumable; `relearn replay`'s reproduces them in fresh containers."""
    from harness.scripted.servers import ModelServer
    from harness.scripted.solutions import solver
    from relearn.ops.collect import run_replay
    from relearn.verbs.collect import ReplayOptions

    ids = ["mini__calc-1", "mini__pager-1"]
    with ModelServer("chat", solver(TASKS, {"mini__calc-1"})) as server:
        options = CollectOptions(
            out=tmp_path / "run",
            model="scripted",
            endpoint=EndpointOptions(base_url=server.base_url),
            ids=ids,
            attempts=2,
            workers=2,
            budget=BudgetOptions(max_turns=5),
        )
        first = run_collect(options)
        again = run_collect(options)
    assert len(first.collect.finished) == 4 and not first.partial and first.ks == (1, 2)
    assert first.trajectories == 4 and first.resolved == 2 and sum(first.exit_status.values()) == 4
    assert {task: row["resolved"] for task, row in first.pass_at_k.items()} == {"mini__calc-1": 2, "mini__pager-1": 0}
    assert again.collect.skipped == 4 and not again.collect.finished and again.trajectories == 4

    solved = next(t for t in read_trajectories(first.pool) if t.outcome and t.outcome.resolved)
    replayed = run_replay(ReplayOptions(first.pool, ids=[solved.id]))
    (row,) = replayed.rows
    assert row.trajectory_id == solved.id and row.reproduced and row.report.verdict.resolved and replayed.failures == 0
    with pytest.raises(OpError, match="no trajectories to replay"):
        run_replay(ReplayOptions(first.pool, ids=["nope"]))


def test_the_pipeline_file_refuses_bad_container_fields_naming_them(tmp_path: Path) -> None:
    from relearn.pipeline.config import PipelineError, load_pipeline

    for table, line, field in [
        ("verify", 'memory = "lots"', "verify.memory"),
        ("verify", "workers = 0", "verify.workers"),
        ("eval", "cpus = 0", "eval.cpus"),
        ("pool.collect", 'model = "m"\nagent = "other"', "pool.collect.agent"),
    ]:
        (tmp_path / "p.toml").write_text(f'workdir = "w"\n[pool.import]\nformat = "codex"\npaths = ["r"]\n[{table}]\n{line}\n')
        if table == "pool.collect":
            (tmp_path / "p.toml").write_text(f'workdir = "w"\n[{table}]\n{line}\n')
        with pytest.raises(PipelineError, match=field.replace(".", r"\.")):
            load_pipeline(tmp_path / "p.toml")
