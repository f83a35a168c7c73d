#!/usr/bin/env bash
# Docker Compose, for the compose backend and its tests: `docker compose` (the plugin) or
# `docker-compose` when either works; otherwise, as root on Debian, Debian's package
# `docker-compose` (the plugin is not packaged there) with python3-paramiko, which it needs
# for engines at ssh:// addresses; otherwise say what to do.
set -euo pipefail
if docker compose version >/dev/null 2>&1; then
    exit 0
fi
# the Python docker-compose (1.x) reaches ssh:// engines through paramiko, of its own
# interpreter (its script's #! line)
has_paramiko() {
    local shebang
    shebang=$(head -1 "$(command -v docker-compose)")
    case "$shebang" in
        "#!"*python*) ${shebang#\#!} -c 'import paramiko' 2>/dev/null ;;
        *) true ;;
    esac
}
if docker-compose version >/dev/null 2>&1 && has_paramiko; then
    exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "ensure-compose: Docker Compose is missing; install it (e.g. 'sudo apt-get install" \
         "docker-compose', or the docker-compose-plugin of Docker's own packages)" >&2
    exit 1
fi
echo "ensure-compose: installing docker-compose from Debian's packages..." >&2
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends docker-compose python3-paramiko \
    >/dev/null
docker-compose version >/dev/null
