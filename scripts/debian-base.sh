#!/usr/bin/env bash
# Builds the sidecar image's base without a registry: debootstraps a minimal Debian (variant minbase, with
# python3, python3-venv and ca-certificates), caches it as a tarball and `docker import`s it. Prints the
# image tag on its last line. The tarball is cached in $VLLM_WATCHDOG_CACHE/debian-base (default
# ~/.cache/vllm-watchdog), keyed by this script's version, the suite, the mirror and the package list, so a
# second run (or a fresh Docker engine) only imports it. Needs root, debootstrap and a Docker engine.
set -euo pipefail

SCRIPT_VERSION=1 # bump when what this script puts into the tarball changes
SUITE=${DEBIAN_SUITE:-bookworm}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
# python3-venv brings ensurepip's pip, which installs the wheels offline in the image build.
PACKAGES=python3,python3-venv,ca-certificates
DOCKER=${DOCKER:-docker}
CACHE=${VLLM_WATCHDOG_CACHE:-$HOME/.cache/vllm-watchdog}/debian-base

key=$(printf '%s\n' "$SCRIPT_VERSION" "$SUITE" "$MIRROR" "$PACKAGES" | sha256sum | cut -c1-12)
TARBALL="$CACHE/$SUITE-minbase-$key.tar.gz"
TAG="vllm-watchdog/debian-base:$SUITE-$key"

if "$DOCKER" image inspect "$TAG" >/dev/null 2>&1; then
  echo "$TAG"
  exit 0
fi

if [ ! -f "$TARBALL" ]; then
  command -v debootstrap >/dev/null || { echo "debian-base: debootstrap missing: run scripts/setup.sh" >&2; exit 1; }
  [ "$(id -u)" = 0 ] || { echo "debian-base: debootstrap needs root" >&2; exit 1; }
  mkdir -p "$CACHE"
  rootfs=$(mktemp -d "$CACHE/rootfs.XXXXXX")
  # debootstrap mounts proc and sys in the tree while it installs; a failed run may leave them.
  trap 'umount -R "$rootfs/proc" "$rootfs/sys" 2>/dev/null || true; rm -rf --one-file-system "$rootfs" "$TARBALL.tmp"' EXIT
  echo "debian-base: debootstrap $SUITE (minbase + $PACKAGES) from $MIRROR" >&2
  debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$rootfs" "$MIRROR" >&2
  # What a container never needs: downloaded packages, package lists, documentation, translations.
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/log/* \
    "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/* \
    "$rootfs"/usr/share/locale/*
  # Docker provides /dev, /proc and /sys; the device nodes debootstrap made stay out of the image.
  tar --numeric-owner --exclude='./dev/*' --exclude='./proc/*' --exclude='./sys/*' \
    -C "$rootfs" -czf "$TARBALL.tmp" .
  mv "$TARBALL.tmp" "$TARBALL"
  echo "debian-base: cached $TARBALL ($(du -h "$TARBALL" | cut -f1))" >&2
fi

echo "debian-base: importing $TARBALL as $TAG" >&2
"$DOCKER" import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' \
  --change 'CMD ["/bin/bash"]' \
  "$TARBALL" "$TAG" >&2
echo "$TAG"
