"""``relearn stats``: outcomes, pass@k (the unbiased estimator of harness.collect), review
decisions and reasons, TER per trajectory and weighted by training-step window, excluded
content by category, lengths; tables, JSON and PNG plots; bad input located."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from records.passk import pass_at_k
from records.pool_index import PoolIndex, ReviewIndex
from records.pools import JsonlWriter, write_atomic
from records.review import Defect, Review
from records.trajectory import Trajectory
from relearn.cli.main import app as cli_app
from relearn.stats.compute import compute, step_windows
from relearn.view.catalog import DatasetInfo

PNG = b"\x89PNG\r\n\x1a\n"
CONTENT = "I think the bug is in parse(). Running ls again. Then fixing add()."

# id, task, step, outcome, exit status
POOL = [
    ("a1", "t1", 0, {"resolved": True, "reward": 1.0}, "submitted"),
    ("a2", "t1", 10, {"resolved": False, "reward": 0.0}, "turns_exhausted"),
    ("a3", "t1", 50, {"resolved": True, "reward": 1.0}, "submitted"),
    ("a4", "t1", 60, {"resolved": False, "reward": 0.0}, "submitted"),
    ("b1", "t2", 20, {"resolved": False}, "turns_exhausted"),
    ("b2", "t2", 90, {"resolved": False}, "submitted"),
    ("c1", "t3", 80, {"reward": 1.0}, "submitted"),  # a verifier that gives only a reward
    ("d1", "t4", None, None, "unknown"),  # never verified
]


def trajectory(tid: str, task: str, step: int | None, outcome: dict | None, exit_status: str) -> Trajectory:
    return Trajectory.model_validate(
        {
            "id": tid,
            "task_id": task,
            "policy": {"name": "p", "checkpoint": f"iter-{step}" if step is not None else None, "step": step},
            "messages": [
                {"role": "user", "content": "Fix add()."},
                {
                    "role": "assistant",
                    "generated": True,
                    "content": CONTENT,
                    "tool_calls": [{"id": "c", "function": {"name": "shell", "arguments": {"command": ["ls"]}}}],
                },
                {"role": "tool", "tool_call_id": "c", "content": "calc.py"},
                {"role": "assistant", "generated": True, "content": "Done."},
            ],
            "final_patch": "--- a/calc.py\n+++ b/calc.py\n@@\n-x\n+y\n",
            "exit_status": exit_status,
            "outcome": outcome,
        }
    )


def span(quote: str, category: str) -> Defect:
    start = CONTENT.index(quote)
    return Defect(message_index=1, field="content", start=start, end=start + len(quote), quote=quote, category=category)


REVIEWS = [
    Review(
        trajectory_id="a1",
        decision="accept",
        errors=[{"category": "wrong_hypothesis"}, {"category": "redundant_exploration"}, {"category": "redundant_exploration"}],
        defects=[span("the bug is in parse()", "wrong_hypothesis"), span("Running ls again.", "redundant_exploration")],
    ),
    Review(trajectory_id="a2", decision="reject", reason="not verified positive"),
    Review(
        trajectory_id="a3",
        decision="accept",
        errors=[{"category": "redundant_exploration"}],
        defects=[span("Running ls again.", "redundant_exploration")],
    ),
    Review(trajectory_id="a4", decision="reject", reason="too many errors: 3 of 5 steps"),
    Review(trajectory_id="b1", decision="reject", reason="not verified positive"),
    Review(trajectory_id="b2", decision="reject", reason="not verified positive"),
    Review(trajectory_id="c1", decision="accept"),
]
# What relearn masks wrote for the accepted trajectories (token counts).
DATASET = {
    "mode": "ross",
    "per_turn": False,
    "trajectories_in": 8,
    "trajectories_out": 3,
    "samples": 3,
    "rejected": {"not verified positive": 4, "review rejected": 1, "no review": 1},
    "tokens": {"total": 900, "eligible": 350, "excluded": 20, "supervised": 330},
    "ter_token_weighted": 20 / 350,
    "ter_mean": 0.05,
    "excluded_by_category": {"wrong_hypothesis": 6, "redundant_exploration": 14},
    "per_sample": [
        {"sample_id": "a1", "tokens": 300, "eligible": 100, "excluded": 10, "ter": 0.1},
        {"sample_id": "a3", "tokens": 400, "eligible": 200, "excluded": 10, "ter": 0.05},
        {"sample_id": "c1", "tokens": 200, "eligible": 50, "excluded": 0, "ter": 0.0},
    ],
}


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    pool = tmp_path / "pool.jsonl"
    with JsonlWriter(pool) as writer:
        for row in POOL:
            writer.write(trajectory(*row))
    with open(pool, "a", encoding="utf-8") as handle:
        handle.write('{"schema_version": "1.0", "messages": [{"role": "tool", "content": "x"}]}\n')  # line 9: no tool_call_id
    reviews = tmp_path / "reviews.jsonl"
    write_atomic(reviews, [r.model_dump(mode="json") for r in REVIEWS])
    dataset = tmp_path / "dataset"
    dataset.mkdir()
    (dataset / "stats.json").write_text(json.dumps(DATASET))
    return {"pool": pool, "reviews": reviews, "dataset": dataset}


def report_of(files: dict[str, Path], *, dataset: bool = True, **options: object) -> dict:
    pool = PoolIndex(files["pool"], cache=False).build()
    reviews = ReviewIndex(files["reviews"], cache=False).build()
    return compute([pool], reviews, DatasetInfo.load(files["dataset"]) if dataset else None, **options)  # type: ignore[arg-type]


def test_outcomes_exit_statuses_and_unbiased_pass_at_k(files: dict[str, Path]) -> None:
    report = report_of(files, ks=(1, 2))
    t = report["trajectories"]
    assert t["total"] == 8 and t["unreadable"] == 1
    assert t["by_outcome"] == {"unresolved": 4, "resolved": 3, "not verified": 1}
    assert t["by_exit_status"] == {"submitted": 5, "turns_exhausted": 2, "unknown": 1}
    assert t["outcome_by_exit_status"]["submitted"] == {"resolved": 3, "unresolved": 2}

    p = report["pass_at_k"]
    assert p["tasks"]["t1"] == {"attempts": 4, "resolved": 2, "pass@1": 0.5, "pass@2": pytest.approx(5 / 6)}
    assert p["tasks"]["t2"] == {"attempts": 2, "resolved": 0, "pass@1": 0.0, "pass@2": 0.0}
    assert p["tasks"]["t3"] == {"attempts": 1, "resolved": 1, "pass@1": 1.0}  # too few attempts for pass@2
    assert "t4" not in p["tasks"]  # never verified: no attempt to count
    assert p["tasks"]["t1"]["pass@2"] == pass_at_k(4, 2, 2)
    assert p["mean"] == {"pass@1": pytest.approx(0.5), "pass@2": pytest.approx(5 / 12)}
    assert p["tasks_counted"] == {"pass@1": 3, "pass@2": 2}


def test_reviews_dataset_ter_by_step_window_and_categories(files: dict[str, Path]) -> None:
    report = report_of(files, ks=(1,))
    r = report["reviews"]
    assert (r["reviewed"], r["not_reviewed"]) == (7, 1)
    assert r["decisions"] == {"reject": 4, "accept": 3}
    assert r["rejection_reasons"] == {"not verified positive": 3, "too many errors": 1}
    assert (r["accepted_of_positive"], r["positive"]) == (3, 3)
    assert r["errors_by_category"] == {"redundant_exploration": 3, "wrong_hypothesis": 1}
    assert r["primary_category"] == {"none": 5, "redundant_exploration": 2}

    d = report["dataset"]
    assert (d["mode"], d["trajectories_out"]) == ("ross", 3) and d["excluded_share_by_category"] == {
        "wrong_hypothesis": 0.3,
        "redundant_exploration": 0.7,
    }

    ter = report["ter"]
    assert ter["source"] == "tokens" and ter["weighted"] == pytest.approx(20 / 350)
    assert (
        ter["per_trajectory"]["n"] == 3
        and ter["per_trajectory"]["mean"] == pytest.approx(0.05)
        and ter["per_trajectory"]["median"] == pytest.approx(0.05)
    )
    assert ter["zero_share"] == pytest.approx(1 / 3)
    # Two equal windows over steps 0..90 (early vs late): a1 alone early, a3 and c1 late.
    groups = {g["group"]: g for g in ter["groups"]}
    assert list(groups) == ["steps 0–45", "steps 46–90", "no step"]
    assert groups["steps 0–45"]["ter_token_weighted"] == pytest.approx(10 / 100) and groups["steps 0–45"]["trajectories"] == 3
    assert groups["steps 46–90"]["ter_token_weighted"] == pytest.approx(10 / 250) and groups["steps 46–90"]["ter_mean"] == pytest.approx(
        0.025
    )
    assert groups["steps 46–90"]["resolved_rate"] == pytest.approx(2 / 4) and groups["no step"]["ter_token_weighted"] is None

    e = report["excluded"]
    assert e["trajectories"] == 3 and e["with_defects"] == 2
    assert e["primary_category"] == {"redundant_exploration": 2}
    assert e["token_share"] == {"wrong_hypothesis": 0.3, "redundant_exploration": 0.7}
    quote_a, quote_b = len("the bug is in parse()"), len("Running ls again.")
    assert e["char_share"] == {
        "redundant_exploration": pytest.approx(2 * quote_b / (quote_a + 2 * quote_b)),
        "wrong_hypothesis": pytest.approx(quote_a / (quote_a + 2 * quote_b)),
    }

    lengths = report["lengths"]
    assert lengths["messages"]["all"]["mean"] == 4 and lengths["tool_calls"]["resolved"]["n"] == 3
    assert lengths["tokens"]["all"]["max"] == 400


def test_ter_in_characters_without_a_dataset_and_other_groupings(files: dict[str, Path]) -> None:
    report = report_of(files, dataset=False, by="checkpoint")
    ter = report["ter"]
    eligible = len(CONTENT) + len('{"command": ["ls"]}') + len("Done.")
    excluded_a1 = len("the bug is in parse()") + len("Running ls again.")
    assert ter["source"] == "chars" and ter["per_trajectory"]["n"] == 3  # the accepted, verified-positive ones
    assert ter["weighted"] == pytest.approx((excluded_a1 + len("Running ls again.")) / (3 * eligible))
    assert [g["group"] for g in ter["groups"]] == ["?", "iter-0", "iter-10", "iter-20", "iter-50", "iter-60", "iter-80", "iter-90"]
    assert "dataset" not in report and "token_share" not in report["excluded"]

    fixed = report_of(files, window_size=50)
    assert [g["group"] for g in fixed["ter"]["groups"]] == ["steps 0–49", "steps 50–99", "no step"]
    window = step_windows([3], 4, None)
    assert window(3) == (3, 3) and window(None) is None


def run(*args: str):  # noqa: ANN201
    return CliRunner().invoke(cli_app, list(args))


def test_cli_tables_json_and_plots(files: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "stats.json"
    plots = tmp_path / "plots"
    result = run(
        "stats",
        str(files["pool"]),
        "-r",
        str(files["reviews"]),
        "-d",
        str(files["dataset"]),
        "--k",
        "1,2",
        "--json",
        str(out),
        "--plots",
        str(plots),
    )
    assert result.exit_code == 1, result.output  # one unreadable record, listed
    assert f"{files['pool']}:9: messages[0]" in " ".join(result.stderr.split())
    words = " ".join(result.stdout.split())
    for expected in (
        "trajectories: 8 (1 unreadable)",
        "pass@k (unbiased) over 3 tasks",
        "steps 0–45",
        "steps 46–90",
        "redundant_exploration",
        "too many errors",
    ):
        assert expected in words, expected
    saved = json.loads(out.read_text())
    assert saved["pass_at_k"]["mean"]["pass@2"] == pytest.approx(5 / 12) and saved["ter"]["weighted"] == pytest.approx(20 / 350)
    for name in ("ter_over_steps.png", "category_shares.png"):
        data = (plots / name).read_bytes()
        assert data.startswith(PNG) and len(data) > 10_000

    piped = run("stats", str(files["pool"]), "-r", str(files["reviews"]), "--json", "-")
    assert json.loads(piped.stdout)["ter"]["source"] == "chars"


def test_zstd_pool_gives_the_same_statistics(files: dict[str, Path], tmp_path: Path) -> None:
    compressed = tmp_path / "pool.jsonl.zst"
    with JsonlWriter(compressed) as writer:
        for row in POOL:
            writer.write(trajectory(*row))
    plain = report_of(files)
    zst = compute(
        [PoolIndex(compressed, cache=False).build()], ReviewIndex(files["reviews"], cache=False).build(), DatasetInfo.load(files["dataset"])
    )
    for key in ("pass_at_k", "reviews", "ter", "excluded", "lengths"):
        assert zst[key] == plain[key], key
    assert zst["trajectories"]["unreadable"] == 0 and plain["trajectories"]["unreadable"] == 1


def test_cli_usage_errors_exit_2(files: dict[str, Path], tmp_path: Path) -> None:
    for args, words in (
        (["--by", "colour"], "'colour' is not one of 'step'"),
        (["--k", "0"], "--k takes positive integers"),
        (["-r", str(tmp_path / "missing.jsonl")], "no such file"),
        (["-d", str(tmp_path)], "stats.json"),
    ):
        result = run("stats", str(files["pool"]), *args)
        assert result.exit_code == 2 and words in result.stderr, (args, result.output)
    bad = tmp_path / "ds"
    bad.mkdir()
    (bad / "stats.json").write_text(json.dumps({"per_sample": [{"sample_id": "a1"}]}))
    result = run("stats", str(files["pool"]), "-d", str(bad))
    assert result.exit_code == 2 and "per_sample[0]" in result.stderr
    assert "pass@k" in run("stats", "--help").stdout


def test_a_suspicious_success_is_its_own_outcome(tmp_path: Path) -> None:
    pool = tmp_path / "pool.jsonl"
    suspicious = {"resolved": True, "reward": 1.0, "suspicious": ["conftest.py: the patch changes pytest's configuration or plugins"]}
    write_atomic(pool, [trajectory("s1", "t1", 0, suspicious, "submitted"), trajectory("s2", "t1", 1, {"resolved": True}, "submitted")])
    report = compute([PoolIndex(pool, cache=False).build()], None, None)
    assert report["trajectories"]["by_outcome"] == {"suspicious": 1, "resolved": 1}
    assert report["pass_at_k"]["tasks"]["t1"]["resolved"] == 1  # not a success for pass@k either


def test_a_pool_of_one_training_step_plots_a_bar_with_its_value(files: dict[str, Path], tmp_path: Path) -> None:
    from matplotlib.image import imread

    from relearn.stats.plots import ter_figure, write_plots

    pool = tmp_path / "one-step.jsonl"
    with JsonlWriter(pool) as writer:
        for tid in ("a1", "a3", "c1"):  # the accepted ones, all at step 40
            writer.write(trajectory(tid, "t1", 40, {"resolved": True}, "submitted"))
    report = compute(
        [PoolIndex(pool, cache=False).build()], ReviewIndex(files["reviews"], cache=False).build(), DatasetInfo.load(files["dataset"])
    )
    figure = ter_figure(report)
    assert figure is not None
    (axis,) = figure.axes
    (bar,) = [p for p in axis.patches if p.get_height() > 0]  # the weighted TER of the step, drawn
    assert bar.get_x() < 40 < bar.get_x() + bar.get_width() and bar.get_height() == pytest.approx(100 * 20 / 350)
    assert "5.7%" in [t.get_text() for t in axis.texts]
    assert axis.get_xlim()[0] < 40 - bar.get_width() / 2 and axis.get_xlim()[1] > 40 + bar.get_width() / 2

    (written, *_) = write_plots(report, tmp_path / "plots")
    pixels = imread(written)[..., :3]
    bar_colour = ((abs(pixels[..., 0] - 0xDC / 255) < 0.06) & (abs(pixels[..., 1] - 0x95 / 255) < 0.06)).sum()
    assert bar_colour > 5_000  # the bar (#C44E52 at 60% on white) covers a block of the PNG

    none_excluded = [{**p, "ter": 0.0} for p in report["ter"]["points"]]
    flat = ter_figure({**report, "ter": {**report["ter"], "points": none_excluded}})
    assert flat is not None and "0.0%" in [t.get_text() for t in flat.axes[0].texts] and flat.axes[0].get_ylim()[1] >= 1
    import matplotlib.pyplot as plt

    plt.close("all")


def test_a_context_reset_trajectorys_samples_count_as_its_own(tmp_path: Path) -> None:
    """A trajectory with a context reset is compiled into ``#r`` samples (per-turn ones end in
    ``#m``): the dataset's per-sample records name their trajectory, and the statistics add
    its samples up under it."""
    samples = [
        {"sample_id": "t1#r0", "trajectory_id": "t1", "tokens": 100, "eligible": 40, "excluded": 10},
        {"sample_id": "t1#r1", "trajectory_id": "t1", "tokens": 60, "eligible": 20, "excluded": 0},
        {"sample_id": "t2#r0#m3", "trajectory_id": "t2", "tokens": 30, "eligible": 8, "excluded": 2},
        {"sample_id": "t3", "tokens": 10, "eligible": 5, "excluded": 1},  # written before the field
    ]
    (tmp_path / "stats.json").write_text(json.dumps({"per_turn": False, "per_sample": samples}))
    info = DatasetInfo.load(tmp_path)
    assert sorted(info.by_trajectory) == ["t1", "t2", "t3"]
    t1 = info.by_trajectory["t1"]
    assert (t1.samples, t1.eligible, t1.excluded, t1.tokens) == (2, 60, 10, 160)
