#!/usr/bin/env bash
# Make sure an OpenSSH server binary is installed: the ssh backend's tests start their own
# sshd on 127.0.0.1 (a free port, keys generated in a temporary folder); nothing here starts
# a system-wide server. As root on Debian, installs openssh-server (and the client).
set -euo pipefail

SSHD="${SBX_TEST_SSHD:-/usr/sbin/sshd}"
if [ -x "$SSHD" ] && command -v ssh >/dev/null 2>&1 && command -v ssh-keygen >/dev/null 2>&1; then
  exit 0
fi

say() { echo "ensure-sshd: $*" >&2; }

if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  say "no OpenSSH server at $SSHD, and I can only install one as root on Debian."
  say "Install it yourself (e.g. 'sudo apt-get install openssh-server openssh-client'),"
  say "or point SBX_TEST_SSHD at an sshd binary, then run this again."
  exit 1
fi

say "installing openssh-server and openssh-client from Debian's packages..."
apt-get update -qq
# policy-rc.d 101: the package must not start a system-wide sshd; the tests start their own
had_policy=0
[ -e /usr/sbin/policy-rc.d ] && had_policy=1
if [ "$had_policy" = 0 ]; then
  printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
  chmod +x /usr/sbin/policy-rc.d
fi
DEBIAN_FRONTEND=noninteractive NEEDRESTART_SUSPEND=1 apt-get install -y -qq openssh-server openssh-client >/dev/null
[ "$had_policy" = 0 ] && rm -f /usr/sbin/policy-rc.d

if [ ! -x "$SSHD" ]; then
  say "openssh-server was installed but $SSHD is still missing"
  exit 1
fi
