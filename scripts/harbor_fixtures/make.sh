#!/usr/bin/env bash
# Regenerate tests/fixtures/harbor/: real Harbor job folders written by the real `harbor`
# package (PyPI), run here against local tasks and local scripted model servers.
#
#   bash scripts/harbor_fixtures/make.sh            # all jobs: oracle, terminus-2, codex
#   bash scripts/harbor_fixtures/make.sh codex      # only these jobs (the others are kept)
#
# What it needs (none of it is needed by CI, which only reads the committed fixtures):
# - Docker, and the project's venv (.venv: `make setup`), with the Codex CLI in its cache
#   (`python -m harness.codex_cli.install`, part of set-up) and debootstrap for the base image.
# - Harbor in a Python >= 3.12 venv at $HARBOR_ENV (default /opt/harbor-env/venv) and the
#   Docker Compose v2 plugin at $HARBOR_ENV/../docker-config/cli-plugins/ (Harbor runs
#   `docker compose`). Made on first use when missing: the venv from python3.12/3.13 on PATH
#   or pyenv (`pip install harbor==$HARBOR_VERSION`, from PyPI); the plugin from Debian
#   trixie's docker-compose package (v2), fetched with apt into the same folder. Nothing is
#   installed system-wide.
# - No other network: the task images build FROM a local image (image.py), compose is
#   never asked to pull, and the model servers are on this machine.
#
# What it writes: tests/fixtures/harbor/<job>/ for the jobs oracle, terminus-2 and codex
# (see tests/fixtures/harbor/README.md), copied from $WORK/jobs/ (default
# /work/harbor-gen/jobs/, outside the project, where Harbor wrote them: their absolute
# trial_uri point there). Scratch in $WORK: job configs, server logs, every model request.
#
# How long: about 3 minutes on a 2-core machine once the images exist (measured 3 min 3 s:
# oracle 32 s, terminus-2 75 s, codex 49 s, plus starting the servers); the first run adds
# ~4 minutes for the base image (debootstrap), ~1.5 minutes for the Harbor venv and a few
# seconds for the plugin.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
HARBOR_VERSION="${HARBOR_VERSION:-0.26.0}"
HARBOR_ENV="${HARBOR_ENV:-/opt/harbor-env/venv}"
DOCKER_CONFIG="${DOCKER_CONFIG:-$(dirname "$HARBOR_ENV")/docker-config}"
WORK="${WORK:-/work/harbor-gen}"
export DOCKER_CONFIG

find_python312() {
    for candidate in python3.13 python3.12; do
        if command -v "$candidate" >/dev/null && "$candidate" -c 'import sys' 2>/dev/null; then
            command -v "$candidate"
            return
        fi
    done
    if command -v pyenv >/dev/null; then
        for version in $(pyenv versions --bare | grep -E '^3\.1[2-9]' | sort -rV); do
            echo "$(pyenv root)/versions/$version/bin/python3"
            return
        done
    fi
    echo "no Python >= 3.12 found (Harbor needs one): install python3.12 or set HARBOR_ENV to a venv holding harbor" >&2
    exit 1
}

if [ ! -x "$HARBOR_ENV/bin/harbor" ]; then
    python="$(find_python312)"
    echo "== making $HARBOR_ENV with $python and harbor==$HARBOR_VERSION"
    "$python" -m venv "$HARBOR_ENV"
    "$HARBOR_ENV/bin/pip" install -q "harbor==$HARBOR_VERSION"
fi

if ! docker compose version >/dev/null 2>&1; then
    echo "== fetching Docker Compose v2 (Debian trixie's docker-compose) into $DOCKER_CONFIG/cli-plugins"
    apt_dir="$(dirname "$DOCKER_CONFIG")/apt"
    mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial" "$DOCKER_CONFIG/cli-plugins"
    echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian trixie main" >"$apt_dir/sources.list"
    apt_opts=(-o "Dir::Etc::sourcelist=$apt_dir/sources.list" -o "Dir::Etc::sourceparts=-"
        -o "Dir::State::Lists=$apt_dir/lists" -o "Dir::Cache=$apt_dir/cache" -o "Dir::State::status=/dev/null")
    apt-get "${apt_opts[@]}" update -q
    (cd "$apt_dir" && apt-get "${apt_opts[@]}" download docker-compose)
    dpkg-deb -x "$apt_dir"/docker-compose_*.deb "$apt_dir/root"
    cp "$apt_dir/root/usr/libexec/docker/cli-plugins/docker-compose" "$DOCKER_CONFIG/cli-plugins/"
    docker compose version
fi

cd "$ROOT"
echo "== harbor $("$HARBOR_ENV/bin/harbor" --version), $(docker compose version)"
echo "== task base image"
.venv/bin/python scripts/harbor_fixtures/image.py
echo "== jobs"
only=()
if [ "$#" -gt 0 ]; then only=(--only "$@"); fi
PATH="$HARBOR_ENV/bin:$PATH" python3 scripts/harbor_fixtures/generate.py \
    --harbor "$HARBOR_ENV/bin/harbor" --work "$WORK" --out "$ROOT/tests/fixtures/harbor" "${only[@]}"
du -sh "$ROOT/tests/fixtures/harbor"
