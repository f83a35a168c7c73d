#!/usr/bin/env bash
# Make sure a Docker engine answers. Uses one that does; otherwise, as root on Debian,
# installs docker.io (and busybox-static for the offline base image) and starts dockerd.
set -euo pipefail

if docker info >/dev/null 2>&1; then
  exit 0
fi

say() { echo "ensure-docker: $*" >&2; }

if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  say "no Docker engine answers, and I can only install one as root on Debian."
  say "Start yours (e.g. 'sudo systemctl start docker'), or set DOCKER_HOST, then run this again."
  exit 1
fi

if ! command -v dockerd >/dev/null 2>&1 || ! command -v busybox >/dev/null 2>&1; then
  say "installing docker.io and busybox-static from Debian's packages..."
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io busybox-static >/dev/null
fi

if [ -n "${DOCKER_HOST:-}" ] && [ "${DOCKER_HOST#unix://}" = "$DOCKER_HOST" ]; then
  say "DOCKER_HOST=$DOCKER_HOST does not answer; not starting a local engine in its place."
  exit 1
fi

if ! pgrep -x dockerd >/dev/null 2>&1; then
  rm -f /var/run/docker.pid  # stale after a reboot or a killed daemon
  say "starting dockerd (log: /tmp/sbx-dockerd.log)..."
  setsid dockerd >/tmp/sbx-dockerd.log 2>&1 < /dev/null &
fi

for _ in $(seq 60); do
  if docker info >/dev/null 2>&1; then
    exit 0
  fi
  sleep 1
done
say "dockerd did not answer within 60 s; see /tmp/sbx-dockerd.log"
exit 1
