"""Grading with the network on (``relearn verify --network``, ``[verify] network = true``), as the
official SWE-bench harness grades, and a verdict graded offline that names the tests that failed
for want of the network (``network_needed``), never resolved.

The docker tests grade a mini task whose added test fetches a file from an HTTP server this test
starts on the host, at the Docker bridge's gateway address. The detection tests read the real
offline logs of the two Verified instances the seeded sweep graded unresolved for this reason
(``psf__requests-2317``: httpbin.org; ``sphinx-doc__sphinx-8269``: www.google.com), cut to the
lines that matter: each failure section's heading and its last lines, the summary lines."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import docker
import pytest
from rich.console import Console
from typer.testing import CliRunner

from envs.network_failures import needs_network, network_needed, offline_failures
from envs.tasks import load_tasks
from envs.verify import Verdict
from records.pools import read_trajectories
from records.trajectory import Message, Trajectory
from relearn.cli.main import app
from relearn.pipeline.config import load_pipeline
from relearn.pipeline.context import Context, pool_path, verdicts_path, verified_path

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "network"
MINI = {t.instance_id: t for t in load_tasks(Path(__file__).resolve().parent.parent / "envs" / "mini_tasks")[0]}
REACH = "tests/test_reach.py::test_the_served_file_is_read"
SERVED = "served from the host\n"

# --- detection on the real logs ----------------------------------------------------------------

REQUESTS_F2P = [
    "test_requests.py::RequestsTestCase::test_HTTP_302_ALLOW_REDIRECT_GET",
    "test_requests.py::TestTimeout::test_encoded_methods",
]
REQUESTS_P2P = ["test_requests.py::RequestsTestCase::test_BASICAUTH_TUPLE_HTTP_200_OK_GET"]
REQUESTS_OTHER = [  # failed too, for reasons of their own (pytest.raises with a string; an assert)
    "test_requests.py::RequestsTestCase::test_conflicting_post_params",
    "test_requests.py::RetainsIpManualTests::test_iterable_ok_docstring",
]
LINKCHECK = [f"tests/test_build_linkcheck.py::{name}" for name in ("test_defaults", "test_defaults_json", "test_anchors_ignored")]
SPHINX_F2P = "tests/test_build_linkcheck.py::test_raises_for_invalid_status"


def test_requests_2317_tests_that_call_httpbin_are_named_and_no_others() -> None:
    """Every section of a test that called httpbin.org ends with requests' ConnectionError over a
    gaierror; the two that failed otherwise (a TypeError, an assert) are not named."""
    log = (FIXTURES / "psf__requests-2317.offline.log").read_text()
    failed = [*REQUESTS_F2P, *REQUESTS_P2P, *REQUESTS_OTHER]
    assert network_needed(log, failed) == [*REQUESTS_F2P, *REQUESTS_P2P]
    assert network_needed(log, REQUESTS_OTHER) == []
    # A test that passed is never named, even when a section of its name says gaierror.
    assert network_needed(log, ["test_requests.py::RequestsTestCase::test_connection_error"]) == []


def test_sphinx_8269_linkcheck_tests_are_named_and_the_fix_test_is_not() -> None:
    """The empty patch's offline run: the three PASS_TO_PASS linkcheck tests could not resolve
    www.google.com and www.w3.org (the log is coloured, and one section's assert line is cut
    before the error: its captured output says it); the FAIL_TO_PASS test failed because the
    fix is missing, against a server of its own on localhost, which is not the network."""
    log = (FIXTURES / "sphinx-doc__sphinx-8269.offline.log").read_text()
    assert "\x1b[" in log  # the real shape: pytest's colours, under tox
    assert network_needed(log, [SPHINX_F2P, *LINKCHECK]) == LINKCHECK


def test_a_refused_local_connection_is_not_the_network() -> None:
    line = next(
        line
        for line in (FIXTURES / "sphinx-doc__sphinx-8269.offline.log").read_text().splitlines()
        if "localhost:7777/doesnotexist" in line
    )
    refused = (
        "links.txt:13: [broken] https://localhost:7777/doesnotexist: HTTPSConnectionPool(host='localhost', port=7777): Max retries "
        "exceeded with url: /doesnotexist (Caused by NewConnectionError('<urllib3.connection.HTTPSConnection object at 0x7faf01f0fca0>: "
        "Failed to establish a new connection: [Errno 111] Connection refused'))"
    )  # the same run's line for that link, where it was checked (test_defaults' captured output)
    assert not needs_network(line) and not needs_network(refused)
    assert needs_network(refused.replace("host='localhost'", "host='www.google.com'"))


def test_two_tests_with_one_heading_are_told_apart_by_their_file_or_not_named() -> None:
    """pytest heads a failure with the function's name alone: the file the section names decides
    which test it is; a section that could be either names neither."""
    both = ["tests/test_a.py::test_fetch", "tests/test_b.py::test_fetch"]
    section = "=== FAILURES ===\n____ test_fetch ____\n{where}E   socket.gaierror: [Errno -2] Name or service not known\n=== 1 failed ===\n"
    assert network_needed(section.format(where="tests/test_b.py:3: in test_fetch\n"), both) == [both[1]]
    assert network_needed(section.format(where=""), both) == []


def test_django_and_sympy_sections() -> None:
    """Django's runner: ``ERROR: name (module.Class)`` (Python 3.11 adds the name again), the
    docstring's line under it, up to the next line of equals signs. SymPy: ``file:name``."""
    django = (
        "======================================================================\n"
        "ERROR: test_fetch (app.tests.FetchTests.test_fetch)\n"
        "The page is fetched.\n"
        "----------------------------------------------------------------------\n"
        "OSError: [Errno 101] Network is unreachable\n\n"
        "======================================================================\n"
        "FAIL: test_other (app.tests.FetchTests)\n"
        "----------------------------------------------------------------------\n"
        "AssertionError: 1 != 2\n\n"
        "----------------------------------------------------------------------\n"
        "Ran 2 tests in 0.1s\n"
    )
    assert network_needed(django, ["test_fetch (app.tests.FetchTests)", "test_other (app.tests.FetchTests)"]) == [
        "test_fetch (app.tests.FetchTests)"
    ]
    assert network_needed(django, ["The page is fetched."]) == ["The page is fetched."]  # named by its docstring
    sympy = (
        "________________________________________________________________________________\n"
        "______________ sympy/utilities/tests/test_fetch.py:test_fetch _________________\n"
        "Traceback (most recent call last):\n"
        "socket.gaierror: [Errno -3] Temporary failure in name resolution\n"
        "============= tests finished: 1 passed, 1 exceptions, in 0.10 seconds =============\n"
    )
    assert network_needed(sympy, ["test_fetch", "test_other"]) == ["test_fetch"]


def test_only_an_offline_unresolved_verdict_gets_the_note() -> None:
    log = (FIXTURES / "psf__requests-2317.offline.log").read_text()
    tests = {"FAIL_TO_PASS": {"success": [], "failure": REQUESTS_F2P}, "PASS_TO_PASS": {"success": [], "failure": REQUESTS_P2P}}

    def verdict(network: bool) -> Verdict:
        limits = {"cpus": 2.0, "memory_mb": 2048, "pids": 512, "network": network}
        return Verdict(
            instance_id="psf__requests-2317", patch_hash="0", resolved=False, reward=0.0, patch_exists=True, patch_applied=True,
            image="i", tests=tests, limits=limits,
        )  # fmt: skip

    assert offline_failures(verdict(False), log) == [*REQUESTS_F2P, *REQUESTS_P2P]
    assert offline_failures(verdict(True), log) == []  # with the network on, a failure is the patch's


# --- grading with the network on and off, in containers ----------------------------------------


@pytest.fixture(scope="module")
def host_server() -> Iterator[str]:
    """An HTTP server on the host at the Docker bridge's gateway: what a container reaches
    through the bridge when it has the network, and cannot reach without it."""
    gateway = docker.from_env().networks.get("bridge").attrs["IPAM"]["Config"][0]["Gateway"]

    class Served(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            body = SERVED.encode()
            self.send_response(200 if self.path == "/served.txt" else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_args: object) -> None:
            pass

    server = ThreadingHTTPServer((gateway, 0), Served)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://{gateway}:{server.server_address[1]}/served.txt"
    server.shutdown()
    server.server_close()


def _reach_files(tmp_path: Path, url: str, image: str) -> tuple[Path, Path, Path]:
    """mini__calc-1 with one more FAIL_TO_PASS test, which reads ``url``: its task file, its
    image map (the mini image the suite built) and the gold patch as a prediction."""
    calc = MINI["mini__calc-1"]
    source = f"import urllib.request\n\n\ndef test_the_served_file_is_read():\n    assert urllib.request.urlopen({url!r}, timeout=10).read() == {SERVED.encode()!r}\n"
    added = "".join("+" + line + "\n" for line in source.splitlines())
    new_file = (
        "diff --git a/tests/test_reach.py b/tests/test_reach.py\nnew file mode 100644\n--- /dev/null\n+++ b/tests/test_reach.py\n"
        f"@@ -0,0 +1,{len(source.splitlines())} @@\n{added}"
    )
    task = calc.model_copy(
        update={"test_patch": calc.test_patch.rstrip("\n") + "\n" + new_file, "FAIL_TO_PASS": [*calc.FAIL_TO_PASS, REACH]}
    )
    tasks, image_map, predictions = tmp_path / "tasks.jsonl", tmp_path / "images.json", tmp_path / "preds.jsonl"
    tasks.write_text(task.model_dump_json(exclude_none=True) + "\n")
    image_map.write_text(json.dumps({calc.instance_id: image}))
    predictions.write_text(json.dumps({"instance_id": calc.instance_id, "model_patch": calc.patch}) + "\n")
    return tasks, image_map, predictions


def test_verify_offline_names_the_test_and_with_network_resolves(images: dict[str, str], host_server: str, tmp_path: Path) -> None:
    tasks, image_map, predictions = _reach_files(tmp_path, host_server, images["mini__calc-1"])
    common = ["verify", "-p", str(predictions), "-t", str(tasks), "--image-map", str(image_map)]

    offline = CliRunner().invoke(app, [*common, "-o", str(tmp_path / "offline.jsonl")])
    assert (tmp_path / "offline.jsonl").exists(), offline.output
    verdict = Verdict.model_validate_json((tmp_path / "offline.jsonl").read_text())
    assert not verdict.resolved and verdict.limits and verdict.limits["network"] is False, offline.output
    assert verdict.tests and verdict.tests["FAIL_TO_PASS"]["failure"] == [REACH]  # the fix itself passes
    assert verdict.network_needed == [REACH]
    assert "1 graded unresolved with tests that needed the network: rerun with --network" in offline.stdout
    assert "1 failed test needed the network" in offline.stdout  # the table's "why not"

    online = CliRunner().invoke(app, [*common, "--network", "-o", str(tmp_path / "online.jsonl")])
    assert (tmp_path / "online.jsonl").exists(), online.output
    verdict = Verdict.model_validate_json((tmp_path / "online.jsonl").read_text())
    assert verdict.resolved and verdict.limits and verdict.limits["network"] is True, online.stdout
    assert verdict.network_needed == [] and "graded with the network on" in online.stdout and "rerun with --network" not in online.stdout


def test_the_pipeline_verify_stage_grades_with_the_network_on(images: dict[str, str], host_server: str, tmp_path: Path) -> None:
    """``[verify] network = true`` reaches the grading through the stage's own code, and is part
    of the stage's identity (turning it on or off grades again)."""
    from relearn.pipeline.stages import verify as verify_stage

    tasks, image_map, _predictions = _reach_files(tmp_path, host_server, images["mini__calc-1"])
    pipeline = tmp_path / "PIPELINE.toml"
    head = f'workdir = "w"\ntasks = "{tasks.name}"\n[pool]\nimport = {{ format = "codex", paths = ["x"] }}\n[verify]\nimage_map = "{image_map.name}"\n'
    pipeline.write_text(head + "network = true\n")
    ctx = Context(load_pipeline(pipeline), Console(quiet=True))
    calc = MINI["mini__calc-1"]
    pool_path(ctx).parent.mkdir(parents=True)
    trajectory = Trajectory(id="gold", task_id=calc.instance_id, messages=[Message(role="user", content="fix it")], final_patch=calc.patch)
    pool_path(ctx).write_text(trajectory.model_dump_json() + "\n")

    counts = verify_stage.run(ctx)
    assert counts["network"] == "on" and counts["resolved"] == 1
    [graded] = read_trajectories(verified_path(ctx))
    assert graded.outcome and graded.outcome.resolved
    assert json.loads(verdicts_path(ctx).read_text())["limits"]["network"] is True

    settings = verify_stage.stages(ctx)[0].settings
    pipeline.write_text(head)
    assert verify_stage.stages(Context(load_pipeline(pipeline), Console(quiet=True)))[0].settings != settings
