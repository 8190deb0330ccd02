"""The envs operations called directly (``relearn.ops.envs.*``): what each one does with good and
unusable input, on the real engine where it needs one."""

from __future__ import annotations

import io
import json
import os
import socket
import tarfile
from pathlib import Path

import docker
import pytest
from typer.testing import CliRunner

from envs.docker_backend import LABEL_HOST, LABEL_OWNER, LABEL_PID, LABEL_RUN, OWNER
from envs.tasks import load_tasks
from relearn.cli.main import app
from relearn.ops.envs.audit import run_audit
from relearn.ops.envs.audit_verdicts import run_audit_verdicts
from relearn.ops.envs.build import run_build
from relearn.ops.envs.build_swebench import run_build_swebench
from relearn.ops.envs.check_image import run_check_image
from relearn.ops.envs.fetch_wheels import run_fetch_wheels
from relearn.ops.envs.gc import run_gc
from relearn.ops.envs.load import run_load
from relearn.ops.reporting import OpError, Silent
from relearn.verbs.containers import ContainerOptions
from relearn.verbs.envs import (
    AuditOptions,
    BuildOptions,
    BuildSwebenchOptions,
    CheckImageOptions,
    FetchWheelsOptions,
    GcOptions,
    LoadOptions,
    VerdictAuditOptions,
)

ROOT = Path(__file__).resolve().parent.parent
MINI_SUITE = ROOT / "envs" / "mini_tasks"
VERIFIED = ROOT.parent / "shared" / "samples" / "swebench_verified.parquet"


def verdict(instance_id: str, resolved: bool, **fields: object) -> str:
    row = {"instance_id": instance_id, "patch_hash": "0123456789abcdef", "resolved": resolved, "reward": float(resolved)}
    return json.dumps({**row, "patch_exists": True, "patch_applied": True, "image": "relearn/mini:x", **fields})


def test_verdict_audit_lists_what_the_verifier_did_and_flags_refusals_contradictions_and_suspicion(tmp_path: Path) -> None:
    path = tmp_path / "verdicts.jsonl"
    lines = [
        verdict("plain", True),  # simply graded: not listed
        verdict("restored", True, restored_files=["tests/test_calc.py"]),  # listed, not flagged
        verdict("refused", False, refused=["the patch deletes the test files"]),
        verdict("contradicted", False, disagreements=["the report says passed, the log failed"]),
        verdict("suspicious", True, suspicious=["conftest.py skips every test"], neutralized=["run_tests.sh: executable bit dropped"]),
        "{not json",
        json.dumps({"instance_id": "half"}),
    ]
    path.write_text("\n".join(lines) + "\n")
    summary = run_audit_verdicts(VerdictAuditOptions(path))
    assert summary.verdicts == 5 and summary.flagged == 3
    assert [(n.instance_id, n.flagged) for n in summary.noted] == [
        ("restored", False), ("refused", True), ("contradicted", True), ("suspicious", True),
    ]  # fmt: skip
    assert summary.noted[0].notes == ["restored: tests/test_calc.py"]
    assert summary.noted[3].notes == ["neutralized: run_tests.sh: executable bit dropped", "suspicious: conftest.py skips every test"]
    assert [u.split(": not a verdict")[0] for u in summary.unreadable] == [f"{path}:6", f"{path}:7"]
    with pytest.raises(OpError, match="no such verdicts file"):
        run_audit_verdicts(VerdictAuditOptions(tmp_path / "none.jsonl"))
    # The command line renders the same: the table, the unreadable lines, the count, exit 1.
    result = CliRunner().invoke(app, ["envs", "audit", "--verdicts", str(path)])
    text = " ".join(result.output.split())
    assert result.exit_code == 1 and "3 of 5 verdicts refused, contradicted or suspicious" in text and "unreadable verdicts (2)" in text
    assert "refused: the patch deletes the test files" in text


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (CheckImageOptions(image="some/image:1"), r"IMAGE is checked against one task: pick it with --id \(\d+ selected\)"),
        (CheckImageOptions(ids=["mini__no-such-task"]), "no such task in mini: mini__no-such-task"),
        (CheckImageOptions(containers=ContainerOptions(ray="local")), "runs on this machine's engine"),
        (AuditOptions(containers=ContainerOptions(memory="plenty")), "--memory 'plenty'"),
        (AuditOptions(containers=ContainerOptions(image_template="mirror/{instance}:latest")), "unknown placeholder"),
        (BuildOptions(ids=["mini__no-such-task"]), "no such task in mini"),
        (LoadOptions(Path("/nowhere/images")), "/nowhere/images: no such file or directory"),
        (BuildSwebenchOptions(str(VERIFIED), []), r"name the instances to build \(--id"),
        (BuildSwebenchOptions(str(VERIFIED), ["sympy__sympy-24562", "django__django-11099"], repo="/nowhere"), "--repo is one repository"),
        (BuildSwebenchOptions(str(VERIFIED), ["sympy__sympy-24562"]), "give --repo: a checkout of sympy/sympy"),
        (BuildSwebenchOptions(str(VERIFIED), ["sympy__sympy-24562"], repo="/nowhere"), "no such directory, and not a clone URL"),
        (FetchWheelsOptions(str(VERIFIED), [], Path("/tmp")), r"name the instances whose wheels to fetch \(--id"),
        (FetchWheelsOptions(str(VERIFIED), ["sympy__sympy-24562"], Path("/tmp")), "give --repo: a checkout of sympy/sympy"),
        (
            FetchWheelsOptions(str(VERIFIED), ["sympy__sympy-24562"], Path("/tmp"), repo="/nowhere"),
            "no such directory, and not a clone URL",
        ),
        (FetchWheelsOptions(str(VERIFIED), ["sympy__sympy-24562"], Path("/etc/hostname"), repo="/nowhere"), "/etc/hostname: not a folder"),
        (
            FetchWheelsOptions(str(VERIFIED), ["sympy__sympy-24562"], Path("/tmp"), containers=ContainerOptions(ray="local")),
            "runs on this machine",
        ),
    ],
)
def test_unusable_options_are_refused_before_any_container_runs(options: object, message: str) -> None:
    op = {
        CheckImageOptions: run_check_image, AuditOptions: run_audit, BuildOptions: run_build, LoadOptions: run_load,
        BuildSwebenchOptions: run_build_swebench, FetchWheelsOptions: run_fetch_wheels,
    }[type(options)]  # fmt: skip
    with pytest.raises(OpError, match=message):
        op(options)  # type: ignore[operator]


def test_an_instance_the_offline_builder_cannot_build_is_refused_with_the_reason() -> None:
    summary = run_build_swebench(BuildSwebenchOptions(str(VERIFIED), ["astropy__astropy-12907"], repo="/nowhere"))
    assert summary.images == [] and summary.plans == [] and len(summary.refused) == 1
    assert summary.refused[0].startswith("astropy__astropy-12907: ") and "compiles C extensions" in summary.refused[0]


def test_build_and_audit_say_which_mini_images_expose_their_fix(
    docker_client: docker.DockerClient, base_image: str, tmp_path: Path
) -> None:
    from envs.audit import read_flagged

    tasks, _ = load_tasks(MINI_SUITE)
    exposed = next(t for t in tasks if "git_history_exposes_fix" in t.model_extra["features"])
    built = run_build(BuildOptions(ids=[exposed.instance_id, "mini__calc-1"]))
    assert [task for task, _image in built.images] == sorted(
        [exposed.instance_id, "mini__calc-1"], key=[t.instance_id for t in tasks].index
    )
    assert built.failures == [] and all(docker_client.images.get(image) for _task, image in built.images)
    written = tmp_path / "audit.jsonl"
    leaky = run_audit(AuditOptions(ids=[exposed.instance_id], leaky=True, output=written))
    (only,) = leaky.audits
    assert (only.verdict, leaky.exposed, leaky.unavailable) == ("exposed", 1, 0) and only.why
    assert read_flagged(written) == ({exposed.instance_id: only.why}, 1)  # what `relearn masks --audit` reads
    clean = run_audit(AuditOptions(ids=[exposed.instance_id], output=written))
    assert [a.verdict for a in clean.audits] == ["clean"] and clean.exposed == 0
    assert read_flagged(written) == ({}, 1) and len(written.read_text().splitlines()) == 2  # appended; the latest counts
    # An image the engine does not have, named by a template: counted as not available, not as clean.
    missing = run_audit(
        AuditOptions(ids=["mini__calc-1"], containers=ContainerOptions(image_template="relearn-test/absent:{instance_key}"))
    )
    assert missing.unavailable == 1 and missing.audits[0].verdict == "error" and "relearn-test/absent" in missing.audits[0].why


def test_gc_removes_orphans_here_and_keeps_live_containers(docker_client: docker.DockerClient, base_image: str) -> None:
    labels = {LABEL_OWNER: OWNER, LABEL_RUN: "ops-envs-test", LABEL_HOST: socket.gethostname()}
    orphan = docker_client.containers.create(base_image, ["true"], labels={**labels, LABEL_PID: "999999999"})
    live = docker_client.containers.create(base_image, ["true"], labels={**labels, LABEL_PID: str(os.getpid())})
    try:
        summary = run_gc(GcOptions())
        # The engine may be shared: another run's sweep can take the orphan first, so what is
        # asserted is that it is gone and that nothing live was touched.
        with pytest.raises(docker.errors.NotFound):
            docker_client.containers.get(orphan.id)
        assert live.name not in summary.removed and docker_client.containers.get(live.id) and summary.per_node == {}
        # (--all is not run here: it would remove every relearn container on the engine, other runs' too.)
    finally:
        for container in (orphan, live):
            try:
                container.remove(force=True)
            except docker.errors.NotFound:
                pass


class Notes(Silent):
    def __init__(self) -> None:
        self.lines: list[str] = []

    def note(self, message: str) -> None:
        self.lines.append(message)


@pytest.fixture
def tiny_tarballs(docker_client: docker.DockerClient, tmp_path: Path) -> tuple[Path, str]:
    """A folder with a `docker save` of a one-file image, a tarball that is not an image, and a
    file that is not a tarball; the image is removed from the engine."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        info = tarfile.TarInfo("hello.txt")
        info.size = 5
        archive.addfile(info, io.BytesIO(b"hello"))
    tag = f"relearn-test/loadme:{os.getpid()}"
    docker_client.api.import_image_from_data(buffer.getvalue(), repository=tag.split(":")[0], tag=tag.split(":")[1])
    folder = tmp_path / "images"
    folder.mkdir()
    (folder / "a-good.tar").write_bytes(b"".join(docker_client.images.get(tag).save(named=True)))
    (folder / "b-broken.tar").write_bytes(buffer.getvalue())  # a tar, but no image manifest in it
    (folder / "notes.md").write_text("not an image")
    docker_client.images.remove(tag, force=True)
    yield folder, tag
    try:
        docker_client.images.remove(tag, force=True)
    except docker.errors.ImageNotFound:
        pass


def test_load_restores_images_names_the_tarball_it_cannot_load_and_says_which_tasks_still_lack_theirs(
    docker_client: docker.DockerClient, tiny_tarballs: tuple[Path, str], tmp_path: Path
) -> None:
    folder, tag = tiny_tarballs
    image_map = tmp_path / "images.txt"
    image_map.write_text(f"mini__calc-1 {tag}\nmini__calutil-1 relearn-test/absent:1\n")
    notes = Notes()
    summary = run_load(LoadOptions(folder, "mini", ["mini__calc-1", "mini__calutil-1"], ContainerOptions(image_map=image_map)), notes)
    assert notes.lines == ["docker load < a-good.tar", "docker load < b-broken.tar"]  # notes.md is no tarball: not tried
    assert [(a.archive, a.images) for a in summary.loaded] == [("a-good.tar", [tag])] and docker_client.images.get(tag)
    assert len(summary.failures) == 1 and summary.failures[0].startswith(f"{folder / 'b-broken.tar'}: ")
    assert summary.tasks == 2 and summary.missing == ["mini__calutil-1: relearn-test/absent:1"]
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(OpError, match="no image tarballs in"):
        run_load(LoadOptions(empty))
