"""Build the local image every fixture task starts FROM (see make.sh), offline.

    .venv/bin/python scripts/harbor_fixtures/image.py

The project's own base (a debootstrap of Debian bookworm, ``envs.images.build_base``) with
tmux and asciinema added for Harbor's terminus-2 agent (it would otherwise try to install
them), ripgrep, and the pinned Codex CLI binary (``harness.codex_cli.install``) on PATH, so
Harbor's codex agent finds it and skips its npm install. Tagged ``TAG``, the name the task
Dockerfiles use; docker's layer cache makes a rerun instant.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import docker

from envs.images import BASE_PACKAGES, build_base
from harness.codex_cli import install as codex_install

TAG = "relearn/harbor-fixtures:task-base"
EXTRA_PACKAGES = ["tmux", "asciinema", "ripgrep"]


def build() -> str:
    client = docker.from_env()
    base = build_base(client, packages=BASE_PACKAGES + EXTRA_PACKAGES)
    codex = codex_install.install(log=print)
    with tempfile.TemporaryDirectory(prefix="harbor-fixture-image-") as tmp:
        context = Path(tmp)
        try:  # the binary is 300 MB: a hard link when the cache is on the same disk
            os.link(codex.binary, context / "codex")
        except OSError:
            shutil.copy2(codex.binary, context / "codex")
        (context / "Dockerfile").write_text(
            f"FROM {base}\n"
            "COPY codex /usr/local/bin/codex\n"
            f'LABEL org.relearn.harbor-fixtures.base="{base}" org.relearn.harbor-fixtures.codex="{codex.version}"\n'
        )
        subprocess.run(["docker", "build", "-q", "-t", TAG, str(context)], check=True)
    print(f"{TAG}: {base} + codex-cli {codex.version}")
    return TAG


if __name__ == "__main__":
    build()
