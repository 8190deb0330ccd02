"""Containers on a real Docker engine, for running untrusted commands.

Every container: network off unless asked, CPU/memory/pids limits, all capabilities
dropped but the few a root shell needs to edit a repository, no new privileges, and
labels naming its owner so that ``gc`` finds orphans. Every exec has a timeout that
kills its whole process tree, and its output is capped with a visible marker.
"""

from __future__ import annotations

import io
import os
import select
import shlex
import signal
import socket
import struct
import tarfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker
from docker.models.containers import Container as DockerContainer

from envs.limits import DEFAULT_LIMITS, Limits

LABEL_OWNER = "relearn.owner"
LABEL_RUN = "relearn.run"
LABEL_PID = "relearn.pid"
LABEL_HOST = "relearn.host"
OWNER = "relearn"
# A root shell editing a repository needs these; everything else is dropped.
CAPABILITIES = ["CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID"]
DEFAULT_OUTPUT_CAP = 1 << 20
TRUNCATION_MARKER = "\n[... relearn: {skipped} bytes of output omitted ...]\n"
# After a timeout, how long to wait for the stream to close once everything was killed.
KILL_GRACE_S = 5.0
# How long an exec whose stream ended may take to have its exit code recorded: seconds on
# an engine under load (a 2-core machine running a Ray cluster beside the containers).
EXIT_RECORD_WAIT_S = 120.0
MAIN_PID_FILE = "/run/relearn-main.pid"
# Every process but init, the container's main process and this shell.
KILL_ALL = (
    f"main=$(cat {MAIN_PID_FILE} 2>/dev/null); for d in /proc/[0-9]*; do p=${{d#/proc/}}; "
    '[ "$p" = 1 ] || [ "$p" = "$$" ] || [ "$p" = "$main" ] || kill -KILL "$p" 2>/dev/null; done; true'
)


@dataclass
class CappedBuffer:
    """Keeps the head and the tail of a stream, counting what it skips in between."""

    cap: int
    head: bytearray = field(default_factory=bytearray)
    tail: bytearray = field(default_factory=bytearray)
    total: int = 0

    def add(self, data: bytes) -> None:
        self.total += len(data)
        half = self.cap // 2
        room = half - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail += data
            if len(self.tail) > self.cap - half:
                del self.tail[: len(self.tail) - (self.cap - half)]

    @property
    def truncated(self) -> bool:
        return self.total > len(self.head) + len(self.tail)

    @property
    def omitted(self) -> int:
        return self.total - len(self.head) - len(self.tail)

    def text(self) -> str:
        if not self.truncated:
            return (bytes(self.head) + bytes(self.tail)).decode("utf-8", errors="replace")
        skipped = self.total - len(self.head) - len(self.tail)
        marker = TRUNCATION_MARKER.format(skipped=skipped)
        return bytes(self.head).decode("utf-8", errors="replace") + marker + bytes(self.tail).decode("utf-8", errors="replace")


@dataclass
class ExecResult:
    exit_code: int | None  # None when the command was killed on timeout
    stdout: str
    stderr: str
    output: str  # stdout and stderr interleaved as they arrived
    timed_out: bool
    truncated: bool
    duration_s: float
    omitted_bytes: int = 0  # of the interleaved output, cut from its middle (see CappedBuffer)

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


def client_from_env() -> docker.DockerClient:
    try:
        client = docker.from_env(timeout=300)
        client.ping()
    except docker.errors.DockerException as exc:
        raise RuntimeError(f"no Docker engine answers ({exc}); run `bash scripts/ensure-docker.sh`") from None
    return client


class Container:
    """One running container; use as a context manager so it is always removed."""

    def __init__(self, client: docker.DockerClient, handle: DockerContainer, workdir: str) -> None:
        self.client = client
        self.handle = handle
        self.workdir = workdir
        self.id = handle.id

    @classmethod
    def start(
        cls,
        client: docker.DockerClient,
        image: str,
        *,
        limits: Limits = DEFAULT_LIMITS,
        workdir: str = "/testbed",
        run_label: str = "",
        env: dict[str, str] | None = None,
        network: str | None = None,
    ) -> Container:
        """``network``: attach the container to this Docker network and to no other (an
        internal network whose only other member is a relay, for agents that must reach
        a model gateway and nothing else); overrides ``limits.network``."""
        labels = {
            LABEL_OWNER: OWNER,
            LABEL_RUN: run_label or uuid.uuid4().hex[:12],
            LABEL_PID: str(os.getpid()),
            LABEL_HOST: socket.gethostname(),
        }
        handle = client.containers.run(
            image,
            # The main process records its pid so that kill_all can spare it.
            command=["sh", "-c", f"echo $$ > {MAIN_PID_FILE}; exec sleep infinity"],
            detach=True,
            name=f"relearn-{uuid.uuid4().hex[:12]}",
            labels=labels,
            working_dir=workdir,
            environment=env or {},
            network_mode=network or ("bridge" if limits.network else "none"),
            nano_cpus=int(limits.cpus * 1e9),
            mem_limit=f"{limits.memory_mb}m",
            memswap_limit=f"{limits.memory_mb}m",
            pids_limit=limits.pids,
            cap_drop=["ALL"],
            cap_add=CAPABILITIES,
            security_opt=["no-new-privileges"],
            privileged=False,
            init=True,  # reaps zombies and forwards signals
            stop_signal="SIGKILL",
        )
        return cls(client, handle, workdir)

    def __enter__(self) -> Container:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()

    def remove(self) -> None:
        try:
            self.handle.remove(force=True)
        except docker.errors.NotFound:
            pass

    def exec(
        self,
        command: str | list[str],
        *,
        timeout_s: float = 60.0,
        workdir: str | None = None,
        env: dict[str, str] | None = None,
        output_cap: int = DEFAULT_OUTPUT_CAP,
        stream_cap: int | None = None,
        stdin: bytes | None = None,
        keep_background: bool = False,
    ) -> ExecResult:
        """Run ``command`` (a shell string, or an argv list) with a hard timeout.

        The command runs under ``timeout`` in its own process group, and that group is
        killed when the command ends (``keep_background`` spares background jobs, e.g. a
        server the next command talks to). If the stream has not ended by the deadline,
        every process the execs started is killed, also those that left the group.

        ``output_cap`` bounds the interleaved output, ``stream_cap`` (default: the same)
        each of stdout and stderr apart: a caller that reads only the interleaved output
        can keep much of it without holding three copies.
        """
        argv = ["bash", "-c", command] if isinstance(command, str) else list(command)
        wrapped = ["timeout", "--kill-after=1", "--signal=KILL", f"{max(timeout_s, 0.1):.3f}", *argv]
        api = self.client.api
        exec_id = api.exec_create(
            self.id,
            wrapped,
            stdout=True,
            stderr=True,
            stdin=stdin is not None,
            workdir=workdir or self.workdir,
            environment=env or {},
        )["Id"]
        started = time.monotonic()
        sock = api.exec_start(exec_id, socket=True)
        raw = sock._sock if hasattr(sock, "_sock") else sock
        early = _read_ahead(sock, raw)
        if stdin is not None:
            raw.sendall(stdin)
            raw.shutdown(socket.SHUT_WR)
        streams = output_cap if stream_cap is None else stream_cap
        stdout, stderr, combined = CappedBuffer(streams), CappedBuffer(streams), CappedBuffer(output_cap)
        timed_out, ended = False, False
        try:
            timed_out = not _drain(raw, started + timeout_s + 2.0, stdout, stderr, combined, early=early)
            if timed_out:
                self.kill_all()
                _drain(raw, time.monotonic() + KILL_GRACE_S, stdout, stderr, combined)
            ended = not timed_out
        finally:
            raw.close()
            # An output that ended means an exit on its way; a kill or a broken stream
            # gets the short wait.
            inspect = _finished_exec(api, exec_id, EXIT_RECORD_WAIT_S if ended else KILL_GRACE_S)
            if not keep_background:
                self._kill_group(inspect.get("Pid"))
        if ended and inspect.get("Running"):
            # Not the command's failure: the engine lost track of it. Raised as an engine
            # error so that the batch retries the unit rather than grading it "timed out".
            raise docker.errors.DockerException(
                f"the engine recorded no exit status for exec {exec_id[:12]} {EXIT_RECORD_WAIT_S:g} s after its output ended"
            )
        duration = time.monotonic() - started
        exit_code = inspect.get("ExitCode")
        # timeout(1) exits 137 when it had to KILL the command.
        if exit_code in (124, 137) and duration >= timeout_s:
            timed_out = True
        if timed_out:
            exit_code = None
            combined.add(f"\n[relearn: command timed out after {timeout_s:g} s and was killed]\n".encode())
        return ExecResult(
            exit_code=exit_code,
            stdout=stdout.text(),
            stderr=stderr.text(),
            output=combined.text(),
            timed_out=timed_out,
            truncated=stdout.truncated or stderr.truncated,
            duration_s=duration,
            omitted_bytes=combined.omitted,
        )

    def _kill_group(self, host_pid: int | None) -> None:
        """Kill the process group ``timeout`` led (its pgid is its pid on the host).
        Only possible when the engine runs on this host; elsewhere the group is left
        to the next timeout's kill_all or the container's removal."""
        if not host_pid or not self.client.api.base_url.startswith("http+docker://localhost"):
            return
        for _ in range(2):  # a fork bomb may fork between the two
            try:
                os.killpg(host_pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                return

    def kill_all(self) -> None:
        """Kill every process the execs started, wherever they went (setsid, nohup)."""
        api = self.client.api
        exec_id = api.exec_create(self.id, ["sh", "-c", KILL_ALL], user="root")["Id"]
        api.exec_start(exec_id)

    def sh(self, command: str, *, timeout_s: float = 60.0, check: bool = True, **kwargs: Any) -> ExecResult:
        result = self.exec(command, timeout_s=timeout_s, **kwargs)
        if check and not result.ok:
            raise RuntimeError(f"`{command}` failed in {self.handle.name} (exit {result.exit_code}):\n{result.output[-2000:]}")
        return result

    def put_file(self, path: str, data: bytes | str, mode: int = 0o644) -> None:
        payload = data.encode() if isinstance(data, str) else data
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as archive:
            info = tarfile.TarInfo(name=os.path.basename(path))
            info.size = len(payload)
            info.mode = mode
            info.mtime = int(time.time())
            archive.addfile(info, io.BytesIO(payload))
        directory = os.path.dirname(path) or "/"
        self.sh(f"mkdir -p {shlex.quote(directory)}")
        self.handle.put_archive(directory, buffer.getvalue())

    def put_files(self, files: dict[str, tuple[bytes | str, int]]) -> None:
        """Several files (absolute path -> content and mode) in one copy, folders made as needed."""
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as archive:
            folders: set[str] = set()
            for path, (data, mode) in files.items():
                parts = path.strip("/").split("/")
                for depth in range(1, len(parts)):
                    folder = "/".join(parts[:depth])
                    if folder not in folders:
                        folders.add(folder)
                        entry = tarfile.TarInfo(name=folder)
                        entry.type, entry.mode, entry.mtime = tarfile.DIRTYPE, 0o755, int(time.time())
                        archive.addfile(entry)
                payload = data.encode() if isinstance(data, str) else data
                info = tarfile.TarInfo(name="/".join(parts))
                info.size, info.mode, info.mtime = len(payload), mode, int(time.time())
                archive.addfile(info, io.BytesIO(payload))
        self.handle.put_archive("/", buffer.getvalue())

    def put_dir(self, local: str, remote: str) -> None:
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as archive:
            archive.add(local, arcname=".")
        self.sh(f"mkdir -p {shlex.quote(remote)}")
        self.handle.put_archive(remote, buffer.getvalue())

    def get_file(self, path: str) -> bytes:
        try:
            stream, _stat = self.handle.get_archive(path)
        except docker.errors.NotFound:
            raise FileNotFoundError(path) from None
        with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as archive:
            member = archive.next()
            if member is None or not member.isfile():
                raise IsADirectoryError(path)
            extracted = archive.extractfile(member)
            assert extracted is not None
            return extracted.read()

    def get_files(self, directory: str) -> dict[str, bytes]:
        """Every regular file under ``directory``, by its path relative to it, in one copy."""
        try:
            stream, _stat = self.handle.get_archive(directory)
        except docker.errors.NotFound:
            raise FileNotFoundError(directory) from None
        files: dict[str, bytes] = {}
        with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as archive:
            for member in archive:
                extracted = archive.extractfile(member) if member.isfile() else None
                if extracted is not None:
                    files[member.name.split("/", 1)[1] if "/" in member.name else member.name] = extracted.read()
        return files

    def diff(self, base_commit: str = "HEAD", *, repo: str | None = None) -> str:
        """The repository's changes since ``base_commit``, new, deleted and binary files
        included, without touching the repository's own index. A diff that fails or is cut
        raises: a partial one would be graded."""
        script = (
            "set -e; idx=$(mktemp); trap 'rm -f $idx' EXIT; export GIT_INDEX_FILE=$idx; "
            f"git read-tree {shlex.quote(base_commit)}; git add -A; "
            f"git -c core.quotepath=false diff --cached --binary --no-color --no-ext-diff {shlex.quote(base_commit)}"
        )
        result = self.sh(script, workdir=repo or self.workdir, output_cap=64 << 20)
        if result.truncated:
            raise RuntimeError("the diff of the work directory is over 64 MiB: not kept (a cut patch would be graded)")
        return result.stdout


def _read_ahead(sock: Any, raw: socket.socket) -> bytes:
    """The stream bytes the HTTP client already buffered with the upgrade's headers.

    docker-py hands back the socket under a buffered reader that parsed the response
    headers; a command quick to answer on a busy machine has its first frames in that
    buffer, and reading the socket alone would lose them (an empty ``git diff`` of a
    changed repository). Taken without blocking: the socket is non-blocking meanwhile."""
    try:
        reader = sock._response.raw._fp.fp
    except AttributeError:  # not docker-py's http+docker socket: nothing is buffered
        return b""
    if reader is None:
        return b""
    timeout = raw.gettimeout()
    raw.setblocking(False)
    try:
        ahead = reader.peek(1)  # what is buffered, or one non-blocking read into the buffer
        return reader.read(len(ahead)) if ahead else b""
    except BlockingIOError:
        return b""
    finally:
        raw.settimeout(timeout)


def _finished_exec(api: Any, exec_id: str, wait_s: float) -> dict[str, Any]:
    """The exec's inspection once the engine has recorded its exit (or after ``wait_s``).
    The stream closes when the process's output ends, a moment before the engine stores the
    exit code; an inspection in between says ``Running`` with no code, which would read as
    a failure (a gold patch graded "timed out"): on a loaded engine that moment is seconds."""
    deadline = time.monotonic() + wait_s
    inspect = api.exec_inspect(exec_id)
    pause = 0.01
    while inspect.get("Running") and time.monotonic() < deadline:
        time.sleep(pause)
        pause = min(pause * 2, 0.25)
        inspect = api.exec_inspect(exec_id)
    return inspect


def _drain(raw: socket.socket, deadline: float, *buffers: CappedBuffer, early: bytes = b"") -> bool:
    """Read docker's multiplexed exec stream until it ends (True) or the deadline passes
    (False). Frames are an 8-byte header (stream, 0, 0, 0, length) then the payload;
    ``early`` is the stream's start, already read."""
    stdout, stderr, combined = buffers
    pending = early
    while True:
        while len(pending) >= 8:
            stream, length = pending[0], struct.unpack(">I", pending[4:8])[0]
            if len(pending) < 8 + length:
                break
            payload = pending[8 : 8 + length]
            pending = pending[8 + length :]
            (stderr if stream == 2 else stdout).add(payload)
            combined.add(payload)
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        ready, _, _ = select.select([raw], [], [], min(remaining, 1.0))
        if not ready:
            continue
        chunk = raw.recv(1 << 16)
        if not chunk:
            return True
        pending += chunk


def gc(client: docker.DockerClient, *, everything: bool = False) -> list[str]:
    """Remove relearn's orphaned containers: those whose creating process on this host
    is gone (or all of relearn's containers with ``everything``)."""
    removed = []
    host = socket.gethostname()
    # The bare listing, not ``containers.list`` (which inspects each in turn): other processes'
    # containers come and go meanwhile, and one removed between the two calls is not an error.
    for row in client.api.containers(all=True, filters={"label": f"{LABEL_OWNER}={OWNER}"}):
        labels = row.get("Labels") or {}
        alive = labels.get(LABEL_HOST) == host and pid_alive(labels.get(LABEL_PID, ""))
        if everything or not alive:
            try:
                client.api.remove_container(row["Id"], force=True)
            except docker.errors.NotFound:
                continue  # gone meanwhile
            except docker.errors.APIError as exc:
                if exc.status_code == 409:
                    continue  # its owner is removing it already
                raise
            removed.append(row["Names"][0].lstrip("/") if row.get("Names") else row["Id"][:12])
    return removed


def pid_alive(pid: str) -> bool:
    try:
        os.kill(int(pid), 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:
        return True
    # A killed process its parent has not reaped yet (a Ray worker cancelled with force, just
    # before the driver's sweep) still answers signal 0, but it is dead: a zombie.
    try:
        return Path(f"/proc/{int(pid)}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def owned_containers(client: docker.DockerClient, run_label: str | None = None) -> list[DockerContainer]:
    filters = [f"{LABEL_OWNER}={OWNER}"] + ([f"{LABEL_RUN}={run_label}"] if run_label else [])
    return client.containers.list(all=True, filters={"label": filters})
