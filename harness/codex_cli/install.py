"""The Codex CLI binary: fetched once from the npm registry, verified, cached.

    python -m harness.codex_cli.install        # what `make` set-up runs; instant when cached

The pinned version and the sha512 the registry publishes for its Linux x64 package live
here and nowhere else. The package (about 170 MB) holds a static musl binary; we keep
that binary, ripgrep (Codex's search tool of choice, which its npm launcher puts on
PATH) and the model catalog the binary ships, under
``~/.cache/relearn/codex/<version>/`` (``$RELEARN_CACHE/codex/<version>/`` when set).

The tarball comes from ``npm pack`` when npm is installed, else straight from the
registry over HTTPS; either way its sha512 must equal the pinned integrity before
anything is unpacked. The cached binary is checked against the sha256 recorded at
install each time it is loaded, so a truncated or replaced file is never run.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CODEX_VERSION = "0.171.0"
PACKAGE = "@openai/codex"
PLATFORM = "linux-x64"  # the npm dist-tag suffix of the platform package
TARGET = "x86_64-unknown-linux-musl"
# `dist.integrity` of @openai/codex@<version>-linux-x64 on registry.npmjs.org.
INTEGRITY: dict[str, str] = {
    "0.171.0": "sha512-l66NZkQgdk2C3pbcfULDz42yEUB581MVA6I+Y43Wp4OIqEy73HCdmZ0GTjeAHY2ycuH4N00d9VsLrwT1jxshTw==",
}
# The bundled catalog entry our own model entry is made from: the newest one that still
# offers the classic tool set (exec_command, write_stdin, apply_patch, update_plan)
# rather than "code mode" only.
CATALOG_TEMPLATE = "gpt-5.5"
DEFAULT_REGISTRY = "https://registry.npmjs.org"
# What we keep from the package: path inside package/vendor/<TARGET>/ -> cache name.
MEMBERS = {"bin/codex": "codex", "codex-path/rg": "rg"}
INSTALL_RECORD = "install.json"
LAYOUT = 1  # bump when the cache folder's layout changes


class InstallError(RuntimeError):
    pass


@dataclass(frozen=True)
class CodexInstall:
    version: str
    folder: Path
    integrity: str  # of the npm tarball it came from
    pinned: bool  # the integrity was checked against a pinned value, not the registry's word
    sha256: dict[str, str]  # of each cached file

    @property
    def binary(self) -> Path:
        return self.folder / "codex"

    @property
    def rg(self) -> Path:
        return self.folder / "rg"

    @property
    def version_string(self) -> str:
        return f"codex-cli {self.version}"

    def bundled_models(self) -> list[dict[str, Any]]:
        return json.loads((self.folder / "models-bundled.json").read_text())["models"]

    def catalog_template(self) -> dict[str, Any]:
        for model in self.bundled_models():
            if model.get("slug") == CATALOG_TEMPLATE:
                return model
        raise InstallError(
            f"{self.folder / 'models-bundled.json'}: no catalog entry {CATALOG_TEMPLATE!r} in codex {self.version}'s bundled models"
        )


def cache_root() -> Path:
    env = os.environ.get("RELEARN_CACHE")
    return (Path(env) if env else Path.home() / ".cache" / "relearn") / "codex"


def install(
    version: str = CODEX_VERSION,
    *,
    integrity: str | None = None,
    registry: str | None = None,
    cache: Path | None = None,
    use_npm: bool | None = None,
    log: Callable[[str], None] = lambda _m: None,
) -> CodexInstall:
    """The cached install of ``version``, fetching and verifying it first if needed.

    ``integrity`` defaults to the pinned value for ``version``; a version with no pinned
    value is accepted on the registry's integrity and marked ``pinned=False``.
    ``use_npm``: None uses npm when it is on PATH, else HTTPS.
    """
    root = Path(cache) if cache is not None else cache_root()
    folder = root / version
    expected = integrity or INTEGRITY.get(version)
    root.mkdir(parents=True, exist_ok=True)
    with _locked(root / f".{version}.lock"):
        if (folder / INSTALL_RECORD).is_file():
            return load(folder)
        if folder.exists():  # a half-written folder from an older layout or a crash
            shutil.rmtree(folder)
        staging = Path(tempfile.mkdtemp(prefix=f".{version}.", dir=root))
        try:
            record = _fetch_and_unpack(version, expected, registry or _registry(), staging, use_npm, log)
            (staging / INSTALL_RECORD).write_text(json.dumps(record, indent=1, sort_keys=True))
            staging.chmod(0o755)
            staging.rename(folder)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    log(f"codex-cli {version} installed in {folder}")
    return load(folder)


def installed(version: str = CODEX_VERSION, cache: Path | None = None) -> CodexInstall:
    """The cached install, never a download: what runs use (set-up fetched it)."""
    folder = (Path(cache) if cache is not None else cache_root()) / version
    if not (folder / INSTALL_RECORD).is_file():
        raise InstallError(
            f"codex-cli {version} is not installed in {folder}; run `python -m harness.codex_cli.install` (part of `make setup`)"
        )
    return load(folder)


def load(folder: Path) -> CodexInstall:
    """A cached install, after checking each file against the sha256 recorded at install."""
    path = folder / INSTALL_RECORD
    try:
        record = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise InstallError(
            f"{path}: unreadable install record ({exc}); delete {folder} and run `python -m harness.codex_cli.install`"
        ) from None
    if record.get("layout") != LAYOUT:
        raise InstallError(f"{path}: layout {record.get('layout')!r}, this relearn writes {LAYOUT}; delete {folder} and install again")
    for name, digest in record["sha256"].items():
        actual = _sha256(folder / name) if (folder / name).is_file() else "missing"
        if actual != digest:
            raise InstallError(
                f"{folder / name}: sha256 {actual} differs from {digest} recorded at install ({path}); delete {folder} and install again"
            )
    return CodexInstall(
        version=record["version"], folder=folder, integrity=record["integrity"], pinned=record["pinned"], sha256=record["sha256"]
    )


def _fetch_and_unpack(
    version: str, expected: str | None, registry: str, staging: Path, use_npm: bool | None, log: Callable[[str], None]
) -> dict[str, Any]:
    spec = f"{PACKAGE}@{version}-{PLATFORM}"
    download = staging / "download"
    download.mkdir()
    npm = shutil.which("npm") if use_npm is not False else None
    if use_npm and npm is None:
        raise InstallError("npm is not on PATH (use_npm=True)")
    started = time.monotonic()
    if npm:
        log(f"fetching {spec} with npm pack from {registry}")
        tarball, reported = _npm_pack(npm, spec, registry, download)
    else:
        log(f"fetching {spec} over HTTPS from {registry}")
        tarball, reported = _http_fetch(spec, version, registry, download)
    actual = _integrity(tarball)
    if expected is not None and actual != expected:
        raise InstallError(
            f"{spec}: the tarball's integrity {actual} differs from the pinned {expected} (harness/codex_cli/install.py INTEGRITY); refusing to install it"
        )
    if reported and reported != actual:
        raise InstallError(f"{spec}: the tarball's integrity {actual} differs from the registry's {reported}")
    if expected is None:
        log(f"warning: {spec} has no pinned integrity; accepted on the registry's {actual}")
    log(f"fetched {tarball.stat().st_size / 1e6:.0f} MB in {time.monotonic() - started:.0f} s; integrity verified")
    digests = _unpack(tarball, staging)
    shutil.rmtree(download)
    _check_binary(staging, version)
    return {
        "layout": LAYOUT,
        "version": version,
        "package": spec,
        "integrity": actual,
        "pinned": expected is not None,
        "sha256": digests,
        "registry": registry,
    }


def _registry() -> str:
    return (os.environ.get("npm_config_registry") or os.environ.get("NPM_CONFIG_REGISTRY") or DEFAULT_REGISTRY).rstrip("/")


def _npm_pack(npm: str, spec: str, registry: str, destination: Path) -> tuple[Path, str | None]:
    command = [npm, "pack", spec, "--json", "--pack-destination", str(destination), "--registry", registry]
    # npm writes its own cache under $HOME; a private one keeps a shared home clean and
    # lets npm verify what it downloads without trusting an older cache entry.
    env = {**os.environ, "npm_config_cache": str(destination / ".npm"), "npm_config_update_notifier": "false"}
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=1800)
    if result.returncode != 0:
        raise InstallError(f"`{' '.join(command)}` failed (exit {result.returncode}):\n{result.stderr[-2000:]}")
    try:
        info = json.loads(result.stdout)[0]
        tarball = destination / info["filename"]
    except (json.JSONDecodeError, IndexError, KeyError, TypeError):
        raise InstallError(f"`npm pack` printed no package description:\n{result.stdout[-1000:]}") from None
    if not tarball.is_file():
        raise InstallError(f"`npm pack` reported {tarball}, which does not exist")
    return tarball, info.get("integrity")


def _http_fetch(spec: str, version: str, registry: str, destination: Path) -> tuple[Path, str | None]:
    url = f"{registry}/{urllib.parse.quote(PACKAGE, safe='@')}/{version}-{PLATFORM}"
    try:
        with urllib.request.urlopen(url, timeout=60) as response:  # noqa: S310 (a configured registry URL)
            meta = json.load(response)
        dist = meta["dist"]
        tarball_url = dist["tarball"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InstallError(f"{url}: no package description for {spec} ({exc})") from None
    tarball = destination / f"codex-{version}-{PLATFORM}.tgz"
    try:
        with urllib.request.urlopen(tarball_url, timeout=600) as response, tarball.open("wb") as out:  # noqa: S310
            shutil.copyfileobj(response, out, 1 << 20)
    except OSError as exc:
        raise InstallError(f"{tarball_url}: download failed ({exc})") from None
    return tarball, dist.get("integrity")


def _unpack(tarball: Path, staging: Path) -> dict[str, str]:
    """Only the members we keep, each a regular file, written under our own names."""
    prefix = f"package/vendor/{TARGET}/"
    wanted = {prefix + inside: name for inside, name in MEMBERS.items()}
    digests: dict[str, str] = {}
    try:
        with tarfile.open(tarball, "r:gz") as archive:
            for member in archive:
                name = wanted.get(member.name)
                if name is None:
                    continue
                if not member.isfile():
                    raise InstallError(f"{tarball}: {member.name} is not a regular file")
                source = archive.extractfile(member)
                assert source is not None
                target = staging / name
                with target.open("wb") as out:
                    shutil.copyfileobj(source, out, 1 << 20)
                target.chmod(0o755)
                digests[name] = _sha256(target)
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise InstallError(f"{tarball}: not a readable package tarball ({exc})") from None
    missing = sorted(path for path, name in wanted.items() if name not in digests)
    if missing:
        raise InstallError(f"{tarball}: the package has no {', '.join(missing)}")
    return digests


def _check_binary(staging: Path, version: str) -> None:
    """The binary runs here, says the version we asked for, and ships the catalog entry
    our model entry is built from."""
    home = staging / "probe-home"
    home.mkdir()
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "CODEX_HOME": str(home)}
    try:
        said = subprocess.run([str(staging / "codex"), "--version"], capture_output=True, text=True, env=env, timeout=60)
        models = subprocess.run(
            [str(staging / "codex"), "debug", "models", "--bundled"], capture_output=True, text=True, env=env, timeout=60
        )
    except OSError as exc:
        raise InstallError(f"{staging / 'codex'} does not run on this machine ({exc})") from None
    finally:
        shutil.rmtree(home, ignore_errors=True)
    if said.returncode != 0 or said.stdout.strip() != f"codex-cli {version}":
        raise InstallError(
            f"{staging / 'codex'} --version said {said.stdout.strip() or said.stderr.strip()!r}, expected 'codex-cli {version}'"
        )
    try:
        catalog = json.loads(models.stdout)
        slugs = [m["slug"] for m in catalog["models"]]
    except (json.JSONDecodeError, KeyError, TypeError):
        raise InstallError(f"`codex debug models --bundled` printed no model catalog:\n{models.stderr[-1000:]}") from None
    if CATALOG_TEMPLATE not in slugs:
        raise InstallError(
            f"codex {version} ships no catalog entry {CATALOG_TEMPLATE!r} (has {slugs}); update CATALOG_TEMPLATE in harness/codex_cli/install.py"
        )
    (staging / "models-bundled.json").write_text(models.stdout)


def _integrity(path: Path) -> str:
    digest = hashlib.sha512()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return "sha512-" + base64.b64encode(digest.digest()).decode()


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Two set-ups (or test sessions) at once fetch once: the second waits, then finds the cache."""
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Fetch, verify and cache the pinned Codex CLI binary (idempotent).")
    parser.add_argument("--version", default=CODEX_VERSION, help=f"Codex version (default: the pinned {CODEX_VERSION})")
    parser.add_argument("--cache", type=Path, default=None, help=f"cache folder (default: {cache_root()})")
    args = parser.parse_args(argv)
    try:
        done = install(args.version, cache=args.cache, log=lambda m: print(m, file=sys.stderr))
    except InstallError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"{done.version_string}: {done.binary}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
