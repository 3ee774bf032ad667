#!/usr/bin/env bash
# make compose-demo / make compose-down's demo half: the CPU demo in docker/compose.yaml, with
# nothing on the host but Docker.
#
#   docker/compose-demo.sh up      # build, make secrets and data in a container, six rounds, one result line
#   TASK=fedfr docker/compose-demo.sh up   # the FedFR demo (docker/compose.fedfr-demo.yaml): face sites,
#                                          # two rounds, each scoring its personalised model after the last
#   docker/compose-demo.sh down    # stop and remove the demo's containers, network, volumes and folder
#
# up: builds the image (CPU-only torch; GPU=1: the CUDA image of docker/compose.gpu.yaml) on the
# local base fedreid-base:bookworm when it exists (docker/base-image.sh: no Docker Hub needed), else
# on python:3.11-slim; when containers cannot reach torch's CPU index, torch comes from PyPI (CUDA
# bundled, fedreid:cuda) and a line says so. A container of the image then writes the certificates,
# the site keys, the registry and the synthetic data (python -m server.demos.compose_demo setup) into the
# demo folder; compose runs the coordinator, its proxy and four sites (experiment compose-demo: the
# six rounds of `make demo`, enough for the global model to beat its untrained start); the
# coordinator's round lines are shown as they come, then one result line.
#
# Environment: DOCKER_COMPOSE (default: detected, docker/compose-cli.sh), FEDREID_DEMO_DIR (default
# docker/demo), FEDREID_DEMO_PROJECT (compose project, default fedreid-demo), FEDREID_DEMO_TIMEOUT_S
# (default 3600), FEDREID_DEMO_ROUNDS (default 6, FedFR 2), FEDREID_DEMO_SCALE (full, the default, or quick:
# the machinery at its smallest, experiment compose-demo-quick / compose-fedfr-demo-quick, what
# tests/e2e/test_docker_compose.py runs), FEDREID_BASE_IMAGE, FEDREID_TORCH_INDEX_URL, FEDREID_IMAGE, GPU,
# TASK (fedreid or fedfr).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
say() { echo "compose-demo: $*"; }
die() {
  echo "compose-demo: $*" >&2
  exit 1
}

command -v docker >/dev/null || die "expected the docker command, found none: install Docker"
timeout 30 docker info >/dev/null 2>&1 || die "expected a Docker engine, none answers \`docker info\`: start it (e.g. sudo systemctl start docker)"
read -r -a compose_cli <<<"$("$here/compose-cli.sh")"
[ ${#compose_cli[@]} -gt 0 ] || exit 1

project="${FEDREID_DEMO_PROJECT:-fedreid-demo}"
demo_dir="${FEDREID_DEMO_DIR:-$here/demo}"
mkdir -p "$demo_dir"
demo_dir="$(cd "$demo_dir" && pwd)"
task="${TASK:-fedreid}"
case "$task" in
  fedreid) files=(-f "$here/compose.yaml" -f "$here/compose.demo.yaml") ;;
  fedfr) files=(-f "$here/compose.yaml" -f "$here/compose.fedfr-demo.yaml") ;;
  *) die "expected TASK=fedreid or TASK=fedfr, found TASK=$task" ;;
esac
scale="${FEDREID_DEMO_SCALE:-full}"
case "$scale" in
  full) suffix="" ;;
  quick) suffix="-quick" ;;
  *) die "expected FEDREID_DEMO_SCALE=full or FEDREID_DEMO_SCALE=quick, found FEDREID_DEMO_SCALE=$scale" ;;
esac
if [ -n "${GPU:-}" ]; then
  files+=(-f "$here/compose.gpu.yaml")
  export SITE_DEVICE=cuda
fi
image="${FEDREID_IMAGE:-$([ -n "${GPU:-}" ] && echo fedreid:cuda || echo fedreid:cpu)}"

# what compose.yaml reads: the demo's folder, experiment and a free loopback port; the services run
# as the image's user, who owns what the setup container writes
export FEDREID_DEMO_DIR="$demo_dir" FEDREID_SECRETS="$demo_dir/secrets" \
  MARKET1501_DATA="$demo_dir/data/market1501" DUKEMTMC_DATA="$demo_dir/data/dukemtmc" \
  CUHK03_DATA="$demo_dir/data/cuhk03" MSMT17_DATA="$demo_dir/data/msmt17" \
  FEDREID_EXPERIMENT="$([ "$task" = fedfr ] && echo compose-fedfr-demo || echo compose-demo)$suffix" \
  FEDREID_RUN="$task" FEDREID_SITES="$([ "$task" = fedfr ] && echo '[face1,face2,face3,face4]' || echo '[market1501,dukemtmc,cuhk03,msmt17]')" \
  FEDREID_ROUNDS="${FEDREID_DEMO_ROUNDS:-$([ "$task" = fedfr ] && echo 2 || echo 6)}" FEDREID_MIN_SITES=4 FEDREID_BATCH_SIZE=32 \
  FEDREID_PORT=127.0.0.1: FEDREID_UID=10001 FEDREID_GID=10001
compose=("${compose_cli[@]}" -p "$project" "${files[@]}")

# Empty the demo folder (its files belong to the image's user: removed from a container) and remove
# the demo's containers, network and volumes.
down() {
  # every demo's files: whichever task ran, its containers and volumes are known to compose
  "${compose_cli[@]}" -p "$project" -f "$here/compose.yaml" -f "$here/compose.demo.yaml" \
    -f "$here/compose.fedfr-demo.yaml" down --volumes --remove-orphans --timeout 10 >/dev/null 2>&1 || true
  if [ -n "$(ls -A "$demo_dir" 2>/dev/null)" ]; then
    local with=""
    for candidate in "$image" fedreid:cpu fedreid:cuda; do  # any image the demo may have built
      if docker image inspect "$candidate" >/dev/null 2>&1; then
        with="$candidate"
        break
      fi
    done
    if [ -n "$with" ]; then
      docker run --rm --user 0:0 -v "$demo_dir:/demo" --entrypoint sh "$with" -c 'rm -rf /demo/* /demo/.[!.]*'
    else
      rm -rf "${demo_dir:?}"/* 2>/dev/null || die "expected to empty $demo_dir, could not (its files belong to uid 10001)"
    fi
  fi
}

if [ "${1:-up}" = down ]; then
  down
  rmdir "$demo_dir" 2>/dev/null || true
  say "removed the demo's containers, network, volumes and $demo_dir"
  exit 0
fi
[ "${1:-up}" = up ] || die "expected up or down, found ${1}"

# ---- the images
local_base=fedreid-base:bookworm
if [ -z "${FEDREID_BASE_IMAGE:-}" ] && docker image inspect "$local_base" >/dev/null 2>&1; then
  export FEDREID_BASE_IMAGE="$local_base" FEDREID_PROXY_BASE_IMAGE="${FEDREID_PROXY_BASE_IMAGE:-$local_base}"
  say "building on the local base image $local_base"
fi
# BuildKit comes with the buildx plugin; without it, the classic builder
if [ -z "${DOCKER_BUILDKIT:-}" ] && ! docker buildx version >/dev/null 2>&1; then
  export DOCKER_BUILDKIT=0
fi
cpu_index=https://download.pytorch.org/whl/cpu
if [ -z "${GPU:-}" ] && [ -z "${FEDREID_TORCH_INDEX_URL+set}" ]; then
  base="${FEDREID_BASE_IMAGE:-python:3.11-slim}"
  if ! docker run --rm "$base" python3 -c \
    "import urllib.request as u; u.urlopen('$cpu_index/torch/', timeout=15)" >/dev/null 2>&1; then
    say "$cpu_index cannot be reached from a container: torch comes from PyPI (CUDA bundled, a larger image)"
    export FEDREID_TORCH_INDEX_URL=""
    image="${FEDREID_IMAGE:-fedreid:cuda}"
  fi
fi
export FEDREID_IMAGE="$image"
say "building $image and fedreid-proxy:latest (the first build downloads torch: minutes)"
"${compose[@]}" build superlink proxy

# ---- a fresh deployment: secrets, keys, registry and data, made in a container of the image
down
say "secrets, site keys and synthetic data in $demo_dir (in a container)"
if ! log="$(docker run --rm --user 0:0 -v "$demo_dir:/demo" "$image" python -m server.demos.compose_demo setup /demo "$task" "$scale" 2>&1)"; then
  echo "$log" | tail -n 20 >&2
  die "expected the demo's secrets and data in $demo_dir, the setup container failed (above)"
fi

# ---- the run
say "starting the coordinator, its proxy and four $task sites (project $project)"
"${compose[@]}" up --detach --no-build
coordinator="$("${compose[@]}" ps -q superlink)"
[ -n "$coordinator" ] || die "expected the coordinator's container, compose started none"
timeout "${FEDREID_DEMO_TIMEOUT_S:-3600}" docker logs -f "$coordinator" 2>&1 \
  | grep --line-buffered -E '^\[round [0-9]+/' | sed -u 's/^/compose-demo: /' &
follower=$!
code="$(timeout "${FEDREID_DEMO_TIMEOUT_S:-3600}" docker wait "$coordinator" || echo timeout)"
wait "$follower" 2>/dev/null || true
if [ "$code" != 0 ]; then
  docker logs --tail 40 "$coordinator" >&2 || true
  die "expected the coordinator to end the run with 0, found $code; its log above; \`make compose-down\` removes the demo"
fi
runs="$(docker volume ls -q --filter "label=com.docker.compose.project=$project" --filter label=com.docker.compose.volume=runs)"
docker run --rm -v "$runs:/runs:ro" "$image" python -m server.demos.compose_demo result "/runs/$task"
say "outputs in the volume $runs; stop and remove everything with: make compose-down"
