# Docker compose targets (docker/compose.yaml). Include from the Makefile: `include docker/compose.mk`.
#   make compose-up            sites on CPU
#   make compose-up GPU=1      one GPU reserved per site (docker/compose.gpu.yaml)
#   DOCKER_COMPOSE=docker-compose   Compose v1 (Debian's docker-compose package) instead of the plugin
#   make compose-down          stop and remove the containers (volumes are kept; VOLUMES=1 removes them)
COMPOSE_FILES := -f docker/compose.yaml $(if $(GPU),-f docker/compose.gpu.yaml)
COMPOSE_ENV := $(if $(GPU),SITE_DEVICE=cuda)
DOCKER_COMPOSE ?= docker compose
COMPOSE := $(COMPOSE_ENV) $(DOCKER_COMPOSE) -p fedreid $(COMPOSE_FILES)

.PHONY: compose-up compose-down
compose-up:  ## build the image, start the coordinator and 4 sites, wait for the run; exit code = the run's
	$(COMPOSE) up --build --detach
	@echo "compose-up: waiting for the run (docker compose -f docker/compose.yaml -p fedreid logs -f to follow)"
	@code=$$(docker wait $$($(COMPOSE) ps --all --quiet superlink)); \
	  echo "compose-up: coordinator exited with code $$code (outputs in the fedreid_runs volume)"; exit $$code

compose-down:  ## stop and remove the federation's containers and network
	$(COMPOSE) down $(if $(VOLUMES),--volumes)
