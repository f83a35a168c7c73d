#!/usr/bin/env bash
# Make sure the Docker engine has gVisor's `runsc` runtime (profile `isolation: gvisor`,
# docs/security.md). As root on Debian: installs the `runsc` package, registers it in the
# engine's daemon.json `runtimes` with the flags that run here, and reloads dockerd with SIGHUP,
# which keeps running containers running.
set -euo pipefail

say() { echo "ensure-gvisor: $*" >&2; }
has_runsc() { docker info --format '{{json .Runtimes}}' 2>/dev/null | grep -q '"runsc"'; }

if has_runsc; then
  exit 0
fi

if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  say "the engine has no 'runsc' runtime, and I can only install one as root on Debian."
  say "Install gVisor (https://gvisor.dev/docs/user_guide/install/) and register it with your engine."
  exit 1
fi

if [ -n "${DOCKER_HOST:-}" ] && [ "${DOCKER_HOST#unix://}" = "$DOCKER_HOST" ]; then
  say "DOCKER_HOST=$DOCKER_HOST is not this machine's engine; register runsc on that host."
  exit 1
fi

if ! command -v runsc >/dev/null 2>&1; then
  say "installing runsc from Debian's packages..."
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq runsc >/dev/null
fi
RUNSC=$(command -v runsc)

# Which runsc flags work here, tried through the engine itself on the busybox base image (make
# image): the default platform needs KVM or a kernel feature some machines (nested VMs) lack, where
# ptrace still runs; and runsc 2022-12-19 takes a container's own network namespace for the host's
# on kernels that show /proc/sys/net/core/rmem_default in every namespace ("cannot run with network
# enabled in root network namespace"), where --network=host, which uses the container's namespace
# through the host kernel's stack, still runs (docs/security.md says what that gives up).
CONF=/etc/docker/daemon.json
IMAGE=${SBX_BASE_IMAGE:-sandboxer/base:busybox}
mkdir -p /etc/docker
PID=$(pgrep -o -x dockerd || true)
if [ -z "$PID" ]; then
  say "no local dockerd to reload; start it (make docker) and run this again."
  exit 1
fi

register() {  # $1: the runtimeArgs as a JSON list
  python3 - "$CONF" "$RUNSC" "$1" <<'PY'
import json, os, sys
path, runsc, args = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
conf = json.load(open(path)) if os.path.exists(path) and os.path.getsize(path) else {}
entry = {"path": runsc}
if args:
    entry["runtimeArgs"] = args
conf.setdefault("runtimes", {})["runsc"] = entry
tmp = path + ".sbx-tmp"
with open(tmp, "w") as f:
    json.dump(conf, f, indent=2)
    f.write("\n")
os.replace(tmp, path)
PY
  kill -HUP "$PID"
  for _ in $(seq 30); do
    if docker info --format '{{json .Runtimes.runsc}}' 2>/dev/null | python3 -c '
import json, sys
got = json.loads(sys.stdin.read() or "null") or {}
sys.exit((got.get("runtimeArgs") or []) != json.loads(sys.argv[1]))' "$1"; then
      return 0
    fi
    sleep 1
  done
  say "dockerd did not take the runtime within 30 s; see /tmp/sbx-dockerd.log"
  exit 1
}

for ARGS in '[]' '["--network=host"]' '["--platform=ptrace"]' '["--platform=ptrace","--network=host"]'; do
  register "$ARGS"
  if timeout 60 docker run --rm --runtime=runsc --network=none "$IMAGE" true >/dev/null 2>&1; then
    say "the engine now has the runsc runtime ($RUNSC, runtimeArgs $ARGS, in $CONF)."
    exit 0
  fi
done
python3 - "$CONF" <<'PY'
import json, sys
conf = json.load(open(sys.argv[1]))
conf.get("runtimes", {}).pop("runsc", None)
json.dump(conf, open(sys.argv[1], "w"), indent=2)
PY
kill -HUP "$PID"
say "runsc runs no container here with any of its platforms; see: docker run --runtime=runsc $IMAGE true"
exit 1
