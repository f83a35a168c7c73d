#!/usr/bin/env bash
# The Python base image of the service's container, made from Debian's packages, for an engine
# that cannot pull from a registry: debootstrap a minimal Debian with python3, python3-venv and
# ca-certificates into a folder, then `docker import` it. Does nothing if the image exists.
# Elsewhere, build the service from an official image instead (make service-image
# BASE=python:3.11-slim). Usage: scripts/build-python-base.sh [IMAGE]
set -euo pipefail

IMAGE="${1:-sandboxer/python-base:bookworm}"
SUITE="${DEBIAN_SUITE:-bookworm}"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
PACKAGES=python3,python3-venv,ca-certificates

say() { echo "build-python-base: $*" >&2; }

if docker image inspect "$IMAGE" >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  say "$IMAGE is missing, and debootstrap needs root to make it."
  say "Run this as root, or build the service from an official image: make service-image BASE=python:3.11-slim"
  exit 1
fi

work="$(mktemp -d /var/tmp/sbx-python-base.XXXXXX)"
rootfs="$work/rootfs"
cleanup() {
  # debootstrap mounts /proc and /sys inside the target; a failed run may leave them there
  for mnt in proc sys dev/pts; do
    mountpoint -q "$rootfs/$mnt" 2>/dev/null && umount -l "$rootfs/$mnt"
  done
  rm -rf --one-file-system "$work"
}
trap cleanup EXIT

debootstrap_cmd=(debootstrap)
if ! command -v debootstrap >/dev/null 2>&1; then
  # Debian's debootstrap package, unpacked into the work folder: nothing installed on the host
  if ! command -v apt-get >/dev/null 2>&1; then
    say "debootstrap is missing and there is no apt-get to fetch it; install debootstrap"
    exit 1
  fi
  say "fetching Debian's debootstrap package (not installing it)..."
  (cd "$work" && apt-get download -q -o APT::Sandbox::User=root debootstrap >/dev/null)
  dpkg-deb -x "$work"/debootstrap_*.deb "$work/debootstrap"
  export DEBOOTSTRAP_DIR="$work/debootstrap/usr/share/debootstrap"
  debootstrap_cmd=("$work/debootstrap/usr/sbin/debootstrap")
fi

keyring=()
if [ -f /usr/share/keyrings/debian-archive-keyring.gpg ]; then
  keyring=(--keyring=/usr/share/keyrings/debian-archive-keyring.gpg)
fi

say "debootstrap $SUITE ($PACKAGES) from $MIRROR (about a minute; log: $work/debootstrap.log)..."
if ! "${debootstrap_cmd[@]}" --variant=minbase --include="$PACKAGES" "${keyring[@]}" \
    "$SUITE" "$rootfs" "$MIRROR" >"$work/debootstrap.log" 2>&1; then
  tail -20 "$work/debootstrap.log" >&2
  say "debootstrap failed (the lines above are the end of its log)"
  exit 1
fi

# What an image does not need: downloaded packages, package lists, documentation, and the
# host's own resolver and name (the engine gives each container its own)
rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/cache/apt/*.bin \
       "$rootfs"/var/lib/apt/lists/* "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* \
       "$rootfs"/usr/share/info/* "$rootfs"/var/log/*.log
rm -f "$rootfs"/etc/resolv.conf "$rootfs"/etc/hostname

# the archive first, so that a failed tar leaves no half-made image behind
tar --numeric-owner -C "$rootfs" -cf "$work/rootfs.tar" .
docker import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' \
  --change 'CMD ["python3"]' \
  --change "LABEL org.opencontainers.image.description=\"Debian $SUITE with python3, made by debootstrap\"" \
  --message "debootstrap --variant=minbase --include=$PACKAGES $SUITE" \
  "$work/rootfs.tar" "$IMAGE" >/dev/null
say "built $IMAGE"
