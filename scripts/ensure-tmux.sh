#!/usr/bin/env bash
# tmux, for the dashboard's real-terminal test and benchmark: Debian's package when missing
# (as root); otherwise say what to do.
set -euo pipefail
command -v tmux >/dev/null 2>&1 && exit 0
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "ensure-tmux: tmux is missing; install it (e.g. 'sudo apt-get install tmux')" >&2
    exit 1
fi
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq tmux >/dev/null
