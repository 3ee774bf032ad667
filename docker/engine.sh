#!/usr/bin/env bash
# Make a Docker engine and the local base image available (CI, and machines without Docker Hub).
# Idempotent: installs Debian's docker.io, docker-compose and debootstrap only when missing,
# starts dockerd only when no daemon answers, makes fedreid-base:bookworm only when absent.
#
#   sudo docker/engine.sh        # then: docker info; docker image ls fedreid-base
#
# Without root (and no engine already answering) it says so and exits 0: the docker tests then skip.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
wait_s="${FEDREID_DOCKERD_WAIT_S:-60}"

log() { echo "docker/engine.sh: $*" >&2; }

engine_answers() { command -v docker >/dev/null && timeout 20 docker info >/dev/null 2>&1; }

if ! engine_answers; then
  if [ "$(id -u)" != 0 ]; then
    log "no Docker engine answers and this is not root: skipping (docker tests will be skipped)"
    exit 0
  fi
  missing=()
  command -v dockerd >/dev/null || missing+=(docker.io)
  command -v docker-compose >/dev/null || missing+=(docker-compose)
  command -v debootstrap >/dev/null || missing+=(debootstrap)
  if [ ${#missing[@]} -gt 0 ]; then
    log "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" iptables >/dev/null
  fi
  if ! pgrep -x dockerd >/dev/null; then
    log "starting dockerd (log: /var/log/dockerd.log)"
    nohup dockerd >/var/log/dockerd.log 2>&1 &
  fi
  for _ in $(seq "$wait_s"); do
    engine_answers && break
    sleep 1
  done
  if ! engine_answers; then
    log "dockerd did not answer within ${wait_s}s; its log:"
    tail -n 30 /var/log/dockerd.log >&2 || true
    exit 1
  fi
fi
# the tests drive Compose v1 (Debian's docker-compose); install it if the engine came without it
if ! command -v docker-compose >/dev/null && [ "$(id -u)" = 0 ]; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends docker-compose >/dev/null
fi
"$here/base-image.sh"
