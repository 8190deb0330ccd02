#!/usr/bin/env bash
# Make sure a Docker engine answers: install Debian's docker.io (and debootstrap, which
# builds our base image without a registry) when missing, and start dockerd when no
# daemon is running. Idempotent; the stages that run containers need it.
set -euo pipefail

if docker info >/dev/null 2>&1; then
    exit 0
fi
if ! command -v dockerd >/dev/null 2>&1 || ! command -v debootstrap >/dev/null 2>&1; then
    echo "installing docker.io and debootstrap" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq docker.io debootstrap >/dev/null
fi
if ! pgrep -x dockerd >/dev/null 2>&1; then
    echo "starting dockerd (log: /var/log/dockerd.log)" >&2
    nohup dockerd >/var/log/dockerd.log 2>&1 &
fi
for _ in $(seq 1 60); do
    if docker info >/dev/null 2>&1; then
        exit 0
    fi
    sleep 1
done
echo "error: the Docker engine did not answer within 60 s; see /var/log/dockerd.log" >&2
tail -n 20 /var/log/dockerd.log >&2 || true
exit 1
