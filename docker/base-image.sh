#!/usr/bin/env bash
# Make the local base image fedreid-base:bookworm (Debian 12 + Python 3.11) with debootstrap and
# `docker import`, for machines that cannot pull from Docker Hub. Reused when it already exists.
#
#   docker/base-image.sh                      # then: docker build --build-arg BASE_IMAGE=fedreid-base:bookworm ...
#
# FEDREID_DEBIAN_MIRROR overrides the Debian mirror (default: the one of this machine's apt sources).
set -euo pipefail
image="${FEDREID_BASE_IMAGE:-fedreid-base:bookworm}"
mirror="${FEDREID_DEBIAN_MIRROR:-http://deb.debian.org/debian}"

if docker image inspect "$image" >/dev/null 2>&1; then
  echo "docker/base-image.sh: $image exists, reused" >&2
  exit 0
fi
command -v debootstrap >/dev/null || { echo "docker/base-image.sh: debootstrap is missing (apt-get install debootstrap)" >&2; exit 1; }

root="$(mktemp -d /tmp/fedreid-base.XXXXXX)"
# debootstrap mounts proc and sys in the target: unmount before removing anything
trap 'umount -R "$root/proc" "$root/sys" 2>/dev/null || true; rm -rf --one-file-system "$root"' EXIT
echo "docker/base-image.sh: debootstrap bookworm into $root" >&2
# What the Dockerfile needs: python3.11 with venv and pip (the project is installed into a venv as
# `make install` does), CA certificates for PyPI over HTTPS.
debootstrap --variant=minbase \
  --include=python3,python3-venv,python3-pip,ca-certificates \
  bookworm "$root" "$mirror" >/tmp/fedreid-base-debootstrap.log 2>&1 \
  || { tail -n 30 /tmp/fedreid-base-debootstrap.log >&2; exit 1; }
# the security updates' suite, as the python:*-slim images carry
echo "deb http://deb.debian.org/debian-security bookworm-security main" >>"$root/etc/apt/sources.list"
# the CA certificates this machine adds to Debian's (a company's TLS-inspecting proxy, say): the
# image then reaches PyPI and Debian's registry the way the machine itself does
extra=(/usr/local/share/ca-certificates/*.crt)
if [ -e "${extra[0]}" ]; then
  mkdir -p "$root/usr/local/share/ca-certificates"
  cp "${extra[@]}" "$root/usr/local/share/ca-certificates/"
  chroot "$root" update-ca-certificates >/dev/null
  echo "docker/base-image.sh: added this machine's CA certificates: ${extra[*]##*/}" >&2
fi
chroot "$root" apt-get clean
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/tmp/*
tar -C "$root" --one-file-system -c . | docker import \
  --change 'ENV LANG=C.UTF-8' \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'CMD ["/bin/bash"]' \
  - "$image" >/dev/null
echo "docker/base-image.sh: made $image ($(docker image inspect -f '{{.Size}}' "$image") bytes)" >&2
