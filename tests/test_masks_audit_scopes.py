"""The image audit used by `relearn masks` (flagged tasks left out of every mode), and TER under
both defect scopes in the masks' stats.json and in `relearn stats`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from records.pool_index import PoolIndex, ReviewIndex
from records.pools import write_atomic
from records.review import Review
from relearn.cli.main import app as cli_app
from relearn.masks.compile import FLAGGED_BY_AUDIT
from relearn.masks.template import render
from relearn.ops.masks import run_masks
from relearn.ops.reporting import OpError
from relearn.stats.compute import compute
from relearn.verbs.masks import MasksOptions
from relearn.view.catalog import DatasetInfo
from review.heuristic import heuristic_review
from tests.test_masks import BASE, compile_ross, defect, trajectory
from tests.test_review_heuristic import load_labelled


def _by_hand(tok, t, lo: int, hi: int) -> int:  # noqa: ANN001
    """Tokens of ``t``'s render (all inside a generated turn here) touching characters [lo, hi)."""
    text = render(t, tok).text
    offsets = tok(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    return sum(1 for a, b in offsets if b > a and a < hi and b > lo)


def test_ter_under_both_scopes_on_a_hand_made_trajectory(tok) -> None:  # noqa: ANN001
    t = trajectory(BASE)
    wrong = defect(t, 2, "tool_calls[0].arguments", "cat calc.py")
    action = compile_ross(t, [wrong], tok)
    minimal = compile_ross(t, [wrong], tok, defect_scope="minimal")
    rendered = render(t, tok)
    lo, hi = rendered.turns[0].calls[0].region
    quote = rendered.text.index("cat calc.py", lo)
    # The whole call (wrapper tags, name, both arguments, the end of turn) and the quote alone.
    assert _by_hand(tok, t, lo, hi) == 50 and _by_hand(tok, t, quote, quote + len("cat calc.py")) == 3
    assert action.eligible == minimal.eligible == 140
    assert action.excluded_by_scope == minimal.excluded_by_scope == {"action": 50, "minimal": 3}
    assert (action.excluded, minimal.excluded) == (50, 3)  # the trained scope's count is the mask's
    # Nothing excluded: both zero; ross-nomask excludes nothing under either scope.
    assert compile_ross(t, [], tok).excluded_by_scope == {"action": 0, "minimal": 0}


def _two_task_pool(tmp_path: Path) -> tuple[Path, Path, dict[str, list[str]]]:
    """Two successes of a leaky task, one of a clean one, one failure of the leaky task, all
    accepted with the same defect in a tool call."""
    made = {
        "leaky": [trajectory(BASE, task_id="leaky", id=f"leaky-{n}") for n in range(2)],
        "clean": [trajectory(BASE, task_id="clean", id="clean-0")],
    }
    failed = trajectory(BASE, task_id="leaky", id="leaky-failed")
    failed.outcome.resolved = False  # type: ignore[union-attr]
    failed.outcome.reward = 0.0  # type: ignore[union-attr]
    every = [*made["leaky"], *made["clean"], failed]
    pool = tmp_path / "pool.jsonl"
    write_atomic(pool, every)
    reviews = tmp_path / "reviews.jsonl"
    reviews.write_text(
        "".join(
            Review(
                trajectory_id=t.id, decision="accept", defects=[defect(t, 2, "tool_calls[0].arguments", "cat calc.py")]
            ).model_dump_json()
            + "\n"
            for t in every
        )
    )
    return pool, reviews, {task: [t.id for t in ts] for task, ts in made.items()}


def _audit_file(tmp_path: Path) -> Path:
    path = tmp_path / "audit.jsonl"
    records = [
        {"instance_id": "leaky", "image": "i:1", "verdict": "clean", "why": ""},
        {"instance_id": "clean", "image": "i:2", "verdict": "clean", "why": ""},
        {"instance_id": "other", "image": None, "verdict": "error", "why": "no image"},
        {"instance_id": "leaky", "image": "i:1", "verdict": "exposed", "why": "the fixed content of calc.py is in .git"},  # the latest wins
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _ids(dataset: Path) -> set[str]:
    return {s["sample_id"] for s in json.loads((dataset / "stats.json").read_text())["per_sample"]}


def test_flagged_tasks_are_left_out_of_every_mode_counted_unless_kept(tmp_path: Path, tok) -> None:  # noqa: ANN001
    pool, reviews, ids = _two_task_pool(tmp_path)
    audit = _audit_file(tmp_path)
    for mode in ("ross", "ross-nomask", "positive"):
        out = tmp_path / mode
        summary = run_masks(MasksOptions(pool=pool, output=out, reviews=reviews, mode=mode, audit=audit), tokenizer=tok)
        stats = summary.stats
        assert _ids(out) == set(ids["clean"]), mode
        assert stats["rejected"] == {FLAGGED_BY_AUDIT: 2, "not verified positive": 1}, mode
        assert stats["audit"] == {
            "applied": True, "file": str(audit), "tasks_audited": 3, "tasks_flagged": 1, "kept": False,
            "trajectories_of_flagged_tasks": 3, "trajectories_left_out": 2,
        }  # fmt: skip
        reasons = {r["trajectory_id"]: r for r in stats["rejections"] if r["reason"] == FLAGGED_BY_AUDIT}
        assert set(reasons) == set(ids["leaky"]) and "calc.py is in .git" in reasons["leaky-0"]["detail"]
        assert not summary.partial and not summary.warnings  # the audit's choice, not a problem with the input
        assert json.loads((out / "stats.json").read_text())["audit"] == stats["audit"]

    kept = run_masks(MasksOptions(pool=pool, output=tmp_path / "kept", reviews=reviews, audit=audit, keep_flagged=True), tokenizer=tok)
    assert _ids(tmp_path / "kept") == set(ids["clean"] + ids["leaky"]) and FLAGGED_BY_AUDIT not in kept.stats["rejected"]
    assert kept.stats["audit"]["kept"] and kept.stats["audit"]["trajectories_of_flagged_tasks"] == 3

    none = run_masks(MasksOptions(pool=pool, output=tmp_path / "none", reviews=reviews), tokenizer=tok)
    assert len(_ids(tmp_path / "none")) == 3 and none.stats["audit"]["applied"] is False
    assert "no audit applied" in none.stats["audit"]["note"]

    # A new audit of the same pool compiles again (the flagged tasks are part of the inputs).
    audit.write_text(json.dumps({"instance_id": "leaky", "verdict": "clean"}) + "\n")
    again = run_masks(MasksOptions(pool=pool, output=tmp_path / "ross", reviews=reviews, audit=audit), tokenizer=tok)
    assert again.reused == 0 and len(_ids(tmp_path / "ross")) == 3

    audit.write_text(
        json.dumps({"instance_id": "leaky", "verdict": "clean"}) + "\n" + json.dumps({"instance_id": "x", "verdict": "leaky"}) + "\n"
    )
    with pytest.raises(OpError, match=rf"--audit {audit}:2: verdict: Input should be 'exposed', 'clean' or 'error'"):
        run_masks(MasksOptions(pool=pool, output=tmp_path / "bad", reviews=reviews, audit=audit), tokenizer=tok)
    with pytest.raises(OpError, match="--keep-flagged needs --audit"):
        run_masks(MasksOptions(pool=pool, output=tmp_path / "bad", reviews=reviews, keep_flagged=True), tokenizer=tok)

    result = CliRunner().invoke(
        cli_app, ["masks", str(pool), "-o", str(tmp_path / "cli"), "-r", str(reviews), "--audit", str(_audit_file(tmp_path))]
    )
    words = " ".join(result.stdout.split())
    assert result.exit_code == 0, result.output
    assert "1 of 3 tasks flagged; 2 successes of them left out" in words and f"left out: {FLAGGED_BY_AUDIT}" in words
    assert "TER action scope (trained)" in words and "TER minimal scope" in words


def test_ter_of_both_scopes_in_stats_json_and_relearn_stats(tmp_path: Path, tok) -> None:  # noqa: ANN001
    pool, reviews, _ids_by_task = _two_task_pool(tmp_path)
    for scope in ("action", "minimal"):
        out = tmp_path / scope
        stats = run_masks(MasksOptions(pool=pool, output=out, reviews=reviews, defect_scope=scope), tokenizer=tok).stats
        # Three accepted successes, each 140 eligible tokens, 50 excluded under action, 3 under minimal.
        assert stats["tokens"]["eligible"] == 3 * 140
        assert stats["ter_by_scope"] == {
            "action": {"excluded": 150, "ter_token_weighted": pytest.approx(50 / 140), "ter_mean": pytest.approx(50 / 140)},
            "minimal": {"excluded": 9, "ter_token_weighted": pytest.approx(3 / 140), "ter_mean": pytest.approx(3 / 140)},
        }
        assert stats["ter_token_weighted"] == pytest.approx(stats["ter_by_scope"][scope]["ter_token_weighted"])  # the trained one
        assert json.loads((out / "stats.json").read_text())["ter_by_scope"]["minimal"]["excluded"] == 9

        report = compute([PoolIndex(pool, cache=False).build()], ReviewIndex(reviews, cache=False).build(), DatasetInfo.load(out))
        ter = report["ter"]
        assert ter["trained_scope"] == scope and ter["weighted"] == pytest.approx(ter["by_scope"][scope]["weighted"])
        assert ter["by_scope"]["action"] == {
            "trajectories": 3, "eligible": 420, "excluded": 150, "weighted": pytest.approx(50 / 140), "mean": pytest.approx(50 / 140)
        }  # fmt: skip
        assert ter["by_scope"]["minimal"]["excluded"] == 9 and ter["by_scope"]["minimal"]["weighted"] == pytest.approx(3 / 140)
        assert report["dataset"]["ter_by_scope"] == stats["ter_by_scope"] and report["dataset"]["audit"]["applied"] is False

    json_out = tmp_path / "report.json"
    result = CliRunner().invoke(cli_app, ["stats", str(pool), "-r", str(reviews), "-d", str(tmp_path / "minimal"), "--json", str(json_out)])
    assert result.exit_code == 0, result.output
    words = " ".join(result.stdout.replace("│", " ").split())
    assert "TER, action scope 35.7% weighted" in words and "TER, minimal scope (trained) 2.1% weighted" in words
    assert "image audit none applied" in words
    saved = json.loads(json_out.read_text())["ter"]["by_scope"]
    assert (saved["action"]["excluded"], saved["minimal"]["excluded"]) == (150, 9)

    # Without a dataset the estimate is the quotes' characters: no action scope to tell.
    chars = compute([PoolIndex(pool, cache=False).build()], ReviewIndex(reviews, cache=False).build(), None)["ter"]["by_scope"]
    assert chars["action"] is None and chars["minimal"]["excluded"] == 3 * len("cat calc.py")


def test_a_demo_like_pool_excludes_more_under_the_action_scope(tmp_path: Path, tok) -> None:  # noqa: ANN001
    """The labelled trajectories of the heuristic reviewer (the demo's scripted policy among
    them), reviewed by it: a defect's call holds its quote, so the action scope excludes at least
    what the quote-only scope does, trajectory by trajectory, and more over the pool."""
    cases = load_labelled()
    pool = tmp_path / "pool.jsonl"
    trajectories = [case.trajectory.model_copy(update={"id": f"case-{n}"}) for n, case in enumerate(cases)]
    write_atomic(pool, trajectories)
    reviews = tmp_path / "reviews.jsonl"
    reviews.write_text("".join(heuristic_review(t).model_dump_json() + "\n" for t in trajectories))
    stats = run_masks(MasksOptions(pool=pool, output=tmp_path / "ross", reviews=reviews), tokenizer=tok).stats
    assert stats["trajectories_out"] >= 20
    by_scope = stats["ter_by_scope"]
    assert by_scope["action"]["ter_token_weighted"] > by_scope["minimal"]["ter_token_weighted"] > 0
    assert all(s["excluded_by_scope"]["action"] >= s["excluded_by_scope"]["minimal"] for s in stats["per_sample"])
    # The other scope's count is what compiling under it excludes, sample by sample.
    minimal = run_masks(MasksOptions(pool=pool, output=tmp_path / "minimal", reviews=reviews, defect_scope="minimal"), tokenizer=tok).stats
    assert {s["sample_id"]: s["excluded_by_scope"] for s in minimal["per_sample"]} == {
        s["sample_id"]: s["excluded_by_scope"] for s in stats["per_sample"]
    }
    assert all(s["excluded"] == s["excluded_by_scope"]["minimal"] for s in minimal["per_sample"])
    assert minimal["ter_by_scope"] == by_scope


def test_a_pipeline_file_names_the_audit_relative_to_itself(tmp_path: Path) -> None:
    from relearn.pipeline.config import load_pipeline

    path = tmp_path / "pipeline.toml"
    (tmp_path / "x").mkdir()  # the import's source: a plan checks that it exists
    path.write_text(
        'workdir = "w"\n[pool]\nimport = { format = "codex", paths = ["x"] }\n[review]\nreviewer = "heuristic"\n'
        '[masks]\nvariants = ["ross", "positive"]\naudit = "envs/audit.jsonl"\nkeep_flagged = true\n'
    )
    config = load_pipeline(path)
    assert config.masks.audit is not None and config.resolve(config.masks.audit) == tmp_path / "envs" / "audit.jsonl"
    options = config.masks.options(
        tmp_path / "v.jsonl", tmp_path / "d", tmp_path / "r.jsonl", "positive", no_thinking=False, ray=None,
        audit=config.resolve(config.masks.audit),
    )  # fmt: skip
    assert (options.audit, options.keep_flagged) == (tmp_path / "envs" / "audit.jsonl", True)
    assert options.compile_options({"t": "exposed"}).flagged_tasks == {}  # kept

    # The audit's content decides the masks stages' outputs: a new audit redoes them.
    import io

    from rich.console import Console

    from relearn.pipeline.context import Context
    from relearn.pipeline.plan import plan

    def masks_settings() -> dict:
        stages = {s.name: s for s in plan(Context(load_pipeline(path), Console(file=io.StringIO())), dict)}
        assert stages["masks:ross"].settings.get("audit") == stages["masks:positive"].settings.get("audit")
        return stages["masks:ross"].settings

    (tmp_path / "envs").mkdir()
    (tmp_path / "envs" / "audit.jsonl").write_text(json.dumps({"instance_id": "t", "verdict": "clean"}) + "\n")
    before = masks_settings()
    (tmp_path / "envs" / "audit.jsonl").write_text(json.dumps({"instance_id": "t", "verdict": "exposed"}) + "\n")
    after = masks_settings()
    assert before["audit"] != after["audit"] and before["keep_flagged"] is True
    path.write_text(
        'workdir = "w"\n[pool]\nimport = { format = "codex", paths = ["x"] }\n[review]\nreviewer = "heuristic"\n'
        '[masks]\nvariants = ["ross", "positive"]\n'
    )
    plain = masks_settings()  # a file without them keeps its stamps (no tasks for its imported pool: no audit stage)
    assert "audit" not in plain and "keep_flagged" not in plain


def test_the_audit_appends_only_to_an_audit_file(tmp_path: Path) -> None:
    from relearn.ops.envs.audit import run_audit
    from relearn.verbs.envs import AuditOptions

    pool = tmp_path / "pool.jsonl"
    write_atomic(pool, [trajectory(BASE)])
    with pytest.raises(OpError, match=r"--output .*pool.jsonl: exists and is not an audit file .*line 1 has no instance_id, verdict"):
        run_audit(AuditOptions(ids=["mini__calc-1"], output=pool))
    verdicts = tmp_path / "verdicts.jsonl"
    verdicts.write_text(json.dumps({"schema_version": 1, "instance_id": "t", "verdict": "x", "resolved": True}) + "\n")
    with pytest.raises(OpError, match="is a relearn record"):
        run_audit(AuditOptions(ids=["mini__calc-1"], output=verdicts))
