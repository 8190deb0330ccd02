"""The one route out of a Codex container: an internal Docker network whose only other
member is a relay to the gateway's Unix socket on the host.

Why not let the container reach a gateway on the host's bridge address: on an internal
network the host still owns the bridge's gateway address, and a packet from the
container to any of the host's addresses (that one, docker0's, eth0's) takes the host's
INPUT path, not the FORWARD chain that "internal" filters, so every service the host
listens on with 0.0.0.0 would be reachable (Docker 20.10, checked). So the bridge gets
no host address at all (``com.docker.network.bridge.inhibit_ipv4``): the container's
default route points at an address nobody has, every connect outside the subnet fails
with "no route to host", and the only peer is the relay. The relay has no network of its
own beyond that bridge; it reaches the gateway through a bind-mounted Unix socket, runs
as nobody with a read-only root, no capabilities and small limits, and carries
relearn's labels so that ``relearn envs gc`` removes it after a crash.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import docker
from docker.models.containers import Container as DockerContainer
from docker.models.networks import Network

from envs.docker_backend import LABEL_HOST, LABEL_OWNER, LABEL_PID, LABEL_RUN, OWNER, pid_alive

INHIBIT_IPV4 = "com.docker.network.bridge.inhibit_ipv4"
RELAY_PORT = 8080
SOCKET_MOUNT = "/gateway"
READY_LINE = "relay listening"

# TCP on RELAY_PORT <-> the gateway's Unix socket, byte for byte, both directions; a
# half-close is passed on so HTTP bodies are never cut short. Runs on python3 in the base
# image.
RELAY = r"""
import socket, sys, threading
path, port = sys.argv[1], int(sys.argv[2])

def pump(src, dst):
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    try:
        dst.shutdown(socket.SHUT_WR)
    except OSError:
        pass

def serve(client):
    upstream = socket.socket(socket.AF_UNIX)
    try:
        upstream.connect(path)
    except OSError:
        client.close()
        return
    back = threading.Thread(target=pump, args=(upstream, client), daemon=True)
    back.start()
    pump(client, upstream)
    back.join()
    client.close()
    upstream.close()

server = socket.create_server(("0.0.0.0", port), backlog=64)
print("relay listening", flush=True)
while True:
    client, _ = server.accept()
    threading.Thread(target=serve, args=(client,), daemon=True).start()
"""


@dataclass
class Route:
    """An internal network with a relay on it; attach the agent container to
    ``network_name`` and point Codex at ``base_url``."""

    client: docker.DockerClient
    network: Network
    relay: DockerContainer
    address: str
    port: int = RELAY_PORT

    @property
    def network_name(self) -> str:
        return self.network.name

    @property
    def base_url(self) -> str:
        return f"http://{self.address}:{self.port}/v1"

    def close(self) -> None:
        """Remove the relay, then the network (which Docker refuses while a container is
        still attached, so the agent container must be gone first)."""
        try:
            self.relay.remove(force=True)
        except docker.errors.NotFound:
            pass
        for attempt in range(5):
            try:
                self.network.remove()
                return
            except docker.errors.NotFound:
                return
            except docker.errors.APIError:
                if attempt == 4:
                    raise
                time.sleep(0.2 * (attempt + 1))

    def __enter__(self) -> Route:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def labels(run_label: str = "") -> dict[str, str]:
    return {
        LABEL_OWNER: OWNER,
        LABEL_RUN: run_label or uuid.uuid4().hex[:12],
        LABEL_PID: str(os.getpid()),
        LABEL_HOST: socket.gethostname(),
    }


def open_route(client: docker.DockerClient, image: str, socket_path: Path, *, ready_timeout_s: float = 30.0) -> Route:
    """Create the network and start the relay to ``socket_path`` (a Unix socket the
    gateway listens on, alone in its folder: the folder is what gets mounted)."""
    if not client.api.base_url.startswith("http+docker://localhost"):
        raise RuntimeError(
            f"the codex-cli agent needs the Docker engine on this host (it bind-mounts the gateway's socket); DOCKER_HOST points at {client.api.base_url}"
        )
    tag = uuid.uuid4().hex[:12]
    marks = labels()
    network = client.networks.create(f"relearn-codex-{tag}", driver="bridge", internal=True, options={INHIBIT_IPV4: "true"}, labels=marks)
    relay: DockerContainer | None = None
    try:
        socket_path.parent.chmod(0o755)  # the relay runs as nobody
        relay = client.containers.run(
            image,
            ["python3", "-c", RELAY, f"{SOCKET_MOUNT}/{socket_path.name}", str(RELAY_PORT)],
            detach=True,
            name=f"relearn-relay-{tag}",
            labels=marks,
            network=network.name,
            volumes={str(socket_path.parent): {"bind": SOCKET_MOUNT, "mode": "rw"}},
            user="65534:65534",
            read_only=True,
            cap_drop=["ALL"],
            security_opt=["no-new-privileges"],
            mem_limit="128m",
            pids_limit=128,
            nano_cpus=int(0.5e9),
            init=True,
            stop_signal="SIGKILL",
        )
        deadline = time.monotonic() + ready_timeout_s
        while READY_LINE not in relay.logs().decode(errors="replace"):
            relay.reload()
            if relay.status not in ("created", "running") or time.monotonic() > deadline:
                raise RuntimeError(f"the gateway relay did not start ({relay.status}): {relay.logs().decode(errors='replace')[-1000:]}")
            time.sleep(0.02)
        relay.reload()
        address = relay.attrs["NetworkSettings"]["Networks"][network.name]["IPAddress"]
        return Route(client, network, relay, address)
    except BaseException:
        if relay is not None:
            relay.remove(force=True)
        network.remove()
        raise


def sweep_networks(client: docker.DockerClient, *, everything: bool = False) -> list[str]:
    """Remove relearn's networks whose creating process on this host is gone (run after
    ``docker_backend.gc`` removed their containers). Docker has a few dozen address
    pools for bridges, so leaked networks would soon stop new episodes."""
    removed = []
    host = socket.gethostname()
    for network in client.networks.list(filters={"label": f"{LABEL_OWNER}={OWNER}"}):
        marks = network.attrs.get("Labels") or {}
        alive = marks.get(LABEL_HOST) == host and pid_alive(marks.get(LABEL_PID, ""))
        if everything or not alive:
            try:
                network.remove()
                removed.append(network.name)
            except docker.errors.APIError:
                pass  # still has a container attached; the next sweep gets it
    return removed

    return True
