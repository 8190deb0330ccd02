"""Every ordinary mistake ends the same way: one line on stderr naming the path, what to do,
exit 2 (130 for Ctrl-C), no traceback, and no file other than the command's output changed."""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import zstandard
from typer.testing import CliRunner

from records.pools import write_atomic
from relearn.cli.errors import report
from relearn.cli.main import app
from relearn.masks.compile import CompileOptions
from relearn.masks.shards import build_dataset
from tests.test_export import _pool

CODEX = "codex_rollout_v0.135.0_exec.jsonl"


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` and its bytes."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def one_error_line(stderr: str, *names: str) -> str:
    """The one line of stderr: ``error: ...`` naming each of ``names``, no traceback."""
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("error: ") and "Traceback" not in stderr, stderr
    for name in names:
        assert name in lines[0], (name, lines[0])
    return lines[0]


def relearn(*args: str | Path) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, [str(a) for a in args])
    return result.exit_code, result.stdout, result.stderr


@contextlib.contextmanager
def read_only(folder: Path) -> Iterator[Path]:
    """``folder`` made unwritable: its write permission removed, and for root (whom permissions
    do not stop) the immutable attribute; writable again afterwards so the test can clean up."""
    folder.chmod(stat.S_IRUSR | stat.S_IXUSR)
    immutable = False
    if os.access(folder, os.W_OK) and shutil.which("chattr"):
        immutable = subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode == 0
    try:
        if os.access(folder, os.W_OK):
            pytest.skip("no way to make a folder read-only here (root on a file system without chattr)")
        yield folder
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(folder)], check=True)
        folder.chmod(stat.S_IRWXU)


@pytest.fixture
def pool(tmp_path: Path, samples: Path) -> Path:
    """A one-trajectory pool imported from the real Codex sample."""
    out = tmp_path / "pool.jsonl"
    code, _out, err = relearn("import", "codex", samples / CODEX, "-o", out)
    assert code == 0, err
    return out


# ---------------------------------------------------------------- validate


def test_validate_a_folder_or_a_missing_pool_is_one_line(tmp_path: Path) -> None:
    before = snapshot(tmp_path)
    code, _out, err = relearn("validate", tmp_path)
    assert code == 2 and "is a folder, not a pool file" in one_error_line(err, str(tmp_path))
    code, _out, err = relearn("validate", tmp_path / "missing.jsonl")
    assert code == 2 and "no such pool file" in one_error_line(err, "missing.jsonl")
    assert snapshot(tmp_path) == before


def test_a_compressed_pool_under_another_name_is_one_line_before_anything_is_written(tmp_path: Path, pool: Path) -> None:
    gzipped = tmp_path / "gz.jsonl"
    gzipped.write_bytes(gzip.compress(pool.read_bytes()))
    zstd_named_plain = tmp_path / "zst.jsonl"
    zstd_named_plain.write_bytes(zstandard.ZstdCompressor().compress(pool.read_bytes()))
    before = snapshot(tmp_path)
    for path, words in ((gzipped, "is gzip-compressed"), (zstd_named_plain, "is zstd-compressed but its name does not end in .zst")):
        for args in (
            ("stats", path),
            ("validate", path),
            ("view", path, "--print"),
            ("masks", path, "--mode", "positive", "-o", tmp_path / "ds", "--tokenizer", "qwen3.6"),
        ):
            code, _out, err = relearn(*args)
            assert code == 2 and words in one_error_line(err, str(path)), (args, err)
        code, _out, err = relearn("import", "codex", pool, "-o", path)  # appended to, it would be corrupted
        assert code == 2 and words in one_error_line(err, str(path)), err
    assert snapshot(tmp_path) == before


def test_swapped_pool_and_reviews_are_one_line_and_nothing_is_written(tmp_path: Path, tok) -> None:  # noqa: ANN001
    trajectories, reviews = _pool()
    write_atomic(tmp_path / "pool.jsonl", trajectories)
    write_atomic(tmp_path / "reviews.jsonl", [r.model_dump(mode="json") for r in reviews])
    before = snapshot(tmp_path)
    code, _out, err = relearn(
        "masks", tmp_path / "reviews.jsonl", "-r", tmp_path / "pool.jsonl", "-o", tmp_path / "ds", "--tokenizer", "qwen3.6"
    )
    line = one_error_line(err, f"POOL {tmp_path / 'reviews.jsonl'}: is a reviews file, not a pool of trajectories")
    assert code == 2 and "check the order of the arguments" in line
    code, _out, err = relearn(
        "masks", tmp_path / "pool.jsonl", "-r", tmp_path / "pool.jsonl", "-o", tmp_path / "ds", "--tokenizer", "qwen3.6"
    )
    assert code == 2 and "is a pool of trajectories, not a reviews file" in one_error_line(err, "--reviews")
    code, _out, err = relearn("review", tmp_path / "reviews.jsonl", "-o", tmp_path / "r2.jsonl", "--reviewer", "heuristic")
    assert code == 2 and "is a reviews file" in one_error_line(err, "reviews.jsonl"), err
    code, _out, err = relearn("stats", tmp_path / "pool.jsonl", "--reviews", tmp_path / "pool.jsonl")
    assert code == 2 and "is a pool of trajectories, not a reviews file" in one_error_line(err, "--reviews"), err
    assert snapshot(tmp_path) == before


def test_masks_lists_only_input_problems_and_its_exit_code_says_so(tmp_path: Path) -> None:
    trajectories, reviews = _pool()
    write_atomic(tmp_path / "pool.jsonl", trajectories)
    reviews[1] = reviews[1].model_copy(update={"decision": "reject"})  # selected out by the review: counted, not an error
    write_atomic(tmp_path / "reviews.jsonl", [r.model_dump(mode="json") for r in reviews])
    args = ("masks", tmp_path / "pool.jsonl", "-r", tmp_path / "reviews.jsonl", "--tokenizer", "qwen3.6")
    code, out, err = relearn(*args, "-o", tmp_path / "a")
    assert code == 0 and "rejected (" not in err and "left out: review rejected" in " ".join(out.split()), (out, err)
    with open(tmp_path / "pool.jsonl", "ab") as pool:
        pool.write(b"[1, 2]\n")  # a line that is no trajectory: an input problem, listed and located
    code, _out, err = relearn(*args, "-o", tmp_path / "b")
    listed = [line.strip() for line in err.splitlines() if line.startswith("  ")]
    assert code == 1 and len(listed) == 1, err
    assert listed[0].startswith(f"unreadable record: {tmp_path / 'pool.jsonl'}:4: ") and not listed[0].endswith(":"), listed


def test_a_second_writer_of_one_pool_or_dataset_is_refused_at_once(tmp_path: Path, samples: Path, pool: Path, tok) -> None:  # noqa: ANN001
    from relearn.ops.outputs import output_lock

    trajectories, reviews = _pool()
    write_atomic(tmp_path / "p2.jsonl", trajectories)
    write_atomic(tmp_path / "r2.jsonl", [r.model_dump(mode="json") for r in reviews])
    for output, command in (
        (pool, ("import", "codex", samples / CODEX, "-o", pool)),  # would append what the other had not yet written
        (tmp_path / "r.jsonl", ("review", tmp_path / "p2.jsonl", "-o", tmp_path / "r.jsonl", "--reviewer", "heuristic")),
        (tmp_path / "ds", ("masks", tmp_path / "p2.jsonl", "-r", tmp_path / "r2.jsonl", "-o", tmp_path / "ds", "--tokenizer", "qwen3.6")),
    ):
        with output_lock(output, folder=output.name == "ds"):
            before = snapshot(tmp_path)
            code, _out, err = relearn(*command)
            assert code == 2 and "another relearn command is writing it (pid " in one_error_line(err, str(output)), err
            assert snapshot(tmp_path) == before
        code, _out, err = relearn(*command)  # the lock goes with its holder
        assert code == 0, err


# ---------------------------------------------------------------- outputs that cannot be written


def test_import_into_a_read_only_folder_refuses_before_writing(tmp_path: Path, samples: Path, pool: Path) -> None:
    shelf = tmp_path / "shelf"
    shelf.mkdir()
    kept = shelf / "pool.jsonl"
    shutil.copy(pool, kept)
    with read_only(shelf):
        before = snapshot(tmp_path)
        for output, extra in ((shelf / "new.jsonl", []), (kept, ["--overwrite"]), (shelf / "sub" / "new.jsonl", [])):
            code, out, err = relearn("import", "codex", samples / CODEX, "-o", output, *extra)
            line = one_error_line(err, f"-o {output}", str(shelf))
            assert code == 2 and "choose a writable place" in line and out == ""
        assert snapshot(tmp_path) == before and not (shelf / "sub").exists()


def test_an_output_under_a_file_is_refused_naming_the_file(tmp_path: Path, samples: Path, pool: Path) -> None:
    before = snapshot(tmp_path)
    code, _out, err = relearn("import", "codex", samples / CODEX, "-o", pool / "sub" / "p.jsonl")
    assert code == 2 and f"{pool} is a file, not a folder" in one_error_line(err)
    for flag, value in (("--json", pool / "s.json"), ("--plots", pool / "plots")):
        code, out, err = relearn("stats", pool, "--no-cache", flag, value)
        assert code == 2 and f"{flag} {value}: {pool} is a file, not a folder" in one_error_line(err) and out == ""
    assert snapshot(tmp_path) == before


def test_stats_json_and_plots_into_a_read_only_folder(tmp_path: Path, pool: Path) -> None:
    shelf = tmp_path / "shelf"
    shelf.mkdir()
    with read_only(shelf):
        before = snapshot(tmp_path)
        for flag, value in (("--json", shelf / "stats.json"), ("--plots", shelf / "plots")):
            code, out, err = relearn("stats", pool, "--no-cache", flag, value)
            assert code == 2 and "choose a writable place" in one_error_line(err, f"{flag} {value}", str(shelf))
            assert out == ""  # refused before any statistics are computed
        assert snapshot(tmp_path) == before


def test_export_dataset_into_a_read_only_folder(tmp_path: Path, tok) -> None:  # noqa: ANN001
    trajectories, reviews = _pool()
    write_atomic(tmp_path / "pool.jsonl", trajectories)
    dataset = tmp_path / "dataset"
    build_dataset(tmp_path / "pool.jsonl", {r.trajectory_id: r for r in reviews}, tok, "qwen3.6", CompileOptions(), dataset)
    shelf = tmp_path / "shelf"
    shelf.mkdir()
    with read_only(shelf):
        before = snapshot(tmp_path)
        code, _out, err = relearn("export", "dataset", dataset, "--for", "trl", "-o", shelf / "trl")
        assert code == 2 and "choose a writable place" in one_error_line(err, f"-o {shelf / 'trl'}")
        assert snapshot(tmp_path) == before
    # Writable, the same command writes it (the refusal was the folder's, not the dataset's).
    code, _out, err = relearn("export", "dataset", dataset, "--for", "trl", "-o", tmp_path / "trl")
    assert code == 0, err


# ---------------------------------------------------------------- one wording of a cut line


def test_every_reader_locates_a_line_cut_at_column_5001_the_same_way(tmp_path: Path, pool: Path) -> None:
    record = json.loads(pool.read_text())
    record["messages"][0]["content"] = "x" * 8000
    second = json.dumps(dict(record, id="second"))
    cut = tmp_path / "cut.jsonl"
    cut.write_text(pool.read_text() + second[:5000] + "\n")
    expected = f"{cut}:2: invalid JSON: cut short at column 5,001 (the record is truncated)"
    runs = {
        "validate": relearn("validate", cut),
        "review": relearn("review", cut, "-o", tmp_path / "reviews.jsonl", "--reviewer", "heuristic"),
        "stats": relearn("stats", cut, "--no-cache"),
    }
    for verb, (code, _out, err) in runs.items():
        assert code == 1 and expected in [line.strip() for line in err.splitlines()], (verb, err)
    code, out, err = relearn("view", cut, "--print", "-n", "2", "--no-cache")
    assert code == 1 and expected in [line.strip() for line in err.splitlines()], err


def test_a_codex_line_cut_in_half_reads_in_words_and_salvage_names_it_once(tmp_path: Path, samples: Path) -> None:
    lines = (samples / CODEX).read_text().splitlines()
    cut = tmp_path / "rollout.jsonl"
    cut.write_text("\n".join([*lines[:5], lines[5][: len(lines[5]) // 2], *lines[6:]]) + "\n")
    column = len(lines[5]) // 2 + 1
    code, _out, err = relearn("import", "codex", cut, "-o", tmp_path / "pool.jsonl")
    assert code == 1 and f"{cut}:6: invalid JSON: cut short at column {column} (the record is truncated)" in err
    assert "control character" not in err
    code, _out, err = relearn("import", "codex", cut, "-o", tmp_path / "salvaged.jsonl", "--salvage")
    (warning,) = [line for line in err.splitlines() if "skipped (salvage)" in line]
    assert (
        code == 0 and warning.strip() == f"{cut}:6: skipped (salvage): invalid JSON: cut short at column {column} (the record is truncated)"
    )


# ---------------------------------------------------------------- the net under the verbs


def test_the_net_under_the_verbs_and_debug(tmp_path: Path, pool: Path) -> None:
    """An OSError no op foresaw (the reviews file of a read-only folder, opened by the writer)
    is the same one line; --debug (or RELEARN_DEBUG=1) shows its traceback instead."""
    shelf = tmp_path / "shelf"
    shelf.mkdir()
    with read_only(shelf):
        before = snapshot(tmp_path)
        code, _out, err = relearn("review", pool, "-o", shelf / "reviews.jsonl", "--reviewer", "heuristic")
        assert code == 2 and "choose a place you may use" in one_error_line(err, str(shelf / "reviews.jsonl"))
        result = CliRunner().invoke(app, ["--debug", "review", str(pool), "-o", str(shelf / "reviews.jsonl"), "--reviewer", "heuristic"])
        assert isinstance(result.exception, PermissionError) and "error:" not in result.stderr
        result = CliRunner().invoke(
            app, ["review", str(pool), "-o", str(shelf / "reviews.jsonl"), "--reviewer", "heuristic"], env={"RELEARN_DEBUG": "1"}
        )
        assert isinstance(result.exception, PermissionError)
        assert snapshot(tmp_path) == before


def test_an_unforeseen_error_says_bug_and_an_environment_one_names_its_path(capsys: pytest.CaptureFixture[str]) -> None:
    try:
        {}["missing"]  # noqa: B018
    except KeyError as exc:
        assert report(exc, ["stats", "p.jsonl"]) == 1
    line = one_error_line(capsys.readouterr().err, "this is a bug in relearn (KeyError: 'missing', at ", "--debug")
    assert line.endswith("report it")
    assert report(ValueError("a message\n  of two lines"), []) == 1
    one_error_line(capsys.readouterr().err, "(ValueError: a message of two lines)")
    try:
        b"\xff".decode("utf-8")
    except UnicodeDecodeError as exc:
        assert report(exc, []) == 2  # an input problem, though it names no file: --debug shows which
    assert "not UTF-8 text (invalid start byte at byte 0); run again with --debug" in one_error_line(capsys.readouterr().err)
    assert report(PermissionError(13, "Permission denied", "/data/out.json"), []) == 2
    assert one_error_line(capsys.readouterr().err) == (
        "error: /data/out.json: permission denied; choose a place you may use, or change its permissions"
    )
    # Ctrl-C in any other verb: the command that goes on, quoted as the shell takes it back.
    assert report(KeyboardInterrupt(), ["collect", "-t", "mini", "-o", "runs/my run"]) == 130
    assert one_error_line(capsys.readouterr().err).endswith("resumes where it stopped): relearn collect -t mini -o 'runs/my run'")


def test_other_packages_warnings_and_logs_go_to_the_log_file_not_the_terminal(tmp_path: Path) -> None:
    script = (
        "import logging, os, warnings\n"
        "from relearn.cli.logs import route_third_party_output\n"
        "route_third_party_output()\n"
        "warnings.warn('a deprecated argument')\n"
        "logging.getLogger('deepspeed.runtime').warning('ZeRO stage 3 enabled')\n"
        "print(os.environ['HF_HUB_DISABLE_PROGRESS_BARS'], os.environ['TRANSFORMERS_VERBOSITY'])\n"
    )
    log = tmp_path / "logs" / "relearn.log"
    env = {**os.environ, "RELEARN_LOG": str(log), "TRANSFORMERS_VERBOSITY": "info"}
    env.pop("HF_HUB_DISABLE_PROGRESS_BARS", None)
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert done.stdout.split() == ["1", "info"]  # a user's own setting wins
    text = log.read_text()
    assert "py.warnings WARNING" in text and "a deprecated argument" in text and "deepspeed.runtime WARNING ZeRO stage 3 enabled" in text
    unwritable = {**env, "RELEARN_LOG": "/proc/no/such/relearn.log"}
    done = subprocess.run([sys.executable, "-c", script], env=unwritable, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stderr == "", done.stderr  # the log is lost, the command is not


def test_ctrl_c_while_relearn_starts_is_one_line_and_exit_130(relearn_bin: str) -> None:
    # The verbs take about a second to import; Ctrl-C lands in that second at some delay.
    # Earlier than Python's own start, the process just dies of SIGINT (no output at all).
    started_up = 0
    for delay in (0.15, 0.3, 0.6):
        process = subprocess.Popen(
            ["env", "--default-signal=INT", relearn_bin, "stats", "--help"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        time.sleep(delay)
        process.send_signal(signal.SIGINT)
        _stdout, stderr = process.communicate(timeout=60)
        assert "Traceback" not in stderr, stderr
        if process.returncode == -signal.SIGINT:
            assert stderr == ""
            continue
        assert process.returncode in (0, 130), (process.returncode, stderr)
        if process.returncode == 130:
            line = one_error_line(stderr, "interrupted (Ctrl-C)")
            started_up += "while relearn was starting" in line
    assert started_up, "no delay landed in the start-up imports"


def test_ctrl_c_during_an_import_says_what_was_kept_and_how_to_resume(relearn_bin: str, tmp_path: Path, samples: Path) -> None:
    # The second input is a FIFO nobody writes to: the import holds there, after the first
    # file's trajectory is in the pool, until Ctrl-C.
    fifo = tmp_path / "held.jsonl"
    os.mkfifo(fifo)
    out = tmp_path / "pool.jsonl"
    command = [relearn_bin, "import", "codex", str(samples / CODEX), str(fifo), "-o", str(out)]
    # With SIGINT's default action restored: a suite started as a background job of a shell
    # without job control inherits SIGINT ignored, and Python then never turns it into
    # KeyboardInterrupt (the import would wait on the FIFO for ever, as the user asked).
    process = subprocess.Popen(["env", "--default-signal=INT", *command], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not (out.exists() and out.read_bytes().endswith(b"\n")):
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()
        time.sleep(0.05)
    process.send_signal(signal.SIGINT)
    _stdout, stderr = process.communicate(timeout=60)
    assert process.returncode == 130
    line = one_error_line(stderr, f"1 trajectory was added to {out}, each whole")
    assert line.endswith(f"to resume, run the same command again: relearn import codex {samples / CODEX} {fifo} -o {out}")
    assert len(out.read_bytes().splitlines()) == 1 and json.loads(out.read_text())["id"]
