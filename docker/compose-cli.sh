#!/usr/bin/env bash
# Print the Compose command of this machine: the v2 plugin (`docker compose`) when it answers, else
# v1 (`docker-compose`, Debian's package); DOCKER_COMPOSE set and not empty wins. One line on stderr
# and exit 1 when there is none.
set -euo pipefail
if [ -n "${DOCKER_COMPOSE:-}" ]; then
  echo "$DOCKER_COMPOSE"
elif docker compose version >/dev/null 2>&1; then
  echo "docker compose"
elif command -v docker-compose >/dev/null && docker-compose version >/dev/null 2>&1; then
  echo "docker-compose"
else
  echo "compose: expected Docker Compose, found neither the plugin (\`docker compose\`) nor \`docker-compose\`:" \
    "install one (e.g. apt-get install docker-compose), or name yours with DOCKER_COMPOSE=..." >&2
  exit 1
fi
