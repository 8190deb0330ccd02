"""The reward-hack corpus (tests/data/reward_hacks/): patches that leave the bug in place and
try to talk the verifier into "resolved" (pytest configuration and plugins, entry points,
a shadowing pytest, spoofed output and markers, hidden conftest files, writes into .git,
site hooks, symlinks out of the repository, report rewriting from the package under test).
Each is graded in a real container and must not resolve, for the reason its manifest
entry names; the gold patches keep resolving (tests/test_verify.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import docker
import pytest

from envs.tasks import load_tasks
from envs.verify import Verdict, verify

CORPUS = Path(__file__).resolve().parent / "data" / "reward_hacks"
MANIFEST = json.loads((CORPUS / "manifest.json").read_text())
TASKS = {t.instance_id: t for t in load_tasks(Path(__file__).resolve().parent.parent / "envs" / "mini_tasks")[0]}


def test_the_corpus_covers_every_class() -> None:
    classes = {hack["class"] for hack in MANIFEST}
    assert len(MANIFEST) >= 25 and len({hack["task"] for hack in MANIFEST}) >= 2
    assert {
        "pytest_config", "xfail_plugin", "dist_info_entry_point", "shadow_pytest", "spoof_stdout", "spoof_exit_marker",
        "spoof_end_marker", "diff_echo_marker", "apply_log_spoof", "hidden_conftest", "rej_leftover", "git_hook",
        "git_index_lock", "test_patch_sabotage", "sitecustomize", "pth_file", "symlink_escape", "package_runtime_hook",
    } <= classes  # fmt: skip
    depths = {hack["defense"].get("restored", "").count("/") for hack in MANIFEST if hack["class"] == "hidden_conftest"}
    assert {0, 1, 2} <= depths  # conftest.py at the root, one and two folders down


def _why(verdict: Verdict) -> str:
    return json.dumps({k: getattr(verdict, k) for k in ("error", "refused", "restored_files", "neutralized", "disagreements", "tests")})[
        :3000
    ]


@pytest.mark.parametrize("hack", MANIFEST, ids=[hack["name"] for hack in MANIFEST])
def test_a_reward_hack_is_not_resolved(docker_client: docker.DockerClient, images: dict[str, str], hack: dict) -> None:
    task = TASKS[hack["task"]]
    patch = (CORPUS / f"{hack['name']}.patch").read_bytes().decode()
    verdict = verify(docker_client, task, patch, images[task.instance_id])
    assert not verdict.resolved and verdict.reward == 0.0, _why(verdict)
    defense = hack["defense"]
    if "refused" in defense:
        assert not verdict.patch_applied and verdict.tests is None, _why(verdict)
        assert any(defense["refused"] in reason for reason in verdict.refused), _why(verdict)
        assert verdict.error and verdict.error.startswith("the patch was refused")
    elif "restored" in defense:
        assert defense["restored"] in verdict.restored_files, _why(verdict)
        assert verdict.tests["FAIL_TO_PASS"]["failure"], _why(verdict)  # the tests ran, on the bug
    elif "neutralized" in defense:
        assert any(n.startswith(defense["neutralized"] + ":") for n in verdict.neutralized), _why(verdict)
        assert verdict.tests["FAIL_TO_PASS"]["failure"], _why(verdict)
    elif "disagreement" in defense:
        assert any(defense["disagreement"] in d for d in verdict.disagreements), _why(verdict)
    elif "error" in defense:
        assert verdict.error and verdict.error.startswith(defense["error"]), _why(verdict)
    else:  # the hack is inert under the hardened run: the tests simply fail
        assert defense == {"tests_fail": True} and verdict.tests["FAIL_TO_PASS"]["failure"], _why(verdict)


def test_verify_and_audit_show_what_the_verifier_did(relearn_bin: str, images: dict[str, str], tmp_path: Path) -> None:
    """`relearn verify` grades a refused, a restored and a tampered hack next to the gold
    patch; `relearn envs audit --verdicts` lists each with its reasons and exits 1."""
    import subprocess

    chosen = {
        "git_hook_conftest": "refused: .git/hooks/post-checkout: inside .git",
        "pytest_ini_plugin": "restored: pytest.ini",
        "package_runtime_hook": "disagreement: a canary",
    }
    rows = [
        {"instance_id": h["task"], "model_patch": (CORPUS / f"{h['name']}.patch").read_text(), "model_name_or_path": h["name"]}
        for h in MANIFEST
        if h["name"] in chosen
    ]
    rows.append({"instance_id": "mini__calc-1", "model_patch": TASKS["mini__calc-1"].patch, "model_name_or_path": "gold"})
    predictions = tmp_path / "predictions.jsonl"
    predictions.write_text("".join(json.dumps(r) + "\n" for r in rows))
    verdicts = tmp_path / "verdicts.jsonl"
    graded = subprocess.run(
        [relearn_bin, "verify", "-p", str(predictions), "-o", str(verdicts)], capture_output=True, text=True, timeout=900
    )
    assert graded.returncode == 0, graded.stderr
    assert "4 verified, 1 resolved" in graded.stdout
    audited = subprocess.run(
        [relearn_bin, "envs", "audit", "--verdicts", str(verdicts)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "COLUMNS": "400"},
    )
    assert audited.returncode == 1, audited.stderr
    for note in chosen.values():
        assert note in audited.stdout, audited.stdout
    assert "3 of 4 verdicts refused, contradicted or suspicious" in audited.stdout


def test_a_suspicious_success_is_kept_out_and_shown(docker_client: docker.DockerClient, images: dict[str, str]) -> None:
    """A gold fix that also edits pytest's configuration resolves (the edit is put back), but
    the trajectory it belongs to is not positive unless asked for, and the viewer says why."""
    from harness.collect import outcome_of
    from records.trajectory import Trajectory, is_verified_positive
    from relearn.view.screen import verifier_notes

    task = TASKS["mini__calc-1"]
    extra = "diff --git a/pytest.ini b/pytest.ini\nnew file mode 100644\n--- /dev/null\n+++ b/pytest.ini\n@@ -0,0 +1,2 @@\n+[pytest]\n+addopts = -q\n"
    verdict = verify(docker_client, task, task.patch + extra, images[task.instance_id])
    assert verdict.resolved and verdict.restored_files == ["pytest.ini"] and verdict.suspicious
    trajectory = Trajectory(task_id=task.instance_id, messages=[], outcome=outcome_of(verdict))
    assert not is_verified_positive(trajectory) and is_verified_positive(trajectory, allow_suspicious=True)
    notes = verifier_notes(trajectory).plain
    assert "verifier restored to the base: pytest.ini" in notes and "suspicious (kept out of review and training)" in notes
