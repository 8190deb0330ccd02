"""Getting images onto the engine: pulled from the user's registry, or loaded from tarballs.

A pull reports progress (bytes of the layers), retries what may pass (a registry that
does not answer, 5xx, 429, a connection cut short) with backoff, and never retries what
will not (no such image or tag, no access, a malformed name). Either way the error names
the image, the registry and the registry's own answer.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import docker
from docker.utils import parse_repository_tag

# Registry answers that another try will not change.
PERMANENT = (
    "manifest unknown",
    "not found",
    "pull access denied",
    "unauthorized",
    "denied",
    "invalid reference format",
    "repository name must",
    "no matching manifest",
)
ARCHIVE_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.xz", ".tar.bz2", ".tar.zst")


class PullError(RuntimeError):
    pass


def registry_of(image: str) -> str:
    """The registry host an image name points at (Docker's rule: a first component with a
    dot, a port or ``localhost`` is a host; otherwise Docker Hub)."""
    first, _, rest = image.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        return first
    return "docker.io"


@dataclass
class PullProgress:
    """Bytes downloaded over the layers the registry announced so far."""

    image: str
    layers: dict[str, tuple[int, int]] = field(default_factory=dict)  # layer -> (current, total)
    status: str = ""

    @property
    def current(self) -> int:
        return sum(current for current, _total in self.layers.values())

    @property
    def total(self) -> int:
        return sum(total for _current, total in self.layers.values())


def pull_image(
    client: docker.DockerClient,
    image: str,
    *,
    tries: int = 4,
    backoff_s: float = 2.0,
    on_progress: Callable[[PullProgress], None] | None = None,
    log: Callable[[str], None] = lambda _m: None,
) -> str:
    """Pull ``image`` (tag ``latest`` when it names none); returns its id. PullError when
    the registry refuses it or every try failed."""
    repository, tag = parse_repository_tag(image)
    registry = registry_of(image)
    answer = ""
    for attempt in range(1, max(1, tries) + 1):
        progress = PullProgress(image)
        try:
            for event in client.api.pull(repository, tag=tag or "latest", stream=True, decode=True):
                if "error" in event:
                    raise _StreamError(str(event.get("errorDetail", {}).get("message") or event["error"]))
                _advance(progress, event)
                if on_progress:
                    on_progress(progress)
            return client.images.get(image).id
        except (_StreamError, docker.errors.APIError, docker.errors.ImageNotFound, ConnectionError) as exc:
            answer = _answer(exc)
        except Exception as exc:  # requests' own connection and read errors
            answer = f"{type(exc).__name__}: {exc}"
        if _permanent(answer) or attempt == tries:
            break
        wait = backoff_s * 2 ** (attempt - 1)
        log(f"pulling {image} from {registry} failed ({answer}); try {attempt + 1} of {tries} in {wait:g} s")
        time.sleep(wait)
    tried = "" if _permanent(answer) else f" after {tries} tries"
    raise PullError(f"pulling {image} from {registry} failed{tried}: the registry answered: {answer}")


class _StreamError(Exception):
    """An error the engine reports inside the pull's event stream."""


def _advance(progress: PullProgress, event: dict[str, object]) -> None:
    layer = str(event.get("id") or "")
    progress.status = str(event.get("status") or "")
    detail = event.get("progressDetail")
    if layer and isinstance(detail, dict) and detail.get("total"):
        if progress.status.startswith("Downloading"):
            progress.layers[layer] = (int(detail.get("current") or 0), int(detail["total"]))
    if layer and progress.status in ("Download complete", "Pull complete", "Already exists") and layer in progress.layers:
        total = progress.layers[layer][1]
        progress.layers[layer] = (total, total)


def _answer(exc: Exception) -> str:
    if isinstance(exc, docker.errors.APIError):
        text = exc.explanation if isinstance(exc.explanation, str) and exc.explanation else str(exc)
        status = exc.status_code
        return f"{text} (HTTP {status})" if status and str(status) not in text else text
    return str(exc) or type(exc).__name__


def _permanent(answer: str) -> bool:
    lowered = answer.lower()
    transient = ("500 internal server error" in lowered or "503" in lowered or "502" in lowered or "429" in lowered
                 or "too many requests" in lowered or "timeout" in lowered or "connection refused" in lowered)  # fmt: skip
    return not transient and any(word in lowered for word in PERMANENT)


# --- tarballs -------------------------------------------------------------------------------


def image_archives(path: Path) -> list[Path]:
    """``path`` itself when it is an archive, else the archives in the folder (sorted)."""
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: no such file or directory")
    return sorted(p for p in path.iterdir() if p.is_file() and p.name.endswith(ARCHIVE_SUFFIXES))


def load_archive(client: docker.DockerClient, archive: Path) -> list[str]:
    """``docker load`` of one archive (the engine reads tar, gzip, xz and bzip2 itself; zstd
    is decompressed here, as a stream); returns the tags (or ids) it loaded."""
    if archive.name.endswith(".zst"):
        import zstandard

        with open(archive, "rb") as raw:
            reader = zstandard.ZstdDecompressor().stream_reader(raw)
            loaded = client.images.load(_chunks(reader))
    else:
        with open(archive, "rb") as handle:
            loaded = client.images.load(handle)
    names: list[str] = []
    for image in loaded:
        names.extend(image.tags or [image.short_id])
    return names


def _chunks(reader: object, size: int = 1 << 20) -> Iterator[bytes]:
    while chunk := reader.read(size):  # type: ignore[attr-defined]
        yield chunk
