"""A Docker registry (distribution API v2, the read half) on 127.0.0.1, serving images
taken from the local engine with ``docker save``: what `--pull` talks to in the tests,
since no real registry is reachable here. The engine treats 127.0.0.0/8 as an insecure
registry, so plain HTTP works without configuration.

``fail_manifests`` answers that many manifest requests with 500 first (a registry having
a bad moment), to show that a pull retries; unknown names get the registry's own 404
``MANIFEST_UNKNOWN``.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import re
import tarfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import docker

MANIFEST_TYPE = "application/vnd.docker.distribution.manifest.v2+json"


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


class Registry:
    def __init__(self) -> None:
        self.manifests: dict[tuple[str, str], bytes] = {}
        self.blobs: dict[str, bytes] = {}
        self.fail_manifests = 0
        self.manifest_requests = 0
        self.chunk_delay_s = 0.0
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> Registry:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def add_image(self, client: docker.DockerClient, local: str, name: str, tag: str) -> None:
        """Serve the local image ``local`` as ``name:tag``."""
        saved = b"".join(client.images.get(local).save())
        with tarfile.open(fileobj=io.BytesIO(saved)) as archive:
            index = json.loads(archive.extractfile("manifest.json").read())[0]  # type: ignore[union-attr]
            config = archive.extractfile(index["Config"]).read()  # type: ignore[union-attr]
            layers = [gzip.compress(archive.extractfile(layer).read(), mtime=0) for layer in index["Layers"]]  # type: ignore[union-attr]
        for blob in (config, *layers):
            self.blobs[_digest(blob)] = blob
        manifest = {
            "schemaVersion": 2,
            "mediaType": MANIFEST_TYPE,
            "config": {"mediaType": "application/vnd.docker.container.image.v1+json", "size": len(config), "digest": _digest(config)},
            "layers": [
                {"mediaType": "application/vnd.docker.image.rootfs.diff.tar.gzip", "size": len(b), "digest": _digest(b)} for b in layers
            ],
        }
        body = json.dumps(manifest).encode()
        self.manifests[(name, tag)] = body
        self.manifests[(name, _digest(body))] = body  # the engine asks by digest after the tag

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        registry = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_args: object) -> None:
                pass

            def _send(
                self, status: int, body: bytes, content_type: str = "application/json", headers: dict[str, str] | None = None
            ) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Docker-Distribution-API-Version", "registry/2.0")
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                self.end_headers()
                if self.command == "HEAD":
                    return
                for start in range(0, len(body), 1 << 18):
                    self.wfile.write(body[start : start + (1 << 18)])
                    if registry.chunk_delay_s:
                        time.sleep(registry.chunk_delay_s)

            def _error(self, status: int, code: str, message: str) -> None:
                self._send(status, json.dumps({"errors": [{"code": code, "message": message}]}).encode())

            def do_HEAD(self) -> None:  # noqa: N802
                self.do_GET()

            def do_GET(self) -> None:  # noqa: N802
                if self.path.rstrip("/") == "/v2":
                    self._send(200, b"{}")
                    return
                manifest = re.match(r"^/v2/(.+)/manifests/([^/]+)$", self.path)
                if manifest:
                    registry.manifest_requests += 1
                    if registry.fail_manifests > 0:
                        registry.fail_manifests -= 1
                        self._send(500, b"internal error", "text/plain")
                        return
                    body = registry.manifests.get((manifest.group(1), manifest.group(2)))
                    if body is None:
                        self._error(404, "MANIFEST_UNKNOWN", "manifest unknown")
                        return
                    self._send(200, body, MANIFEST_TYPE, {"Docker-Content-Digest": _digest(body)})
                    return
                blob = re.match(r"^/v2/(.+)/blobs/(sha256:[0-9a-f]{64})$", self.path)
                if blob and blob.group(2) in registry.blobs:
                    data = registry.blobs[blob.group(2)]
                    self._send(200, data, "application/octet-stream", {"Docker-Content-Digest": blob.group(2)})
                    return
                self._error(404, "BLOB_UNKNOWN", "blob unknown to registry")

        return Handler
